"""Fixtures of the distributed tests: one cluster (a real service on Redis and one worker) that the
tests of a module share, and torchrun jobs of tests/distributed/train_child.py as its clients."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import client_env_of, running_cluster

CHILD = Path(__file__).with_name("train_child.py")


@pytest.fixture(scope="module")
def shared_cluster(redis_url: str, module_redis_prefix: str,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A service and a worker for every test of the module: (url, the environment of its clients)."""
    with running_cluster(redis_url, module_redis_prefix, tmp_path_factory.mktemp("cluster")) as (url, env):
        yield url, client_env_of(url, env)


def torchrun(env: dict[str, str], ranks: int, parallel: str, width: int, workdir: Path,
             script: Path = CHILD) -> list[dict]:
    """Run `script` on `ranks` CPU processes (gloo), each rank with its own FXCC_CACHE_DIR under
    `workdir`; each rank's report (train_child.py), rank 0 first.

    Note: twice in CI (sessions 16 and 18, never in 80 runs alone or under load) a gloo rank died
    of SIGABRT ("terminate called without an active exception": a C++ std::terminate, no Python
    error) while the suite ran. Such a death (a rank killed by a signal, as torchrun reports it) is
    said as a warning with the ranks' stderr and the job runs once more in a fresh directory; any
    other failure, or a second death, fails the test. PYTHONFAULTHANDLER makes a dying rank print
    every Python thread's stack."""
    env = dict(env, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    for attempt in ("", "-again"):
        out = workdir / f"{parallel}-{ranks}{attempt}"
        out.mkdir(parents=True)
        run_env = dict(env, FXCC_PARALLEL=parallel, FXCC_CACHE_ROOT=str(out / "cache"))
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                               "--nproc-per-node", str(ranks), str(script), "--out", str(out), "--width", str(width)],
                              check=False, env=run_env, timeout=300, capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        if done.returncode == 0:
            return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
        if attempt or not _KILLED.search(done.stderr):
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        warnings.warn(f"a rank of the {parallel}-{ranks} job was killed by a signal; running it again:\n"
                      + "\n".join(done.stderr.splitlines()[-40:]), stacklevel=2)
    raise AssertionError("unreachable")


# torchrun's line for a rank that a signal ended: "failed (exitcode: -6) local_rank: 1 (pid: ...)"
_KILLED = re.compile(r"failed \(exitcode: -\d+\) local_rank")


def assert_same_compile_on_every_rank(url: str, env: dict[str, str], reports: list[dict]) -> None:
    """Every rank got graphs of the same keys as rank 0, the service ran one compile job per distinct
    graph however many ranks asked for it, and every rank's losses equal eager's."""
    import pytest

    keys = [e["key"] for e in reports[0]["events"]]
    for report in reports[1:]:
        assert [e["key"] for e in report["events"]] == keys, f"rank {report['rank']} has other keys"
    jobs = jobs_by_key(url, env)
    assert {k: len(jobs.get(k, [])) for k in set(keys)} == {k: 1 for k in set(keys)}
    for report in reports:
        assert report["fxcc"] == pytest.approx(report["eager"], rel=1e-4, abs=1e-5), report["rank"]


def jobs_by_key(url: str, env: dict[str, str]) -> dict[str, list[str]]:
    """The compile jobs the service holds for the clients' principal, by compile key (GET /v1/jobs)."""
    answer = httpx.get(f"{url}/v1/jobs", params={"limit": 1000}, timeout=10,
                       headers={"Authorization": f"Bearer {env['FXCC_TOKEN']}"})
    answer.raise_for_status()
    out: dict[str, list[str]] = {}
    for job in answer.json():
        if job["kind"] == "compile":
            out.setdefault(job["key"], []).append(job["id"])
    return out


def precompile(env: dict[str, str], world_size: int, parallel: str, width: int, workdir: Path) -> dict:
    """`fxcc precompile --world-size N` of train_child.py in one process: its report (as rank 0)."""
    out = workdir / f"precompile-{parallel}"
    out.mkdir(parents=True)
    env = dict(env, FXCC_PARALLEL=parallel, FXCC_CACHE_ROOT=str(out / "cache"), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "fxcc.client.cli", "precompile", "--world-size", str(world_size),
                    str(CHILD), "--out", str(out), "--width", str(width)], env=env, check=True, timeout=300)
    return json.loads((out / "rank0.json").read_text())


def wait_for_jobs(url: str, env: dict[str, str], job_ids: list[str], timeout_s: float = 240) -> dict[str, str]:
    """Each job's final state, long-polling GET /v1/jobs/{id}?wait= until it ends."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {env['FXCC_TOKEN']}"}
    states: dict[str, str] = {}
    for job_id in job_ids:
        while True:
            job = httpx.get(f"{url}/v1/jobs/{job_id}", params={"wait": 10}, headers=headers, timeout=30).json()
            if job["state"] not in ("queued", "running") or time.monotonic() > deadline:
                states[job_id] = job["state"]
                break
    return states
