#!/usr/bin/env python3
"""The work check's parts that need no GPU, as CI runs them: `scripts/gpu-work.sh --fake`
(a simulated agent, a few milliseconds of arithmetic for a model) serves every
configuration through Tessera, reads the completed work and p99 from Tessera's work figures
and writes the table; bad arguments are refused.

    TESSERA_BIN_DIR=target/debug scripts/gpu_work_test.py
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ["TESSERA_BIN_DIR"]


def run(*args):
    out = tempfile.mkdtemp(prefix="tessera-gpu-work-test-")
    p = subprocess.run([os.path.join(ROOT, "scripts", "gpu-work.sh"), "--fake", "--bin-dir", BIN,
                        "--out", out, *args], capture_output=True, text=True, timeout=600)
    return p, out


def main():
    p, out = run("--counts", "1,2", "--seconds", "6", "--p99-ms", "1000")
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.load(open(os.path.join(out, "gpu-work.json")))
    rows = {r["configuration"]: r for r in report["rows"]}
    assert sorted(rows) == ["1 under MPS", "2 under MPS", "whole GPU"], sorted(rows)
    for name, r in rows.items():
        assert r["completed_per_sec"] > 0, (name, r)
        assert r["gpus"] == 1, (name, r)
        assert r["p99_ms"] is not None, (name, r)
        assert r["requests_failed"] == 0, (name, r)
    assert rows["2 under MPS"]["tasks"] == 2
    table = open(os.path.join(out, "gpu-work.md")).read()
    assert "| 2 under MPS | 2 | 1 |" in table, table
    print("--fake: each configuration served through Tessera, its work read back:",
          {n: r["completed_per_sec"] for n, r in rows.items()})

    for bad, said in ((["--counts", "0"], "--counts: each between 1 and 48"),
                      (["--counts", "two"], "--counts: whole numbers"),
                      (["--seconds", "1"], "--seconds: at least 5")):
        p, _ = run(*bad)
        assert p.returncode == 2 and said in p.stderr, (bad, p.stderr)
    print("bad arguments are refused, naming what was wrong")


if __name__ == "__main__":
    sys.exit(main())
