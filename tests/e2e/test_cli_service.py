"""`fxcc status|jobs|stats|cache` as real processes against a real `fxcc serve` (embedded default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from fxcc.client.demo import free_port, wait_healthy
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec

pytestmark = pytest.mark.e2e


@pytest.fixture
def service(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_DATA_DIR=str(tmp_path / "data"))
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, dict(env, FXCC_URL=url)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def fxcc(env, *args):
    r = subprocess.run([sys.executable, "-m", "fxcc.client.cli", *args], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    return r.returncode, r.stdout, r.stderr


def test_cli_reads_and_manages_a_running_service(service):
    url, env = service
    graph = GraphSpec(placeholders=[Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[8], strides=[1]))],
                      nodes=[Node(name="y", target="aten.exp.default", args=[NodeRef(name="x")])],
                      outputs=[NodeRef(name="y")])
    answer = httpx.post(f"{url}/v1/compile", content=CompileRequest(graph=graph).model_dump_json(),
                        headers={"Content-Type": "application/json"}, timeout=30).json()
    job, key = answer["job_id"], answer["key"]
    httpx.get(f"{url}/v1/jobs/{job}", params={"wait": 30}, timeout=40)

    code, out, err = fxcc(env, "status", job, "--json")
    assert code == 0, err
    assert json.loads(out)["state"] == "done"
    code, out, _ = fxcc(env, "jobs", "--json", "--state", "done")
    assert code == 0 and job in [j["id"] for j in json.loads(out)]
    code, out, _ = fxcc(env, "jobs", "--state", "done")
    row = next(line for line in out.splitlines() if line.startswith(job))
    assert code == 0 and row.split()[1:3] == ["done", "interactive"]
    assert row.split()[-1] == "anonymous"  # who asked (the embedded default's one user)
    code, out, _ = fxcc(env, "stats", "--json")
    assert code == 0 and json.loads(out)["cache"]["entries"] == 1
    code, out, _ = fxcc(env, "cache", "ls")
    assert code == 0 and key in out
    code, out, _ = fxcc(env, "cache", "rm", key)
    assert code == 0 and "removed 1 entry" in out
    code, out, _ = fxcc(env, "cache", "ls", "--json")
    assert code == 0 and key not in out
    code, _, err = fxcc(env, "status", "no-such-job")
    assert code == 1 and "404" in err
    code, out, _ = fxcc(env, "cache", "purge", "--yes")
    assert code == 0 and "purged" in out
