"""On a GPU: kernels run from prebuilt cubins (no Triton compile) and match eager.

Skipped where torch sees no CUDA device. FXCC_PREBUILT_DIR may point at an artifact store built
on another machine (another Triton version) by `python -m bench.prebuild`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from bench.handmade import cos_sin_artifact, cos_sin_request
from fxcc.client import cuda_loader
from fxcc.client.runtime import cuda_arch_key, load_plan
from fxcc.compiler_core.artifact import load_artifact
from fxcc.compiler_core.build import build_artifact

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def _arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def _built(n: int, dtype: str = "float32"):  # type: ignore[no-untyped-def]
    request = cos_sin_request(n, dtype, arch=_arch())
    return build_artifact(cos_sin_artifact(request), request, _arch())


def _ref(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(torch.sin(x.double())).to(x.dtype)


@pytest.mark.parametrize("n", [(1 << 20) + 3, 1 << 20, 17])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cubin_matches_eager(n, dtype):
    art = _built(n, dtype)
    ref = art.manifest.kernels[0].binaries[cuda_arch_key()]
    fallbacks = cuda_loader.stats.jit_fallbacks
    runner = load_plan(art)
    x = torch.randn(n, device="cuda").to(getattr(torch, dtype))
    (out,) = runner([x])
    torch.cuda.synchronize()
    tol = 1e-6 if dtype == "float32" else 1e-2
    torch.testing.assert_close(out, _ref(x), rtol=tol, atol=tol)
    assert cuda_loader.is_loaded(ref.digest, x.device.index)  # ran from the cubin
    assert cuda_loader.stats.jit_fallbacks == fallbacks


def test_unaligned_pointer_falls_back_to_source_and_stays_correct():
    n = 4099
    runner = load_plan(_built(n))
    fallbacks = cuda_loader.stats.jit_fallbacks
    x = torch.randn(n + 1, device="cuda")[1:]  # 4-byte offset: the build assumed 16-byte alignment
    (out,) = runner([x])
    torch.cuda.synchronize()
    torch.testing.assert_close(out, _ref(x), rtol=1e-6, atol=1e-6)
    assert cuda_loader.stats.jit_fallbacks == fallbacks + 1
    y = torch.randn(n, device="cuda")  # aligned again: back on the cubin
    (out,) = runner([y])
    torch.testing.assert_close(out, _ref(y), rtol=1e-6, atol=1e-6)


def test_launch_from_a_fresh_thread_and_a_side_stream():
    n = 1 << 16
    runner = load_plan(_built(n))
    x = torch.randn(n, device="cuda")
    got: list[torch.Tensor] = []
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()  # x is ready before the side stream reads it

    def work() -> None:
        with torch.cuda.stream(stream):
            got.append(runner([x])[0])
        stream.synchronize()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    torch.testing.assert_close(got[0], _ref(x), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not os.environ.get("FXCC_PREBUILT_DIR"), reason="FXCC_PREBUILT_DIR is not set")
def test_cubins_built_on_another_machine_run_here():
    root = Path(os.environ["FXCC_PREBUILT_DIR"])
    keys = sorted(p.stem for p in (root / "manifests").glob("*.json"))
    assert keys
    for key in keys:
        art = load_artifact(root, key)
        assert art is not None
        spec = art.manifest.plan.inputs
        assert spec == ["arg0_1"]
        n = next(s.spec.sizes[0] for s in art.manifest.plan.steps if s.kind == "alloc")
        x = torch.randn(n, device="cuda")
        (out,) = load_plan(art)([x])
        torch.testing.assert_close(out, _ref(x), rtol=1e-6, atol=1e-6)
        assert cuda_loader.is_loaded(art.manifest.kernels[0].binaries["sm_90"].digest, x.device.index)


@pytest.mark.parametrize("index", [0, 1, 2], ids=["cos_sin", "bias_gelu_ln", "transformer_block"])
def test_seed_workloads_through_torch_compile_match_eager(index, tmp_path, monkeypatch, no_tf32):
    from fxcc.client import backend
    from fxcc.client.backend import fxcc_backend
    from fxcc.client.examples import seed_workloads

    monkeypatch.setenv("FXCC_CACHE_DIR", str(tmp_path))
    for k in ("FXCC_URL", "FXCC_FALLBACK"):
        monkeypatch.delenv(k, raising=False)
    torch._dynamo.reset()
    backend.clear_events()
    try:
        w = seed_workloads("cuda", small=True)[index]
        with torch.no_grad():
            expected = w.fn(*w.inputs)
            got = torch.compile(w.fn, backend=fxcc_backend)(*w.inputs)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    evs = backend.events()
    assert evs and all(e.source != "fallback" for e in evs), [e.error for e in evs]
    arch = cuda_arch_key()
    for e in evs:  # every kernel came with a cubin, and each ran from it
        art = load_artifact(tmp_path / "artifacts", e.key)
        assert art is not None
        for k in art.manifest.kernels:
            assert arch in k.binaries, k.metadata.get(f"{arch}.error")
            assert cuda_loader.is_loaded(k.binaries[arch].digest, got.device.index)


def test_preload_loads_each_cubin_once_before_its_first_launch_from_a_side_thread():
    from fxcc.client.runtime import plan_cubins

    n = 1 << 12
    art = _built(n)
    (kernel,) = plan_cubins(art)  # the process-wide kernel a plan of this artifact launches
    ref = art.manifest.kernels[0].binaries[cuda_arch_key()]
    assert kernel is cuda_loader.cubin_kernel(ref.digest, art.blobs[ref.digest], kernel.meta)
    fresh = cuda_loader.CubinKernel(kernel.cubin, kernel.meta)  # not loaded anywhere yet, whatever ran before
    device = torch.cuda.current_device()
    counts: list[int] = []

    def side() -> None:  # as a package load's side thread: the caller's device set, no context current yet
        with torch.cuda.device(device):
            counts.append(cuda_loader.preload([fresh, fresh], device))

    before = cuda_loader.stats.preloaded
    t = threading.Thread(target=side)
    t.start()
    t.join()
    assert counts == [1] and device in fresh._functions  # loaded once, though named twice
    assert cuda_loader.stats.preloaded == before + 1
    assert cuda_loader.preload([fresh], device) == 0  # already there
    cuda_loader.preload(plan_cubins(art), device)
    assert cuda_loader.is_loaded(ref.digest, device)  # before any launch of this plan
    loaded = cuda_loader.stats.modules_loaded
    x = torch.randn(n, device="cuda")
    (out,) = load_plan(art)([x])
    torch.cuda.synchronize()
    torch.testing.assert_close(out, _ref(x), rtol=1e-6, atol=1e-6)
    assert cuda_loader.stats.modules_loaded == loaded  # the launch loaded nothing more
