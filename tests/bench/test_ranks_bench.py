"""bench.ranks end to end on the CPU (--smoke, fxcc only: Inductor's CPU compile takes minutes here):
a torchrun job of 2 gloo ranks through the bench's own cluster (redis-server, `fxcc serve`, CPU
workers), cold then warm. Every rank reports its first step and a loss equal to eager's; the cold job
compiled each distinct graph once for both ranks, and the warm job's ranks got every graph from the
cluster with nothing compiled again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")]

REPO = Path(__file__).parents[2]


def test_the_ranks_bench_times_every_rank_cold_and_warm(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-m", "bench.ranks", "--smoke", "--compilers", "fxcc", "--workers", "1",
                        "--out", str(tmp_path), "--tag", "cpu"], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    (row,) = json.loads((tmp_path / "cpu-ranks.json").read_text())["rows"]
    assert row["ranks"] == 2 and row["backend"] == "gloo"
    # cold: a rank gets a graph compiled for it, or (asking after the other rank's job finished) a hit
    for run, sources in (("fxcc_cold", {"remote-compiled", "remote-hit"}), ("fxcc_warm", {"remote-hit"})):
        job = row[run]
        assert "error" not in job, job
        assert [r["rank"] for r in job["ranks"]] == [0, 1]
        assert job["losses_match"] and all(r["losses_match"] for r in job["ranks"])
        assert all(r["first_step_s"] > 0 for r in job["ranks"])
        assert row[f"{run}_s"] == max(r["first_step_s"] for r in job["ranks"])
        assert all(set(r["sources"]) <= sources for r in job["ranks"]), [r["sources"] for r in job["ranks"]]
    assert any("remote-compiled" in r["sources"] for r in row["fxcc_cold"]["ranks"])
    graphs = row["fxcc_cold"]["ranks"][0]["graphs"]
    assert graphs >= 2  # forward and backward at least (DDPOptimizer may split more)
    assert row["cluster"]["compile_jobs"] == graphs  # once for both ranks, and never again when warm
