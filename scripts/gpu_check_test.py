#!/usr/bin/env python3
"""The GPU check's parts that need no GPU, as CI runs them: `scripts/gpu-check.sh --fake`
(a stand-in nvidia-smi, a simulated agent and the stand-in MPS control program) passes
every check it can run and skips, never passes, the ones that need CUDA; a disagreement
between NVML and nvidia-smi fails the check and the run; bad arguments are refused.

    TESSERA_BIN_DIR=target/debug scripts/gpu_check_test.py
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ["TESSERA_BIN_DIR"]
CUDA = {"two-tasks-one-gpu", "measured-memory", "over-budget", "two-processes-over-budget",
        "compute-cap", "other-gpu", "whole-gpu"}


def run(*args, env=None):
    out = tempfile.mkdtemp(prefix="tessera-gpu-check-test-")
    p = subprocess.run([os.path.join(ROOT, "scripts", "gpu-check.sh"), "--fake", "--bin-dir", BIN,
                        "--out", out, *args], capture_output=True, text=True,
                       env=dict(os.environ, **(env or {})), timeout=300)
    report = None
    if os.path.exists(os.path.join(out, "gpu-check.json")):
        report = json.load(open(os.path.join(out, "gpu-check.json")))
        assert os.path.exists(os.path.join(out, "gpu-check.md")), "the Markdown report"
    return p, report


def main():
    p, report = run()
    assert p.returncode == 0, p.stderr
    status = {c["name"]: c for c in report["checks"]}
    for name, c in status.items():
        if name in CUDA:
            assert c["status"] == "skipped" and "--fake" in c["detail"], c
        else:
            assert c["status"] == "passed", c
    assert len(status) == 12, sorted(status)
    print("--fake: every check without CUDA passed, every CUDA check skipped")

    p, report = run(env={"FAKE_SMI_MEMORY_MIB": "16384"})
    assert p.returncode == 1, p.stderr
    nvml = next(c for c in report["checks"] if c["name"] == "nvml-vs-nvidia-smi")
    assert nvml["status"] == "failed", nvml
    assert "memory: agent 24576 MiB, nvidia-smi 16384 MiB" in nvml["detail"], nvml
    print("a disagreement on memory fails the run:", nvml["detail"][:80])

    p, _ = run("--time-limit", "0")
    assert p.returncode == 2 and "--time-limit must be" in p.stderr, p.stderr
    print("a time limit of 0 is refused")


if __name__ == "__main__":
    sys.exit(main())
