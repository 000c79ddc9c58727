"""Every rank of a training job gets the same compile: torchrun jobs of CPU ranks (gloo, each rank
its own local cache) under DDP (DDPOptimizer's graph splits), FSDP2 (fully_shard) and tensor
parallelism (DTensor's parallelize_module), through one real service, Redis and worker. Each job
trains a few steps eagerly and with fxcc on every rank.

Note: DDP, FSDP2 and TP run on 2 ranks, which take every path a rank has; 4 ranks (a world size
in TP's graphs, groups smaller than the world) only where the test needs them: precompile and the
process groups."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.distributed.conftest import (
    assert_same_compile_on_every_rank,
    jobs_by_key,
    precompile,
    torchrun,
    wait_for_jobs,
)

pytestmark = pytest.mark.e2e

# A width per job, so that each job's graphs are new to the shared cluster.
WIDTHS = {("ddp", 2): 16, ("fsdp", 2): 20, ("tp", 2): 40}
GROUPS_CHILD = Path(__file__).with_name("groups_child.py")
COLLECTIVES = {"_c10d_functional.all_reduce.default", "_c10d_functional.wait_tensor.default"}


@pytest.mark.parametrize("parallel,ranks", list(WIDTHS))
def test_every_rank_gets_the_same_compile(shared_cluster, tmp_path, parallel, ranks):
    url, env = shared_cluster
    reports = torchrun(env, ranks, parallel, WIDTHS[parallel, ranks], tmp_path)

    if parallel == "ddp":  # DDPOptimizer split Dynamo's graph at its gradient buckets
        assert reports[0]["aot_graphs"] > reports[0]["dynamo_graphs"], reports[0]
    if parallel == "tp":  # the row-parallel layer's all-reduce runs inside a graph, between kernels
        (forward,) = [e for e in reports[0]["events"] if COLLECTIVES & set(e["extern_ops"])]
        assert forward["kernels"] >= 2
    first = reports[0]["events"]
    assert first, "fxcc compiled no graph"
    assert all(e["source"] in ("remote-compiled", "remote-hit") for r in reports for e in r["events"]), \
        [e for r in reports for e in r["events"]]
    assert_same_compile_on_every_rank(url, env, reports)


def test_precompile_on_one_rank_fills_the_cache_for_every_rank(shared_cluster, tmp_path):
    # Tensor parallelism: its graphs' sizes depend on the world size (DDP's and FSDP2's do not).
    url, env = shared_cluster
    parallel, width = "tp", 56
    report = precompile(env, 4, parallel, width, tmp_path)
    assert report["world"] == 4
    events = report["events"]
    assert events and all(e["source"] == "precompile-submitted" for e in events), events
    assert set(wait_for_jobs(url, env, [e["job_id"] for e in events]).values()) == {"done"}
    jobs = jobs_by_key(url, env)

    # The job itself, 4 ranks with empty local caches: every graph is a hit, nothing compiles.
    reports = torchrun(env, 4, parallel, width, tmp_path)
    for r in reports:
        assert [e["source"] for e in r["events"]] == ["remote-hit"] * len(events), r["events"]
        assert [e["key"] for e in r["events"]] == [e["key"] for e in events]
        assert r["fxcc"] == pytest.approx(r["eager"], rel=1e-4, abs=1e-5)
    assert jobs_by_key(url, env) == jobs


def test_groups_of_one_shape_and_other_names_share_one_key_and_each_call_runs_on_its_own(shared_cluster, tmp_path):
    url, env = shared_cluster
    reports = torchrun(env, 4, "groups", 6, tmp_path, script=GROUPS_CHILD)
    names = {name for r in reports for name in r["groups"]}
    assert len(names) == 3, names  # the two pairs and the world: three groups, three names

    keys = {e["key"] for r in reports for e in r["events"]}
    assert len(keys) == 1 and all(len(r["events"]) == 2 for r in reports), [r["events"] for r in reports]
    assert all("_c10d_functional.all_reduce.default" in e["extern_ops"] for r in reports for e in r["events"])
    assert {k: len(v) for k, v in jobs_by_key(url, env).items() if k in keys} == {keys.pop(): 1}

    for r in reports:
        pair = (0, 1) if r["rank"] < 2 else (2, 3)
        expect = {"pair": math.tanh(2 * sum(0.1 * (i + 1) for i in pair)) + 1,
                  "world": math.tanh(2 * sum(0.1 * (i + 1) for i in range(4))) + 1}
        for group, want in expect.items():
            assert r["results"][group] == pytest.approx([want] * 24, rel=1e-6), (r["rank"], group)
