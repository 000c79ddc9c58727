"""On a GPU: a compiled callable loaded as a Dynamo package loads it (FxccCompiled's deserialization)
starts its plan's cuDNN / cuBLAS calls on a side thread (client/prewarm.py), its first call waits for
them and returns what the original returns. Skipped without CUDA.

The check runs in a child process with the Dynamo package cache on (FXCC_DYNAMO_CACHE=1): only then
does Dynamo name its graphs for a package, which is what records a compiled callable to serialize;
the test process has the cache off (tests/conftest.py), and turning it on there would last for every
later test of the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_a_loaded_plan_makes_its_library_calls_on_a_thread_before_its_first_call(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_CACHE_DIR=str(tmp_path / "cache"), FXCC_DYNAMO_CACHE="1")
    p = subprocess.run([sys.executable, "-c", "from tests.gpu.test_prewarm_gpu import check; check()"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0 and "prewarm checked" in p.stdout, p.stdout[-4000:] + p.stderr[-4000:]


def check() -> None:
    """The child's check (FXCC_DYNAMO_CACHE=1, a fresh cache, no service, TF32 off)."""
    from torch import nn

    from fxcc.client import dynamo_cache, prewarm
    from fxcc.client.dynamo_cache import FxccCompiled

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 4)).cuda().eval()
    x = torch.randn(8, 3, 32, 32, device="cuda")
    compiled = torch.compile(model, backend="fxcc")
    with torch.no_grad():
        want = model(x)
        compiled(x)
    made = list(dynamo_cache._state.compiled.values())[-1]
    assert made.state["input_layouts"] and len(made.state["input_layouts"]) == made.state["inputs"]
    args: list = []
    run = made.fn

    def recording(*a):
        args.append(a)
        return run(*a)

    made.fn = recording
    with torch.no_grad():
        compiled(x)
    assert args, "the second call ran the same compiled callable"

    before = dict(prewarm.stats)
    loaded = FxccCompiled.deserialize_compile_artifacts(FxccCompiled.serialize_compile_artifacts(made))
    assert prewarm.stats["started"] == before["started"] + 1
    with torch.no_grad():
        (got,) = loaded(*args[0])
    assert prewarm.stats["failed"] == before["failed"]
    assert prewarm.stats["calls"] >= before["calls"] + 3  # two convolutions and the linear layer's addmm
    assert loaded.fn.__name__ != "first_call" and not prewarm._threads  # waited once, then the plan itself
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    print("prewarm checked")
