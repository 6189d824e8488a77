#!/usr/bin/env python3
"""The GPU check: Tessera's real NVML, MPS and task paths on a machine with NVIDIA GPUs.

    scripts/gpu-check.sh [--bin-dir DIR] [--out DIR] [--time-limit SECONDS] [--fake]

On a machine with one or more NVIDIA GPUs and the driver (no internet needed), in at most
--time-limit seconds (480): takes `tessera` and `tessera-agent` from --bin-dir (or builds
them), compares the agent's NVML view with `nvidia-smi -q -x`, starts a server and a real
agent (no simulation), MPS through the agent (or says exactly why it cannot, and goes on
with the GPUs time-shared), then runs real CUDA tasks (PyTorch) as Tessera tasks and checks
what users of GPU sharing ask for. Every check passes, fails, or says why it was skipped;
`gpu-check.md` and `gpu-check.json` are written to --out. Exit status 1 when a check failed.

It never changes the GPU's settings: no MIG or compute-mode changes, no resets, no clock
changes. It reads (`nvidia-smi -q -x`, NVML) and runs CUDA programs, nothing else.

--fake runs what needs no GPU, as CI does: a stand-in `nvidia-smi` describing the agent's
simulated GPUs, a simulated agent and the stand-in MPS control program. Checks that need
CUDA say they were skipped, never that they passed.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import drills  # noqa: E402  (the fleet helper the drills use)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_SMI = os.path.join(ROOT, "scripts", "fake-nvidia-smi")
SIMULATED = "2xL4-24GB"
HOST = "gpucheck"
POOL = "gpucheck"

# The CUDA programs the tasks run (PyTorch). Each prints one JSON line on stdout.
ALLOCATE = r"""
import json, os, sys, time, torch
mib = int(os.environ["ALLOC_MIB"])
procs = int(os.environ.get("ALLOC_PROCS", "1"))
if procs > 1 and os.fork() == 0:
    os.environ["ALLOC_PROCS"] = "1"
x = None
try:
    x = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print(json.dumps({"allocated_mib": mib}), flush=True)
except RuntimeError as e:
    print(json.dumps({"error": str(e)[:300]}), flush=True)
    # As an application's traceback would: the agent reads it to say "out of memory".
    print(f"{type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(float(os.environ.get("HOLD_SECS", "600")))
"""

THROUGHPUT = r"""
import json, time, torch
a = torch.randn(4096, 4096, device="cuda")
for _ in range(3):
    a @ a
torch.cuda.synchronize()
n, t0 = 0, time.time()
while time.time() - t0 < 8:
    a @ a
    n += 1
    if n % 10 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(json.dumps({"matmuls_per_sec": n / (time.time() - t0)}), flush=True)
time.sleep(600)
"""

OTHER_GPU = r"""
import json, glob, os
# What the task reaches when it ignores what it was given: its own environment dropped.
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
import torch
seen = torch.cuda.device_count()
opened = []
for node in sorted(glob.glob("/dev/nvidia[0-9]*")):
    try:
        open(node, "rb").close()
        opened.append(node)
    except OSError as e:
        pass
other = None
try:
    torch.empty(1, device="cuda:1")
    other = "allocated on cuda:1"
except Exception as e:
    other = "refused: " + str(e)[:200]
print(json.dumps({"devices_seen": seen, "nodes_opened": opened, "cuda1": other}), flush=True)
import time; time.sleep(600)
"""


class Check:
    def __init__(self, name, what):
        self.name = name
        self.what = what
        self.status = "skipped"
        self.detail = "not run"
        self.seconds = 0.0

    def passed(self, detail):
        self.status, self.detail = "passed", detail

    def failed(self, detail):
        self.status, self.detail = "failed", detail

    def skipped(self, detail):
        self.status, self.detail = "skipped", detail


class GpuCheck:
    def __init__(self, args):
        self.args = args
        self.fake = args.fake
        self.deadline = time.time() + args.time_limit
        self.work = tempfile.mkdtemp(prefix="tessera-gpu-check-")
        self.fleet = None
        self.checks = []
        self.facts = {}
        self.mps = True
        self.smi = FAKE_SMI if self.fake else shutil.which("nvidia-smi")
        # Tasks run as uids of their own: their Python must be reachable by any user (not
        # a virtual environment under /root, which is 0700).
        self.python = args.python or "/usr/bin/python3"

    # Running the checks.

    def check(self, name, what, fn, needs_cuda=False):
        c = Check(name, what)
        self.checks.append(c)
        if time.time() > self.deadline:
            c.skipped(f"the time limit ({self.args.time_limit} s) was reached")
            return c
        if needs_cuda and self.fake:
            c.skipped("--fake: no GPU and no CUDA here")
            return c
        if needs_cuda and not self.torch:
            c.skipped(f"PyTorch with CUDA is not importable by {self.python}: {self.torch_why}")
            return c
        t0 = time.time()
        try:
            fn(c)
        except Exception as e:  # a check that cannot finish has failed, saying where
            c.failed(f"{type(e).__name__}: {e}")
        c.seconds = round(time.time() - t0, 1)
        print(f"{c.status:>8}  {name}: {c.detail}", file=sys.stderr, flush=True)
        return c

    def run(self):
        self.bins()
        self.torch, self.torch_why = self.find_torch()
        self.check("nvml-vs-nvidia-smi",
                   "the agent's NVML view (UUID, model, memory, ECC and MIG mode) against nvidia-smi -q -x",
                   self.nvml_vs_smi)
        started = self.check("server-and-agent",
                             "a server and a real agent (no simulation): the host registers with its GPUs",
                             self.server_and_agent)
        if started.status != "passed":
            return
        self.check("mps", "MPS started through the agent, one daemon per GPU",
                   self.mps_started)
        self.check("two-tasks-one-gpu", "two CUDA tasks on one GPU at once",
                   self.two_tasks, needs_cuda=True)
        self.check("measured-memory",
                   "each task's measured GPU memory within 5 % (or 64 MiB) of what it allocated",
                   self.measured_memory, needs_cuda=True)
        self.check("over-budget",
                   "a task allocating past its budget fails or is stopped; its neighbour keeps running",
                   self.over_budget, needs_cuda=True)
        self.check("two-processes-over-budget",
                   "a task of two processes, each within the budget, together over it: stopped",
                   self.two_processes, needs_cuda=True)
        self.check("compute-cap",
                   "a compute-bound kernel's throughput at a 25 % cap against 100 %",
                   self.compute_cap, needs_cuda=True)
        self.check("other-gpu", "a task given one GPU cannot use another",
                   self.other_gpu, needs_cuda=True)
        self.check("whole-gpu", "a whole-GPU task runs alone on its GPU",
                   self.whole_gpu, needs_cuda=True)
        self.check("gpu-health", "the GPUs' health as the agent reads it (Xid, ECC)",
                   self.gpu_health)
        self.check("mps-failed", "the MPS daemon failed for good: the host impaired, its tasks moved off",
                   self.mps_failed)

    # Setup.

    def bins(self):
        if self.args.bin_dir:
            self.bin = os.path.abspath(self.args.bin_dir)
        else:
            subprocess.run(["cargo", "build", "--release", "-p", "tessera-server",
                            "-p", "tessera-agent"], cwd=ROOT, check=True)
            target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
            self.bin = os.path.join(target, "release")
        for b in ("tessera", "tessera-agent"):
            if not os.access(os.path.join(self.bin, b), os.X_OK):
                raise SystemExit(f"{b} is not in {self.bin}: pass --bin-dir, or build it")

    def find_torch(self):
        """Whether the tasks' Python imports PyTorch with a CUDA device (`--python`, else
        the first of the system's Pythons that does)."""
        if self.fake:
            return False, "--fake"
        candidates = [self.args.python] if self.args.python else [
            "/usr/bin/python3", "/usr/local/bin/python3", "/opt/conda/bin/python3",
            shutil.which("python3")]
        why = "no python3 found"
        for python in [c for c in candidates if c and os.access(c, os.X_OK)]:
            probe = subprocess.run(
                [python, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__)"],
                capture_output=True, text=True, timeout=120)
            if probe.returncode == 0:
                self.python = python
                self.facts["torch"] = f"{probe.stdout.strip()} ({python})"
                if not world_reachable(python):
                    return False, f"{python} imports PyTorch but is not reachable by other users (tasks run as uids of their own): pass --python"
                return True, ""
            why = f"{python}: " + (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return False, why

    def agent_args(self):
        if self.fake:
            return ["--simulate", SIMULATED, "--mps-control", drills.FAKE_MPS]
        return [] if self.mps else ["--no-mps"]

    def start(self):
        f = drills.Fleet(self.bin, self.work)
        self.fleet = f
        f.server_args = ["--gpu-budget-grace-secs", "5"]
        f.start_server()
        f.sign_in()
        status, body = f.api("POST", "/api/v1/pools", {"name": POOL, "gpu_budget": "enforce"})
        assert status == 201, body
        self.start_agent()

    def start_agent(self):
        f = self.fleet
        log = open(os.path.join(self.work, "agent.log"), "a")
        env = dict(os.environ, RUST_LOG="info", TESSERA_AGENT_JOIN_TOKEN=drills.JOIN)
        f.agents[HOST] = subprocess.Popen(
            [os.path.join(self.bin, "tessera-agent"), "--server", f.url,
             "--state-dir", os.path.join(self.work, HOST), "--pool", POOL, "--name", HOST]
            + self.agent_args(), stdout=log, stderr=log, env=env)

    def host(self):
        status, body = self.fleet.api("GET", f"/api/v1/hosts/{HOST}")
        return body if status == 200 else None

    # The checks.

    def nvml_vs_smi(self, c):
        if not self.smi:
            c.failed("nvidia-smi is not on PATH")
            return
        probe = subprocess.run(
            [os.path.join(self.bin, "tessera-agent"), "--probe", "--name", HOST]
            + (["--simulate", SIMULATED] if self.fake else []),
            capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            c.failed(f"tessera-agent --probe: {probe.stderr.strip()}")
            return
        nvml = {g["uuid"]: g for g in json.loads(probe.stdout)["gpus"]}
        smi = smi_gpus(subprocess.run([self.smi, "-q", "-x"], capture_output=True,
                                      text=True, timeout=60, check=True).stdout)
        self.facts["gpus"] = [dict(uuid=u, **g) for u, g in smi.items()]
        wrong = []
        if set(nvml) != set(smi):
            wrong.append(f"UUIDs: agent {sorted(nvml)}, nvidia-smi {sorted(smi)}")
        for uuid in sorted(set(nvml) & set(smi)):
            a, s = nvml[uuid], smi[uuid]
            if a["model"] != s["model"]:
                wrong.append(f"{uuid} model: agent {a['model']!r}, nvidia-smi {s['model']!r}")
            if a["memory_total"] != s["memory_mib"]:
                wrong.append(f"{uuid} memory: agent {a['memory_total']} MiB, nvidia-smi {s['memory_mib']} MiB")
            for key in ("ecc", "mig"):
                if a.get(f"{key}_enabled") != s[key]:
                    wrong.append(f"{uuid} {key.upper()} mode: agent {a.get(key + '_enabled')}, nvidia-smi {s[key]}")
        if wrong:
            c.failed("; ".join(wrong))
        else:
            c.passed(f"{len(smi)} GPU(s) agree: " + ", ".join(
                f"{s['model']} {s['memory_mib']} MiB ECC {s['ecc']} MIG {s['mig']}" for s in smi.values()))

    def server_and_agent(self, c):
        self.start()
        self.fleet.wait(lambda: self.host() is not None, 60, "the agent to register")
        self.fleet.wait(lambda: self.host()["status"] in ("active", "impaired"), 30,
                        "the host to report")
        h = self.host()
        how = " (--fake: simulated GPUs)" if self.fake else ""
        c.passed(f"host {HOST} registered with {len(h['gpus'])} GPU(s){how}, status {h['status']}")

    def mps_started(self, c):
        f = self.fleet
        time.sleep(3)
        h = self.host()
        if h["status"] == "active":
            c.passed("every GPU's MPS control daemon answers")
            return
        why = h.get("status_reason") or "no reason given"
        if self.fake:
            c.failed(f"the stand-in MPS daemons did not start: {why}")
            return
        # Why MPS cannot run here, said exactly, then the GPUs time-shared.
        self.mps = False
        f.signal_agent(HOST, drills.signal.SIGTERM)
        f.agents[HOST].wait(timeout=30)
        self.start_agent()
        f.wait(lambda: self.host()["status"] == "active", 60, "the host active without MPS")
        c.skipped(f"MPS cannot run here ({why}); going on with the GPUs time-shared")

    def task_def(self, family, program, env, gpu):
        status, body = self.fleet.api("POST", "/api/v1/task-definitions", {
            "family": family, "containers": [{
                "name": "main", "command": [self.python, "-c", program],
                "cpu_milli": 1000, "memory_mib": 4096, "env": env, "gpu": gpu}]})
        assert status == 201, body
        return f"{family}:{body['revision']}"

    def service(self, name, definition, count=1):
        status, body = self.fleet.api("POST", "/api/v1/services", {
            "name": name, "task_definition": definition, "pool": POOL,
            "desired_count": count, "stop_timeout_secs": 2})
        assert status == 201, body

    def delete(self, name):
        self.fleet.api("DELETE", f"/api/v1/services/{name}")
        self.fleet.wait(lambda: not self.fleet.running(name), 60, f"{name} to stop")

    def output(self, task_id, timeout=90):
        """The first JSON line task `task_id` printed on stdout."""
        path = os.path.join(self.work, HOST, "tasks", task_id, "main.log")
        end = time.time() + timeout
        while time.time() < end:
            try:
                for line in open(path):
                    # Each line starts with the agent's stamp: `2026-11-30T12:00:09.000Z `.
                    line = line.split(" ", 1)[-1]
                    if line.startswith("{"):
                        return json.loads(line)
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"task {task_id} printed nothing in {timeout} s (see {path})")

    def two_tasks(self, c):
        d = self.task_def("alloc", ALLOCATE, {"ALLOC_MIB": "2048"},
                          {"mps": {"memory_mib": 4096, "max_compute_percent": 50}})
        self.service("pair", d, 2)
        self.fleet.wait(lambda: len(self.fleet.running("pair")) == 2, 120, "two tasks running")
        tasks = self.fleet.running("pair")
        outs = [self.output(t["id"]) for t in tasks]
        gpus = {t["allocations"][0]["gpu"] for t in tasks}
        if all("allocated_mib" in o for o in outs) and len(gpus) == 1:
            c.passed(f"both allocated 2048 MiB on {gpus.pop()}")
        else:
            c.failed(f"outputs {outs}, GPUs {sorted(gpus)}")

    def measured_memory(self, c):
        time.sleep(8)
        wrong, seen = [], []
        for t in self.fleet.running("pair"):
            peak = t["measured"].get("gpu_memory_peak")
            seen.append(f"{t['id']}: {peak} MiB")
            if peak is None or abs(peak - 2048) > max(2048 * 0.05, 64):
                wrong.append(f"{t['id']} measured {peak} MiB for 2048 MiB allocated")
        (c.failed if wrong else c.passed)("; ".join(wrong) if wrong else ", ".join(seen))

    def over_budget(self, c):
        d = self.task_def("greedy", ALLOCATE, {"ALLOC_MIB": "3072"},
                          {"mps": {"memory_mib": 2048, "max_compute_percent": 25}})
        self.service("greedy", d)
        self.fleet.wait(lambda: self.stopped("greedy") or self.printed("greedy"), 120,
                        "the greedy task to fail, be stopped or allocate")
        neighbours = len(self.fleet.running("pair"))
        said = [t.get("stop_reason") for t in self.stopped("greedy")]
        printed = self.printed("greedy")
        held = bool(said) or any("error" in o for o in printed)
        self.delete("greedy")
        # Refused by MPS at its pinned limit, the task's stop reason says out of memory;
        # time-shared, Tessera's measure stops it over budget.
        named = any(r and (r.startswith("out of memory") or r.startswith("gpu memory over budget"))
                    for r in said)
        if held and neighbours == 2:
            c.passed(f"refused or stopped ({said or printed}); both neighbours still running"
                     + ("" if named or not said else "; but its stop reason names no memory cause"))
        else:
            c.failed(f"greedy: stopped {said}, printed {printed}; neighbours running: {neighbours}")

    def two_processes(self, c):
        d = self.task_def("twin", ALLOCATE, {"ALLOC_MIB": "1536", "ALLOC_PROCS": "2"},
                          {"mps": {"memory_mib": 2048, "max_compute_percent": 25}})
        self.service("twin", d)
        self.fleet.wait(lambda: self.stopped("twin"), 90, "the twin task to be stopped")
        reason = self.stopped("twin")[0].get("stop_reason") or ""
        self.delete("twin")
        if reason.startswith("gpu memory over budget"):
            c.passed(reason)
        else:
            c.failed(f"stopped with {reason!r}")

    def stopped(self, service):
        _, body = self.fleet.api("GET", f"/api/v1/tasks?service={service}&state=stopped")
        return (body or {}).get("tasks", []) if isinstance(body, dict) else []

    def printed(self, service):
        out = []
        for t in self.fleet.running(service):
            try:
                out.append(self.output(t["id"], timeout=1))
            except RuntimeError:
                pass
        return out

    def compute_cap(self, c):
        self.delete("pair")
        rates = {}
        for cap in (100, 25):
            d = self.task_def(f"spin{cap}", THROUGHPUT, {},
                              {"mps": {"memory_mib": 4096, "max_compute_percent": cap}})
            self.service(f"spin{cap}", d)
            self.fleet.wait(lambda: self.fleet.running(f"spin{cap}"), 120, f"spin{cap} running")
            rates[cap] = self.output(self.fleet.running(f"spin{cap}")[0]["id"], 120)["matmuls_per_sec"]
            self.delete(f"spin{cap}")
        ratio = rates[25] / rates[100]
        detail = f"{rates[25]:.1f} matmuls/s at 25 % against {rates[100]:.1f} at 100 % ({ratio:.2f})"
        if not self.mps:
            c.skipped("no MPS here, so no compute cap: " + detail)
        elif ratio < 0.5:
            c.passed(detail)
        else:
            c.failed(detail)

    def other_gpu(self, c):
        gpus = self.host()["gpus"]
        if len(gpus) < 2:
            c.skipped("one GPU on this machine: no other GPU to try")
            return
        d = self.task_def("thief", OTHER_GPU, {},
                          {"mps": {"memory_mib": 1024, "max_compute_percent": 25}})
        self.service("thief", d)
        self.fleet.wait(lambda: self.fleet.running("thief"), 120, "the thief running")
        t = self.fleet.running("thief")[0]
        out = self.output(t["id"])
        self.delete("thief")
        own = next((g for g in self.facts.get("gpus", []) if g["uuid"] == t["allocations"][0]["gpu"]), {})
        own_node = f"/dev/nvidia{own.get('minor')}"
        detail = (f"without CUDA_VISIBLE_DEVICES it sees {out['devices_seen']} device(s); cuda:1 "
                  f"{out['cuda1']}; GPU nodes it could open: {out['nodes_opened']} (its own: {own_node})")
        if (out["devices_seen"] == 1 and out["cuda1"].startswith("refused")
                and out["nodes_opened"] in ([], [own_node])):
            c.passed(detail)
        else:
            c.failed(detail)

    def whole_gpu(self, c):
        d = self.task_def("whole", ALLOCATE, {"ALLOC_MIB": "1024"}, {"gpus": 1})
        self.service("whole", d)
        self.fleet.wait(lambda: self.fleet.running("whole"), 120, "the whole-GPU task running")
        t = self.fleet.running("whole")[0]
        out = self.output(t["id"])
        gpu = t["allocations"][0]["gpu"]
        _, every = self.fleet.api("GET", f"/api/v1/tasks?host={HOST}&state=running")
        others = [x["id"] for x in every["tasks"]
                  if x["id"] != t["id"] and any(a["gpu"] == gpu for a in x["allocations"])]
        self.delete("whole")
        if "allocated_mib" in out and t["allocations"][0]["dedicated"] and not others:
            c.passed(f"alone on {gpu}")
        else:
            c.failed(f"output {out}, dedicated {t['allocations'][0]['dedicated']}, others {others}")

    def gpu_health(self, c):
        h = self.host()
        health = {g["uuid"]: g["health"] for g in h["gpus"]}
        bad = {u: s for u, s in health.items() if s != "healthy"}
        if bad:
            c.failed(f"the agent reads these GPUs unhealthy: {bad}")
        else:
            c.passed(f"{len(health)} GPU(s) healthy (no critical Xid, no uncorrectable ECC error)")

    def mps_failed(self, c):
        if not self.mps:
            c.skipped("no MPS here")
            return
        f = self.fleet
        d = self.task_def("bystander", "import time; time.sleep(600)", {},
                          {"mps": {"memory_mib": 1024, "max_compute_percent": 10}})
        self.service("bystander", d)
        f.wait(lambda: f.running("bystander"), 120, "a task running")
        gpu = f.running("bystander")[0]["allocations"][0]["gpu"]
        pipe = os.path.join(self.work, HOST, "mps", gpu, "pipe")
        # Somewhere to move to: a simulated host beside this one (it has no real GPU, and
        # the bystander needs none).
        log = open(os.path.join(self.work, "spare.log"), "a")
        env = dict(os.environ, RUST_LOG="warn", TESSERA_AGENT_JOIN_TOKEN=drills.JOIN)
        f.agents["spare"] = subprocess.Popen(
            [os.path.join(self.bin, "tessera-agent"), "--server", f.url,
             "--state-dir", os.path.join(self.work, "spare"), "--pool", POOL, "--name", "spare",
             "--simulate", "1xL4-24GB", "--mps-control", drills.FAKE_MPS],
            stdout=log, stderr=log, env=env)
        f.wait(lambda: f.api("GET", "/api/v1/hosts/spare")[0] == 200, 60, "the spare host")
        # The daemon killed, again whenever the agent restarts it, until the agent gives up
        # (3 restarts in 10 minutes): the daemon has then failed for good.
        end = time.time() + 90
        while time.time() < end and self.host()["status"] != "impaired":
            kill_mps_daemons(pipe, self.fake)
            time.sleep(1)
        moved = lambda: [t for t in f.running("bystander") if t["host"] == "spare"]  # noqa: E731
        try:
            f.wait(lambda: moved() and all(t["host"] == "spare" for t in f.running("bystander")),
                   60, "the task to move")
        except RuntimeError:
            pass
        h = self.host()
        where = sorted(t["host"] for t in f.running("bystander"))
        if h["status"] == "impaired" and where == ["spare"]:
            c.passed(f"host impaired ({h.get('status_reason')}); its task moved to the spare host")
        else:
            c.failed(f"host {h['status']} ({h.get('status_reason')}); the task runs on {where}")

    # The report.

    def report(self):
        os.makedirs(self.args.out, exist_ok=True)
        doc = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "fake": self.fake,
            "mps": self.mps,
            "facts": self.facts,
            "checks": [vars(c) for c in self.checks],
        }
        with open(os.path.join(self.args.out, "gpu-check.json"), "w") as fh:
            json.dump(doc, fh, indent=2)
        lines = [f"# GPU check, {doc['date']}", ""]
        if self.fake:
            lines += ["Run with `--fake` (no GPU): checks that need CUDA were skipped.", ""]
        for g in self.facts.get("gpus", []):
            lines.append(f"- {g['uuid']}: {g['model']}, {g['memory_mib']} MiB, ECC {g['ecc']}, MIG {g['mig']}")
        lines += ["", "| check | result | what it found | s |", "| --- | --- | --- | --- |"]
        for c in self.checks:
            lines.append(f"| {c.name}: {c.what} | {c.status} | {c.detail.replace('|', '/')} | {c.seconds} |")
        with open(os.path.join(self.args.out, "gpu-check.md"), "w") as fh:
            fh.write("\n".join(lines) + "\n")


def world_reachable(path):
    """Whether every directory above `path` lets any user through (o+x)."""
    d = os.path.dirname(os.path.realpath(path))
    while d != "/":
        if not os.stat(d).st_mode & 0o001:
            return False
        d = os.path.dirname(d)
    return True


def smi_gpus(xml_text):
    """Each GPU of `nvidia-smi -q -x` by UUID: model, memory (MiB), ECC and MIG mode
    (True, False, or None where the GPU has no such mode)."""
    def mode(gpu, path):
        v = (gpu.findtext(path) or "N/A").strip()
        return {"Enabled": True, "Disabled": False}.get(v)

    gpus = {}
    for gpu in ET.fromstring(xml_text).findall("gpu"):
        gpus[gpu.findtext("uuid").strip()] = {
            "model": gpu.findtext("product_name").strip(),
            "memory_mib": int(gpu.findtext("fb_memory_usage/total").split()[0]),
            "ecc": mode(gpu, "ecc_mode/current_ecc"),
            "mig": mode(gpu, "mig_mode/current_mig"),
            "minor": (gpu.findtext("minor_number") or "").strip(),
        }
    return gpus


def kill_mps_daemons(pipe, fake):
    """Kills the MPS control daemon serving `pipe` (the stand-in's by its pid file)."""
    if fake:
        try:
            os.kill(int(open(os.path.join(pipe, "fake-daemon.pid")).read()), drills.signal.SIGKILL)
        except (OSError, ValueError):
            pass
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{entry}/environ", "rb").read()
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"nvidia-cuda-mps-control") and pipe.encode() in env:
            try:
                os.kill(int(entry), drills.signal.SIGKILL)
            except OSError:
                pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin-dir", help="a folder with tessera and tessera-agent (default: build them)")
    p.add_argument("--out", default="gpu-check-report", help="where the reports go")
    p.add_argument("--time-limit", type=int, default=480, help="seconds, 480 by default")
    p.add_argument("--fake", action="store_true", help="no GPU: stand-ins, as CI runs it")
    p.add_argument("--python", help="the Python (with PyTorch) tasks run: reachable by any user")
    args = p.parse_args()
    if args.time_limit <= 0:
        p.error(f"--time-limit must be a number of seconds above 0, got {args.time_limit}")
    g = GpuCheck(args)
    try:
        g.run()
    finally:
        if g.fleet:
            g.fleet.stop()
        g.report()
    failed = [c.name for c in g.checks if c.status == "failed"]
    print(f"{len(g.checks)} checks: {len(failed)} failed {failed}; report in {args.out}; logs in {g.work}",
          file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
