#!/usr/bin/env python3
"""The rolling-upgrade drill on the real binaries of two revisions (built by
scripts/upgrade_drill.sh): a fleet of two servers on one database and three agents, all
running revision A with tasks on every host, is upgraded to B the way
docs/operations.md says: the servers one by one, then the agents one by one, each stopped
as systemd stops it (SIGTERM) and started again from the new binary on the same state.

After every step it prints what runs on this machine (task process groups found in /proc,
not only what the API says): tasks restarted since the start, duplicate processes, syncs
refused and syncs not answered (an agent failing over while its server is replaced), and
the versions the servers and agents say.

    scripts/upgrade_drill.py --from DIR_A --to DIR_B [--postgres URL]

Exits 1 when a task restarted, a process is duplicated, or a sync was refused.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import drills  # noqa: E402

AGENTS = ["a", "b", "c"]
TASKS = 6


class UpgradeFleet(drills.Fleet):
    """A fleet whose processes each run the binaries of one revision."""

    def __init__(self, bins, work, database=None):
        super().__init__(bins["A"], work, database)
        self.bins = bins
        # Which revision each process runs: "server", "server2" and each agent's name.
        self.runs = {}

    def _serve(self, port, log_name):
        which = "server" if log_name == "server.log" else "server2"
        self.bin = self.bins[self.runs.setdefault(which, "A")]
        return super()._serve(port, log_name)

    def start_agent(self, name):
        self.bin = self.bins[self.runs.setdefault(name, "A")]
        super().start_agent(name)

    def setup(self, agents):
        """The fleet, and a definition whose tasks take most of a GPU: one per GPU, so the
        six tasks run on every host (each agent's upgrade has tasks to keep)."""
        self.start_fleet(agents)
        status, body = self.api("POST", "/api/v1/task-definitions", {
            "family": "drill", "containers": [{
                "name": "main", "command": ["sleep", "600"], "cpu_milli": 500, "memory_mib": 64,
                "env": {"DRILL_RUN": self.run_id},
                "gpu": {"mps": {"memory_mib": 16384, "max_compute_percent": 50}}}]})
        assert status == 201, body

    def replace(self, which, rev):
        """Stops `which` as systemd would (SIGTERM, then its unit's ExecStart again) and
        starts it from revision `rev`."""
        self.runs[which] = rev
        if which in ("server", "server2"):
            proc = self.server if which == "server" else self.server2
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            if which == "server":
                self.start_server()
            else:
                self.start_second_server()
        else:
            self.agents[which].send_signal(signal.SIGTERM)
            self.agents[which].wait(timeout=30)
            self.start_agent(which)

    def log_lines(self, pattern):
        """Lines of the agents' logs matching `pattern`."""
        count = 0
        for name in AGENTS:
            path = os.path.join(self.work, f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    count += sum(1 for line in f if re.search(pattern, line))
        return count


def versions(f):
    """(servers' versions, agents' versions) as the cluster view and the hosts say."""
    _, cluster = f.api("GET", "/api/v1/cluster")
    servers = sorted(s.get("version") or "before 0.2" for s in cluster["servers"])
    _, hosts = f.api("GET", "/api/v1/hosts")
    agents = sorted(h.get("agent_version") or "before 0.2" for h in hosts["hosts"])
    return ", ".join(servers), ", ".join(agents)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from", dest="a", required=True, help="folder with revision A's binaries")
    parser.add_argument("--to", dest="b", required=True, help="folder with revision B's binaries")
    parser.add_argument("--postgres", default=None,
                        help="a PostgreSQL server URL (its user may create databases)")
    parser.add_argument("--settle", type=float, default=4.0,
                        help="seconds to watch after each step (default 4)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tessera-upgrade-")
    database = None
    if args.postgres:
        name = "tessera_upgrade_" + uuid.uuid4().hex[:8]
        subprocess.run(["psql", "-q", args.postgres, "-c", f"CREATE DATABASE {name}"], check=True)
        database = args.postgres.rsplit("/", 1)[0] + "/" + name
    f = UpgradeFleet({"A": args.a, "B": args.b}, work, database)
    rows = []
    ok = True
    try:
        for rev, d in (("A", args.a), ("B", args.b)):
            out = subprocess.run([os.path.join(d, "tessera"), "--version"], capture_output=True,
                                 text=True, check=True).stdout.strip()
            print(f"revision {rev}: {out}")
        f.setup(AGENTS)
        f.start_second_server()
        f.service("web", TASKS)
        f.wait(lambda: f.converged("web", TASKS), 60, f"{TASKS} tasks running")
        time.sleep(2)
        before = {t: sorted(g) for t, g in f.processes().items()}
        on_hosts = sorted({t["host"] for t in f.running("web")})
        print(f"{TASKS} tasks running on {len(on_hosts)} hosts ({', '.join(on_hosts)}), "
              f"two servers, one {'PostgreSQL' if database else 'SQLite'} database")

        steps = [("server", "B"), ("server2", "B")] + [(a, "B") for a in AGENTS]
        for which, rev in [("(fleet on A)", None)] + steps:
            if rev:
                f.replace(which, rev)
            time.sleep(args.settle)
            f.wait(lambda: f.converged("web", TASKS), 60, f"{TASKS} tasks running")
            now = {t: sorted(g) for t, g in f.processes().items()}
            restarted = sum(1 for t, g in before.items() if now.get(t) != g)
            refused = f.log_lines(r"sync refused|registration refused")
            unanswered = f.log_lines(r"not answered|server unavailable")
            servers, agents = versions(f)
            step = which if not rev else f"{which} -> {rev}"
            rows.append((step, restarted, f.duplicates(), refused, unanswered, servers, agents))
            print(f"  step {step:<14} tasks restarted {restarted}  duplicates {f.duplicates()}  "
                  f"syncs refused {refused}  syncs not answered {unanswered}  "
                  f"servers [{servers}]  agents [{agents}]", flush=True)
    except Exception as e:  # a step that cannot finish is a failure, with its logs kept
        ok = False
        print(f"drill failed: {e}; logs in {work}", file=sys.stderr)
    finally:
        f.stop()
    print()
    print(f"{'step':<16} {'restarted':>9} {'duplicates':>10} {'refused':>7} {'unanswered':>10}  "
          "servers / agents")
    for step, restarted, dup, refused, unanswered, servers, agents in rows:
        print(f"{step:<16} {restarted:>9} {dup:>10} {refused:>7} {unanswered:>10}  "
              f"{servers} / {agents}")
    if rows:
        last = rows[-1]
        ok = ok and last[1] == 0 and last[2] == 0 and last[3] == 0
        ok = ok and len(rows) == 1 + 2 + len(AGENTS)
    print("upgrade drill:", "PASSED" if ok else "FAILED",
          "(0 tasks restarted, 0 duplicates, 0 syncs refused)" if ok else f"(logs in {work})")
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
