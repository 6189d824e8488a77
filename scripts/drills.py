#!/usr/bin/env python3
"""Fault drills on the real binaries: `tessera serve` and `tessera-agent` (simulated GPUs,
the stand-in MPS control program), with faults injected by signals. Every figure is
counted on what runs on this machine (processes found in /proc by their task's
environment), not only on what the API says.

    scripts/drills.py [--short] [--bin DIR] [--postgres URL] [--failover-trials N]

With --postgres (a server whose user may create databases) the servers share a fresh
PostgreSQL database instead of an SQLite file, and three drills more run: two servers
taking racing clients, PostgreSQL restarted under load (with TESSERA_TEST_POSTGRES_DIR and
TESSERA_TEST_POSTGRES_CTL, as scripts/with-postgres.sh sets them), and, with
--failover-trials, the scheduling server killed N times over (time to the next placement).

Prints a table (and JSON with --json) and exits 1 when a figure that must be 0 is not.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_MPS = os.path.join(ROOT, "agent", "tests", "fake-mps-control")
JOIN = "drill-join-token-0123456789"
ADMIN_PASSWORD = "drill-admin-password"
SYNC = 1  # seconds; a host is lost after 3 silent intervals
LOST = 3 * SYNC


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    """A server and its agents, in a temporary directory."""

    def __init__(self, bin_dir, work, database=None):
        self.bin = bin_dir
        self.work = work
        # A PostgreSQL URL, or None for the SQLite file in the data directory.
        self.database = database
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A second server on the same database, started by the failover drill; agents know
        # both addresses from the start.
        self.port2 = free_port()
        self.url2 = f"http://127.0.0.1:{self.port2}"
        self.server2 = None
        self.run_id = uuid.uuid4().hex[:12]
        self.server = None
        self.agents = {}
        self.token = None
        # Flags every agent gets on top of the fleet's own, and the servers.
        self.agent_args = []
        self.server_args = []

    # Processes.

    def _serve(self, port, log_name):
        log = open(os.path.join(self.work, log_name), "a")
        # Secrets through the environment: the server refuses them on its command line.
        env = dict(os.environ, TESSERA_ADMIN_PASSWORD=ADMIN_PASSWORD, RUST_LOG="warn",
                   TESSERA_JOIN_TOKEN=JOIN)
        if self.database:
            env["TESSERA_DATABASE"] = self.database
        return subprocess.Popen(
            [os.path.join(self.bin, "tessera"), "serve", "--bind", f"127.0.0.1:{port}",
             "--data-dir", os.path.join(self.work, "server"),
             "--sync-interval-secs", str(SYNC)] + self.server_args,
            stdout=log, stderr=log, env=env)

    def start_server(self):
        self.server = self._serve(self.port, "server.log")
        self.wait(lambda: self.healthy(), 30, "the server to answer")

    def start_second_server(self):
        self.server2 = self._serve(self.port2, "server2.log")
        self.wait(lambda: self.healthy(self.url2), 30, "the second server to answer")

    def kill_server(self):
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()

    def holder_port(self):
        """The port of the server holding the scheduler lease, asked of any that answers."""
        for url in (self.url, self.url2):
            try:
                status, view = self.api("GET", "/api/v1/cluster", url=url)
            except OSError:
                continue
            if status == 200:
                for s in view["servers"]:
                    if s["scheduling"]:
                        return int(s["address"].rsplit(":", 1)[1])
        return None

    def start_agent(self, name):
        log = open(os.path.join(self.work, f"{name}.log"), "a")
        # The join token from the environment: on the command line every process could read it.
        env = dict(os.environ, RUST_LOG="warn", TESSERA_AGENT_JOIN_TOKEN=JOIN)
        self.agents[name] = subprocess.Popen(
            [os.path.join(self.bin, "tessera-agent"), "--server", f"{self.url},{self.url2}",
             "--state-dir", os.path.join(self.work, name),
             "--pool", "drill", "--name", name, "--simulate", "2xL4-24GB",
             "--mps-control", FAKE_MPS, "--cpu-milli", "32000", "--memory-mib", "65536"]
            + self.agent_args,
            stdout=log, stderr=log, env=env)

    def signal_agent(self, name, sig):
        self.agents[name].send_signal(sig)
        if sig == signal.SIGKILL:
            self.agents[name].wait()

    def stop(self):
        for p in list(self.agents.values()) + [self.server, self.server2]:
            if p and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for pid in self.task_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.mps_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # HTTP.

    def healthy(self, url=None):
        try:
            with urllib.request.urlopen((url or self.url) + "/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, method, path, body=None, url=None, timeout=10):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request((url or self.url) + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def sign_in(self):
        req = urllib.request.Request(
            self.url + "/api/v1/session", method="POST",
            data=json.dumps({"username": "admin", "password": ADMIN_PASSWORD}).encode(),
            headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            cookie = r.headers["set-cookie"].split(";")[0]
        req = urllib.request.Request(
            self.url + "/api/v1/tokens", method="POST",
            data=json.dumps({"name": "drills", "role": "admin"}).encode(),
            headers={"content-type": "application/json", "cookie": cookie, "origin": self.url})
        with urllib.request.urlopen(req, timeout=10) as r:
            self.token = json.loads(r.read())["token"]

    # What runs.

    def _scan(self):
        """(pid, task id, agent mark, process group) of live processes of this run."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[0] == "Z" or env.get(b"DRILL_RUN") != self.run_id.encode():
                continue
            task = env.get(b"TESSERA_TASK_ID", b"").decode()
            found.append((int(entry), task, env.get(b"TESSERA_AGENT_MARK", b"").decode(), int(fields[2])))
        return found

    def task_pids(self):
        return [p for p, _, _, _ in self._scan()]

    def running_as_root(self):
        """Task processes whose user is root (the agents run as root; tasks must not)."""
        count = 0
        for pid in self.task_pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    uid = next(l.split()[1] for l in f if l.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            count += uid == "0"
        return count

    def mps_pids(self):
        pids = []
        for name in self.agents:
            # One daemon per GPU, each in its own directory.
            root = os.path.join(self.work, name, "mps")
            for gpu in (os.listdir(root) if os.path.isdir(root) else []):
                path = os.path.join(root, gpu, "pipe", "fake-daemon.pid")
                try:
                    pids.append(int(open(path).read().strip()))
                except (OSError, ValueError):
                    pass
        return pids

    def processes(self):
        """Task id -> set of process groups running it."""
        out = {}
        for _, task, _, pgrp in self._scan():
            out.setdefault(task, set()).add(pgrp)
        return out

    def wanted(self):
        """Task ids the server has assigned, running or stopping."""
        _, body = self.api("GET", "/api/v1/tasks?state=assigned,running,stopping&limit=10000")
        return {t["id"]: t for t in (body or {}).get("tasks", [])}

    def running(self, service):
        _, body = self.api("GET", f"/api/v1/tasks?service={service}&state=running")
        return body["tasks"] if body else []

    def duplicates(self):
        """Processes beyond one group per task, plus processes of tasks the server does not
        want any more."""
        procs = self.processes()
        wanted = self.wanted()
        extra = sum(len(groups) - 1 for groups in procs.values())
        unwanted = sum(len(groups) for task, groups in procs.items() if task not in wanted)
        return extra + unwanted

    def overcommitted(self):
        """GPUs whose allocated memory exceeds their memory, per the store."""
        _, hosts = self.api("GET", "/api/v1/hosts")
        memory = {g["uuid"]: g["memory"] for h in hosts["hosts"] for g in h["gpus"]}
        used = {}
        for t in self.wanted().values():
            for a in t.get("allocations", []):
                used[a["gpu"]] = used.get(a["gpu"], 0) + a["memory"]
        return sum(1 for gpu, m in used.items() if m > memory.get(gpu, 0))

    def wait(self, check, seconds, what):
        end = time.time() + seconds
        while time.time() < end:
            if check():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {seconds} s waiting for {what}")

    def burst(self, calls, settle=6):
        """Runs `calls` all at once, waits `settle` seconds, and returns the most task
        processes seen running at any moment meanwhile (sampled every 0.1 s)."""
        peak = [0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], len(self.processes()))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(settle)
        stop.set()
        sampler.join()
        return peak[0]

    # Setup.

    def start_fleet(self, agents):
        """The server, signed in, pool `drill`, and `agents` registered."""
        self.start_server()
        self.sign_in()
        assert self.api("POST", "/api/v1/pools", {"name": "drill"})[0] == 201
        for name in agents:
            self.start_agent(name)
        self.wait(lambda: len(self.api("GET", "/api/v1/hosts")[1]["hosts"]) == len(agents), 30,
                  "the agents to register")

    def setup(self, agents):
        self.start_fleet(agents)
        status, body = self.api("POST", "/api/v1/task-definitions", {
            "family": "drill", "containers": [{
                "name": "main", "command": ["sleep", "600"], "cpu_milli": 500, "memory_mib": 64,
                "env": {"DRILL_RUN": self.run_id},
                "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 20}}}]})
        assert status == 201, body

    def service(self, name, count):
        status, body = self.api("POST", "/api/v1/services", {
            "name": name, "task_definition": "drill:1", "pool": "drill", "desired_count": count,
            "stop_timeout_secs": 2})
        return status

    def converged(self, service, count):
        running = self.running(service)
        procs = self.processes()
        return len(running) == count and all(t["id"] in procs for t in running)


def drill_server_restart(f, results):
    """Server killed (-9) and back after a downtime longer than the lost timeout."""
    f.service("web", 4)
    f.wait(lambda: f.converged("web", 4), 60, "4 tasks running")
    before = {t: sorted(g) for t, g in f.processes().items()}
    f.kill_server()
    time.sleep(LOST + 2)
    f.start_server()
    time.sleep(LOST + 3)
    after = {t: sorted(g) for t, g in f.processes().items()}
    restarted = sum(1 for t, g in before.items() if after.get(t) != g)
    results.append(("server kill -9, down %d s (> lost timeout %d s)" % (LOST + 2, LOST),
                    "tasks restarted", restarted, 0))
    results.append(("", "duplicate processes", f.duplicates(), 0))
    if os.geteuid() == 0:
        results.append(("", "task processes running as root", f.running_as_root(), 0))


def drill_agent_kill(f, results):
    """Agent killed (-9): its tasks are replaced elsewhere; restarted, it leaves no
    duplicate behind."""
    hosts = [t["host"] for t in f.running("web")]
    victim = max(set(hosts), key=hosts.count)
    on_victim = hosts.count(victim)
    start = time.time()
    f.signal_agent(victim, signal.SIGKILL)
    f.wait(lambda: len([t for t in f.running("web") if t["host"] != victim]) == 4, 60,
           "replacements on other hosts")
    replaced_in = time.time() - start
    f.start_agent(victim)
    f.wait(lambda: f.duplicates() == 0, 30, "the restarted agent to stop its old tasks")
    time.sleep(2)
    results.append(("agent %s kill -9 (%d task(s) on it), then restarted" % (victim, on_victim),
                    "seconds to replace its tasks", round(replaced_in, 1), None))
    results.append(("", "duplicate processes left", f.duplicates(), 0))


def drill_agent_freeze(f, results):
    """Agent frozen (SIGSTOP) past the lost timeout, then resumed."""
    f.wait(lambda: f.converged("web", 4), 60, "4 tasks running")
    victim = next(t["host"] for t in f.running("web"))
    f.signal_agent(victim, signal.SIGSTOP)
    time.sleep(LOST + 3)
    f.signal_agent(victim, signal.SIGCONT)
    f.wait(lambda: f.converged("web", 4) and f.duplicates() == 0, 60, "recovery")
    time.sleep(2)
    results.append(("agent %s frozen %d s, then resumed" % (victim, LOST + 3),
                    "duplicate processes left", f.duplicates(), 0))


def drill_scale_and_crash(f, results):
    """Server killed right after a scale-up; the service converges after a restart."""
    f.api("PATCH", "/api/v1/services/web", {"desired_count": 10})
    f.kill_server()
    f.start_server()
    f.wait(lambda: f.converged("web", 10), 60, "10 tasks running")
    time.sleep(1)
    results.append(("server kill -9 right after a scale-up to 10", "GPUs overcommitted",
                    f.overcommitted(), 0))
    results.append(("", "tasks running (processes)", len(f.processes()), 10))


def drill_failover(f, results):
    """A second server on the same database; the one holding the scheduler lease is
    killed (-9) right after a scale-up. The other takes the lease and finishes it."""
    f.start_second_server()
    f.wait(lambda: len(f.api("GET", "/api/v1/cluster")[1]["servers"]) == 2, 30,
           "both servers in the cluster view")
    holder = [s for s in f.api("GET", "/api/v1/cluster")[1]["servers"] if s["scheduling"]]
    assert holder and holder[0]["address"].endswith(f":{f.port}"), holder
    target = len(f.running("web")) + 3
    f.api("PATCH", "/api/v1/services/web", {"desired_count": target})
    start = time.time()
    f.kill_server()

    def taken_over():
        status, view = f.api("GET", "/api/v1/cluster", url=f.url2)
        return status == 200 and any(
            s["scheduling"] and s["address"].endswith(f":{f.port2}") for s in view["servers"])
    f.wait(taken_over, 30, "the second server to take the lease")
    took = time.time() - start

    def done():
        _, body = f.api("GET", "/api/v1/tasks?service=web&state=running", url=f.url2)
        running = body["tasks"] if body else []
        procs = f.processes()
        return len(running) == target and all(t["id"] in procs for t in running)
    f.wait(done, 60, f"{target} tasks running through the second server")
    converged = time.time() - start
    f.start_server()  # back, for the drills after this one (the other keeps the lease)
    time.sleep(1)
    results.append(("two servers; the scheduling one kill -9 right after a scale-up to %d"
                    % target, "seconds until the other schedules", round(took, 1), None))
    results.append(("", "seconds until all %d run" % target, round(converged, 1), None))
    # The lease lasts 8 s and is tried every second: taken over within 10 s.
    results.append(("", "taken over within 10 s", int(took <= 10), 1))
    results.append(("", "GPUs overcommitted", f.overcommitted(), 0))
    results.append(("", "duplicate processes", f.duplicates(), 0))


def drill_contention(f, results):
    """Many clients create services at once, beyond capacity."""
    peak = f.burst([lambda i=i: f.service(f"burst-{i}", 3) for i in range(16)])
    # 3 hosts x 2 GPUs x 3 slots of 8 GiB (24 GiB each).
    capacity = len(f.agents) * 2 * 3
    results.append(("16 clients create 3-task services at once (48 tasks + 10, capacity %d)" % capacity,
                    "GPUs overcommitted", f.overcommitted(), 0))
    results.append(("", "processes above capacity at any sample", max(0, peak - capacity), 0))
    for i in range(16):
        f.api("DELETE", f"/api/v1/services/burst-{i}")
    f.wait(lambda: len(f.processes()) <= 10, 60, "the burst services to drain")


def drill_mps_daemon(f, results):
    """The (fake) MPS daemon of a host killed: the host is impaired and its tasks move,
    replacements first."""
    f.api("PATCH", "/api/v1/services/web", {"desired_count": 4})
    f.wait(lambda: f.converged("web", 4), 60, "4 tasks running")
    victim, gpu = next((t["host"], t["allocations"][0]["gpu"]) for t in f.running("web"))
    # The daemon of one of its GPUs: one GPU's MPS failing for good impairs the host.
    pipe = os.path.join(f.work, victim, "mps", gpu, "pipe")
    pid = int(open(os.path.join(pipe, "fake-daemon.pid")).read().strip())
    low = [4]
    # Killed, and it cannot start again (the stand-in's `broken` marker): the agent's
    # restarts fail and it reports the daemon unhealthy.
    open(os.path.join(pipe, "broken"), "w").close()
    os.kill(pid, signal.SIGKILL)
    end = time.time() + 60
    while time.time() < end:
        low[0] = min(low[0], len(f.running("web")))
        if all(t["host"] != victim for t in f.running("web")) and len(f.running("web")) == 4:
            break
        time.sleep(0.2)
    _, host = f.api("GET", f"/api/v1/hosts/{victim}")
    results.append(("MPS daemon of host %s killed" % victim, "host status", host["status"], None))
    results.append(("", "fewest running during the move (desired 4)", low[0], 4))


def drill_gpu_removed(f, results):
    """A GPU of a simulated host disappears (as one that falls off the bus): its tasks are
    replaced, the host's other tasks keep running."""
    # 9 tasks of 3 per GPU on the two healthy hosts: one of them uses both its GPUs.
    f.api("PATCH", "/api/v1/services/web", {"desired_count": 9})
    f.wait(lambda: f.converged("web", 9), 60, "9 tasks running")
    running = f.running("web")
    by_gpu = {}
    for t in running:
        for a in t["allocations"]:
            by_gpu.setdefault((t["host"], a["index"]), []).append(t["id"])
    hosts = [h for h in {h for h, _ in by_gpu} if sum(1 for hh, _ in by_gpu if hh == h) > 1]
    victim = hosts[0]
    index, doomed = min(((i, ids) for (h, i), ids in by_gpu.items() if h == victim),
                        key=lambda x: len(x[1]))
    others = [t["id"] for t in running if t["host"] == victim and t["id"] not in doomed]
    with open(os.path.join(f.work, victim, "simulated-gpus-removed"), "w") as out:
        out.write(f"{index}\n")
    f.wait(lambda: f.converged("web", 9) and not set(doomed) & {t["id"] for t in f.running("web")},
           60, "the lost GPU's tasks to be replaced")
    time.sleep(2)
    still = {t["id"] for t in f.running("web")}
    results.append(("GPU %d of host %s removed (%d task(s) on it, %d on its other GPU)"
                    % (index, victim, len(doomed), len(others)),
                    "its other tasks stopped", sum(1 for t in others if t not in still), 0))
    results.append(("", "duplicate processes", f.duplicates(), 0))
    results.append(("", "GPUs overcommitted", f.overcommitted(), 0))


def drill_racing_servers(f, results):
    """Two servers take racing clients at once: half the services are created through
    each, beyond capacity."""
    def create(i):
        f.api("POST", "/api/v1/services", {
            "name": f"race-{i}", "task_definition": "drill:1", "pool": "drill",
            "desired_count": 3, "stop_timeout_secs": 2}, url=f.url if i % 2 == 0 else f.url2)
    peak = f.burst([lambda i=i: create(i) for i in range(16)])
    capacity = len(f.agents) * 2 * 3
    results.append(("two servers, 16 clients split between them, 3-task services at once "
                    "(capacity %d)" % capacity, "GPUs overcommitted", f.overcommitted(), 0))
    results.append(("", "processes above capacity at any sample", max(0, peak - capacity), 0))
    results.append(("", "duplicate processes", f.duplicates(), 0))
    for i in range(16):
        f.api("DELETE", f"/api/v1/services/race-{i}")
    f.wait(lambda: len(f.processes()) <= len(f.running("web")), 60, "the racing services to drain")


def drill_postgres_restart(f, results):
    """PostgreSQL restarted (immediate shutdown: as a crash) while clients write through
    both servers: every write a server acknowledged is there afterwards, the servers carry
    on without being restarted, and no host is lost for it."""
    ctl = os.environ["TESSERA_TEST_POSTGRES_CTL"].split()
    data = os.environ["TESSERA_TEST_POSTGRES_DIR"]
    options = os.environ["TESSERA_TEST_POSTGRES_OPTIONS"]
    acknowledged = []
    failures = [0]
    stop = threading.Event()

    def writer(url):
        n = 0
        while not stop.is_set():
            n += 1
            try:
                status, body = f.api("POST", "/api/v1/task-definitions", {
                    "family": "ledger", "containers": [{
                        "name": "main", "command": ["true"], "cpu_milli": 10, "memory_mib": 8,
                        "env": {"WRITE": f"{url}-{n}"}}]}, url=url, timeout=30)
            except OSError:
                status, body = None, None
            if status == 201:
                acknowledged.append(body["revision"])
            else:
                failures[0] += 1
                time.sleep(0.1)

    writers = [threading.Thread(target=writer, args=(u,), daemon=True) for u in (f.url, f.url2)]
    before = {t["id"] for t in f.running("web")}
    for w in writers:
        w.start()
    time.sleep(2)
    subprocess.run(ctl + ["-D", data, "-m", "immediate", "stop"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    down = time.time()
    time.sleep(5)  # longer than the lost timeout (3 s)
    subprocess.run(ctl + ["-D", data, "-o", options, "-l",
                          os.path.join(os.path.dirname(data), "server.log"), "-w", "start"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    back = time.time()
    count_before = len(acknowledged)

    def writes_again():
        return len(acknowledged) > count_before
    try:
        f.wait(writes_again, 60, "writes to be acknowledged again")
        recovered = time.time() - back
        time.sleep(2)
    finally:
        stop.set()
    for w in writers:
        w.join()
    _, revs = f.api("GET", "/api/v1/task-definitions/ledger")
    stored = {r["revision"] for r in revs["revisions"]} if revs and "revisions" in revs else set()
    lost = len(set(acknowledged) - stored)
    # Scheduling carries on: one more task, placed and running.
    target = len(f.running("web")) + 1
    f.api("PATCH", "/api/v1/services/web", {"desired_count": target})
    f.wait(lambda: f.converged("web", target), 60, f"{target} tasks running after the restart")
    kept = len(before & {t["id"] for t in f.running("web")})
    _, hosts = f.api("GET", "/api/v1/hosts")
    lost_hosts = sum(1 for h in hosts["hosts"] if h["status"] == "lost")
    results.append(("PostgreSQL killed for %.0f s under writes through both servers"
                    % (back - down), "acknowledged writes", len(acknowledged), None))
    results.append(("", "acknowledged writes missing afterwards", lost, 0))
    results.append(("", "seconds from its start to the next write", round(recovered, 1), None))
    results.append(("", "servers that had to be restarted",
                    sum(1 for p in (f.server, f.server2) if p.poll() is not None), 0))
    results.append(("", "hosts declared lost", lost_hosts, 0))
    results.append(("", "tasks that were running and stopped", len(before) - kept, 0))
    if kept < len(before):
        _, events = f.api("GET", "/api/v1/events?limit=40")
        for e in reversed((events or {}).get("events", [])):
            print(f"    event {e['at']} {e['message']}", file=sys.stderr)
    results.append(("", "GPUs overcommitted", f.overcommitted(), 0))
    results.append(("", "duplicate processes", f.duplicates(), 0))


def failover_trials(f, trials):
    """The scheduling server killed (-9) `trials` times, each time the other one holding
    the lease: seconds from the kill to the next committed placement (a task asked for
    through the surviving server, assigned)."""
    times = []
    for _ in range(trials):
        f.wait(lambda: f.holder_port() is not None, 30, "a scheduling server")
        holder = f.holder_port()
        victim, survivor = ("server", f.url2) if holder == f.port else ("server2", f.url)
        proc = getattr(f, victim)
        _, body = f.api("GET", "/api/v1/services/web", url=survivor)
        target = body["desired_count"] + 1
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.time()
        f.api("PATCH", "/api/v1/services/web", {"desired_count": target}, url=survivor)

        def placed():
            _, tasks = f.api("GET", "/api/v1/tasks?service=web&state=assigned,running&limit=1000",
                             url=survivor)
            return tasks is not None and len(tasks["tasks"]) >= target
        f.wait(placed, 60, "the next placement")
        times.append(time.time() - killed)
        if victim == "server":
            f.start_server()
        else:
            f.start_second_server()
        # Back to a count the fleet holds (3 hosts x 6 slots), once the new task runs.
        f.wait(lambda: f.converged("web", target), 60, f"{target} tasks running")
        if target >= 15:
            f.api("PATCH", "/api/v1/services/web", {"desired_count": 10}, url=survivor)
            f.wait(lambda: f.converged("web", 10), 60, "10 tasks running")
    times.sort()
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--short", action="store_true", help="the drills CI runs")
    parser.add_argument("--bin", default=None, help="folder with tessera and tessera-agent")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--postgres", default=None,
                        help="a PostgreSQL server URL (its user may create databases)")
    parser.add_argument("--failover-trials", type=int, default=0,
                        help="with --postgres: kill the scheduling server this many times")
    args = parser.parse_args()
    bin_dir = args.bin or os.environ.get("TESSERA_BIN_DIR")
    work = tempfile.mkdtemp(prefix="tessera-drills-")
    database = None
    if args.postgres:
        name = "tessera_drills_" + uuid.uuid4().hex[:8]
        subprocess.run(["psql", "-q", args.postgres, "-c", f"CREATE DATABASE {name}"],
                       check=True)
        database = args.postgres.rsplit("/", 1)[0] + "/" + name
    f = Fleet(bin_dir, work, database)
    results = []
    drills = [drill_server_restart, drill_agent_kill, drill_scale_and_crash, drill_contention,
              drill_failover]
    if not args.short:
        drills[2:2] = [drill_agent_freeze]
        drills.append(drill_mps_daemon)
        drills.append(drill_gpu_removed)
    if database:
        drills += [drill_racing_servers, drill_postgres_restart]
    ok = True
    try:
        f.setup(["a", "b", "c"])
        for d in drills:
            t0 = time.time()
            d(f, results)
            print(f"  {d.__name__} done in {time.time() - t0:.1f} s", file=sys.stderr)
        if database and args.failover_trials:
            times = failover_trials(f, args.failover_trials)
            p50 = times[len(times) // 2]
            results.append(("the scheduling server kill -9, %d trials" % len(times),
                            "seconds to the next placement, p50", round(p50, 1), None))
            results.append(("", "seconds to the next placement, max", round(times[-1], 1), None))
            results.append(("", "max within 10 s", int(times[-1] <= 10), 1))
            results.append(("", "GPUs overcommitted", f.overcommitted(), 0))
            results.append(("", "duplicate processes", f.duplicates(), 0))
    except Exception as e:  # a drill that cannot finish is a failure, with its logs kept
        ok = False
        print(f"drill failed: {e}; logs in {work}", file=sys.stderr)
    finally:
        f.stop()
    print(f"store: {'PostgreSQL' if database else 'SQLite'}")
    print(f"{'drill':<72} {'figure':<42} {'value':>6}  expected")
    for drill, figure, value, expected in results:
        bad = expected is not None and value != expected
        ok = ok and not bad
        shown = "" if expected is None else str(expected)
        print(f"{drill:<72} {figure:<42} {value!s:>6}  {shown}{'  FAILED' if bad else ''}")
    if args.json:
        print(json.dumps([dict(zip(["drill", "figure", "value", "expected"], r)) for r in results]))
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
