"""The applications behind the guard: `App`, an h2 server on 127.0.0.1:0 with
a thread per connection, routes for bodies, echoes and gRPC streams, and
hooks for tests that need it to misbehave; `NoApp` (a port nothing listens
on) and `Http1App` (Python's `http.server`, HTTP/1.1 only)."""

import hashlib
import heapq
import http.server
import json
import queue
import select
import socket
import threading
import time

import h2.events

from .endpoint import Endpoint
from .frames import DATA, HEADERS, MAX_STREAM_ID, err_name, grpc_message, pattern, ping_frame
from .waiting import wait_until


class AppRequest:
    """A request as the app received it."""

    def __init__(self, conn, sid, headers):
        self.conn, self.sid = conn, sid
        self.headers = list(headers)
        self.h = dict(self.headers)
        self.path = self.h.get(":path", "")
        self.body = bytearray()
        self.ended = False      # END_STREAM received
        self.reset = None       # RST_STREAM code received
        self.answered = False   # we sent END_STREAM
        self.ignored = False    # above our final GOAWAY: never processed
        self.t = time.monotonic()

    @property
    def done(self):
        return self.reset is not None or (self.ended and self.answered) or self.ignored

    @property
    def call(self):
        """The test's label for the call (header x-call)."""
        return self.h.get("x-call")

    def __repr__(self):
        return (f"app-request s={self.sid} {self.path} call={self.call} body={len(self.body)} "
                f"ended={self.ended} answered={self.answered} ignored={self.ignored} "
                f"reset={err_name(self.reset) if self.reset is not None else None}")


def grpc_tick(seq):
    return grpc_message(b"tick %08d " % seq + b"x" * 18)


class AppConn(Endpoint):
    """One connection of the app: an h2 server in its own thread."""

    def __init__(self, app, sock, index):
        super().__init__(sock, server=True, name=f"app-conn-{index}")
        self.app = app
        self.index = index
        self.requests = {}
        self.calls = queue.Queue()
        self.timers = []          # heap of (when, seq, fn)
        self.timer_seq = 0
        self.preface = False
        self.highest_in = 0
        self.final_last = None    # last-stream-id of our final GOAWAY
        self.answer_held = False  # held calls are answered as they come
        self.acks_in = []
        self.ping_waiters = {}    # PING payload -> fn(self) on its ack
        self.stopping = False
        self.conn.initiate_connection()
        if app.settings:
            self.conn.update_settings(app.settings)
        if app.conn_window:
            self.conn.increment_flow_control_window(app.conn_window)
        self.flush()

    # Scheduling (from any thread) ---------------------------------------

    def call(self, fn):
        """Runs fn(self) on this connection's thread."""
        self.calls.put(fn)

    def after(self, seconds, fn):
        """Runs fn(self) after `seconds` (connection thread only)."""
        self.timer_seq += 1
        heapq.heappush(self.timers, (time.monotonic() + seconds, self.timer_seq, fn))

    def run(self):
        try:
            while not self.stopping and not self.closed:
                while True:
                    try:
                        fn = self.calls.get_nowait()
                    except queue.Empty:
                        break
                    fn(self)
                now = time.monotonic()
                while self.timers and self.timers[0][0] <= now:
                    _, _, fn = heapq.heappop(self.timers)
                    fn(self)
                timeout = 0.05
                if self.timers:
                    timeout = max(0.0, min(timeout, self.timers[0][0] - time.monotonic()))
                self.step(timeout)
                self.maybe_finish_shutdown()
                self.app.notify()
                if self.eof and not self.wbuf:
                    break
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.app.errors.append(f"{self.name}: {type(e).__name__}: {e}")
            raise
        finally:
            self.close()
            self.app.notify()

    # Incoming --------------------------------------------------------------

    def on_frame(self, seen):
        if seen.stream % 2 == 1 and seen.type in (HEADERS, DATA):
            self.highest_in = max(self.highest_in, seen.stream)
        if not self.preface:
            self.preface = True
            self.app.add_conn(self)

    def on_event(self, ev):
        sid = getattr(ev, "stream_id", None)
        req = self.requests.get(sid) if sid else None
        if isinstance(ev, h2.events.RequestReceived):
            req = AppRequest(self, ev.stream_id, ev.headers)
            self.requests[ev.stream_id] = req
            self.app.add_request(req)
            if self.final_last is not None and ev.stream_id > self.final_last:
                req.ignored = True   # RFC 9113 §6.8: not processed
                return
            self.app.dispatch(self, req, "headers")
            if ev.stream_ended is not None:
                req.ended = True
                self.app.dispatch(self, req, "end")
        elif isinstance(ev, h2.events.DataReceived):
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if req and not req.ignored:
                req.body += ev.data
                self.app.dispatch(self, req, "data", ev.data)
        elif isinstance(ev, h2.events.StreamEnded) and req and not req.ended:
            req.ended = True
            if not req.ignored:
                self.app.dispatch(self, req, "end")
        elif isinstance(ev, h2.events.StreamReset) and req:
            req.reset = ev.error_code
            self.outbox.pop(ev.stream_id, None)
        elif isinstance(ev, h2.events.PingAckReceived):
            self.acks_in.append(ev.ping_data)
            waiter = self.ping_waiters.pop(ev.ping_data, None)
            if waiter:
                waiter(self)
        self.maybe_finish_shutdown()

    # Answers (connection thread) -----------------------------------------

    def respond(self, req, headers, body=b"", end=True, trailers=None):
        if req.reset is not None or self.closed:
            return
        self.conn.send_headers(req.sid, headers, end_stream=(end and not body and trailers is None))
        if body or trailers is not None:
            self.send_body(req.sid, body, end=end, trailers=trailers)
        if end:
            req.answered = True
        self.flush()

    def answer_grpc(self, req, message, status=0):
        if req.answered or req.reset is not None:
            return
        self.respond(req, [(":status", "200"), ("content-type", "application/grpc")],
                     grpc_message(message), trailers=[("grpc-status", str(status))])

    # A graceful shutdown like grpc servers do ------------------------------

    def graceful_shutdown(self, answer_after=1.0, grace=10.0):
        """GOAWAY(2^31-1) + PING; on the ack (or after 2 s) GOAWAY(highest
        stream received); held calls answered `answer_after` later; the
        socket closed once every processed stream is done, or after `grace`."""
        self.shutdown_started = time.monotonic()
        self.ping_waiters[b"appdown1"] = lambda c: c._final_goaway(answer_after)
        self.send_goaway(MAX_STREAM_ID)
        self.send_raw(ping_frame(b"appdown1"))
        self.after(2.0, lambda c: c._final_goaway(answer_after))
        self.after(grace, lambda c: c.close())

    def _final_goaway(self, answer_after):
        if self.final_last is not None:
            return
        self.final_last = self.highest_in
        self.send_goaway(self.final_last)
        self.app.notify()
        self.after(answer_after, lambda c: c._answer_all_held())

    def _answer_all_held(self):
        self.answer_held = True
        for req in self.requests.values():
            if not req.ignored and req.ended and req.path.endswith("/Hold"):
                self.answer_grpc(req, b"answer:" + (req.call or "").encode())

    def maybe_finish_shutdown(self):
        if self.final_last is None or self.closed or self.linger_until is not None:
            return
        if all(r.done for r in self.requests.values()):
            self.flush()
            if not self.outbox and not self.wbuf:
                self.linger_close()


class App:
    """The application: an h2 server on 127.0.0.1:0.

    Routes (by path), each answered on the connection's thread:
      GET  /bytes?n=N&seed=S     N bytes of pattern(N, S)
      POST /sha                  {"len": .., "sha256": ..} of the body
      POST /echo                 the body back, as it arrives
      GET  /headers              200, headers x-echo (x-probe's value) and x-big
      POST /<svc>/Ticks          gRPC: a message every 100 ms until the stream ends
      POST /<svc>/Hold           gRPC: held; answered by the test (or a shutdown)
      GET  /hold                 held; never answered
    A test adds its own with `route(prefix, fn)`: fn(conn, req, event, data)
    with event "headers", "data" or "end"."""

    def __init__(self, settings=None, conn_window=None):
        self.settings = settings or {}
        self.conn_window = conn_window
        self.routes = []
        self.conns = []
        self.requests = []
        self.errors = []
        self.cond = threading.Condition()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.addr = self.listener.getsockname()
        self.stop = threading.Event()
        self.accepting = True
        self.threads = []
        self.accepted = 0
        self.all_conns = []

    def start(self):
        t = threading.Thread(target=self._accept_loop, name="app-accept", daemon=True)
        t.start()
        self.threads.append(t)
        return self

    def _accept_loop(self):
        # Bounded: at most 256 connections, and it stops with the app.
        while not self.stop.is_set() and self.accepted < 256:
            try:
                r, _, _ = select.select([self.listener], [], [], 0.1)
            except (OSError, ValueError):
                return
            if not r or not self.accepting:
                continue
            try:
                sock, _ = self.listener.accept()
            except OSError:
                continue
            self.accepted += 1
            conn = AppConn(self, sock, self.accepted)
            t = threading.Thread(target=conn.run, name=conn.name, daemon=True)
            t.start()
            self.threads.append(t)
            # Connections that never send a preface (readiness probes) are
            # not listed in self.conns.
            self.all_conns.append(conn)

    def stop_accepting(self):
        """Closes the listener, as a server that shuts down does."""
        self.accepting = False
        try:
            self.listener.close()
        except OSError:
            pass

    def close(self):
        self.stop.set()
        self.stop_accepting()
        for c in self.all_conns:
            c.stopping = True
        for t in self.threads:
            t.join(timeout=5)
        for c in self.all_conns:
            c.close()

    # Record ---------------------------------------------------------------

    def notify(self):
        with self.cond:
            self.cond.notify_all()

    def add_conn(self, conn):
        with self.cond:
            self.conns.append(conn)
            self.cond.notify_all()

    def add_request(self, req):
        with self.cond:
            self.requests.append(req)
            self.cond.notify_all()

    def find(self, call=None, path=None):
        """Requests with x-call `call` (or whose path ends with `path`)."""
        return [r for r in list(self.requests)
                if (call is None or r.call == call) and (path is None or r.path.endswith(path))]

    def wait(self, pred, timeout, what):
        def step(t):
            with self.cond:
                self.cond.wait(t)
        wait_until(pred, timeout, what, step=step, describe=self.describe)

    def h2_errors(self):
        return [f"{c.name}: {c.h2_error}" for c in list(self.conns) if c.h2_error] + self.errors

    def describe(self):
        lines = [f"app: {len(self.conns)} h2 connections, errors={self.h2_errors()}"]
        for c in list(self.conns):
            lines.append(f"  {c.name}: eof={c.eof} closed={c.closed} goaways sent={c.goaways_sent} "
                         f"received={[(l, err_name(k)) for l, k, _ in c.goaways()]}")
            lines += [f"    {r!r}" for r in list(c.requests.values())]
        return "\n".join(lines)

    # Routing (connection thread) ---------------------------------------------

    def route(self, prefix, fn):
        self.routes.insert(0, (prefix, fn))

    def dispatch(self, conn, req, event, data=None):
        path = req.path.split("?")[0]
        for prefix, fn in self.routes:
            if path.startswith(prefix):
                fn(conn, req, event, data)
                return
        default_route(conn, req, event, data)


def query(path):
    q = path.split("?", 1)[1] if "?" in path else ""
    return dict(kv.split("=", 1) for kv in q.split("&") if "=" in kv)


def default_route(conn, req, event, data):
    path = req.path.split("?")[0]
    if path == "/bytes" and event == "end":
        q = query(req.path)
        conn.respond(req, [(":status", "200")], pattern(int(q["n"]), int(q.get("seed", 0))))
    elif path == "/sha" and event == "end":
        body = json.dumps({"len": len(req.body),
                           "sha256": hashlib.sha256(req.body).hexdigest()}).encode()
        conn.respond(req, [(":status", "200"), ("content-type", "application/json")], body)
    elif path == "/echo":
        if event == "headers":
            conn.respond(req, [(":status", "200")], end=False)
        elif event == "data":
            conn.send_body(req.sid, data, end=False)
        elif event == "end":
            conn.send_body(req.sid, b"", end=True)
            req.answered = True
    elif path == "/headers" and event == "end":
        conn.respond(req, [(":status", "200"), ("x-echo", req.h.get("x-probe", "")),
                           ("x-big", "b" * 300)], b"ok")
    elif path.endswith("/Ticks") and event == "headers":
        conn.respond(req, [(":status", "200"), ("content-type", "application/grpc")], end=False)
        seq = [0]

        def tick(c):
            if req.reset is not None or c.closed or c.eof or req.answered:
                return
            c.send_body(req.sid, grpc_tick(seq[0]), end=False)
            seq[0] += 1
            c.after(0.1, tick)
        tick(conn)
    elif path.endswith("/Hold") and event == "end":
        if conn.answer_held:
            conn.answer_grpc(req, b"answer:" + (req.call or "").encode())
    elif path == "/hold":
        pass
    elif event == "end" and not req.answered and not any(
            path == p or path.endswith(p) for p in ("/echo", "/Ticks", "/Hold", "/hold")):
        conn.respond(req, [(":status", "404")], b"no route\n")


# --- applications that are not there, or do not speak HTTP/2 -------------------

class NoApp:
    """No application: a port on 127.0.0.1 that nothing listens on (bound
    to be free, then closed), as while a pod's app has not started yet."""

    def start(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        self.addr = s.getsockname()
        s.close()
        return self

    def close(self):
        pass

    def h2_errors(self):
        return []

    def describe(self):
        return f"no app (nothing listens on {self.addr})"


class Http1App:
    """An application that only speaks HTTP/1.1: Python's `http.server`,
    serving no route. HTTP/2's preface reaches it as a request line for
    HTTP/2.0, which it answers 505 before it closes."""

    def start(self):
        self.requests = []
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_request(self, code="-", size="-"):
                app.requests.append((self.requestline, code))

            def log_message(self, format, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = self.server.server_address
        self.thread = threading.Thread(target=self.server.serve_forever, name="http1-app",
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def h2_errors(self):
        return []

    def describe(self):
        return f"HTTP/1.1 app at {self.addr}: requests {self.requests[-10:]}"
