"""Dynamic shapes end to end: symbolic sizes travel, one artifact serves every size, guards hold."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from fxcc.client.backend import events
from fxcc.client.examples import GPT2Block, TransformerBlock
from fxcc.client.runtime import GuardFailed, load_plan
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest


@pytest.fixture(autouse=True)
def _fresh(fresh_compiles):
    yield


def _compiles() -> list:
    return [e for e in events() if e.source != "fallback"]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(16, 32), nn.Linear(32, 8), nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(self.norm(torch.nn.functional.gelu(self.fc1(x)))), dim=-1)


def test_batch_sizes_1_to_64_compile_at_most_twice_and_match_eager():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="fxcc")
    with torch.no_grad():
        for batch in range(1, 65):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x))
    compiles = _compiles()
    assert len(compiles) <= 2, [e.source for e in compiles]
    assert all(e.error is None for e in events())
    dynamic = compiles[-1]
    # The dynamic graph is fused, not an all-extern fallback: GELU+LayerNorm and softmax.
    assert dynamic.stats.kernels >= 2
    assert dynamic.stats.nodes_lowered > dynamic.stats.nodes_extern


@pytest.mark.parametrize("block", ["transformer", "gpt2"])
def test_sequence_lengths_compile_at_most_twice_and_match_eager(block):
    torch.manual_seed(0)
    model = (TransformerBlock(64, 4) if block == "transformer" else GPT2Block(64, 4)).eval()
    compiled = torch.compile(model, backend="fxcc")
    with torch.no_grad():
        for seq in (8, 9, 12, 16, 23, 31, 5):  # 5: shorter than the static graph's 8 and the heads' 8
            x = torch.randn(2, seq, 64)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-5, rtol=2e-5)
    compiles = _compiles()
    assert len(compiles) <= 2
    assert compiles[-1].stats.kernels >= 1
    # The dynamic graph's attention runs as one SDPA call, as the static graph's does: the
    # attention pass keeps the graph's size symbols (it used to fail on them and leave bmm →
    # softmax → bmm, materializing the 8 × s × s scores).
    ops = compiles[-1].stats.extern_ops
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops and "aten.bmm.default" not in ops


def test_reduction_over_a_dynamic_row_is_tiled_by_its_hint_and_matches_eager(monkeypatch):
    """A softmax over a symbolic row length loops over the row (any length), with a tile sized by
    the example's row, many rows per program, not one 2048-wide row per program (over 98% of it
    masked for rows of a few dozen); it matches eager for rows shorter and far longer than that."""
    arts: list = []
    real = compile_request

    def spy(request, tune_device=None):
        arts.append(real(request))
        return arts[-1]
    monkeypatch.setattr("fxcc.compiler_core.pipeline.compile_and_build", spy)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.5, dim=-1)

    compiled = torch.compile(fn, backend="fxcc")
    for n in (8, 9, 12, 31, 300):
        x = torch.randn(6, n, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(arts) == 2 and all(e.error is None for e in events())
    dynamic = arts[-1].manifest
    assert dynamic.plan.symbols, "the second graph is dynamic"
    reductions = [k for k in dynamic.kernels if "RBLOCK" in k.constexprs]
    assert reductions
    from fxcc.compiler_core.codegen.triton import SYMBOLIC_RBLOCK_MIN

    for k in reductions:  # the hint's row is 9 long: the narrowest tile, several rows per program
        assert k.constexprs["RBLOCK"] == max(16, SYMBOLIC_RBLOCK_MIN), (k.name, k.constexprs)
        assert k.constexprs["XBLOCK"] > 1, (k.name, k.constexprs)


def test_symbolic_plan_checks_its_guards():
    """A plan whose guard fails for the call's sizes refuses to run (GuardFailed), and runs for
    sizes that satisfy it."""
    request = _dynamic_request()
    art = compile_request(request)
    plan = art.manifest.plan
    assert plan.symbols and plan.guards
    narrowed = art.manifest.model_copy(update={"plan": plan.model_copy(update={"guards": [*plan.guards, "s0 <= 8"]})})
    art.manifest = narrowed
    runner = load_plan(art)
    x = torch.randn(8, 16)
    args = _args_for(request, x)
    runner(args)
    with pytest.raises(GuardFailed, match="s0 <= 8"):
        runner(_args_for(request, torch.randn(9, 16)))


def _narrow_the_dynamic_artifact(monkeypatch) -> list[str]:
    """Compiles as usual, but the second artifact (the MLP's dynamic graph) serves only batch <= 8;
    the keys of every artifact compiled, in order."""
    seen: list[str] = []
    real = compile_request

    def narrowing(request, tune_device=None):
        art = real(request)
        seen.append(art.manifest.key)
        if len(seen) == 2:  # the dynamic graph's first artifact serves only batch <= 8
            plan = art.manifest.plan
            art.manifest = art.manifest.model_copy(update={"plan": plan.model_copy(
                update={"guards": [*plan.guards, "s0 <= 8"]})})
        return art
    monkeypatch.setattr("fxcc.compiler_core.pipeline.compile_and_build", narrowing)
    return seen


def test_guard_failure_runs_eagerly_and_compiles_a_variant(monkeypatch):
    """A call whose sizes fail every known variant's guards runs correctly and gets its own
    variant (keyed with its hints), without replacing the first one."""
    seen = _narrow_the_dynamic_artifact(monkeypatch)
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="fxcc")
    with torch.no_grad():
        for batch in (2, 3, 8, 9, 12, 5):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(seen) == 3 and len(set(seen)) == 3, seen
    assert [e.source for e in events()].count("variant") == 1


def test_a_variant_that_fails_to_compile_costs_only_its_own_calls(monkeypatch):
    """With the variant's compile failing (a service outage), calls of sizes only a variant would
    serve run eagerly (one warning); calls the plan serves keep running it; after the retry
    delay a working compile adds the variant."""
    from fxcc.client import backend, graphs
    from fxcc.client.runtime import PlanRunner

    seen = _narrow_the_dynamic_artifact(monkeypatch)
    real_fetch = backend.GraphCompiler.fetch
    down = {"now": True}

    def fetch(self, request, key):
        if request.variant and down["now"]:
            raise ConnectionError("service unreachable")
        return real_fetch(self, request, key)
    monkeypatch.setattr(backend.GraphCompiler, "fetch", fetch)
    runs = {"plan": 0}
    real_steal = PlanRunner.steal

    def counting(self, args):  # plans that ran (a failed guard raises before any step)
        out = real_steal(self, args)
        runs["plan"] += 1
        return out
    monkeypatch.setattr(PlanRunner, "steal", counting)  # how a guarded graph calls its plans

    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="fxcc")
    with torch.no_grad():
        for batch in (2, 3):  # the static graph, then the dynamic one
            compiled(torch.randn(batch, 16))
        before = runs["plan"]
        xs = [torch.randn(batch, 16) for batch in (12, 5, 16, 7)]
        with pytest.warns(RuntimeWarning, match="runs eagerly for some sizes"):
            got = [compiled(x) for x in xs]
        for x, y in zip(xs, got):
            torch.testing.assert_close(y, model(x))
        assert runs["plan"] - before == 2  # batches 5 and 7 still ran the compiled plan
        monkeypatch.setattr(graphs, "VARIANT_RETRY_S", 0.0)
        down["now"] = False
        x = torch.randn(12, 16)
        torch.testing.assert_close(compiled(x), model(x))
    assert [e.source for e in events()].count("variant") == 1
    assert runs["plan"] - before == 3  # batch 12 now ran its variant
    assert len(seen) == 3 and len(set(seen)) == 3, seen  # static, dynamic, and the one variant


def _dynamic_request() -> CompileRequest:
    """The compile request of the MLP's dynamic (batch-symbolic) forward graph."""
    captured: list = []
    real = compile_request

    def spy(request, tune_device=None):
        captured.append(request)
        return real(request)
    import fxcc.compiler_core.pipeline as cc

    saved, cc.compile_and_build = cc.compile_and_build, spy
    try:
        torch.manual_seed(0)
        compiled = torch.compile(MLP().eval(), backend="fxcc")
        with torch.no_grad():
            compiled(torch.randn(2, 16))
            compiled(torch.randn(3, 16))
    finally:
        cc.compile_and_build = saved
    request = captured[-1]
    assert request.graph.symbols, "the second call's graph is dynamic"
    return request


def _args_for(request: CompileRequest, x: torch.Tensor) -> list:
    """Inputs for the captured graph: the batch where a SymInt is expected, x for the activation,
    random tensors of the right sizes for the parameters."""
    args = []
    for p in request.graph.placeholders:
        if p.symbol is not None:
            args.append(x.shape[0])
        elif any(isinstance(s, str) for s in p.spec.sizes):
            args.append(x)
        else:
            args.append(torch.randn(*p.spec.sizes))
    return args


KEY_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torch import nn
    from fxcc.client.capture import capture_graph
    from fxcc.client.backend import decomposition_table
    from fxcc.compiler_core.keys import compile_key
    from fxcc.compiler_core.wire import CompileRequest
    from torch._dynamo.backends.common import aot_autograd
    keys = []
    def fw(gm, example_inputs):
        cap = capture_graph(gm, example_inputs)
        keys.append((compile_key(CompileRequest(graph=cap.spec, hints=cap.hints)), cap.hints))
        return gm
    torch.manual_seed(int(sys.argv[1]))
    junk = [torch.empty(int(sys.argv[1]) * 1000) for _ in range(3)]  # other data pointers
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)).eval()
    f = torch.compile(model, backend=aot_autograd(fw_compiler=fw, decompositions=decomposition_table()))
    with torch.no_grad():
        for b in map(int, sys.argv[2:]):
            f(torch.randn(b, 16))
    print(json.dumps(keys))
""")


def test_dynamic_keys_are_equal_across_processes_whatever_the_sizes():
    def run(seed: str, *batches: str) -> list:
        out = subprocess.run([sys.executable, "-c", KEY_SCRIPT, seed, *batches], check=True,
                             capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    a, b = run("1", "4", "5"), run("2", "7", "33")
    assert a[-1][1] != b[-1][1], "the hints differ"
    assert a[-1][0] == b[-1][0], "but the dynamic graph's key does not"
    assert a[0][0] != b[0][0], "static graphs of different sizes have different keys"


def test_extern_result_in_another_layout_is_copied_into_the_planned_one():
    from fxcc.client.runtime import _in_layout
    from fxcc.compiler_core.artifact import ExternStep

    step = ExternStep(op="aten.clone.default", args=[], out="r", expect_strides=[1, 4])
    value = torch.randn(4, 3)  # strides (3, 1); the plan assumes column-major (1, 4)
    fixed = _in_layout(value, (1, 4), step)
    assert fixed.stride() == (1, 4)
    torch.testing.assert_close(fixed, value)
    same = torch.randn(3, 4).t()
    assert _in_layout(same, (1, 4), step) is same  # already laid out as planned: no copy
    row = torch.randn(1, 5)
    assert _in_layout(row, (7, 1), step) is row  # a size-1 dim's stride does not matter


def test_training_with_dynamic_batch_compiles_forward_and_backward_once_each():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    reference = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="fxcc")
    for batch in (2, 3, 5, 9):
        x = torch.randn(batch, 16)
        loss = compiled(x).square().mean()
        loss.backward()
        ref = reference(x).square().mean()
        ref.backward()
        torch.testing.assert_close(loss, ref)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    compiles = _compiles()
    assert len(compiles) == 4, [e.source for e in compiles]  # static fw+bw, then dynamic fw+bw
    assert all(e.stats.kernels >= 1 for e in compiles[2:])


def test_symbolic_plan_checks_input_strides():
    """An input laid out unlike the plan assumes (a transposed view) is refused, not misread."""
    request = _dynamic_request()
    runner = load_plan(compile_request(request))
    x = torch.randn(8, 16)
    runner(_args_for(request, x))
    with pytest.raises(GuardFailed, match="stride"):
        runner(_args_for(request, torch.randn(16, 8).t()))


def test_symbolic_plan_writes_in_place_for_every_size(monkeypatch):
    """GELU+LayerNorm over fc1's result writes into it (a buffer of the very same size expression),
    and every batch gives what the plan without in-place writes gives."""
    import fxcc.compiler_core.plan as plan_mod

    request = _dynamic_request()
    art = compile_request(request)
    assert any(s.kind == "alloc" and s.reuse for s in art.manifest.plan.steps)
    monkeypatch.setattr(plan_mod, "write_in_place", lambda steps, candidates, outputs: list(steps))
    plain = compile_request(request)
    assert not any(s.kind == "alloc" and s.reuse for s in plain.manifest.plan.steps)
    runner, reference = load_plan(art), load_plan(plain)
    for batch in (2, 5, 17, 64):
        args = _args_for(request, torch.randn(batch, 16))
        torch.testing.assert_close(runner(args), reference(args), rtol=0, atol=0)


def test_attention_fused_under_its_guard_refuses_sizes_beyond_it(monkeypatch):
    """With batch × heads symbolic, the attention pass fires only under a guard (batch × heads at
    most MAX_HEADS), which the plan keeps: sizes within it run the fused plan and match eager; a
    size beyond it fails the guard and runs eagerly (here, with no room for a variant), never
    through the fused plan; the variant those sizes would get compiles unfused, under the opposite
    guard."""
    from fxcc.client import graphs
    from fxcc.compiler_core.passes.attention import CPU_OP, MAX_HEADS

    requests: list = []
    arts: list = []
    real = compile_request

    def recording(request, tune_device=None):
        requests.append(request)
        arts.append(real(request))
        return arts[-1]
    monkeypatch.setattr("fxcc.compiler_core.pipeline.compile_and_build", recording)
    monkeypatch.setattr(graphs, "MAX_VARIANTS", 1)  # the unfused variant runs too slowly in the interpreter

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1) @ v

    compiled = torch.compile(attention, backend="fxcc", dynamic=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for shape in ((2, 3, 12, 8), (3, 5, 7, 8)):
            q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))
            torch.testing.assert_close(compiled(q, k, v), attention(q, k, v), atol=1e-5, rtol=1e-5)
        (fused,) = arts
        assert fused.manifest.plan.symbols and CPU_OP in fused.manifest.stats.extern_ops
        assert f"s0*s1 <= {MAX_HEADS}" in fused.manifest.plan.guards, fused.manifest.plan.guards
        q, k, v = (torch.randn(2, MAX_HEADS // 2 + 1, 2, 8, generator=g) for _ in range(3))
        with pytest.warns(RuntimeWarning, match="runs eagerly for some sizes"):
            torch.testing.assert_close(compiled(q, k, v), attention(q, k, v), atol=1e-5, rtol=1e-5)
    assert len(arts) == 1
    hints = {"s0": 2, "s1": MAX_HEADS // 2 + 1, "s2": 2, "s3": 8}
    variant = compile_request(requests[0].model_copy(update={"hints": hints, "variant": True}))
    assert CPU_OP not in variant.manifest.stats.extern_ops
    assert f"s0*s1 > {MAX_HEADS}" in variant.manifest.plan.guards, variant.manifest.plan.guards


class Positions(nn.Module):
    """What transformers' encoders do with a sequence length: a position-id buffer sliced to it
    (`ids[:, :s]`), embedded, and a padding mask gathered by index tensors whose sizes are it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ids", torch.arange(64)[None], persistent=False)
        self.emb = nn.Embedding(64, 16)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, s = pad.shape
        pos = self.emb(self.ids[:, :s])  # a slice with a symbolic end
        keep = pad[torch.arange(b)[:, None], torch.arange(s)[None, :]]  # indices into a symbolic dim
        return (x + pos) * keep[..., None]


def test_slices_and_gathers_of_a_sequence_length_stay_symbolic():
    """One dynamic plan serves every length: no guard pins the length (Python's range() on a
    SymInt slice bound did, so each new length compiled a variant), and the slice, the aranges
    of the length and the gather into it are lowered (each was an extern call or a guard)."""
    torch.manual_seed(0)
    model = Positions().eval()
    compiled = torch.compile(model, backend="fxcc")
    with torch.no_grad():
        for s in (20, 13, 7, 41):
            x, pad = torch.randn(3, s, 16), torch.rand(3, s) > 0.2
            torch.testing.assert_close(compiled(x, pad), model(x, pad))
    compiles = _compiles()
    assert [e.source for e in compiles] == ["compiled-in-process"] * 2, [e.source for e in compiles]
    dynamic = compiles[-1]
    assert all(e.error is None for e in events())
    assert dynamic.stats.nodes_extern == 0 and dynamic.stats.kernels >= 1


SLICES = {
    "from_end": lambda x, w: x[:, -3:] * 2,
    "negative_symbolic_bounds": lambda x, w: x[:, -w.shape[0]:-2] * 3,
    "both_ends": lambda x, w: x[:, 1:x.shape[1] - 1] + 1,  # may be empty: a size s - 2
    "half": lambda x, w: x[:, x.shape[1] // 2:] * 2,
    "step": lambda x, w: x[:, 1::2] * 2,
    "prefix": lambda x, w: x[:, :w.shape[0]] * 2,
    "past_the_end": lambda x, w: x[:, :100] * 2,
    "symbolic_start": lambda x, w: x[:, w.shape[0]:] * 2,  # an input read at a symbolic offset
    "symbolic_start_reduced": lambda x, w: x[:, w.shape[0]:].sum(1),
}


@pytest.mark.parametrize("case", list(SLICES))
def test_symbolic_slices_are_lowered_and_match_eager(case):
    """Bounds from the end (ints and negated sizes), steps, bounds of the length's expression, one
    past the end: over the lengths one dynamic plan serves, every node lowered (a slice whose
    size may be 0 made contiguous_strides ask `s0 - 2 < 1`, which failed the whole graph)."""
    fn = SLICES[case]
    compiled = torch.compile(fn, backend="fxcc", dynamic=True)
    for s in (9, 12, 17):
        x, w = torch.randn(2, s), torch.zeros(5)
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    (event,) = _compiles()
    assert event.error is None and event.stats.nodes_extern == 0, event.stats.extern_ops


def test_a_slice_between_negated_sizes_reads_from_the_end():
    """x[-a:-b] with a, b sizes: the bounds count from the end, as eager's (it read at -a before)."""
    fn = lambda x, y, w: x[-w.shape[0]:-y.shape[0]][:1] * 3
    compiled = torch.compile(fn, backend="fxcc", dynamic=True)
    for s in (10, 12, 15):
        args = (torch.arange(1.0, s + 1), torch.zeros(3), torch.zeros(7))
        torch.testing.assert_close(compiled(*args), fn(*args))
    (event,) = _compiles()
    assert event.stats.nodes_extern == 0
