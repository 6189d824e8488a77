#!/usr/bin/env python3
"""Work drill on the real binaries: `tessera serve`, three `tessera-agent`s (simulated GPUs,
one-second syncs) running `tessera example-server` tasks whose own Prometheus metrics the
agents scrape, and a load generator sending requests to the service's healthy endpoints.
The service is judged by what its application reports, as an operator's would be:

 1. service `api` (api:1, 10 ms of work a request), autoscaling on
    completed_per_task_per_sec toward 20 (1..6 tasks, cooldowns 5 s out and 20 s in), an
    alarm `latency_p99_ms above 150 for 5 s` and a bake time of 10 s;
 2. load 20 requests/s: one task; then 120 requests/s: scaled out to 6 tasks (time to
    6 healthy endpoints printed); then 20 again: back to 1 after the cooldown (printed);
 3. a rolling deployment to api:2 (300 ms a request) under that load: the alarm fires and
    rolls it back (printed: seconds from the first api:2 task taking traffic to the
    rollback, to set against for_secs + two sync intervals);
 4. a deployment to api:3 (10 ms again): steady, and still primary after its bake time.

    scripts/work_drill.py [--bin DIR] [--json] [--keep]

Prints a table (and JSON with --json); exits 1 when a figure is not what it must be; logs
stay in the temporary directory on failure.
"""

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import drills  # noqa: E402
import serve_drill  # noqa: E402  (the fleet advertising 127.0.0.1, the task binary)

SERVICE = "api"
FOR_SECS = 5
BAKE = 10


class EndpointLoad:
    """Client threads sending `GET /` to the service's healthy endpoints in turn, at a
    total rate that can be changed while it runs (a new connection per request)."""

    def __init__(self, fleet, rate, clients=8):
        self.f = fleet
        self.rate = rate
        self.clients = clients
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.targets = []
        self.sent = 0
        self.failed = 0
        self.next = 0
        self.threads = []

    def start(self):
        self.threads = [threading.Thread(target=self._refresh, daemon=True)]
        self.threads += [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(15)

    def _refresh(self):
        while not self.stop_flag.is_set():
            try:
                status, body = self.f.api("GET", f"/api/v1/services/{SERVICE}/endpoints")
                if status == 200:
                    with self.lock:
                        self.targets = [(e["address"], e["port"]) for e in body["endpoints"]
                                        if e["health"] == "healthy"]
            except OSError:
                pass
            time.sleep(0.5)

    def _client(self, i):
        due = time.time() + i * (self.clients / self.rate) / self.clients
        while not self.stop_flag.is_set():
            interval = self.clients / self.rate
            now = time.time()
            if due > now:
                time.sleep(due - now)
            due = max(due + interval, time.time() - 1)
            with self.lock:
                if not self.targets:
                    continue
                address, port = self.targets[self.next % len(self.targets)]
                self.next += 1
            try:
                conn = http.client.HTTPConnection(address, port, timeout=10)
                conn.request("GET", "/")
                r = conn.getresponse()
                r.read()
                conn.close()
                ok = r.status == 200
            except Exception:
                ok = False
            with self.lock:
                self.sent += 1
                self.failed += 0 if ok else 1


class Drill:
    def __init__(self, args, work, task_bin):
        self.args = args
        self.work = work
        self.f = serve_drill.ServeFleet(args.bin, work)
        self.task_bin = task_bin
        self.results = []
        self.load = None

    def definition(self, revision, work_ms):
        status, body = self.f.api("POST", "/api/v1/task-definitions", {
            "family": SERVICE, "containers": [{
                "name": "main", "command": [os.path.join(self.task_bin, "tessera"), "example-server"],
                "cpu_milli": 100, "memory_mib": 64,
                "env": {"DRILL_RUN": self.f.run_id, "EXAMPLE_WORK_MS": str(work_ms),
                        "VERSION": str(revision)},
                "gpu": {"mps": {"memory_mib": 2048}},
                "ports": [{"name": "http", "container_port": 8080}],
                "health_check": {"http": {"port": "http", "path": "/health"},
                                 "interval_secs": 5, "timeout_secs": 2, "retries": 2}}],
            "work": {"port": "http", "completed": "example_requests_total",
                     "errors": "example_errors_total", "latency": "example_request_seconds"}})
        assert status == 201, (status, body)

    def service(self):
        return self.f.api("GET", f"/api/v1/services/{SERVICE}")[1]

    def healthy(self):
        status, body = self.f.api("GET", f"/api/v1/services/{SERVICE}/endpoints")
        assert status == 200, (status, body)
        return [e for e in body["endpoints"] if e["health"] == "healthy"]

    def events(self):
        status, body = self.f.api("GET", f"/api/v1/events?service={SERVICE}")
        assert status == 200, (status, body)
        return body["events"] if isinstance(body, dict) else body

    def wait(self, check, seconds, what):
        self.f.wait(check, seconds, what)
        return time.time()

    def scale(self, r, rate, want, seconds, label):
        self.load.rate = rate
        t = time.time()
        done = self.wait(lambda: self.service()["desired_count"] == want
                         and len(self.healthy()) == want, seconds,
                         f"{want} healthy task(s) at {rate} requests/s")
        r.append((label, "seconds until that many healthy endpoints", round(done - t, 1), None))
        return done - t

    def run(self):
        r = self.results
        self.f.start_fleet(["a", "b", "c"])
        for revision, ms in ((1, 10), (2, 300), (3, 10)):
            self.definition(revision, ms)
        status, body = self.f.api("POST", "/api/v1/services", {
            "name": SERVICE, "task_definition": f"{SERVICE}:1", "pool": "drill",
            "desired_count": 1, "stop_timeout_secs": 5, "deregistration_delay_secs": 1,
            "alarms": [{"metric": "latency_p99_ms", "above": 150, "for_secs": FOR_SECS}],
            "bake_secs": BAKE,
            "autoscaling": {"min": 1, "max": 6, "metric": "completed_per_task_per_sec",
                            "target": 20, "scale_out_cooldown_secs": 5,
                            "scale_in_cooldown_secs": 20}})
        assert status == 201, (status, body)
        self.wait(lambda: len(self.healthy()) == 1, 60, "the first task healthy")
        self.load = EndpointLoad(self.f, 20).start()
        self.wait(lambda: (self.f.api("GET", f"/api/v1/services/{SERVICE}/work")[1]
                           .get("completed_per_sec") or 0) > 5, 30,
                  "work measured from the application")
        time.sleep(8)
        r.append(("20 requests/s", "desired count", self.service()["desired_count"], 1))
        out = self.scale(r, 120, 6, 120, "20 -> 120 requests/s (target 20 a task)")
        r.append(("", "scaled out within 60 s", int(out <= 60), 1))
        self.scale(r, 20, 1, 180, "120 -> 20 requests/s (scale-in cooldown 20 s)")
        time.sleep(4)
        work = self.f.api("GET", f"/api/v1/services/{SERVICE}/work")[1]
        r.append(("", "completed/s the application reports", round(work.get("completed_per_sec") or 0, 1), None))

        # A slow revision: its latency alarm rolls it back.
        before = {e["id"] for e in self.events()}
        status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}",
                                  {"task_definition": f"{SERVICE}:2"})
        assert status == 200, (status, body)
        first = {}

        def serving_v2():
            if "at" not in first and any(e["task_definition"] == f"{SERVICE}:2" for e in self.healthy()):
                first["at"] = time.time()
            return any("rolled back: alarm" in e["message"] for e in self.events()
                       if e["id"] not in before)
        rolled = self.wait(serving_v2, 90, "the alarm to roll api:2 back")
        after = rolled - first.get("at", rolled)
        r.append(("api:1 -> api:2 (300 ms a request), alarm p99 > 150 ms for 5 s",
                  "seconds from api:2 taking traffic to the rollback", round(after, 1), None))
        r.append(("", f"within for_secs + 2 syncs + 3 s ({FOR_SECS + 2 * drills.SYNC + 3} s)",
                  int(after <= FOR_SECS + 2 * drills.SYNC + 3), 1))
        message = next(e["message"] for e in self.events() if "rolled back: alarm" in e["message"])
        print(f"    {message}", file=sys.stderr)
        self.wait(lambda: [e["task_definition"] for e in self.healthy()] == [f"{SERVICE}:1"], 60,
                  "api:1 alone again")

        # A good revision completes after its bake time.
        status, body = self.f.api("PATCH", f"/api/v1/services/{SERVICE}",
                                  {"task_definition": f"{SERVICE}:3"})
        assert status == 200, (status, body)
        self.wait(lambda: [e["task_definition"] for e in self.healthy()] == [f"{SERVICE}:3"], 60,
                  "api:3 serving alone")
        time.sleep(BAKE + 3)
        primary = [d for d in self.service()["deployments"] if d["status"] == "primary"]
        r.append(("api:1 -> api:3 (10 ms a request), bake 10 s", "still primary after the bake time",
                  int(bool(primary) and primary[0]["task_definition"] == f"{SERVICE}:3"), 1))
        self.load.stop()
        r.append(("all of it", "requests sent", self.load.sent, None))
        r.append(("", "failed requests", self.load.failed, None))
        self.load = None

    def cleanup(self):
        if self.load is not None:
            self.load.stop()
        self.f.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=None, help="folder with tessera and tessera-agent")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the logs even when it passes")
    args = parser.parse_args()
    args.bin = args.bin or os.environ.get("TESSERA_BIN_DIR")
    if not args.bin:
        sys.exit("no binaries: pass --bin DIR or set TESSERA_BIN_DIR")
    work = tempfile.mkdtemp(prefix="tessera-work-drill-")
    task_bin = serve_drill.task_binary_dir(args.bin)
    d = Drill(args, work, task_bin)
    ok = True
    try:
        d.run()
    except Exception as e:
        ok = False
        print(f"drill failed: {type(e).__name__}: {e}; logs in {work}", file=sys.stderr)
    finally:
        d.cleanup()
        shutil.rmtree(task_bin, ignore_errors=True)
    print(f"{'drill':<62} {'figure':<52} {'value':>8}  expected")
    for drill, figure, value, expected in d.results:
        bad = expected is not None and value != expected
        ok = ok and not bad
        shown = "" if expected is None else str(expected)
        print(f"{drill:<62} {figure:<52} {value!s:>8}  {shown}{'  FAILED' if bad else ''}")
    if args.json:
        print(json.dumps([dict(zip(["drill", "figure", "value", "expected"], r)) for r in d.results]))
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs in {work}", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
