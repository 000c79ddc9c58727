"""On GPUs (issue 23): the rank tests of test_ranks.py with every rank on a GPU — NCCL when each rank
has a GPU of its own, gloo on CUDA tensors when ranks share one (NCCL refuses two ranks on a GPU) —
through one real service, Redis and worker that builds for the GPUs' arch: equal keys on every rank,
one compile job per distinct graph, losses equal to eager's (TF32 off). Skipped without CUDA.

On the GPU machine Redis is not running: start one first (`redis-server --port 6379 --daemonize yes`
from the carried Debian packages, bench/README.md)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.conftest import assert_same_compile_on_every_rank, torchrun

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

WIDTHS = {"ddp": 64, "fsdp": 96, "tp": 128}


@pytest.mark.parametrize("parallel", list(WIDTHS))
def test_every_gpu_rank_gets_the_same_compile(shared_cluster, tmp_path, parallel):
    url, env = shared_cluster
    ranks = 2
    reports = torchrun(dict(env, FXCC_RANKS_DEVICE="cuda"), ranks, parallel, WIDTHS[parallel], tmp_path)
    want = "nccl" if torch.cuda.device_count() >= ranks else "gloo"
    assert {r["backend"] for r in reports} == {want}
    assert all(r["device"].startswith("cuda") for r in reports)
    first = reports[0]["events"]
    assert first and all(e["error"] is None for r in reports for e in r["events"]), [r["events"] for r in reports]
    assert all(e["kernels"] > 0 for e in first)
    assert_same_compile_on_every_rank(url, env, reports)
