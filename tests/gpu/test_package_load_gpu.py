"""On a GPU: a Dynamo package loaded in a new process (client/package_load.py's PackageLoad) has its
plans built, its cubins loaded into the device's context and its cuDNN / cuBLAS first calls made on
its side thread, on the caller's CUDA device, before the first call; that first call runs without
tracing, loads no module, and equals eager. Skipped without CUDA.

Child processes with the package cache on (FXCC_DYNAMO_CACHE=1; the test process has it off,
tests/conftest.py): one traces, compiles in-process and saves; the next loads."""

from __future__ import annotations

import json
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


def _child(phase: str, env: dict[str, str]) -> dict:
    p = subprocess.run([sys.executable, "-c", f"from tests.gpu.test_package_load_gpu import check; check({phase!r})"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_loaded_package_is_warmed_on_its_side_thread_and_its_first_call_equals_eager(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_CACHE_DIR=str(tmp_path / "cache"), FXCC_PACKAGE_KEY_FILE=str(tmp_path / "keys" / "package.key"),
               FXCC_DYNAMO_CACHE="1", FXCC_FALLBACK="error")
    env.pop("TRITON_INTERPRET", None)
    saved = _child("save", env)
    assert saved["traced"] == 1 and saved["counters"]["saved"] == 1
    loaded = _child("load", env)
    assert loaded["traced"] == 0 and loaded["counters"] == {"hits": 1}
    assert loaded["side_device"] == loaded["device"]  # the side thread ran on the caller's device
    assert loaded["cubins"] == loaded["kernels"] > 0 and loaded["preloaded"] == loaded["kernels"]
    assert loaded["loaded_before_call"]  # every cubin in the device's context before the first call
    assert loaded["modules_loaded_by_call"] == 0 and loaded["jit_fallbacks"] == 0
    assert loaded["library_calls"] >= 3  # two convolutions and the linear layer's addmm
    # the package recorded them when it was saved: they started before the artifact was fetched
    assert loaded["timings"]["recorded_calls"] == loaded["library_calls"]
    for name in ("ready_wait_s", "plans_s", "ready_s", "warm_s"):
        assert name in loaded["timings"], name


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(16, 4))

    def forward(self, x):
        return self.body(x).softmax(-1)


def check(phase: str) -> None:
    """The child's part: `save` traces and saves the package, `load` loads it (prints one JSON line)."""
    import torch._dynamo.utils as dynamo_utils

    from fxcc.client import backend, cuda_loader, dynamo_cache
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    device = torch.device("cuda", torch.cuda.device_count() - 1)  # the last GPU: not the default one where there are two
    torch.cuda.set_device(device)
    model = Net().to(device).eval()
    x = torch.randn(8, 3, 32, 32, device=device)
    with torch.no_grad():
        want = model(x)
    out: dict = {"device": device.index}
    if phase == "save":
        with torch.no_grad():
            got = torch.compile(model, backend="fxcc")(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        out.update(traced=dynamo_utils.counters["frames"]["ok"], counters=dynamo_cache.counters())
        print(json.dumps(out))
        return
    devices: list[int] = []
    plan = dynamo_cache.BackendArtifact.plan

    def recording(self, *args, **kwargs):
        devices.append(torch.cuda.current_device())
        return plan(self, *args, **kwargs)

    dynamo_cache.BackendArtifact.plan = recording
    compiled = torch.compile(model, backend="fxcc")
    load = dynamo_cache._state.last_load
    assert load is not None and load.thread is not None and load.thread.name == "fxcc-package-load"
    load.join()  # the warm-up done (the first call would wait for it)
    cache = LocalCache(ClientSettings.from_env().cache_dir)
    (event,) = backend.events()
    art = cache.get(event.key)
    arch = f"sm_{torch.cuda.get_device_capability(device)[0]}{torch.cuda.get_device_capability(device)[1]}"
    digests = [k.binaries[arch].digest for k in art.manifest.kernels]
    loaded_before = all(cuda_loader.is_loaded(d, device.index) for d in digests)
    modules, fallbacks = cuda_loader.stats.modules_loaded, cuda_loader.stats.jit_fallbacks
    with torch.no_grad():
        got = compiled(x)
    torch.cuda.synchronize(device)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    timings = dynamo_cache.load_timings()
    out.update(traced=dynamo_utils.counters["frames"]["ok"], counters=dynamo_cache.counters(),
               side_device=devices[0] if devices else None,
               kernels=len(set(digests)),
               cubins=int(timings["cubins"]), preloaded=cuda_loader.stats.preloaded,
               library_calls=int(timings["library_calls"]), loaded_before_call=loaded_before,
               modules_loaded_by_call=cuda_loader.stats.modules_loaded - modules,
               jit_fallbacks=cuda_loader.stats.jit_fallbacks - fallbacks, timings=timings)
    print(json.dumps(out))
