"""The guard: the real `drainshim sidecar` process with its stream guard in
front of an app, its log, its addresses and its control endpoint."""

import http.client
import os
import re
import subprocess
import threading

from .waiting import Deadline


# A drain that fits a test: no deregistration delay, streams ended within 4 s.
DRAIN_FLAGS = ["--deregistration-delay", "0s", "--drain-time", "4s", "--min-drain-time", "0s",
               "--parent-shutdown-time", "6s", "--termination-grace-period", "8s",
               "--linger", "0s"]


class Guard:
    """The real `drainshim sidecar` with its stream guard in front of `upstream`."""

    # DRAINSHIM_TEST_LOG replaces it, to look into a failure.
    LOG = os.environ.get("DRAINSHIM_TEST_LOG") or "warn,drainshim::sidecar=info,drainshim::drain=info"

    def __init__(self, binary, upstream, extra_args=(), log=LOG):
        args = [binary, "sidecar", "--listen", "127.0.0.1:0",
                "--envoy-admin", "http://127.0.0.1:9",
                "--guard-listen", "127.0.0.1:0",
                "--guard-upstream", f"{upstream[0]}:{upstream[1]}",
                "--log", log,
                *DRAIN_FLAGS, *extra_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINSHIM_")}
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        self.reader = threading.Thread(target=self._read, name="guard-stderr", daemon=True)
        self.reader.start()
        self.addr = self._wait_addr(r"guard_listen=Some\((127\.0\.0\.1):(\d+)\)", "guard_listen")
        self.admin = self._wait_addr(r"sidecar ready listen=(127\.0\.0\.1):(\d+)", "listen")

    def _read(self):
        for line in iter(self.proc.stderr.readline, b""):
            with self.cond:
                self.lines.append(line.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _wait_addr(self, regex, what):
        d = Deadline(30)
        with self.cond:
            while True:
                for line in self.lines:
                    m = re.search(regex, line)
                    if m:
                        return m.group(1), int(m.group(2))
                if self.proc.poll() is not None and not self.reader.is_alive():
                    raise AssertionError(f"drainshim exited with {self.proc.returncode} before "
                                         f"printing {what}:\n{self.log()}")
                if d.expired():
                    raise AssertionError(f"drainshim printed no {what} within 30 s:\n{self.log()}")
                self.cond.wait(min(0.1, d.remaining()))

    def alive(self):
        return self.proc.poll() is None

    def log(self, tail=60):
        with self.cond:
            return "\n".join(self.lines[-tail:])

    def drain(self):
        """POST /drain on the sidecar's control endpoint: starts a drain."""
        c = http.client.HTTPConnection(*self.admin, timeout=5)
        try:
            c.request("POST", "/drain")
            r = c.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        finally:
            self.reader.join(timeout=5)
            if self.proc.stderr:
                self.proc.stderr.close()
