"""The pre-AOT cache (client/pre_aot.py): a plain inference graph compiled once is served in a new
process without AOTAutograd; anything AOTAutograd's runtime wrapper would do more is never served."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from fxcc.client import backend
from fxcc.client.examples import Bottleneck, TransformerBlock
from tests.child_scripts import COUNT_AOT


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.delenv("FXCC_PRE_AOT_CACHE", raising=False)
    yield


def _entries() -> list[Path]:
    root = Path(os.environ["FXCC_CACHE_DIR"]) / "pre_aot"
    return sorted(root.glob("*.json")) if root.exists() else []


def _compile_twice(fn, *args, **compile_kwargs):
    """Compile and run `fn` in two Dynamo sessions of this process (the second one sees the disk
    as a new process would); returns (first result, second result, AOTAutograd runs of each)."""
    with torch.no_grad():
        first = torch.compile(fn, backend="fxcc", **compile_kwargs)(*args)
        runs = backend.aot_runs()
        torch._dynamo.reset()
        second = torch.compile(fn, backend="fxcc", **compile_kwargs)(*args)
    return first, second, (runs, backend.aot_runs() - runs)


# A new process with the cache filled: AOTAutograd is not called at all (counted both by fxcc and
# through a wrapper around torch's aot_module_simplified), and the result matches eager.
CHILD = COUNT_AOT + textwrap.dedent("""
    from fxcc.client.examples import TransformerBlock, Bottleneck
    torch.manual_seed(0)
    block, bottleneck = TransformerBlock(64, 4).eval(), Bottleneck(32, 8, 2).eval()
    x, y = torch.randn(2, 16, 64), torch.randn(2, 32, 8, 8)
    errors = []
    with torch.no_grad():
        for model, inp in ((block, x), (bottleneck, y)):
            got = torch.compile(model, backend="fxcc")(inp)
            torch.testing.assert_close(got, model(inp))
            errors.append(float((got - model(inp)).abs().max()))
            assert type(got) is torch.Tensor and not got.requires_grad
    print(json.dumps({"aot_module_simplified": len(calls), "aot_runs": backend.aot_runs(),
                      "pre_aot": [e.pre_aot for e in backend.events()],
                      "sources": [e.source for e in backend.events()], "errors": errors}))
""")


def _child(cache: Path) -> dict:
    env = dict(os.environ, FXCC_CACHE_DIR=str(cache), TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_skips_aot_autograd_and_matches_eager(tmp_path):
    cache = tmp_path / "shared-cache"
    first = _child(cache)
    assert first["aot_module_simplified"] == 2 and first["aot_runs"] == 2
    assert first["pre_aot"] == ["ran; stored for the next process"] * 2
    assert len(list((cache / "pre_aot").glob("*.json"))) == 2
    second = _child(cache)
    assert second["aot_module_simplified"] == 0 and second["aot_runs"] == 0
    assert second["pre_aot"] == ["skipped: pre-AOT cache hit"] * 2
    assert second["sources"] == ["local-hit", "local-hit"]


def test_a_hit_returns_what_aot_autograd_returns():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)).eval()
    x = torch.randn(4, 16)
    first, second, runs = _compile_twice(model, x)
    assert runs == (1, 0)
    torch.testing.assert_close(second, model(x))
    assert first.stride() == second.stride() and first.dtype == second.dtype
    assert [e.pre_aot for e in backend.events()] == ["ran; stored for the next process",
                                                     "skipped: pre-AOT cache hit"]


def test_a_hit_with_grad_mode_on_and_no_input_needing_grad():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval().requires_grad_(False)
    x = torch.randn(2, 8)
    torch.compile(model, backend="fxcc")(x)
    torch._dynamo.reset()
    before = backend.aot_runs()
    got = torch.compile(model, backend="fxcc")(x)
    assert backend.aot_runs() == before  # served from the pre-AOT cache
    assert torch.is_grad_enabled() and not got.requires_grad
    torch.testing.assert_close(got, model(x))


class _BufferUpdate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1)
        return x * 2


def _in_place_on_input(x):
    x.add_(1)
    return x * 2


def _view_of_input(x):
    return x.t(), x + 1


def _output_twice(x):
    y = x + 1
    return y, y.view(-1)


@pytest.mark.parametrize("make", [
    lambda: (_BufferUpdate(), torch.randn(4)),
    lambda: (nn.BatchNorm1d(4).train(), torch.randn(8, 4)),
    lambda: (_in_place_on_input, torch.randn(4)),
    lambda: (_view_of_input, torch.randn(3, 4)),
    lambda: (_output_twice, torch.randn(3, 4)),
], ids=["buffer-update", "batchnorm-train", "in-place-on-input", "view-of-input", "output-aliases-output"])
def test_mutation_and_aliasing_graphs_are_not_served(make):
    fn, x = make()
    with torch.no_grad():
        expected_input = x.clone()
        expected = fn(expected_input)
        for _ in range(2):
            torch._dynamo.reset()
            a = x.clone()
            got = torch.compile(fn, backend="fxcc")(a)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(a, expected_input)  # the input mutated as eager mutates it
    assert backend.aot_runs() == 2, "AOTAutograd ran in both sessions"
    assert _entries() == []
    assert all(e.pre_aot is None or e.pre_aot.startswith("ran; not cached") for e in backend.events())
    if isinstance(fn, _BufferUpdate):
        torch.testing.assert_close(fn.count, torch.full((4,), 3.0))


def test_training_graphs_are_not_served():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(2, 8)
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(model, backend="fxcc")(x).sum().backward()
    assert backend.aot_runs() == 2 and _entries() == []


def test_dynamic_shapes_are_not_served():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(3, 8)
    _, got, runs = _compile_twice(model, x, dynamic=True)
    assert runs == (1, 1) and _entries() == []
    torch.testing.assert_close(got, model(x))


@pytest.mark.parametrize("damage", [
    lambda raw: raw[: len(raw) // 2],
    lambda raw: b"\x00\xff not json",
    lambda raw: raw.replace(b'"artifact_key": "', b'"artifact_key": "../../x'),
    lambda raw: json.dumps({**json.loads(raw), "outputs": 7}).encode(),
], ids=["truncated", "garbage", "bad-artifact-key", "wrong-arity"])
def test_a_damaged_entry_is_ignored(damage):
    model = TransformerBlock(32, 4).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(x)
    (entry,) = _entries()
    entry.write_bytes(damage(entry.read_bytes()))
    torch._dynamo.reset()
    before = backend.aot_runs()
    with torch.no_grad():
        got = torch.compile(model, backend="fxcc")(x)
        torch.testing.assert_close(got, model(x))
    assert backend.aot_runs() == before + 1  # AOTAutograd ran: the entry was not used
    assert backend.events()[-1].source == "local-hit"
    assert backend.events()[-1].pre_aot == "ran; stored for the next process"  # and it was rewritten


def test_a_missing_artifact_falls_back_to_aot_autograd():
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(x)
        for manifest in (Path(os.environ["FXCC_CACHE_DIR"]) / "artifacts" / "manifests").glob("*.json"):
            manifest.unlink()
        torch._dynamo.reset()
        got = torch.compile(model, backend="fxcc")(x)
    torch.testing.assert_close(got, model(x))
    assert backend.aot_runs() == 2
    assert [e.source for e in backend.events()] == ["compiled-in-process", "compiled-in-process"]


@pytest.mark.parametrize("other", [
    lambda x: x.double(),
    lambda x: torch.randn(5, 16),
    lambda x: torch.randn(16, 4).t(),
], ids=["dtype", "shape", "stride"])
def test_another_dtype_shape_or_stride_misses(other):
    model = nn.Sequential(nn.Linear(16, 8), nn.GELU())
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(x)
        torch._dynamo.reset()
        y = other(x)
        if y.dtype == torch.float64:
            model = model.double()
        got = torch.compile(model, backend="fxcc")(y)
    torch.testing.assert_close(got, model(y))
    assert backend.aot_runs() == 2 and len(_entries()) == 2


def test_the_setting_turns_it_off(monkeypatch):
    monkeypatch.setenv("FXCC_PRE_AOT_CACHE", "0")
    model = Bottleneck(16, 4).eval()
    _, _, runs = _compile_twice(model, torch.randn(1, 16, 4, 4))
    assert runs == (1, 1) and _entries() == []
    assert all(e.pre_aot is None for e in backend.events())


def test_explain_says_the_aot_step_was_skipped():
    from fxcc.client.explain import explain

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        first = str(explain(model)(x))
        second = str(explain(model)(x))
    assert "AOTAutograd: ran; stored for the next process" in first
    assert "AOTAutograd: skipped: pre-AOT cache hit" in second


def test_a_plan_failing_on_a_hit_runs_dynamos_graph_eagerly(monkeypatch):
    from fxcc.client.runtime import PlanRunner

    model = nn.Sequential(nn.Linear(8, 8), nn.GELU()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(x)
        torch._dynamo.reset()

        def broken(self, args):
            raise RuntimeError("kernel launch failed")
        monkeypatch.setattr(PlanRunner, "__call__", broken)
        monkeypatch.setattr(PlanRunner, "steal", broken)  # how a guarded graph calls its plan
        with pytest.warns(RuntimeWarning, match="failed to run"):
            got = torch.compile(model, backend="fxcc")(x)
    assert backend.events()[-1].pre_aot == "skipped: pre-AOT cache hit"
    torch.testing.assert_close(got, model(x))


def test_flipping_tf32_misses():
    """The TF32 flag is part of the compile (fxcc's attention kernel uses it): an entry made with
    it off must not serve a process that turned it on."""
    from fxcc.client.examples import TransformerBlock

    torch.manual_seed(0)
    model, x = TransformerBlock(64, 4).eval(), torch.randn(2, 16, 64)
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        with torch.no_grad():
            torch.compile(model, backend="fxcc")(x)
            torch._dynamo.reset()
            matmul.allow_tf32 = True
            got = torch.compile(model, backend="fxcc")(x)
    finally:
        matmul.allow_tf32 = before
    assert backend.aot_runs() == 2 and len(_entries()) == 2
    torch.testing.assert_close(got, model(x), rtol=1e-2, atol=1e-2)
