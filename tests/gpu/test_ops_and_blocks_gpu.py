"""On a GPU: the compiler's CI op subset and the model blocks run from cubins and match eager.

Each op sample is traced to core aten, compiled for the device's CUDA arch, built to cubins
(compiler_core.build) and run by the client runtime, which launches cubins through the driver
API. Skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

from fxcc.client import cuda_loader
from fxcc.client.runtime import cuda_arch_key

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]



def _ci_ops() -> tuple[list[str], set[str]]:
    """The CPU sweep's CI op list (importing it must not switch this process to the interpreter)."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = saved or "0"
    sys.path.insert(0, str(Path(__file__).parents[1] / "opinfo"))
    try:
        from sweep import CI_OPS, NONDETERMINISTIC
    finally:
        sys.path.pop(0)
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
    return CI_OPS, NONDETERMINISTIC


def _compile_and_run(fn, tensors: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_and_build
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

    def flat_fn(*xs):  # type: ignore[no-untyped-def]
        return pytree.tree_leaves(fn(*xs))

    gm = make_fx(flat_fn, decomposition_table=decomposition_table())(*tensors)
    cap = capture_graph(gm, tensors)
    major, minor = torch.cuda.get_device_capability()
    target = Target(kind="cuda", arch=major * 10 + minor)
    art = compile_and_build(CompileRequest(graph=cap.spec, options=CompileOptions(target=target)))
    return list(load_plan(art)(list(tensors) + cap.constants)), art


def _samples(dtype: torch.dtype):  # type: ignore[no-untyped-def]
    from torch.testing._internal.common_methods_invocations import op_db

    ci_ops, nondeterministic = _ci_ops()
    for opinfo in op_db:
        if opinfo.name not in ci_ops or opinfo.name in nondeterministic:
            continue
        if dtype not in opinfo.supported_dtypes("cuda"):
            continue
        for sample in list(opinfo.sample_inputs("cuda", dtype, requires_grad=False))[:1]:
            yield opinfo, sample


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ci_ops_from_cubins_match_eager(dtype):
    arch = cuda_arch_key()
    failures: list[str] = []
    kernels = launched = 0
    fallbacks = cuda_loader.stats.jit_fallbacks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opinfo, sample in _samples(dtype):
            leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
            positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
            tensors = [leaves[i] for i in positions]

            def fn(*xs, leaves=leaves, positions=positions, spec=spec, op=opinfo.op):  # type: ignore[no-untyped-def]
                filled = list(leaves)
                for i, x in zip(positions, xs):
                    filled[i] = x
                inp, args, kwargs = pytree.tree_unflatten(filled, spec)
                return op(inp, *args, **kwargs)

            try:
                expected = pytree.tree_leaves(fn(*[t.clone() for t in tensors]))
                got, art = _compile_and_run(fn, [t.clone() for t in tensors])
            except Exception as e:  # noqa: BLE001 - untraceable samples are the sweep's business
                if type(e).__name__ in ("UnsupportedOp",):
                    continue
                failures.append(f"{opinfo.name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                continue
            torch.cuda.synchronize()
            for k in art.manifest.kernels:
                kernels += 1
                if arch in k.binaries and cuda_loader.is_loaded(k.binaries[arch].digest, 0):
                    launched += 1
            try:
                for g, e in zip(got, expected, strict=True):
                    if isinstance(e, torch.Tensor):
                        torch.testing.assert_close(g, e, equal_nan=True)
            except (AssertionError, ValueError) as err:
                failures.append(f"{opinfo.name}: {str(err).splitlines()[0][:160]}")
    print(f"\n{dtype}: {kernels} kernels, {launched} launched from cubins, "
          f"{cuda_loader.stats.jit_fallbacks - fallbacks} JIT fallbacks")
    assert not failures, "\n".join(failures)
    assert kernels > 0 and launched == kernels


def _blocks():  # type: ignore[no-untyped-def]
    from fxcc.client.examples import model_blocks

    return model_blocks()


@pytest.fixture
def _fxcc_on_gpu(tmp_path, monkeypatch, no_tf32):  # type: ignore[no-untyped-def]
    from fxcc.client import backend

    for k in ("FXCC_URL", "FXCC_BLOCKING", "FXCC_PRECOMPILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FXCC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch._dynamo.reset()
    backend.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("_fxcc_on_gpu")
@pytest.mark.parametrize("name", ["transformer", "gpt2", "llama", "bottleneck"])
def test_block_inference_from_cubins_matches_eager(name):
    from fxcc.client.backend import fxcc_backend

    model, x = _blocks()[name]
    model, x = model.cuda().eval(), x.cuda()
    fallbacks = cuda_loader.stats.jit_fallbacks
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend=fxcc_backend)(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert cuda_loader.stats.jit_fallbacks == fallbacks


@pytest.mark.usefixtures("_fxcc_on_gpu")
@pytest.mark.parametrize("name", ["gpt2", "bottleneck"])
def test_block_training_step_from_cubins_matches_eager(name):
    from fxcc.client.backend import fxcc_backend

    (model, x), (ref, _) = _blocks()[name], _blocks()[name]
    model, ref, x = model.cuda().train(), ref.cuda().train(), x.cuda()
    loss = torch.compile(model, backend=fxcc_backend)(x).square().mean()
    loss.backward()
    ref_loss = ref(x).square().mean()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=pname: f"{n}: {m}")
