#!/usr/bin/env bash
# The gRPC servers of the peer matrix (tests/it/peer_matrix.rs) that need a
# build, into the cache ($DRAINSHIM_CACHE, default .cache/peers/):
#   - grpc-go/app: tests/peers/go/ built with Debian's golang-go against
#     Debian's golang-google-grpc-dev (grpc-go 1.33) in GOPATH mode, with
#     GOPROXY=off: nothing is downloaded, everything comes from /usr/share/gocode.
#   - grpc-java/app: a launcher for tests/peers/java/StreamApp.java, compiled
#     with the system javac against Debian's libgrpc-java (1.41) on
#     libnetty-java. libperfmark-java is installed too: libgrpc-java's classes
#     call io.perfmark but the package does not depend on it (without it
#     every call fails with NoClassDefFoundError: io/perfmark/PerfMark).
# The other two servers of the matrix need nothing here: grpcio is
# tests/py/grpc_app.py in the venv of scripts/fetch-pytools.sh, tonic is the
# `drainshim bench server` of this build.
#
# Debian packages are installed with apt-get, so this needs root (CI and the
# project's machines run it as root). A peer is rebuilt only when its stamp
# changed: its sources, this script, the compiler's and the packages'
# versions. Fails, loudly, when anything cannot be had: the tests never skip
# a peer.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
out=$cache/peers
debs=(golang-go golang-google-grpc-dev openjdk-17-jdk-headless libgrpc-java libnetty-java libperfmark-java)
die() { printf 'fetch-peers: %s\n' "$*" >&2; exit 1; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
version() { dpkg-query -W -f='${Version}' "$1"; }

missing=()
for p in "${debs[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "apt-get is needed (Debian/Ubuntu) for: ${missing[*]}"
  [[ $(id -u) == 0 ]] || die "needs root to apt-get install: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" \
      || die "apt-get install ${missing[*]} failed"
  fi
  for p in "${missing[@]}"; do installed "$p" || die "$p is still not installed"; done
fi

# What a build depends on, as one line: when it changes, the peer is rebuilt.
# Contents only, never paths: checkouts that share the cache share the build.
stamp_of() { # name, then files
  local name=$1
  shift
  {
    cat "$0" "$@"
    for p in "${debs[@]}"; do echo "$p $(version "$p")"; done
    echo "$name"
  } | sha256sum | cut -d' ' -f1
}
current() { [[ -x $1/app && -f $1/stamp && $(cat "$1/stamp") == "$2" ]]; }

# grpc-go: GOPATH mode, Debian's sources only.
go_dir=$out/grpc-go
go_src=$root/tests/peers/go
go_stamp=$(stamp_of "grpc-go $(go version)" "$go_src"/*.go)
if ! current "$go_dir" "$go_stamp"; then
  rm -rf "$go_dir"
  mkdir -p "$go_dir/gopath"
  (cd "$go_src" && GO111MODULE=off GOPROXY=off GOFLAGS= \
    GOPATH=/usr/share/gocode:$go_dir/gopath GOCACHE=$out/go-cache \
    go build -o "$go_dir/app" .) || die "go build of $go_src failed"
  echo "$go_stamp" >"$go_dir/stamp"
fi

# grpc-java on Netty: Debian's jars, the system javac.
java_dir=$out/grpc-java
java_src=$root/tests/peers/java/StreamApp.java
jars=(grpc-api grpc-context grpc-core grpc-netty grpc-stub guava perfmark-api
  netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-common
  netty-handler netty-resolver netty-transport)
classpath=
for j in "${jars[@]}"; do
  [[ -f /usr/share/java/$j.jar ]] || die "/usr/share/java/$j.jar is missing"
  classpath+=/usr/share/java/$j.jar:
done
java_stamp=$(stamp_of "grpc-java $(javac -version 2>&1) ${jars[*]}" "$java_src")
if ! current "$java_dir" "$java_stamp"; then
  rm -rf "$java_dir"
  mkdir -p "$java_dir/classes"
  # -XDignore.symbol.file: StreamApp takes SIGTERM with sun.misc.Signal, and
  # says so in its source; javac need not warn about it on every build.
  javac -XDignore.symbol.file -d "$java_dir/classes" -cp "$classpath" "$java_src" \
    || die "javac $java_src failed"
  # A small JVM: the app holds a few dozen streams, on a shared 2-core machine.
  # The classes are found beside the launcher, wherever the cache is reached from.
  cat >"$java_dir/app" <<EOF
#!/bin/sh
here=\$(cd "\$(dirname "\$0")" && pwd)
exec java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xmx128m -cp "\$here/classes:${classpath%:}" StreamApp "\$@"
EOF
  chmod +x "$java_dir/app"
  echo "$java_stamp" >"$java_dir/stamp"
fi

echo "fetch-peers: grpc-go $(version golang-google-grpc-dev) ($(go version | cut -d' ' -f3)), grpc-java $(version libgrpc-java) on netty $(version libnetty-java) ($(javac -version 2>&1)) in $out" >&2
