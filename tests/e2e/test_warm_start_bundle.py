"""End to end, real processes: a model of two graphs (a graph break) compiled through the cluster
saves its Dynamo package at the service; a new machine (empty local cache, same principal's package
key) fetches both graphs' artifacts in one bundle request, not one GET per graph, and the next new
machine reads that bundle as stored. Requests are counted in the service's access log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e import test_dynamo_skip_shared as shared

pytestmark = [pytest.mark.e2e, pytest.mark.service_env(FXCC_ACCESS_LOG="1")]

# test_dynamo_skip_shared's client, its model broken into two graphs
CLIENT = shared.CLIENT.replace("        return self.body(x).softmax(-1)\n", """\
        y = self.body[:2](x)
        torch._dynamo.graph_break()
        return self.body[2:](y).softmax(-1)
""")
assert CLIENT != shared.CLIENT

_REQUEST = re.compile(r'"(GET|POST|PUT) (/v1/[a-z-]+)')


def _requests(log: Path, start: int) -> tuple[list[str], int]:
    """The requests the service logged after byte `start` (method and resource), and the log's end."""
    text = log.read_text()
    return [f"{m} {path}" for m, path in _REQUEST.findall(text[start:])], len(text)


def test_a_new_machine_fetches_a_model_in_one_request(client_env, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    key = tmp_path / "principal" / "package.key"
    log = tmp_path / "serve.log"
    a = shared._client(client_env, script, tmp_path / "machine-a", key)
    assert a["aot_runs"] == 2 and a["counters"]["saved"] >= 1
    _, end = _requests(log, 0)

    b = shared._client(client_env, script, tmp_path / "machine-b", key)
    assert (b["traced"], b["aot_runs"]) == (0, 0)
    assert b["events"] == [["remote-hit", "skipped: Dynamo package"]] * 2  # both from the one bundle
    asked, end = _requests(log, end)
    assert asked == ["GET /v1/packages", "GET /v1/bundles", "POST /v1/bundles"]  # assembled and stored

    c = shared._client(client_env, script, tmp_path / "machine-c", key)
    assert c["events"] == [["remote-hit", "skipped: Dynamo package"]] * 2
    assert len(list((tmp_path / "machine-c" / "artifacts" / "manifests").glob("*.json"))) == 2  # kept locally
    asked, _ = _requests(log, end)
    assert asked == ["GET /v1/packages", "GET /v1/bundles"]  # the stored bundle
