"""Autotuning: candidate configs, winner selection with an injected benchmark, grid recomputation,
the manifest's tuning fields, and whole artifacts tuned on CPU through Triton's interpreter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core import autotune, pipeline
from fxcc.compiler_core.artifact import ArtifactManifest, KernelStep, TuningRecord
from fxcc.compiler_core.autotune import (
    Config,
    KernelShape,
    autotune_artifact,
    autotune_for_target,
    candidate_configs,
    retile_step,
)
from fxcc.compiler_core.codegen.triton import next_pow2
from fxcc.compiler_core.errors import AutotuneError
from fxcc.compiler_core.pipeline import compile_and_build, compile_request
from fxcc.compiler_core.tuning import mismatch, select_config
from fxcc.compiler_core.wire import CompileRequest, IntArg, NodeRef, Target

# ---------------------------------------------------------------- candidates


def test_pointwise_candidates_start_with_the_heuristic_and_max_autotune_widens() -> None:
    shape = KernelShape(xnumel=100_000)
    heuristic = Config(1024, 0, 4)
    default = candidate_configs(shape, heuristic)
    wide = candidate_configs(shape, heuristic, "max-autotune")
    assert default[0] == heuristic and wide[0] == heuristic
    assert len(set(default)) == len(default) > 2
    assert set(default) < set(wide)
    for c in wide:
        assert c.rblock == 0 and c.xblock <= 4096 and not c.looped and c.num_stages == 1
        assert c.xblock >= 32 * c.num_warps  # no idle threads


def test_pointwise_candidates_stay_within_the_kernel() -> None:
    configs = candidate_configs(KernelShape(xnumel=300), Config(512, 0, 4), "max-autotune")
    assert all(c.xblock <= 512 for c in configs)


def test_persistent_candidates_cover_the_whole_row() -> None:
    shape = KernelShape(xnumel=4096, rnumel=1000, can_loop=False)
    heuristic = Config(2, 1024, 4)
    for mode in ("default", "max-autotune"):
        configs = candidate_configs(shape, heuristic, mode)
        assert len(configs) > 3
        for c in configs:
            assert not c.looped and c.rblock >= 1000  # a persistent tile must hold every element
            assert c.xblock * c.rblock <= 16384


def test_looped_form_is_offered_only_where_valid_and_rows_are_long() -> None:
    heuristic = Config(2, 2048, 8)
    loopable = candidate_configs(KernelShape(64, 2000, can_loop=True), heuristic)
    assert any(c.looped for c in loopable) and any(not c.looped for c in loopable)
    assert all(c.rblock <= next_pow2(2000) for c in loopable)
    not_loopable = candidate_configs(KernelShape(64, 2000, can_loop=False), heuristic)
    assert not any(c.looped for c in not_loopable)
    short = candidate_configs(KernelShape(64, 300, can_loop=True), Config(8, 512, 4))
    assert not any(c.looped for c in short)  # default mode: short rows stay in registers
    wide = candidate_configs(KernelShape(64, 300, can_loop=True), Config(8, 512, 4), "max-autotune")
    assert any(c.looped for c in wide)


def test_long_rows_may_also_run_persistent() -> None:
    heuristic = Config(1, 2048, 8, looped=True)
    shape = KernelShape(64, 6000, looped=True, can_loop=True)
    configs = candidate_configs(shape, heuristic)
    persistent = [c for c in configs if not c.looped]
    assert persistent and all(c.rblock == 8192 for c in persistent)
    assert all(c.num_stages == 1 for c in configs)
    assert any(c.num_stages > 1 for c in candidate_configs(shape, heuristic, "max-autotune"))
    huge = candidate_configs(KernelShape(64, 50_000, looped=True, can_loop=True), heuristic, "max-autotune")
    assert all(c.looped for c in huge)


def test_column_reductions_stay_looped_with_wide_tiles() -> None:
    shape = KernelShape(4096, 1024, looped=True, column=True, can_loop=True, can_persist=False)
    configs = candidate_configs(shape, Config(16, 128, 4, looped=True), "max-autotune")
    assert len(configs) > 3 and all(c.looped and c.xblock >= 8 for c in configs)
    # Inductor's outer-reduction shapes: wide along the contiguous outputs, shallow along r
    default = {(c.xblock, c.rblock) for c in candidate_configs(shape, Config(64, 16, 4, looped=True))}
    assert {(64, 8), (64, 16), (128, 8), (128, 16)} <= default


@pytest.mark.parametrize("shape,heuristic", [
    (KernelShape(1 << 26), Config(1024, 0, 4)),
    (KernelShape(16384, 1024, can_loop=True), Config(2, 1024, 4)),
    (KernelShape(16384, 4096), Config(1, 4096, 8)),
    (KernelShape(16384, 128), Config(16, 128, 4)),
    (KernelShape(256, 6000, looped=True, can_loop=True), Config(1, 2048, 8, looped=True)),
    (KernelShape(512, 4096, looped=True, column=True, can_loop=True, can_persist=False),
     Config(8, 128, 4, looped=True)),
], ids=["pointwise", "persistent", "persistent_long", "persistent_short", "looped", "column"])
def test_max_autotune_is_a_superset_of_a_small_default(shape: KernelShape, heuristic: Config) -> None:
    default = candidate_configs(shape, heuristic)
    wide = candidate_configs(shape, heuristic, "max-autotune")
    assert 2 < len(default) <= 20 and len(default) < len(wide) <= 80
    assert set(default) <= set(wide)


def test_labels_name_every_knob() -> None:
    assert Config(1024, 0, 4).label == "x1024_w4_s1"
    assert Config(4, 2048, 8, 2, True).label == "x4_r2048_w8_s2_looped"
    assert Config(8, 512, 4).label == "x8_r512_w4_s1_persistent"
    assert Config(8, 512, 4).constexprs == {"XBLOCK": 8, "RBLOCK": 512}


# ---------------------------------------------------------------- grids


@pytest.mark.parametrize("xnumel,xblock,blocks", [(1000, 256, 4), (1024, 256, 4), (1025, 256, 5), (3, 1, 3)])
def test_retile_step_follows_the_block_size(xnumel: int, xblock: int, blocks: int) -> None:
    step = KernelStep(kernel="k", args=[NodeRef(name="a"), IntArg(value=xnumel), IntArg(value=77)], grid=[1])
    assert retile_step(step, xblock).grid == [blocks]
    assert retile_step(step, xblock).args == step.args


# ---------------------------------------------------------------- choosing a winner


class FakeBench:
    """Outputs and times per config label; `broken` labels raise like a failing compile."""

    def __init__(self, times: dict[str, float], wrong: Sequence[str] = (), broken: Sequence[str] = ()) -> None:
        self.times, self.wrong, self.broken = times, set(wrong), set(broken)
        self.ran: list[str] = []

    def run(self, config: Config) -> list[torch.Tensor]:
        self.ran.append(config.label)
        if config.label in self.broken:
            raise RuntimeError("out of resources: shared memory")
        out = torch.arange(8, dtype=torch.float32)
        return [out + 1 if config.label in self.wrong else out]

    def time_ms(self, config: Config) -> float:
        return self.times[config.label]


CANDIDATES = [Config(1024, 0, 4), Config(512, 0, 4), Config(256, 0, 4), Config(2048, 0, 8)]


def test_fastest_correct_candidate_wins_and_every_time_is_recorded() -> None:
    times = {"x1024_w4_s1": 3.0, "x512_w4_s1": 2.0, "x256_w4_s1": 0.5, "x2048_w8_s1": 1.0}
    bench = FakeBench(times, wrong=["x256_w4_s1"], broken=["x2048_w8_s1"])
    winner, timings, rejected = select_config(CANDIDATES, bench)
    assert winner == Config(512, 0, 4)
    assert timings == {"x1024_w4_s1": 3.0, "x512_w4_s1": 2.0}
    assert set(rejected) == {"x256_w4_s1", "x2048_w8_s1"}
    assert "differs" in rejected["x256_w4_s1"] and "shared memory" in rejected["x2048_w8_s1"]
    assert set(bench.ran) == {c.label for c in CANDIDATES}  # every candidate was checked


def test_a_tie_keeps_the_heuristic() -> None:
    bench = FakeBench({c.label: 1.0 for c in CANDIDATES})
    assert select_config(CANDIDATES, bench)[0] == CANDIDATES[0]


def test_a_failing_reference_is_an_autotune_error() -> None:
    bench = FakeBench({c.label: 1.0 for c in CANDIDATES}, broken=["x1024_w4_s1"])
    with pytest.raises(AutotuneError):
        select_config(CANDIDATES, bench)


def test_mismatch_allows_reduction_order_noise_only() -> None:
    ref = torch.randn(1000) * 100
    assert mismatch([ref * (1 + 1e-6)], [ref]) is None
    off = ref.clone()
    off[17] += 1.0
    assert mismatch([off], [ref]) is not None
    nan = ref.clone()
    nan[3] = float("nan")
    assert mismatch([nan], [nan.clone()]) is None and mismatch([ref], [nan]) is not None
    ints = torch.arange(10)
    assert mismatch([ints], [ints.clone()]) is None and mismatch([ints + 1], [ints]) is not None
    bf = torch.randn(64).bfloat16()
    assert mismatch([bf], [bf.clone()]) is None
    assert mismatch([ref, ref], [ref]) is not None
    assert mismatch([ref.double()], [ref]) is not None


# ---------------------------------------------------------------- whole artifacts (interpreter)


def _request(fn: Callable[..., Any], *inputs: torch.Tensor) -> CompileRequest:
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    return CompileRequest(graph=capture_graph(gm, list(inputs)).spec)


def _graph(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.sum(-1) * 3, y.amax(-1) + 1, z.sin() * 2


def _inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(2, 1100), torch.randn(1, 4500), torch.randn(1000)


def _fake_timer(calls: list[str]) -> autotune.Timer:
    """Prefers small tiles, looped rows and few warps: the heuristic loses wherever it can."""

    def timer(config: Config, launch: Callable[[], None]) -> float:
        if not calls:
            launch()  # the thunk launches (do_bench's job on a GPU)
        calls.append(config.label)
        return config.xblock + (0.0 if config.looped else 0.5) + config.num_warps / 100
    return timer


@pytest.fixture(scope="module")
def tuned_pair() -> tuple[Any, Any, CompileRequest, list[str]]:
    request = _request(_graph, *_inputs())
    c = pipeline.run(pipeline.Compilation(request))
    calls: list[str] = []
    return c.artifact, autotune_artifact(c.artifact, request, "cpu", scheduled=c.scheduled,
                                         timer=_fake_timer(calls)), request, calls


def test_tuned_artifact_records_winners_and_timings(tuned_pair) -> None:  # type: ignore[no-untyped-def]
    art, tuned, _, calls = tuned_pair
    assert not art.manifest.tuned and all(not k.tuned for k in art.manifest.kernels)
    m = tuned.manifest
    assert m.tuned and m.key == art.manifest.key
    assert m.stats.tune_s > 0 and art.manifest.stats.tune_s == 0
    assert len(m.kernels) == len(art.manifest.kernels) == 3
    for k in m.kernels:
        rec = k.tuning
        assert rec is not None and rec.device == "cpu"
        assert rec.heuristic in rec.timings_ms and rec.winner in rec.timings_ms
        assert rec.winner == min(rec.timings_ms, key=rec.timings_ms.__getitem__)
        assert len(rec.timings_ms) + len(rec.rejected) >= 3
        assert rec.winner != rec.heuristic  # the fake timer beats every heuristic here
        assert all(label in calls for label in rec.timings_ms)
    sizes = sorted(tuple(k.tuning.sizes) for k in m.kernels)
    assert sizes == [(1, 4500), (2, 1100), (1000,)]
    # The 1100-long rows ran persistent by the heuristic; the looped form won (fake timer).
    row = next(k for k in m.kernels if k.tuning.sizes == [2, 1100])
    assert row.tuning.winner.endswith("_looped") and row.source != _info(art, row.name).source
    tuned.verify()
    assert set(tuned.blobs) == {ref.digest for ref in m.blob_refs()}  # the replaced source is gone
    assert ArtifactManifest.model_validate_json(tuned.manifest_json()) == m


def _info(art: Any, name: str) -> Any:
    return next(k for k in art.manifest.kernels if k.name == name)


def test_tuned_grids_follow_the_winning_block_sizes(tuned_pair) -> None:  # type: ignore[no-untyped-def]
    art, tuned, _, _ = tuned_pair
    before = [s for s in art.manifest.plan.steps if isinstance(s, KernelStep)]
    after = [s for s in tuned.manifest.plan.steps if isinstance(s, KernelStep)]
    assert [s.kernel for s in before] == [s.kernel for s in after]
    changed = 0
    for old, new in zip(before, after):
        xblock = _info(tuned, new.kernel).constexprs["XBLOCK"]
        xnumel = new.args[[isinstance(a, IntArg) for a in new.args].index(True)].value
        assert new.grid == [-(-xnumel // xblock)]
        changed += new.grid != old.grid
    assert changed >= 1


def test_tuned_artifact_matches_eager(tuned_pair) -> None:  # type: ignore[no-untyped-def]
    _, tuned, _, _ = tuned_pair
    inputs = _inputs()
    got = load_plan(tuned)(list(inputs))
    for g, w in zip(got, _graph(*inputs)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)


def test_a_wrong_candidate_never_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A persistent tile shorter than the row drops elements: the real check must reject it."""
    real = autotune.candidate_configs
    bad = Config(1, 512, 4)  # rows of 1100 elements

    def with_bad(shape: KernelShape, heuristic: Config, mode: str = "default") -> list[Config]:
        return [*real(shape, heuristic, mode), bad] if shape.rnumel > 1 else real(shape, heuristic, mode)

    monkeypatch.setattr(autotune, "candidate_configs", with_bad)
    x = torch.randn(3, 1100)
    request = _request(lambda t: t.sum(-1), x)

    def timer(config: Config, launch: Callable[[], None]) -> float:
        return 0.0 if config == bad else 1.0

    c = pipeline.run(pipeline.Compilation(request))
    tuned = autotune_artifact(c.artifact, request, "cpu", scheduled=c.scheduled, timer=timer)
    (k,) = tuned.manifest.kernels
    assert k.tuning is not None and bad.label in k.tuning.rejected
    assert k.tuning.winner != bad.label and k.constexprs.get("RBLOCK") != 512
    torch.testing.assert_close(load_plan(tuned)([x])[0], x.sum(-1))


def test_budget_spent_keeps_heuristics_and_untuned() -> None:
    request = _request(lambda t: t.sin(), torch.randn(100))
    c = pipeline.run(pipeline.Compilation(request))
    art = c.artifact
    assert autotune_artifact(art, request, "cpu", scheduled=c.scheduled, timer=lambda c, f: 1.0, budget_s=-1.0) is art


def test_cpu_builds_stay_untuned() -> None:
    """No GPU of the target's arch: the artifact keeps the heuristic configs and says untuned."""
    request = _request(lambda t: t.cos(), torch.randn(64))
    cuda = request.options.model_copy(update={"target": Target(kind="cuda", arch=90)})
    for req in (request, request.model_copy(update={"options": cuda})):
        art = compile_request(req)
        assert autotune_for_target(art, req, "cuda:0" if not torch.cuda.is_available() else None) is art
        built = compile_and_build(req, tune_device=None)
        assert not built.manifest.tuned and all(k.tuning is None for k in built.manifest.kernels)


def test_tuning_record_round_trips() -> None:
    rec = TuningRecord(device="NVIDIA H200", heuristic="x1024_w4_s1", winner="x2048_w8_s1",
                       timings_ms={"x1024_w4_s1": 0.2, "x2048_w8_s1": 0.15},
                       rejected={"x4096_w16_s1": "RuntimeError: out of resources"}, sizes=[1 << 20])
    assert TuningRecord.model_validate_json(rec.model_dump_json()) == rec


def test_tuning_a_tuned_artifact_changes_nothing(tuned_pair) -> None:  # type: ignore[no-untyped-def]
    _, tuned, request, _ = tuned_pair

    def timer(config: Config, launch: Callable[[], None]) -> float:
        raise AssertionError("nothing should be measured again")

    again = autotune_artifact(tuned, request, "cpu", timer=timer)
    assert again.manifest == tuned.manifest and again.blobs == tuned.blobs


def _scheduled_reductions(fn: Callable[..., Any], *inputs: torch.Tensor) -> list[Any]:
    from fxcc.compiler_core.pipeline import FRONT, Compilation, run

    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    c = run(Compilation(CompileRequest(graph=capture_graph(gm, list(inputs)).spec), record=False), FRONT)
    return [found for found in c.scheduled().values() if found[0].rnumel != 1]


def test_sibling_and_welford_kernels_render_both_forms() -> None:
    """A persistent kernel of sibling reductions and a Welford one (rows of 2000) has a looped form
    too: all its reductions in one r-loop; a softmax (the sum reads the max) has none."""
    from fxcc.compiler_core.autotune import can_loop
    from fxcc.compiler_core.codegen.triton import render_kernel

    x = torch.randn(8, 2000)
    (found,) = _scheduled_reductions(lambda a: (a.sum(-1), a.amax(-1), torch.var_mean(a, -1)), x)
    kernel, buffers, target = found
    assert not kernel.looped and can_loop(kernel)
    looped = render_kernel(kernel, buffers, target, looped=True).source
    assert looped.count("for roffset in range(0, rnumel, RBLOCK):") == 1
    assert "tl.sum(" in render_kernel(kernel, buffers, target, looped=False).source
    (softmax,) = _scheduled_reductions(lambda a: torch.softmax(a, -1), x)
    assert not can_loop(softmax[0])
