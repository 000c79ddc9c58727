"""End to end, real processes: flex_attention's forward and backward (causal and a sliding window with a
captured alibi tensor, BlockMasks from create_block_mask) compile on a real worker from mods that travel
as aten graphs, run fxcc's templates (no extern step), match eager's outputs and grads, and hit the
shared cache from a second machine. The `cluster` fixture is in conftest.py; the device check the
client lifts is explained in tests/client/test_flex_attention.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CLIENT = """
import json, torch
import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from fxcc.client.backend import events

flex_module._validate_device = lambda *a: None
torch.manual_seed(0)
SLOPES = torch.rand(4) + 0.1

def causal(b, h, q, kv):
    return q >= kv

def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv <= 20)

def alibi(score, b, h, m, n):
    return score + SLOPES[h] * (n - m)

masks = {name: create_block_mask(fn, 1, 4, 64, 64, device="cpu", BLOCK_SIZE=32)
         for name, fn in (("causal", causal), ("sliding", sliding))}

def causal_attn(q, k, v):
    return flex_attention(q.sin(), k, v, block_mask=masks["causal"]) * 2

def sliding_alibi(q, k, v):
    return flex_attention(q, k, v, score_mod=alibi, block_mask=masks["sliding"]).cos()

err = 0.0
for fn in (causal_attn, sliding_alibi):
    inputs = [torch.randn(1, 4, 64, 16, requires_grad=True) for _ in range(3)]
    got = torch.compile(fn, backend="fxcc")(*inputs)
    want = fn(*inputs)
    g = torch.randn_like(want)
    for a, b in zip([got, *torch.autograd.grad(got, inputs, g)], [want, *torch.autograd.grad(want, inputs, g)]):
        err = max(err, (a - b).abs().max().item())
rows = [{"source": e.source, "key": e.key, "kernels": e.stats.kernels if e.stats else 0,
         "extern_ops": e.stats.extern_ops if e.stats else [], "error": e.error} for e in events()]
print(json.dumps({"events": rows, "max_abs_err": err}))
"""


def _client(env: dict[str, str], script: Path) -> dict:
    script.write_text(CLIENT)
    out = subprocess.run([sys.executable, str(script)], check=False, env=env, timeout=900,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_flex_attention_forward_and_backward_compile_on_a_worker(cluster, client_env, tmp_path):
    env = dict(client_env, FXCC_FALLBACK="error")
    first = _client(dict(env, FXCC_CACHE_DIR=str(tmp_path / "a")), tmp_path / "client.py")
    assert first["max_abs_err"] < 1e-4, first
    # forward and backward of each function, all compiled by the worker, none with an extern step
    assert [e["source"] for e in first["events"]] == ["remote-compiled"] * 4, first
    assert [e["extern_ops"] for e in first["events"]] == [[]] * 4, first
    # causal: sin, template, *2 | grad*2 with delta's rowsum, template, dq through sin;
    # sliding: template, cos | the incoming grad with delta's rowsum, template
    assert [e["kernels"] for e in first["events"]] == [3, 3, 2, 2], first

    second = _client(dict(env, FXCC_CACHE_DIR=str(tmp_path / "b")), tmp_path / "client.py")
    assert [e["source"] for e in second["events"]] == ["remote-hit"] * 4, second
    assert [e["key"] for e in second["events"]] == [e["key"] for e in first["events"]]
    assert second["max_abs_err"] < 1e-4, second
