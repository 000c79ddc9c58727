"""End to end, real processes: graphs holding ops only the client has (a torch.library custom op)
compile on a real worker, which never registered them, and hit the shared cache from a second
machine. The `cluster` fixture is in conftest.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

CLIENT = """
import json, torch
from fxcc.client.backend import events

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
    for fn in (custom, mutating):
        err = max(err, (torch.compile(fn, backend="fxcc")(x) - fn(x)).abs().max().item())
rows = [{"source": e.source, "key": e.key, "kernels": e.stats.kernels if e.stats else 0,
         "extern_ops": e.stats.extern_ops if e.stats else [], "error": e.error} for e in events()]
print(json.dumps({"events": rows, "max_abs_err": err}))
"""


def _client(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CLIENT], check=False, env=env, timeout=600,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_custom_ops_compile_on_a_worker_that_lacks_them(cluster, client_env, tmp_path):
    env = dict(client_env, FXCC_FALLBACK="error")
    first = _client(dict(env, FXCC_CACHE_DIR=str(tmp_path / "a")))
    assert first["max_abs_err"] < 1e-5, first
    assert [e["source"] for e in first["events"]] == ["remote-compiled"] * 2, first
    assert [e["extern_ops"] for e in first["events"]] == [["fxcc_e2e.scale.default"],
                                                        ["fxcc_e2e.accumulate.default"]], first
    assert [e["kernels"] for e in first["events"]] == [2, 2], first  # the rest of each graph fused

    second = _client(dict(env, FXCC_CACHE_DIR=str(tmp_path / "b")))
    assert [e["source"] for e in second["events"]] == ["remote-hit"] * 2, second
    assert [e["key"] for e in second["events"]] == [e["key"] for e in first["events"]]
    assert second["max_abs_err"] < 1e-5, second
