"""End to end, real processes: a model of two graphs (a graph break) compiled through the cluster
saves its Dynamo package at the service; a new machine (empty local cache, same principal's package
key) fetches both graphs' artifacts in one bundle request, not one GET per graph, and the next new
machine reads that bundle as stored. Requests are counted in the service's access log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_dynamo_skip_shared import _client

pytestmark = [pytest.mark.e2e, pytest.mark.service_env(FXCC_ACCESS_LOG="1")]

# A file, not `python -c`: torch hashes the source of what Dynamo inlined when it loads a package.
CLIENT = """
import json, torch
import torch._dynamo.utils as dynamo_utils
from torch import nn
from fxcc.client import backend, dynamo_cache

class TwoGraphs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        y = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(y).softmax(-1)

torch.manual_seed(0)
model = TwoGraphs().eval()
x = torch.randn(4, 16)
with torch.no_grad():
    got = torch.compile(model, backend="fxcc")(x)
    torch.testing.assert_close(got, model(x))
print(json.dumps({"traced": dynamo_utils.counters["frames"]["ok"], "aot_runs": backend.aot_runs(),
                  "events": [[e.source, e.pre_aot] for e in backend.events()],
                  "counters": dynamo_cache.counters()}))
"""

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
    a = _client(client_env, script, tmp_path / "machine-a", key)
    assert a["aot_runs"] == 2 and a["counters"]["saved"] >= 1
    _, end = _requests(log, 0)

    b = _client(client_env, script, tmp_path / "machine-b", key)
    assert (b["traced"], b["aot_runs"]) == (0, 0)
    assert b["events"] == [["local-hit", "skipped: Dynamo package"]] * 2  # both prefetched
    asked, end = _requests(log, end)
    assert asked == ["GET /v1/packages", "GET /v1/bundles", "POST /v1/bundles"]  # assembled and stored

    c = _client(client_env, script, tmp_path / "machine-c", key)
    assert c["events"] == [["local-hit", "skipped: Dynamo package"]] * 2
    asked, _ = _requests(log, end)
    assert asked == ["GET /v1/packages", "GET /v1/bundles"]  # the stored bundle
