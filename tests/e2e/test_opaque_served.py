"""End to end, real processes: graphs holding ops only the client has (a torch.library custom op, a
user's Triton kernel) compile on a real worker, which never registered or saw them, and hit the
shared cache from a second machine. The `cluster` fixture is in conftest.py; the Triton kernel is
made as tests/client/test_user_kernels.py says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CLIENT = """
import json, torch, triton, triton.language as tl
import torch.utils._triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
from fxcc.client.backend import events

torch.utils._triton.has_triton = lambda: True

def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2 + tl.load(y_ptr + offs, mask=m), mask=m)

add_kernel = JITFunction(add_kernel)
KERNEL = [add_kernel]

def user_kernel(x):
    a, b = x.sin(), x.cos()
    out = torch.empty_like(a)
    KERNEL[0][(triton.cdiv(a.numel(), 16),)](a, b, out, a.numel(), BLOCK=16)
    return out.exp() - x

@torch.library.custom_op("fxcc_e2e::scale", mutates_args=())
def scale(x: torch.Tensor, k: int, group: str) -> torch.Tensor:
    return x * k

@scale.register_fake
def _(x, k, group):
    return torch.empty_like(x)

@torch.library.custom_op("fxcc_e2e::accumulate", mutates_args=("out",))
def accumulate(x: torch.Tensor, out: torch.Tensor) -> None:
    out.add_(x)

@accumulate.register_fake
def _(x, out):
    return None

def custom(x):
    return scale(x.sin() * x, 3, "g0").cos() + x

def mutating(x):
    o = x.cos()
    accumulate(x, o)
    return o.sin()

err = 0.0
with torch.no_grad():
    x = torch.randn(16, 8)
    for fn in (custom, mutating, user_kernel):
        got = torch.compile(fn, backend="fxcc")(x)
        KERNEL[0] = InterpretedFunction(add_kernel.fn)  # eager's reference
        err = max(err, (got - fn(x)).abs().max().item())
        KERNEL[0] = add_kernel
rows = [{"source": e.source, "key": e.key, "kernels": e.stats.kernels if e.stats else 0,
         "extern_ops": e.stats.extern_ops if e.stats else [], "error": e.error} for e in events()]
print(json.dumps({"events": rows, "max_abs_err": err}))
"""


def _client(env: dict[str, str], script: Path) -> dict:
    script.write_text(CLIENT)  # Triton reads a kernel's source from its file
    out = subprocess.run([sys.executable, str(script)], check=False, env=env, timeout=600,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_custom_ops_and_user_kernels_compile_on_a_worker_that_lacks_them(cluster, client_env, tmp_path):
    env = dict(client_env, FXCC_FALLBACK="error")
    first = _client(dict(env, FXCC_CACHE_DIR=str(tmp_path / "a")), tmp_path / "client.py")
    assert first["max_abs_err"] < 1e-5, first
    assert [e["source"] for e in first["events"]] == ["remote-compiled"] * 3, first
    ops = [e["extern_ops"] for e in first["events"]]
    assert ops[:2] == [["fxcc_e2e.scale.default"], ["fxcc_e2e.accumulate.default"]], first
    assert "triton_kernel.add_kernel" in ops[2], first
    assert [e["kernels"] for e in first["events"]] == [2, 2, 2], first  # the rest of each graph fused

    second = _client(dict(env, FXCC_CACHE_DIR=str(tmp_path / "b")), tmp_path / "client.py")
    assert [e["source"] for e in second["events"]] == ["remote-hit"] * 3, second
    assert [e["key"] for e in second["events"]] == [e["key"] for e in first["events"]]
    assert second["max_abs_err"] < 1e-5, second
