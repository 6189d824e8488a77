#!/usr/bin/env python3
"""Notifications drill on the real binaries: `tessera serve` and a `tessera-agent`, with
crash-looping services whose failures are what on-call people must hear.

 1. Delivery: a receiver here checks every request's HMAC-SHA256 signature and notes when
    it arrived; each notice's delivery latency is its arrival less the notice's time
    (p50, p99, max; the target is p99 <= 2 s).
 2. A receiver down for 30 s: nothing is lost. Every delivery made while it was down is
    retried and arrives once it is back; none is given up on.
 3. Alertmanager (Debian's `prometheus-alertmanager`, as operators run it) gets the
    notices as alerts on its `/api/v2/alerts` (skipped, saying so, when it is not
    installed; `scripts/setup.sh --test` installs it).

    scripts/notify_drill.py [--bin DIR] [--services N]

Prints a table of figures; exits 1 when a target is missed.
"""

import argparse
import hashlib
import hmac
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import drills  # noqa: E402

# Crashes a second after it starts, saying why.
CRASH = "sleep 1; echo 'RuntimeError: CUDA error: out of memory' >&2; exit 1"
DOWN_SECS = 30


class Receiver:
    """A webhook receiver on `port` that checks signatures and notes arrivals."""

    def __init__(self, port, secret):
        self.port = port
        self.secret = secret.encode()
        self.got = {}  # delivery id -> (arrival, notice)
        self.bad_signatures = 0
        self.server = None

    def start(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                arrived = time.time()
                sig = self.headers.get("x-tessera-signature", "")
                parts = dict(p.split("=", 1) for p in sig.split(",") if "=" in p)
                want = hmac.new(outer.secret, parts.get("t", "").encode() + b"." + body,
                                hashlib.sha256).hexdigest()
                if not hmac.compare_digest(want, parts.get("v1", "")):
                    outer.bad_signatures += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                notice = json.loads(body)
                outer.got.setdefault(notice["delivery"], (arrived, notice))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def at_secs(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def start_alertmanager(work):
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not binary:
        return None, None
    port = drills.free_port()
    config = os.path.join(work, "alertmanager.yml")
    with open(config, "w") as f:
        f.write("route:\n  receiver: keep\nreceivers:\n  - name: keep\n")
    log = open(os.path.join(work, "alertmanager.log"), "a")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.path={os.path.join(work, 'am')}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"alertmanager did not start; see {work}/alertmanager.log")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bin", default=None, help="folder with tessera and tessera-agent")
    parser.add_argument("--services", type=int, default=8, help="crash-looping services")
    args = parser.parse_args()
    bin_dir = args.bin or os.environ.get("TESSERA_BIN_DIR")
    work = tempfile.mkdtemp(prefix="tessera-notify-")
    f = drills.Fleet(bin_dir, work)
    am, am_url = start_alertmanager(work)
    results = []
    ok = True
    receiver = None
    try:
        f.start_fleet(["a"])
        status, body = f.api("POST", "/api/v1/task-definitions", {
            "family": "crash", "containers": [{
                "name": "main", "command": ["sh", "-c", CRASH], "cpu_milli": 100,
                "memory_mib": 64, "env": {"DRILL_RUN": f.run_id},
                "gpu": {"mps": {"memory_mib": 1024, "max_compute_percent": 5}}}]})
        assert status == 201, body
        port = drills.free_port()
        status, made = f.api("POST", "/api/v1/webhooks", {
            "name": "drill", "url": f"http://127.0.0.1:{port}/hook",
            "kinds": ["task_crash_looping"]})
        assert status == 201, made
        hook = made["webhook"]["id"]
        if am_url:
            status, body = f.api("POST", "/api/v1/webhooks", {
                "name": "alertmanager", "url": am_url, "format": "alertmanager",
                "kinds": ["task_crash_looping"]})
            assert status == 201, body
        receiver = Receiver(port, made["secret"])
        receiver.start()
        # 1. Delivery latency, the receiver up.
        for i in range(args.services):
            status, body = f.api("POST", "/api/v1/services", {
                "name": f"crash-{i}", "task_definition": "crash:1", "pool": "drill",
                "desired_count": 1, "stop_timeout_secs": 1})
            assert status == 201, body
        time.sleep(40)
        first = dict(receiver.got)
        latencies = [arrived - at_secs(n["at"]) for arrived, n in first.values()]
        # 2. Down for 30 s, then back.
        receiver.stop()
        down_at = time.time()
        time.sleep(DOWN_SECS)
        status, listed = f.api("GET", f"/api/v1/webhooks/{hook}/deliveries")
        made_while_down = [d for d in listed["deliveries"]
                           if at_secs(d["notice"]["at"]) >= down_at]
        retried = [d for d in made_while_down if d["attempts"] >= 1 and d["status"] == "pending"]
        receiver = Receiver(port, made["secret"])
        receiver.got = dict(first)
        receiver.start()
        missing = []
        deadline = time.time() + 120
        while time.time() < deadline:
            status, listed = f.api("GET", f"/api/v1/webhooks/{hook}/deliveries")
            ds = listed["deliveries"]
            missing = [d["id"] for d in ds if d["id"] not in receiver.got]
            if not missing and all(d["status"] == "delivered" for d in ds):
                break
            time.sleep(1)
        failed = [d for d in ds if d["status"] == "failed"]
        results += [
            ("delivery, receiver up", "notices delivered", len(latencies), None),
            ("", "latency p50 (s)", round(percentile(latencies, 50), 2), None),
            ("", "latency p99 (s)", round(percentile(latencies, 99), 2), None),
            ("", "p99 within 2 s", int(percentile(latencies, 99) <= 2.0), 1),
            ("", "bad signatures", receiver.bad_signatures, 0),
            (f"receiver down {DOWN_SECS} s", "notices made while down", len(made_while_down), None),
            ("", "tried while down, pending", len(retried), None),
            ("", "deliveries missing at the receiver", len(missing), 0),
            ("", "deliveries given up on", len(failed), 0),
        ]
        if not made_while_down:
            raise RuntimeError("no notice was made while the receiver was down")
        if am_url:
            with urllib.request.urlopen(am_url + "/api/v2/alerts", timeout=5) as r:
                alerts = json.loads(r.read())
            ours = [a for a in alerts if a["labels"].get("alertname") == "TesseraTaskCrashLooping"
                    and a["labels"].get("service", "").startswith("crash-")]
            results.append(("alertmanager", "crash-looping services alerting",
                            len({a["labels"]["service"] for a in ours}), args.services))
        else:
            print("alertmanager: not installed (scripts/setup.sh --test installs it); skipped")
    except Exception as e:  # a drill that cannot finish is a failure, with its logs kept
        ok = False
        print(f"drill failed: {e}; logs in {work}", file=sys.stderr)
    finally:
        if receiver and receiver.server:
            try:
                receiver.stop()
            except Exception:
                pass
        f.stop()
        if am:
            am.kill()
            am.wait()
    print(f"{'drill':<28} {'figure':<38} {'value':>8} {'target':>8}")
    for drill, figure, value, target in results:
        miss = target is not None and value != target
        ok = ok and not miss
        print(f"{drill:<28} {figure:<38} {value:>8} {'' if target is None else target:>8}"
              + ("  MISSED" if miss else ""))
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
