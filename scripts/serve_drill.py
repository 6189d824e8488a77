#!/usr/bin/env python3
"""Serving drill on the real binaries: `tessera serve`, three `tessera-agent`s running
`tessera example-server` tasks, and a real HAProxy whose backend `tessera lb haproxy`
keeps equal to the service's healthy endpoints. Traffic goes through HAProxy the whole
time a rolling deployment, a scale-in and a host drain happen, and every failed request
is counted: serving is only as good as what a client sees.

    scripts/serve_drill.py [--bin DIR] [--changes N] [--json] [--keep] [--haproxy PATH]

The steps:
 1. a fleet (server, 3 agents advertising 127.0.0.1), `web:1`, `web:2` (VERSION=2) and
    `web:3` (a health check on `/nope`: never healthy); service `web`, 3 tasks of web:1;
 2. HAProxy and `tessera lb haproxy`, until HAProxy has the 3 servers ready;
 3. load: 8 client threads, about 150 requests/s in all, through HAProxy's frontend
    (keep-alive connections, as a client's connection pool keeps them, opened again after
    any error; every error, timeout and status other than 200 counts as a failure);
 4. a rolling deployment to web:2, 5. a scale-in 3 -> 2, 6. a drain of a host running a
    task of web, all under that load; 7. the load's figures (failed requests: 0);
 8. a bad revision (web:3): rolled back, never fewer healthy endpoints than the minimum
    (desired 2 x minimum healthy 100 %), again under load;
 9. with --changes N, how fast an endpoint change reaches the API and HAProxy, scaling
    2 -> 4 -> 2 until N changes were measured: from a new task's own /health first
    answering 200 to the API showing it healthy and to HAProxy having it ready; for a task
    scaled in, from the PATCH to the API showing it draining, and from then to HAProxy
    having it drained or removed.

Tasks run as `nobody` (the agents run as root), which cannot read a build directory under
/root: the `tessera` binary is hard-linked (or copied) into a world-readable temporary
folder and the tasks run that.

Prints a table (and JSON with --json) and exits 1 when a figure that must be 0 (or 1) is
not; logs (server, agents, HAProxy, the lb, the timeline of endpoint and HAProxy changes,
failed requests) stay in the temporary directory on failure.
"""

import argparse
import http.client
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no scripts/__pycache__ written by the import
import drills  # noqa: E402  (the fleet: server, agents, API calls, cleanup)

SERVICE = "web"
BACKEND = "web"
RATE = 150  # requests per second, all client threads together
CLIENTS = 8
REQUEST_TIMEOUT = 10  # seconds; HAProxy retries a failed connect 3 times within it
# srv_admin_state bits (HAProxy's enum srv_admin): any maintenance bit, and drain.
MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
DRAIN_BITS = 0x08 | 0x10


def server_name(task, port):
    """The name `tessera lb haproxy` gives the server of `task`'s host port `port`
    (cli/src/lb/runtime.rs, `server_name`): tsr-, the task id's first 12 letters and
    digits in lower case, the port."""
    short = "".join(c for c in task if c.isascii() and c.isalnum())[:12].lower()
    return f"tsr-{short}-{port}"


def percentile(values, q):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


class ServeFleet(drills.Fleet):
    """drills.Fleet whose agents advertise 127.0.0.1 (the address endpoints carry, so
    HAProxy on this machine reaches the tasks' host ports), with the serving API."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_args = ["--advertise-address", "127.0.0.1"]

    def setup_serving(self, agents, task_bin):
        """Server, pool, agents, and the three revisions of `web` (the example server on
        a dynamic port, checked on /health; web:3 checks /nope and never passes)."""
        self.start_fleet(agents)
        for version, path in (("1", "/health"), ("2", "/health"), ("3", "/nope")):
            status, body = self.api("POST", "/api/v1/task-definitions", {
                "family": SERVICE, "containers": [{
                    "name": "main", "command": [os.path.join(task_bin, "tessera"), "example-server"],
                    "cpu_milli": 100, "memory_mib": 64,
                    "env": {"DRILL_RUN": self.run_id, "VERSION": version},
                    "gpu": {"mps": {"memory_mib": 2048}},
                    "ports": [{"name": "http", "container_port": 8080}],
                    "health_check": {"http": {"port": "http", "path": path},
                                     "interval_secs": 5, "timeout_secs": 2, "retries": 2}}]})
            assert status == 201, (status, body)
            assert body.get("revision") in (None, int(version)), body
        status, body = self.api("POST", "/api/v1/services", {
            "name": SERVICE, "task_definition": f"{SERVICE}:1", "pool": "drill",
            "desired_count": 3, "stop_timeout_secs": 10, "deregistration_delay_secs": 2,
            "deployment": {"minimum_healthy_percent": 100, "maximum_percent": 200}})
        assert status == 201, (status, body)

    def endpoints(self):
        """The service's endpoints, as the API lists them now."""
        status, body = self.api("GET", f"/api/v1/services/{SERVICE}/endpoints")
        if status != 200:
            raise RuntimeError(f"GET endpoints answered {status}: {body}")
        return body["endpoints"]


def healthy(eps, revision=None):
    return [e for e in eps if e["health"] == "healthy"
            and (revision is None or e["task_definition"] == revision)]


def draining(eps):
    return [e for e in eps if e["health"] == "draining"]


def describe(eps):
    return ", ".join(f"{e['task'][:8]}@{e['host']}:{e['port']} {e['task_definition']} {e['health']}"
                     for e in eps) or "none"


class Logged:
    """A child process whose output lines go to a log file, each prefixed with the
    seconds since the drill started (to set beside the timeline and failed requests)."""

    def __init__(self, argv, path, t0, env=None):
        self.path = path
        self.t0 = t0
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, text=True, errors="replace")
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        with open(self.path, "a") as log:
            for line in self.proc.stdout:
                stamped = f"{time.time() - self.t0:9.3f} {line.rstrip()}"
                self.lines.append(stamped)
                log.write(stamped + "\n")
                log.flush()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(2)


class HAProxy:
    """HAProxy in the foreground, with an admin socket and an empty backend `web` that
    the lb fills at run time. Only abnormal requests are logged (dontlog-normal): its log
    says why a failed request failed (the termination state)."""

    def __init__(self, binary, work, t0):
        self.dir = os.path.join(work, "haproxy")
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "admin.sock")
        self.port = drills.free_port()
        self.config = os.path.join(self.dir, "haproxy.cfg")
        with open(self.config, "w") as f:
            f.write(f"""global
    stats socket {self.socket} mode 600 level admin
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    option dontlog-normal
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch
frontend fe
    bind 127.0.0.1:{self.port}
    default_backend {BACKEND}
backend {BACKEND}
    balance roundrobin
""")
        self.proc = Logged([binary, "-f", self.config, "-db"], os.path.join(work, "haproxy.log"), t0)

    def command(self, line, timeout=2):
        """One Runtime API command; HAProxy answers and closes the connection."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.socket)
            s.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def servers(self):
        """name -> {address, port, op, admin} of the backend's servers, from
        `show servers state` (columns found by the names on its `#` line)."""
        answer = self.command(f"show servers state {BACKEND}")
        columns = None
        out = {}
        for line in answer.splitlines():
            if line.startswith("#"):
                columns = line[1:].split()
                continue
            fields = line.split()
            if columns is None or len(fields) < len(columns) or not fields[0].isdigit():
                continue
            row = dict(zip(columns, fields))
            out[row["srv_name"]] = {
                "address": row["srv_addr"], "port": int(row["srv_port"]),
                "op": int(row["srv_op_state"]), "admin": int(row["srv_admin_state"])}
        if columns is None:
            raise RuntimeError(f"`show servers state {BACKEND}` answered {answer.strip()!r}")
        return out

    @staticmethod
    def ready(server):
        """Takes new requests: running (srv_op_state 2), neither maintenance nor drain."""
        return server["op"] == 2 and not server["admin"] & (MAINT_BITS | DRAIN_BITS)

    def get(self, path="/", timeout=5):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()


class Load:
    """Client threads sending `GET /` through HAProxy at a steady total rate.

    Each thread keeps one keep-alive connection, as a client's connection pool does, and
    opens a new one after any error (an idle connection a server closed is the client's
    problem only if the load balancer passes that on; HAProxy's client side stays open).
    Every request is counted; a failure is a connection error, a timeout or any status
    other than 200, kept with its time and text."""

    def __init__(self, port, t0, log_path, rate=RATE, clients=CLIENTS):
        self.port = port
        self.t0 = t0
        self.log_path = log_path
        self.interval = clients / rate
        self.clients = clients
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.failures = []  # (seconds since t0, client, text)
        self.served_by = {}
        self.threads = []
        self.started = self.ended = None

    def start(self):
        self.started = time.time()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(REQUEST_TIMEOUT + 5)
        self.ended = time.time()
        with open(self.log_path, "a") as log:
            for at, client, text in self.failures:
                log.write(f"{at:9.3f} client {client}: {text}\n")
        return self

    def rate(self):
        return self.sent / max(1e-9, (self.ended or time.time()) - self.started)

    def _client(self, i):
        conn = None
        due = time.time() + i * self.interval / self.clients
        while not self.stop_flag.is_set():
            now = time.time()
            if due > now:
                time.sleep(due - now)
            # Paced, not bursting to catch up after a stall longer than a second.
            due = max(due + self.interval, time.time() - 1)
            at = time.time() - self.t0
            error = None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                      timeout=REQUEST_TIMEOUT)
                conn.request("GET", "/")
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    error = f"status {r.status}: {body[:200]!r}"
                else:
                    who = json.loads(body).get("served_by", "?")
                    with self.lock:
                        self.served_by[who] = self.served_by.get(who, 0) + 1
                if r.will_close:
                    conn.close()
                    conn = None
            except Exception as e:  # every error a client would see
                error = f"{type(e).__name__}: {e}"
                if conn is not None:
                    conn.close()
                conn = None
            with self.lock:
                self.sent += 1
                if error:
                    self.failures.append((at, i, error))
        if conn is not None:
            conn.close()


class Watcher(threading.Thread):
    """Polls the endpoints and HAProxy's servers every `interval` seconds for the whole
    drill: writes every change to timeline.log (to set beside failed requests and the
    lb's log), and keeps when each state was first seen, which the benchmark reads.

    With `probe` on it also finds this run's task processes (their PORT in /proc) and
    tasks listed as starting, and GETs their /health until it answers 200: the moment a
    task is ready to serve, from which the time to the API and to HAProxy is measured."""

    def __init__(self, fleet, hap, t0, path):
        super().__init__(daemon=True)
        self.f = fleet
        self.hap = hap
        self.t0 = t0
        self.path = path
        self.interval = 0.1
        self.probe = False
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.eps = {}  # (task, port) -> endpoint
        self.revision = {}  # (task, port) -> task definition, of every endpoint ever listed
        self.hap_seen = set()  # every server name HAProxy ever had
        self.servers = {}  # name -> server
        self.first_seen = {}  # (task, port, health) -> time
        self.hap_ready = {}  # server name -> first time ready
        self.hap_out = {}  # server name -> first time drained, in maintenance or gone after ready
        self.health_ok = {}  # (task, port) -> first time its /health answered 200
        self.errors = []
        self.periods = []  # seconds between the starts of successive polls: the resolution

    def log(self, text):
        with open(self.path, "a") as f:
            f.write(f"{time.time() - self.t0:9.3f} {text}\n")

    def run(self):
        last = None
        while not self.stop_flag.is_set():
            started = time.time()
            if last is not None:
                self.periods.append(started - last)
            last = started
            try:
                self.tick()
            except Exception as e:  # a failed poll is logged; the next one tries again
                self.errors.append(str(e))
                self.log(f"poll failed: {e}")
            self.stop_flag.wait(self.interval)

    def tick(self):
        eps = self.f.endpoints()
        now = time.time()
        current = {(e["task"], e["port"]): e for e in eps}
        with self.lock:
            for key, e in current.items():
                self.revision[key] = e["task_definition"]
                old = self.eps.get(key)
                if old is None or old["health"] != e["health"]:
                    self.first_seen.setdefault((key[0], key[1], e["health"]), now)
                    self.log(f"endpoint {key[0]} {e['host']} {e['address']}:{key[1]} "
                             f"{e['task_definition']} {old['health'] if old else '-'} -> "
                             f"{e['health']}{' (' + e['reason'] + ')' if e.get('reason') else ''}")
            for key, old in self.eps.items():
                if key not in current:
                    self.log(f"endpoint {key[0]} {old['address']}:{key[1]} gone")
            self.eps = current
        if self.hap is not None:
            servers = self.hap.servers()
            now = time.time()
            with self.lock:
                self.hap_seen.update(servers)
                for name, s in servers.items():
                    if self.servers.get(name) != s:
                        self.log(f"haproxy {name} {s['address']}:{s['port']} op {s['op']} "
                                 f"admin {s['admin']}")
                    if HAProxy.ready(s):
                        self.hap_ready.setdefault(name, now)
                    elif name in self.hap_ready:
                        self.hap_out.setdefault(name, now)
                for name in self.servers:
                    if name not in servers:
                        self.log(f"haproxy {name} removed")
                        if name in self.hap_ready:
                            self.hap_out.setdefault(name, now)
                self.servers = servers
        if self.probe:
            self.probe_health(current)

    def probe_health(self, current):
        candidates = {key: e["address"] for key, e in current.items() if e["health"] == "starting"}
        for task, port in self.task_ports():
            candidates.setdefault((task, port), "127.0.0.1")
        for key, address in candidates.items():
            if key in self.health_ok:
                continue
            try:
                with urllib.request.urlopen(f"http://{address}:{key[1]}/health", timeout=0.5) as r:
                    if r.status == 200:
                        with self.lock:
                            self.health_ok[key] = time.time()
                        self.log(f"task {key[0]} :{key[1]} /health answers 200")
            except OSError:
                pass

    def task_ports(self):
        """(task id, PORT) of this run's task processes, from their environment."""
        found = set()
        mark = self.f.run_id.encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if env.get(b"DRILL_RUN") == mark and env.get(b"PORT", b"").isdigit():
                found.add((env.get(b"TESSERA_TASK_ID", b"").decode(), int(env[b"PORT"])))
        return found

    def snapshot(self):
        with self.lock:
            return list(self.eps.values()), dict(self.servers)

    def stop(self):
        self.stop_flag.set()
        self.join(5)


class Drill:
    """The drill's state: the fleet, HAProxy, the lb, the watcher, and its results."""

    def __init__(self, args, work, task_bin):
        self.args = args
        self.work = work
        self.t0 = time.time()
        self.f = ServeFleet(args.bin, work)
        self.task_bin = task_bin
        self.hap = None
        self.lb = None
        self.watcher = None
        self.load = None
        self.results = []

    def wait(self, check, seconds, what):
        """Fleet.wait, failing at once if HAProxy or the lb has exited."""
        def checked():
            for name, p in (("HAProxy", self.hap and self.hap.proc), ("tessera lb haproxy", self.lb)):
                if p is not None and not p.alive():
                    raise RuntimeError(f"{name} exited with {p.proc.returncode} while waiting for {what}")
            return check()
        self.f.wait(checked, seconds, what)

    def step(self, fn, *a):
        t = time.time()
        print(f"  {fn.__name__} ...", file=sys.stderr, flush=True)
        out = fn(*a)
        print(f"  {fn.__name__} done in {time.time() - t:.1f} s", file=sys.stderr, flush=True)
        return out

    # 1.
    def fleet(self):
        """Three agents, three revisions, the service; 3 healthy endpoints."""
        self.f.setup_serving(["a", "b", "c"], self.task_bin)
        self.watcher = Watcher(self.f, None, self.t0, os.path.join(self.work, "timeline.log"))
        self.watcher.start()
        self.wait(lambda: len(healthy(self.f.endpoints())) == 3, 90, "3 healthy endpoints")

    # 2.
    def balancer(self):
        """HAProxy and the lb; HAProxy then has 3 ready servers and serves."""
        self.hap = HAProxy(self.args.haproxy, self.work, self.t0)
        self.wait(lambda: os.path.exists(self.hap.socket), 10, "HAProxy's admin socket")
        self.watcher.hap = self.hap
        env = dict(os.environ, RUST_LOG="warn")
        self.lb = Logged(
            [os.path.join(self.args.bin, "tessera"), "lb", "haproxy", "--socket", self.hap.socket,
             "--backend", BACKEND, "--service", SERVICE, "--url", self.f.url,
             "--token", self.f.token], os.path.join(self.work, "lb.log"), self.t0, env=env)

        def serving():
            ready = [s for n, s in self.hap.servers().items() if HAProxy.ready(s)]
            if len(ready) != 3:
                return False
            try:
                return self.hap.get()[0] == 200
            except OSError:
                return False
        self.wait(serving, 30, "HAProxy to have 3 ready servers and serve")

    # 4.
    def rolling_deployment(self):
        """web:1 -> web:2: new tasks healthy first, old ones drained, under load."""
        status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}",
                                  {"task_definition": f"{SERVICE}:2"})
        assert status == 200, (status, body)

        def done():
            eps = self.f.endpoints()
            return (all(e["task_definition"] == f"{SERVICE}:2" for e in eps)
                    and len(healthy(eps)) == 3 and not draining(eps))
        self.wait(done, 120, "every endpoint on web:2, 3 healthy, none draining")

    # 5.
    def scale_in(self):
        """3 -> 2: one task drained out of HAProxy, then stopped."""
        status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}", {"desired_count": 2})
        assert status == 200, (status, body)

        def done():
            eps = self.f.endpoints()
            return len(healthy(eps)) == 2 and len(eps) == 2
        self.wait(done, 60, "2 healthy endpoints, none draining")

    # 6.
    def drain_host(self):
        """A host running a task of web drained: its task is replaced elsewhere first."""
        victim = sorted(e["host"] for e in healthy(self.f.endpoints()))[0]
        status, body = self.f.api("POST", f"/api/v1/hosts/{victim}/drain")
        assert status == 200, (status, body)

        def done():
            eps = self.f.endpoints()
            return (not any(e["host"] == victim for e in eps) and len(healthy(eps)) == 2
                    and len(eps) == 2)
        self.wait(done, 120, f"no task of web on host {victim}, 2 healthy elsewhere")
        return victim

    # 8.
    def bad_revision(self):
        """web:3 never passes its check: the deployment is rolled back, and the service
        never has fewer healthy endpoints than desired x minimum healthy percent."""
        low = [len(healthy(self.f.endpoints()))]
        status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}",
                                  {"task_definition": f"{SERVICE}:3"})
        assert status == 200, (status, body)
        rolled = [False]

        def done():
            eps = self.f.endpoints()  # sampled every 0.2 s (Fleet.wait)
            low[0] = min(low[0], len(healthy(eps)))
            if not rolled[0]:
                _, detail = self.f.api("GET", f"/api/v1/services/{SERVICE}")
                rolled[0] = (any(d["status"] == "rolled_back" for d in detail["deployments"])
                             or any("rolled back" in e["message"] for e in detail["events"]))
            return (rolled[0] and len(healthy(eps, f"{SERVICE}:2")) == 2 and len(eps) == 2)
        self.wait(done, 180, "web:3 rolled back, 2 healthy endpoints of web:2")
        return low[0], int(rolled[0])

    # 9.
    def bench(self, changes):
        """Scales 2 -> 4 -> 2 until `changes` endpoint changes were measured. Returns
        lists of (to the API, to HAProxy) seconds for tasks becoming healthy and for
        tasks drained, how many scaled-in tasks were never seen draining, and the
        watcher's poll periods (the figures' resolution)."""
        w = self.watcher
        w.interval = 0.05
        w.probe = True
        w.periods.clear()
        up, down, skipped = [], [], 0
        while len(up) + len(down) < changes:
            serving = {e["task"] for e in w.snapshot()[0]}
            status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}", {"desired_count": 4})
            assert status == 200, (status, body)

            def grown():
                eps, _ = w.snapshot()
                new = [e for e in healthy(eps) if e["task"] not in serving]
                return (len(healthy(eps)) == 4 and len(eps) == 4
                        and all(server_name(e["task"], e["port"]) in w.hap_ready for e in new)
                        and all((e["task"], e["port"]) in w.health_ok for e in new))
            self.wait(grown, 60, "4 healthy endpoints, each ready in HAProxy")
            eps, _ = w.snapshot()
            for e in eps:
                if e["task"] in serving:
                    continue
                key = (e["task"], e["port"])
                t_ok = w.health_ok[key]
                up.append((w.first_seen[key + ("healthy",)] - t_ok,
                           w.hap_ready[server_name(*key)] - t_ok))
            four = {(e["task"], e["port"]) for e in eps}
            patched = time.time()
            status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}", {"desired_count": 2})
            assert status == 200, (status, body)

            def shrunk():
                eps, _ = w.snapshot()
                gone = four - {(e["task"], e["port"]) for e in eps}
                return (len(healthy(eps)) == 2 and len(eps) == 2
                        and all(server_name(*k) in w.hap_out for k in gone))
            self.wait(shrunk, 60, "2 healthy endpoints, the others out of HAProxy")
            eps, _ = w.snapshot()
            for key in four - {(e["task"], e["port"]) for e in eps}:
                seen = w.first_seen.get(key + ("draining",))
                if seen is None or seen < patched:
                    skipped += 1
                    continue
                # HAProxy may be seen out a poll before the API is seen draining.
                down.append((seen - patched, max(0.0, w.hap_out[server_name(*key)] - seen)))
        periods = list(w.periods) or [0.0]
        w.probe = False
        w.interval = 0.1
        return up, down, skipped, periods

    def run(self):
        r = self.results
        self.step(self.fleet)
        self.step(self.balancer)
        failures_log = os.path.join(self.work, "failed-requests.log")
        victim = "?"
        self.load = Load(self.hap.port, self.t0, failures_log).start()
        try:
            self.step(self.rolling_deployment)
            self.step(self.scale_in)
            victim = self.step(self.drain_host)
            time.sleep(2)  # the lb's next rounds after the drain, still under load
        finally:
            # Counted even when a step failed: what clients saw until then.
            load, self.load = self.load.stop(), None
            r.append(("web:1 -> web:2, scale 3 -> 2, drain host %s; under load" % victim,
                      "requests sent", load.sent, None))
            r.append(("", "requests per second (mean)", round(load.rate(), 1), None))
            r.append(("", "at least 100 per second", int(load.rate() >= 100), 1))
            r.append(("", "tasks that answered", len(load.served_by), None))
            r.append(("", "failed requests", len(load.failures), 0))
            self.report_failures(load)
        # Back to three hosts for what follows.
        status, body = self.f.api("POST", f"/api/v1/hosts/{victim}/activate")
        if status != 200:
            print(f"    host {victim} not activated again: {status} {body}", file=sys.stderr)

        self.load = Load(self.hap.port, self.t0, failures_log).start()
        low, rolled = None, 0
        try:
            low, rolled = self.step(self.bad_revision)
        finally:
            load, self.load = self.load.stop(), None
            r.append(("web:3 (never healthy), desired 2, minimum healthy 100 %",
                      "fewest healthy endpoints during the attempt", low, 2))
            r.append(("", "rolled back", rolled, 1))
            bad = {k for k, rev in self.watcher.revision.items() if rev == f"{SERVICE}:3"}
            r.append(("", "web:3 tasks listed", len(bad), None))
            r.append(("", "web:3 tasks HAProxy ever had",
                      sum(1 for k in bad if server_name(*k) in self.watcher.hap_seen), 0))
            r.append(("", "requests sent (under load)", load.sent, None))
            r.append(("", "requests answered by web:3 tasks",
                      sum(load.served_by.get(k[0], 0) for k in bad), 0))
            r.append(("", "failed requests (under load)", len(load.failures), 0))
            self.report_failures(load)

        if self.args.changes:
            up, down, skipped, periods = self.step(self.bench, self.args.changes)
            r.append(("endpoint changes, scaling 2 -> 4 -> 2", "changes measured",
                      len(up) + len(down), None))
            worst = 0.0
            for what, samples in (("healthy", up), ("draining", down)):
                for i, to in enumerate(("API", "HAProxy")):
                    values = [s[i] for s in samples]
                    if not values:
                        continue
                    p99 = percentile(values, 0.99)
                    worst = max(worst, p99)
                    r.append(("", f"{what} -> {to}, s (n={len(values)}) p50/p99/max",
                              "%.2f/%.2f/%.2f" % (percentile(values, 0.5), p99, max(values)), None))
            r.append(("", "poll period (resolution), s mean/max",
                      "%.3f/%.3f" % (sum(periods) / len(periods), max(periods)), None))
            r.append(("", "scaled-in tasks never shown draining", skipped, 0))
            r.append(("", "p99 within 2 s", int(worst <= 2), 1))

    def report_failures(self, load):
        for at, client, text in load.failures[:10]:
            print(f"    failed request at {at:.3f} s (client {client}): {text}", file=sys.stderr)
        if len(load.failures) > 10:
            print(f"    ... {len(load.failures) - 10} more in failed-requests.log", file=sys.stderr)

    def dump(self):
        """What the service and HAProxy looked like at the end, for the logs."""
        try:
            eps = self.f.endpoints()
            print(f"    endpoints: {describe(eps)}", file=sys.stderr)
            _, detail = self.f.api("GET", f"/api/v1/services/{SERVICE}")
            with open(os.path.join(self.work, "service.json"), "w") as out:
                json.dump(detail, out, indent=1)
        except Exception as e:
            print(f"    endpoints unavailable: {e}", file=sys.stderr)
        if self.hap is not None:
            try:
                print(f"    haproxy: {self.hap.servers()}", file=sys.stderr)
            except Exception as e:
                print(f"    haproxy unavailable: {e}", file=sys.stderr)
        if self.lb is not None:
            for line in self.lb.lines[-10:]:
                print(f"    lb: {line}", file=sys.stderr)

    def cleanup(self):
        """Always: the load, the watcher, the lb, HAProxy, the fleet."""
        if self.load is not None:
            self.load.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self.lb is not None:
            self.lb.stop()
        if self.hap is not None:
            self.hap.proc.stop()
        self.f.stop()


def task_binary_dir(bin_dir):
    """A world-readable folder with `tessera` in it, for tasks that run as nobody."""
    d = tempfile.mkdtemp(prefix="tessera-serve-bin-")
    os.chmod(d, 0o755)
    src, dst = os.path.join(bin_dir, "tessera"), os.path.join(d, "tessera")
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return d


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=None, help="folder with tessera and tessera-agent")
    parser.add_argument("--changes", type=int, default=0,
                        help="measure this many endpoint changes (0: no benchmark)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the logs even when it passes")
    parser.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    args = parser.parse_args()
    args.bin = args.bin or os.environ.get("TESSERA_BIN_DIR")
    if not args.bin:
        sys.exit("no binaries: pass --bin DIR or set TESSERA_BIN_DIR")
    if not os.access(args.haproxy, os.X_OK):
        sys.exit(f"no HAProxy at {args.haproxy}: install it or pass --haproxy")
    work = tempfile.mkdtemp(prefix="tessera-serve-drill-")
    task_bin = task_binary_dir(args.bin)
    d = Drill(args, work, task_bin)
    ok = True
    try:
        d.run()
    except Exception as e:  # a step that cannot finish is a failure, with its logs kept
        ok = False
        print(f"drill failed: {type(e).__name__}: {e}; logs in {work}", file=sys.stderr)
        d.dump()
    finally:
        d.cleanup()
        shutil.rmtree(task_bin, ignore_errors=True)
    print(f"{'drill':<60} {'figure':<52} {'value':>17}  expected")
    for drill, figure, value, expected in d.results:
        bad = expected is not None and value != expected
        ok = ok and not bad
        shown = "" if expected is None else str(expected)
        print(f"{drill:<60} {figure:<52} {value!s:>17}  {shown}{'  FAILED' if bad else ''}")
    if args.json:
        print(json.dumps([dict(zip(["drill", "figure", "value", "expected"], r)) for r in d.results]))
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs in {work}", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
