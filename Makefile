# The two commands a newcomer needs (see README.md):
#   make demo   run the main job end to end on this machine
#   make test   install what the tests need, then lint and run every test
SHELL := /bin/bash
CARGO ?= cargo
# The benchmarks and the demo: drainshim-bench (bench/; its benchmarks are
# benches/, its protocol proto/), release build. What
# they measure is the production binary, target/shipped/drainshim (`make
# shipped`): the guard, and the sidecar, agent and fleet commands the soaks,
# node-scale, failopen and the fleet bench run (DRAINSHIM_BIN). No release
# build of drainshim itself is needed beside it.
SHIPPED_BIN := $(CURDIR)/target/shipped/drainshim
HARNESS = $(CARGO) run --release --locked --quiet -p drainshim-bench --
BENCHES = --bench footprint --bench guard --bench failopen --bench websocket
BENCH = DRAINSHIM_BIN=$(SHIPPED_BIN) $(HARNESS)

.PHONY: demo test clippy deny bench-build fuzz-build conformance webhook-test shipped bench bench-allocator bench-reconnect bench-node bench-fleet envoy prometheus h2load pytools peers lint tools deploy-check deploy-tools deploy-rules fuzz-ci

demo: envoy
	$(HARNESS) demo

# Every test, lint and benchmark, with what they need installed first
# (scripts/test.sh says how, phase by phase).
test:
	CARGO="$(CARGO)" MAKE="$(MAKE)" scripts/test.sh

# The guard's HTTP/2 conformance suite (tests/py/h2_conformance/, a module per
# RFC section): python-h2 and hyperframe peers on either side of the real
# binary, holding it to what RFC 9113/7541 let a client and an app do; and
# with no app, or an app that does not speak HTTP/2, with the guard as the
# client's server.
conformance: pytools
	$(CARGO) build --locked --workspace
	DRAINSHIM_BIN=$(CURDIR)/target/debug/drainshim .cache/py-venv/bin/python -m pytest -q -p no:cacheprovider tests/py/h2_conformance

# drainshim webhook, the real binary over HTTPS, in both modes
# (tests/py/webhook_test.py): its JSON Patches applied by Python's jsonpatch
# give what drainshim inject writes; reviews it cannot handle are allowed
# unchanged with a warning; a rotated certificate is served; SIGTERM. Under
# Istio, every mode (classic or native sidecars, held app or not, either
# webhook first) through an emulation of Istio's injector and the API server.
# And drainshim check on its fixtures (tests/py/check_test.py).
webhook-test: pytools
	$(CARGO) build --locked --workspace
	DRAINSHIM_BIN=$(CURDIR)/target/debug/drainshim .cache/py-venv/bin/python -m pytest -q -s -p no:cacheprovider tests/py/webhook_test.py tests/py/check_test.py

# The production binary, as the image ships it (release, static glibc, the
# system allocator): target/shipped/drainshim.
shipped:
	CARGO="$(CARGO)" scripts/build-shipped.sh

# The bench harness, its binary and the benches make bench runs (release),
# built without running anything. The binary first: its fat-LTO link is the
# longest (130 s of one core; the benches' 35 to 47 s each). Built by cargo
# bench alone, it started after the benches' and ended the build by itself
# on one core; now the benches' links end it, two at a time, and cargo bench
# finds the binary built.
bench-build:
	$(CARGO) build --release --locked -p drainshim-bench
	$(CARGO) bench --locked -p drainshim-bench --no-run $(BENCHES)

# Benchmarks report ratios against a baseline measured in the same run; they
# assert nothing about speed. What they measure is the production binary
# (shipped: the guard, the sidecar); the backends, load clients and the relay
# are drainshim-bench's.
bench: tools shipped bench-build
	@echo "make bench: $$(date +%T) footprint, guard, failopen, websocket"
	DRAINSHIM_BIN=$(SHIPPED_BIN) $(CARGO) bench --locked -p drainshim-bench $(BENCHES)
	@echo "make bench: $$(date +%T) reconnect"
	$(MAKE) bench-reconnect
	@echo "make bench: $$(date +%T) node"
	$(MAKE) bench-node
	@echo "make bench: $$(date +%T) fleet"
	$(MAKE) bench-fleet
	@echo "make bench: $$(date +%T) soak"
	$(MAKE) bench-soak
	@echo "make bench: $$(date +%T) done"

# The production binary's allocator, by measurement: the shipped build with
# the system allocator and with mimalloc as guards side by side, beside direct
# and an Envoy hop, in one run (benches/allocator.rs). Not part of make bench.
bench-allocator: envoy h2load
	CARGO="$(CARGO)" scripts/build-shipped.sh
	CARGO="$(CARGO)" scripts/build-shipped.sh --allocator mimalloc
	$(CARGO) bench --locked -p drainshim-bench --bench allocator

# The restarted pod's 500 gRPC streams, then 500 WebSockets (each its own
# connection through Envoy to the guard, opened in one burst), through real
# Envoy: graceful, cut, bypassed, lost, reconnect success, storm, and how busy
# the machine was. Then 2,000 of each on the pod, writing once a second: at
# ten a second, 4,000 streams saturate a 2-core machine that runs both pods
# and every client, and the bench says so. Exits 1 if drainshim mode cut,
# bypassed or lost anything.
bench-reconnect: envoy
	$(BENCH) reconnect --mode drainshim --protocol grpc --streams 1000
	$(BENCH) reconnect --mode drainshim --protocol websocket --streams 1000
	$(BENCH) reconnect --mode drainshim --protocol grpc --streams 4000 --tick 1s
	$(BENCH) reconnect --mode drainshim --protocol websocket --streams 4000 --tick 1s

# The sidecar binary under 1,000 WebSockets recycled every half second by max
# age until 70,000 streams were recycled, each a new connection through Envoy
# and the guard (about 110 s, where a 1 s age took 145; at most 6 minutes):
# RSS, descriptors, threads and tasks sampled. Exits 1 if a stream was cut, a
# message lost, RSS grew over 8 MiB per 10^5 streams, or descriptors or tasks
# stayed after the clients left. The slope is read after the warm-up (the
# first fifth of the samples), over about 56,000 streams: the soak judges
# none under 50,000. Each stream carries about 5 of the app's messages (one
# per 100 ms), where a 1 s age carried 10: a leak per message must be twice
# as large to cross the limit.
# Then the node agent (root): four pods in network namespaces, the same
# streams through the agent's guards (no Envoy hop) at a 1 s age, and every
# 30 s one pod drained through the agent and replaced, to 10^5 streams
# (about 100 s): its RSS still climbs for the first 30 s, so it keeps the
# longer run.
# Longer: `drainshim bench soak [--node] --duration 24h`.
bench-soak: envoy shipped
	$(BENCH) soak --streams 1000 --max-connection-age 500ms --duration 6m --until-recycled 70000
	$(BENCH) soak --node --streams 1000 --duration 6m --until-recycled 100000 --drain-every 30s

# The fleet tools at the mission's scale: 2,400 pods, 500 services, 100
# namespaces and ten weeks of a migration, simulated, backfilled into a real
# Prometheus (promtool) and imported into a real VictoriaMetrics; inventory,
# skew, verify and plan against both: wall time, peak RSS, queries, bytes.
# Exits 1 if the stores' answers differ or the plan misreads the history.
# About 9 GB of scratch files in $TMPDIR while it runs.
bench-fleet: prometheus shipped
	$(BENCH) fleet

# Everything the tests run against. Envoy, Prometheus and the deploy tools
# (kubectl if absent, kubernetes-validate, hadolint, promtool) go into .cache/;
# h2load and the peer servers' toolchains link or build against system
# packages, so they are apt installs (as root).
tools: envoy prometheus h2load pytools peers deploy-tools

envoy:
	scripts/fetch-envoy.sh

prometheus:
	scripts/fetch-prometheus.sh

h2load:
	scripts/fetch-h2load.sh

# Independent Python clients for the tests (websockets) in .cache/py-venv.
pytools:
	scripts/fetch-pytools.sh

# The gRPC servers of the peer matrix that need a build, into .cache/peers/:
# grpc-go and grpc-java on Netty, from Debian's packages (apt, as root).
peers:
	scripts/fetch-peers.sh

lint:
	$(CARGO) fmt --all --check
	$(MAKE) --no-print-directory clippy deny

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# Licenses, bans and sources of every dependency (cargo-deny, into .cache/).
deny:
	scripts/deny.sh

# Every libFuzzer target in fuzz/ for 20 s each (cargo-fuzz, installed into
# .cache/); fails on any crash. Longer: scripts/fuzz.sh SECONDS [TARGET...].
# make test runs it in the background, at idle priority, while the
# integration tests wait on their drains.
fuzz-ci:
	scripts/fuzz.sh 20

# Only the build of the fuzz targets (make test runs it in the background).
fuzz-build:
	scripts/fuzz.sh --build-only

# deploy/ and the Dockerfile: kustomize builds, Kubernetes schemas, drain
# budgets, Envoy bootstraps, promtool, hadolint (scripts/check-deploy.sh).
deploy-check:
	scripts/check-deploy.sh

# Only the tool installs of deploy-check (it re-checks them and skips what is there).
deploy-tools:
	DEPLOY_TOOLS_ONLY=1 scripts/check-deploy.sh

# Regenerate deploy/monitoring/prometheusrule.yaml after editing rules.yaml.
deploy-rules: deploy-tools
	.cache/deploy-venv/bin/python scripts/check_deploy.py sync-rules

# Node mode at scale (root): 100 pod namespaces, discovery time, RSS, idle CPU;
# then 100 guarded pods: the agent's guards against one sidecar guard per pod.
bench-node: shipped
	$(BENCH) node-scale --pods 100
	$(BENCH) node-scale --pods 100 --guards
