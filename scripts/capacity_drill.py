#!/usr/bin/env python3
"""Capacity drill on the real binaries against a local AWS endpoint (`moto_server`):
`tessera serve` with pool `drill` made by an AWS Auto Scaling group (the `aws-asg`
provider, through the AWS SDK), and this script playing EC2: every instance the group
launches boots for BOOT seconds, then a `tessera-agent` (simulated 2 x L4, the stand-in
MPS control program) joins as it with `--provider-id <instance id>`; an instance the
group terminates takes its agent and the agent's tasks with it.

 1. a pool of 2 hosts (the group's first 2 instances, adopted as the pool's machines);
 2. a service needing 3 more hosts' worth of GPU memory: the group scales out, and every
    task runs within BOOT + 10 s (printed), no machine asked for twice;
 3. one host's MPS daemon failed for good: the host is impaired, its tasks move
    start-before-stop (onto a new instance asked for first: the pool is full), then its
    instance is terminated and the host deregistered; the service never below its count;
 4. scaled to 0 tasks: the pool returns to min_hosts within the scale-in cooldown plus
    the drain (printed);
 5. throughout: 0 instances terminated while running tasks, 0 tasks lost.

    scripts/capacity_drill.py [--bin DIR] [--json] [--keep]

Prints a table (and JSON with --json); exits 1 when a figure is not what it must be; logs
stay in the temporary directory on failure.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import drills  # noqa: E402

GROUP = "drill-gpu"
BOOT = 5  # seconds an instance takes to boot before its agent starts
SCALE_IN = 10  # the provider's scale-in cooldown
REPAIR = 5  # the provider's repair delay
STOP_TIMEOUT = 2  # the service's stop timeout (the drain of a task)
TASKS = 30  # 7 GiB tasks, 6 to a host of 2 x 24 GiB: 5 hosts


def moto(work):
    port = drills.free_port()
    log = open(os.path.join(work, "moto.log"), "a")
    proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 30
    while time.time() < end:
        try:
            import urllib.request
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto_server did not answer")


class Ec2(threading.Thread):
    """Plays the machines: an agent per instance of the group, BOOT s after it appears;
    an instance that leaves the group takes its agent (and the agent's tasks) down, and
    whether it still ran tasks then is counted."""

    def __init__(self, fleet, asg):
        super().__init__(daemon=True)
        self.f = fleet
        self.asg = asg
        self.seen = {}  # instance id -> when it appeared
        self.started = {}  # instance id -> agent name
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.terminated_busy = 0
        self.terminated = 0
        self.most_desired = 0
        self.errors = []

    def group(self):
        return self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]

    def run(self):
        while not self.stop_flag.is_set():
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001  (kept and shown: the drill fails on it)
                self.errors.append(repr(e))
            time.sleep(0.3)

    def tick(self):
        g = self.group()
        with self.lock:
            self.most_desired = max(self.most_desired, g["DesiredCapacity"])
            live = {i["InstanceId"] for i in g["Instances"]
                    if not i["LifecycleState"].startswith("Terminat")}
            now = time.time()
            for i in live - set(self.seen):
                self.seen[i] = now
            for i, since in self.seen.items():
                if i in live and i not in self.started and now - since >= BOOT:
                    self.started[i] = self.f.boot(i)
            for i in [i for i in self.started if i not in live]:
                name = self.started.pop(i)
                self.seen.pop(i, None)
                busy = self.f.agent_tasks(name)
                self.terminated += 1
                self.terminated_busy += 1 if busy else 0
                self.f.power_off(name)

    def agents(self):
        with self.lock:
            return dict(self.started)


class CapacityFleet(drills.Fleet):
    def boot(self, instance):
        """Instance `instance` has booted: its agent starts and joins as it."""
        name = "h-" + instance[-8:]
        log = open(os.path.join(self.work, f"{name}.log"), "a")
        env = dict(os.environ, RUST_LOG="warn", TESSERA_AGENT_JOIN_TOKEN=drills.JOIN)
        self.agents[name] = subprocess.Popen(
            [os.path.join(self.bin, "tessera-agent"), "--server", self.url,
             "--state-dir", os.path.join(self.work, name),
             "--pool", "drill", "--name", name, "--simulate", "2xL4-24GB",
             "--mps-control", drills.FAKE_MPS, "--cpu-milli", "32000", "--memory-mib", "65536",
             "--provider-id", instance],
            stdout=log, stderr=log, env=env)
        return name

    def agent_tasks(self, name):
        """Task processes agent `name` started that still run."""
        agent = self.agents.get(name)
        if agent is None or agent.poll() is not None:
            return 0
        count = 0
        for pid, _, _, _ in self._scan():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == agent.pid:
                count += 1
        return count

    def power_off(self, name):
        """The instance is gone: its agent and every process it started, at once."""
        agent = self.agents.pop(name, None)
        if agent is None:
            return
        children = [pid for pid, _, _, _ in self._scan()
                    if _ppid(pid) == agent.pid]
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        for pid in children:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def hosts(self):
        return [h for h in self.api("GET", "/api/v1/hosts")[1]["hosts"] if h["pool"] == "drill"]

    def lost_tasks(self):
        """Stopped tasks of the service that were not stopped on purpose."""
        _, body = self.api("GET", "/api/v1/tasks?service=batch&state=stopped&limit=10000")
        fine = ("scaled down", "moved: its replacement runs elsewhere")
        return [t for t in body["tasks"] if not (t.get("stop_reason") or "").startswith(fine)]


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rfind(")") + 2:].split()[1])
    except (OSError, ValueError):
        return -1


class Drill:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.results = []
        self.failed = []
        self.moto, self.aws_url = moto(work)
        import boto3  # moto[server] brings it
        self.asg = boto3.client("autoscaling", endpoint_url=self.aws_url, region_name="us-east-1",
                                aws_access_key_id="testing", aws_secret_access_key="testing")
        os.environ.update(AWS_ENDPOINT_URL=self.aws_url, AWS_ACCESS_KEY_ID="testing",
                          AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1",
                          AWS_EC2_METADATA_DISABLED="true")
        self.f = CapacityFleet(args.bin, work)
        self.ec2 = Ec2(self.f, self.asg)

    def figure(self, what, value, want, ok):
        self.results.append((what, value, want, "ok" if ok else "FAILED"))
        if not ok:
            self.failed.append(what)
        print(f"  {what}: {value} ({want})", flush=True)

    def running(self):
        return len(self.f.running("batch"))

    def setup(self):
        self.asg.create_launch_configuration(LaunchConfigurationName="drill-lc",
                                             ImageId="ami-12c6146b", InstanceType="g6.12xlarge")
        self.asg.create_auto_scaling_group(
            AutoScalingGroupName=GROUP, LaunchConfigurationName="drill-lc", MinSize=0,
            MaxSize=8, DesiredCapacity=2, AvailabilityZones=["us-east-1a"])
        self.f.start_server()
        self.f.sign_in()
        status, body = self.f.api("POST", "/api/v1/pools", {"name": "drill", "provider": {
            "kind": "aws-asg", "group": GROUP, "region": "us-east-1", "min_hosts": 2,
            "max_hosts": 7, "scale_out_cooldown_secs": 0, "scale_in_cooldown_secs": SCALE_IN,
            "boot_timeout_secs": 60, "repair_delay_secs": REPAIR}})
        assert status == 201, body
        status, body = self.f.api("POST", "/api/v1/task-definitions", {
            "family": "batch", "containers": [{
                "name": "main", "command": ["sleep", "600"], "cpu_milli": 500, "memory_mib": 64,
                "env": {"DRILL_RUN": self.f.run_id},
                "gpu": {"mps": {"memory_mib": 7168, "max_compute_percent": 20}}}]})
        assert status == 201, body
        self.ec2.start()
        self.f.wait(lambda: len([h for h in self.f.hosts() if h["status"] == "active"]) == 2,
                    60, "the group's first 2 instances to join")
        self.figure("pool ready: hosts (the group's first instances)", len(self.f.hosts()), "2",
                    len(self.f.hosts()) == 2)

    def scale_out(self):
        t0 = time.time()
        status, body = self.f.api("POST", "/api/v1/services", {
            "name": "batch", "task_definition": "batch:1", "pool": "drill",
            "desired_count": TASKS, "stop_timeout_secs": STOP_TIMEOUT})
        assert status == 201, body
        self.f.wait(lambda: self.running() == TASKS, 120, f"{TASKS} tasks running")
        took = time.time() - t0
        hosts = len(self.f.hosts())
        self.figure("scale-out: seconds until every task runs", round(took, 1),
                    f"<= boot {BOOT} s + 10", took <= BOOT + 10)
        self.figure("scale-out: hosts", hosts, "5", hosts == 5)
        self.figure("scale-out: most desired capacity asked", self.ec2.most_desired, "5",
                    self.ec2.most_desired == 5)

    def replace(self):
        victim = self.f.running("batch")[0]["host"]
        gpu = next(t["allocations"][0]["gpu"] for t in self.f.running("batch")
                   if t["host"] == victim)
        instance = next(h.get("provider_id") for h in self.f.hosts() if h["id"] == victim)
        pipe = os.path.join(self.work, victim, "mps", gpu, "pipe")
        pid = int(open(os.path.join(pipe, "fake-daemon.pid")).read().strip())
        open(os.path.join(pipe, "broken"), "w").close()
        t0 = time.time()
        os.kill(pid, signal.SIGKILL)
        fewest = TASKS

        def done():
            nonlocal fewest
            fewest = min(fewest, self.running())
            hosts = self.f.hosts()
            group = {i["InstanceId"] for i in self.ec2.group()["Instances"]}
            return (all(h["id"] != victim for h in hosts) and instance not in group
                    and self.running() == TASKS)

        self.f.wait(done, 180, f"host {victim} replaced")
        took = time.time() - t0
        # A new instance asked for first (the pool is full), booted, the tasks moved onto
        # it, then the repair delay: within those plus 15 s of passes and syncs.
        bound = REPAIR + BOOT + 15
        self.figure(f"replace {victim} (MPS failed for good): seconds until terminated",
                    round(took, 1), f"<= repair {REPAIR} + boot {BOOT} + 15", took <= bound)
        self.figure("replace: fewest tasks running meanwhile", fewest, f"{TASKS}", fewest == TASKS)

    def scale_in(self):
        t0 = time.time()
        self.f.api("PATCH", "/api/v1/services/batch", {"desired_count": 0})

        def back():
            g = self.ec2.group()
            return len(self.f.hosts()) == 2 and g["DesiredCapacity"] == 2 and len(g["Instances"]) == 2

        self.f.wait(back, 120, "the pool back to min_hosts")
        took = time.time() - t0
        self.figure("scale-in to 0 tasks: seconds until the pool has min_hosts (2)",
                    round(took, 1), f"<= cooldown {SCALE_IN} + drain {STOP_TIMEOUT} + 10",
                    took <= SCALE_IN + STOP_TIMEOUT + 10)

    def totals(self):
        # The machines' player sees the last terminations at its next look.
        self.f.wait(lambda: len(self.ec2.agents()) == 2, 10, "the terminated instances' agents gone")
        self.figure("instances terminated", self.ec2.terminated, "4 (3 scale-in, 1 replaced)",
                    self.ec2.terminated == 4)
        self.figure("instances terminated while running tasks", self.ec2.terminated_busy, "0",
                    self.ec2.terminated_busy == 0)
        lost = self.f.lost_tasks()
        self.figure("tasks lost", len(lost), "0", not lost)
        self.figure("errors playing the machines", len(self.ec2.errors), "0",
                    not self.ec2.errors)
        for e in self.ec2.errors[:5]:
            print("   ", e)

    def run(self):
        try:
            self.setup()
            self.scale_out()
            self.replace()
            self.scale_in()
            self.totals()
        finally:
            self.ec2.stop_flag.set()
            self.ec2.join(5)
            for name in list(self.f.agents):
                self.f.power_off(name)
            self.f.stop()
            self.moto.kill()
            self.moto.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("TESSERA_BIN_DIR") or os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.join(drills.ROOT, "target")), "debug"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tessera-capacity-")
    d = Drill(args, work)
    try:
        d.run()
    except Exception as e:  # noqa: BLE001
        d.failed.append(repr(e))
        print(f"drill failed: {e!r}", flush=True)
    print()
    print(f"{'figure':<70} {'value':>8}  {'must be':<28} verdict")
    for what, value, want, verdict in d.results:
        print(f"{what:<70} {value!s:>8}  {want:<28} {verdict}")
    if args.json:
        print(json.dumps([dict(zip(("figure", "value", "must_be", "verdict"), r))
                          for r in d.results], indent=2))
    if d.failed:
        print(f"\nFAILED: {', '.join(d.failed)}; logs in {work}")
        sys.exit(1)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print("\ncapacity drill passed")


if __name__ == "__main__":
    main()
