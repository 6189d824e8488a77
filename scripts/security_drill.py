#!/usr/bin/env python3
"""Security drill on the real binaries: `tessera serve` and a `tessera-agent` running as
root with per-task uids (`--task-uids`) and cgroups, attacked as one compromised task and
one leaked token would attack them. Each attack prints what it tried and what held:

 1. a "thief" task looks for another task's secret in every /proc/PID/environ it can
    read, reads every task log under the agent's state directory it can, and signals
    the victim;
 2. an "escaper" task starts a child in a session of its own (setsid) and another through
    a double fork, then its service is deleted: no process of it may survive;
 3. a rogue registration with a join token used up, and one scoped to another pool;
 4. an agent given its join token on the command line (where /proc/PID/cmdline shows it to
    every process) refuses to start, and so does a server;
 5. a "noisy" task whose own /metrics (200 latency buckets, a bound of -1) and health
    check output (200,000 characters, NUL and escape sequences) break every bound of a
    report: its host stays active, its neighbour keeps running, its work is unknown with
    the reason (root);
 6. an approved host's agent reports 64 made-up H100s: none becomes capacity;
 7. host networking and NET_RAW for a service in a pool that allows neither: refused,
    naming the fields.

    scripts/security_drill.py [--bin DIR] [--keep]

Needs root (per-task uids and cgroups); otherwise it says so and exits 0 having run only
what needs no root (3, 4, 6 and 7). Exits 1 when an attack got through.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import drills  # noqa: E402

SECRET = "drill-secret-value-7f3a9c"
UIDS = "300000-300999"

# The thief: every environ it can read (looking for the victim's secret), every log file
# under the agent's state directory, and a signal to every process of another task.
THIEF = r"""
leaks=0
mine=$(cut -d' ' -f5 /proc/$$/stat)
needle="${SECRET_HEAD}${SECRET_TAIL}"
for e in /proc/[0-9]*/environ; do
  [ "$(cut -d' ' -f5 "${e%/environ}/stat" 2>/dev/null)" = "$mine" ] && continue
  if tr '\0' '\n' < "$e" 2>/dev/null | grep -q "$needle"; then echo "LEAK environ $e"; leaks=$((leaks+1)); fi
done
for f in $(find "$STATE_DIR" -name '*.log' 2>/dev/null); do
  if grep -q "victim-says" "$f" 2>/dev/null; then echo "LEAK log $f"; leaks=$((leaks+1)); fi
done
for p in $(pgrep -f victim-marker); do
  [ "$(cut -d' ' -f5 /proc/$p/stat 2>/dev/null)" = "$mine" ] && continue
  if kill -0 "$p" 2>/dev/null; then echo "LEAK signal $p"; leaks=$((leaks+1)); fi
done
echo "THIEF-DONE leaks=$leaks"
exec sleep 600
"""

# The escaper: a child in its own session and a grandchild reparented to init.
ESCAPER = r"""
setsid sh -c 'while :; do sleep 1; done' escaper-child-setsid &
(sh -c 'while :; do sleep 1; done' escaper-child-doublefork &) &
exec sleep 600
"""


def definition(f, family, script, env=None, secrets=None):
    status, body = f.api("POST", "/api/v1/task-definitions", {
        "family": family, "containers": [{
            "name": "main", "command": ["sh", "-c", script], "cpu_milli": 100, "memory_mib": 64,
            "env": dict({"DRILL_RUN": f.run_id}, **(env or {})),
            "secrets": secrets or {}}]})
    assert status == 201, (status, body)


def service(f, name, family):
    status, body = f.api("POST", "/api/v1/services", {
        "name": name, "task_definition": f"{family}:1", "pool": "drill", "desired_count": 1,
        "stop_timeout_secs": 2})
    assert status == 201, (status, body)


def pids_with(marker):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def task_log(f, service_name):
    """The thief's log as the agent wrote it (read as root)."""
    tasks = f.running(service_name)
    if not tasks:
        return ""
    tid = tasks[0]["id"]
    text = ""
    for dirpath, _, files in os.walk(os.path.join(f.work, "a1")):
        if tid in dirpath:
            for name in files:
                if name.endswith(".log"):
                    with open(os.path.join(dirpath, name), errors="replace") as fh:
                        text += fh.read()
    return text


def register(f, token, pool, name):
    body = {"join_token": token, "pool": pool, "name": name, "cpu_milli": 1000,
            "memory_mib": 1024, "gpus": []}
    req = urllib.request.Request(f.url + "/agent/v1/register", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


# The noisy task: metrics whose latency histogram has 200 bounds (one of them -1) beside a
# counter that grows, on $PORT.
NOISY = r"""
import http.server, os
n = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n[0] += 7
        lines = ["done_total %d" % n[0], 'lat_seconds_bucket{le="-1"} 0']
        lines += ['lat_seconds_bucket{le="%d"} %d' % (i, n[0]) for i in range(1, 200)]
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
"""

# A Python every task's uid can run (not one under root's home, as pyenv's is).
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else (shutil.which("python3") or "python3")

# Its health check: far more output than a report takes, with NUL and terminal escapes.
NOISY_CHECK = "head -c 200000 /dev/zero | tr '\\0' x; printf '\\033]0;owned\\007\\033[2J'; printf '\\000'; exit 1"


def noisy_task(f, report):
    status, body = f.api("POST", "/api/v1/task-definitions", {
        "family": "noisy", "containers": [{
            "name": "main", "command": [PYTHON, "-c", NOISY], "cpu_milli": 100, "memory_mib": 64,
            "env": {"DRILL_RUN": f.run_id},
            "gpu": {"mps": {"memory_mib": 1024}},
            "ports": [{"name": "http", "container_port": 8080}],
            # Failing, with the most retries: it stays up long enough to be judged.
            "health_check": {"command": ["CMD-SHELL", NOISY_CHECK], "interval_secs": 5,
                             "timeout_secs": 3, "retries": 10}}],
        "work": {"port": "http", "completed": "done_total", "latency": "lat_seconds"}})
    assert status == 201, (status, body)
    definition(f, "calm", "exec sleep 600")
    service(f, "calm", "calm")
    f.wait(lambda: f.running("calm"), 60, "the calm neighbour to run")
    calm = f.running("calm")[0]["id"]
    service(f, "noisy", "noisy")
    f.wait(lambda: f.running("noisy"), 60, "the noisy task to run")

    def unknown():
        _, work = f.api("GET", "/api/v1/services/noisy/work")
        return [why for _, why in (work or {}).get("unknown", [])]
    f.wait(lambda: any("bucket" in w for w in unknown()), 60, "the noisy task's work to be judged")
    noisy = f.running("noisy")[0]["id"]
    time.sleep(drills.LOST + 3)
    _, hosts = f.api("GET", "/api/v1/hosts")
    status = [h["status"] for h in hosts["hosts"]]
    calm_now = [t["id"] for t in f.running("calm")]
    noisy_now = f.running("noisy")
    why = unknown()
    output = (noisy_now[0].get("health_output") or "") if noisy_now else ""
    clean = not any(ord(c) < 32 and c not in "\n\t" for c in output)
    ok = (status == ["active"] and calm_now == [calm] and [t["id"] for t in noisy_now] == [noisy]
          and any("64 bucket" in w for w in why) and 0 < len(output) <= 1024 and clean)
    report("a task's own metrics and health output break every bound of a report", ok,
           f"host {status}, neighbour {'kept' if calm_now == [calm] else 'replaced ' + str(calm_now)}, "
           f"the noisy task {'kept' if [t['id'] for t in noisy_now] == [noisy] else 'replaced'}, "
           f"work unknown: {why[:1]}, health output stored: {len(output)} characters"
           f"{'' if clean else ' WITH CONTROL CHARACTERS'}")


def growing_host(f, report):
    """A host admitted with one GPU reports 64 made-up H100s."""
    gpu = {"uuid": "GPU-grower-0", "index": 0, "model": "NVIDIA L4", "memory_mib": 24576, "healthy": True}
    body = {"join_token": drills.JOIN, "pool": "drill", "name": "grower", "cpu_milli": 1000,
            "memory_mib": 1024, "gpus": [gpu]}
    req = urllib.request.Request(f.url + "/agent/v1/register", method="POST", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        joined = json.loads(r.read())
    fake = [{"uuid": f"GPU-made-up-{i}", "index": i, "model": "NVIDIA H100 80GB HBM3",
             "memory_mib": 81559, "healthy": True} for i in range(1, 64)]
    sync = {"gpus": [gpu] + fake, "mps": {"healthy": True}, "tasks": []}
    req = urllib.request.Request(f.url + "/agent/v1/sync", method="POST", data=json.dumps(sync).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": f"Bearer {joined['agent_token']}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        answered = r.status
    _, host = f.api("GET", f"/api/v1/hosts/{joined['host_id']}")
    gpus = len(host["host"]["gpus"]) if "host" in host else len(host.get("gpus", []))
    report("an approved host reports 64 made-up H100s", answered == 200 and gpus == 1,
           f"sync answered {answered}; the host has {gpus} GPU(s) of capacity")


def host_network(f, report):
    # ECS's shape, where these fields live.
    status, body = f.api("POST", "/api/v1/task-definitions", {
        "family": "sniffer", "networkMode": "host", "containerDefinitions": [{
            "name": "main", "image": "busybox", "command": ["sleep", "600"], "cpu": 100,
            "memory": 64, "linuxParameters": {"capabilities": {"add": ["NET_RAW"]}}}]})
    assert status == 201, (status, body)
    status, body = f.api("POST", "/api/v1/services", {
        "name": "sniffer", "task_definition": "sniffer:1", "pool": "drill", "desired_count": 1})
    fields = [e["field"] for e in (body or {}).get("errors", [])]
    report("host networking and NET_RAW in a pool that allows neither",
           status == 422 and "task_definition.networkMode" in fields
           and any("capabilities" in x for x in fields),
           f"{status}: {', '.join(fields) or body}")


def server_token_on_command_line(args, work, report):
    cli = subprocess.run(
        [os.path.join(args.bin, "tessera"), "serve", "--join-token", "on-the-command-line",
         "--data-dir", os.path.join(work, "argv-server"), "--bind", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30)
    said = next((line for line in cli.stderr.splitlines() if "command line" in line), cli.stderr.strip()[:200])
    report("a server given the join token on the command line",
           cli.returncode != 0 and "command line" in cli.stderr, f"exit {cli.returncode}: {said.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("TESSERA_BIN_DIR")
                    or os.path.join(drills.ROOT, "target", "debug"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--shared-uid", action="store_true",
                    help="run the agent without --task-uids (all tasks one uid): attack 1 must then get through")
    args = ap.parse_args()
    root = os.geteuid() == 0
    work = tempfile.mkdtemp(prefix="tessera-security-")
    f = drills.Fleet(args.bin, work)
    if root:
        f.agent_args = ["--cgroup-parent", f"tessera-drill-{f.run_id}"]
        if not args.shared_uid:
            f.agent_args += ["--task-uids", UIDS]
    held = []
    failed = []

    def report(attack, ok, detail):
        print(f"{'held' if ok else 'BROKEN':6}  {attack}: {detail}")
        (held if ok else failed).append(attack)

    try:
        f.start_fleet(["a1"] if root else [])
        if root:
            state = os.path.join(work, "a1")
            definition(f, "victim", "echo victim-says-hello; exec sh -c 'while :; do sleep 1; done' victim-marker",
                       secrets={"API_KEY": SECRET})
            # The secret in two halves: the thief's own environment must not match.
            definition(f, "thief", THIEF, env={"SECRET_HEAD": SECRET[:10], "SECRET_TAIL": SECRET[10:],
                                               "STATE_DIR": state})
            definition(f, "escaper", ESCAPER)
            service(f, "victim", "victim")
            f.wait(lambda: f.running("victim") and pids_with("victim-marker"), 60, "the victim to run")
            service(f, "thief", "thief")
            f.wait(lambda: "THIEF-DONE" in task_log(f, "thief"), 60, "the thief to finish looking")
            log = task_log(f, "thief")
            leaks = [line for line in log.splitlines() if line.startswith("LEAK")]
            report("a task reads another's environment and logs, and signals it", not leaks,
                   "; ".join(leaks) or "no secret, log line or signal crossed (each task its own uid)")

            service(f, "escaper", "escaper")
            f.wait(lambda: len(pids_with("escaper-child")) == 2, 60, "the escaper's children")
            before = pids_with("escaper-child")
            status, body = f.api("DELETE", "/api/v1/services/escaper")
            assert status in (200, 202, 204), (status, body)
            f.wait(lambda: not pids_with("escaper-child"), 30, "the escaper's children to die")
            report("a task escapes its stop with setsid and a double fork", True,
                   f"{len(before)} escaped processes {before}, 0 alive after the stop (its cgroup killed)")
            noisy_task(f, report)
        else:
            print("skipped: per-task uids and cgroups need root (run as root for attacks 1, 2 and 5)")
        growing_host(f, report)
        host_network(f, report)

        status, minted = f.api("POST", "/api/v1/join-tokens", {"pool": "drill", "uses": 1})
        assert status == 201, (status, minted)
        first, _ = register(f, minted["token"], "drill", "rogue-1")
        second, answer = register(f, minted["token"], "drill", "rogue-2")
        report("a rogue registration with a used-up token", first == 201 and second == 401,
               f"first use {first}, second {second} ({(answer or {}).get('error')})")
        assert f.api("POST", "/api/v1/pools", {"name": "other"})[0] == 201
        status, scoped = f.api("POST", "/api/v1/join-tokens", {"pool": "other", "uses": 5})
        assert status == 201
        wrong, answer = register(f, scoped["token"], "drill", "rogue-3")
        report("a token for pool other registering in pool drill", wrong == 401,
               f"{wrong} ({(answer or {}).get('error')})")

        cli = subprocess.run(
            [os.path.join(args.bin, "tessera-agent"), "--server", f.url, "--join-token",
             "on-the-command-line", "--state-dir", os.path.join(work, "argv"), "--pool", "drill",
             "--simulate", "1xL4-24GB"], capture_output=True, text=True, timeout=30)
        refused = cli.returncode != 0 and "command line" in cli.stderr
        said = next((line for line in cli.stderr.splitlines() if "command line" in line), cli.stderr.strip()[:200])
        report("an agent given its join token on the command line", refused,
               f"exit {cli.returncode}: {said.strip()}")
        server_token_on_command_line(args, work, report)
    finally:
        f.stop()
        if root:
            # Cgroups of this run, if a failure left any.
            base = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
            for d in (f"{base}/tessera-drill-{f.run_id}",):
                if os.path.isdir(d):
                    subprocess.run(["find", d, "-depth", "-type", "d", "-exec", "rmdir", "{}", ";"],
                                   capture_output=True)
        if args.keep or failed:
            print(f"logs: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(held)} attacks held, {len(failed)} got through")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
