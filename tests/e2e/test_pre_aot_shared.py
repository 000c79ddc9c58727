"""End to end, real processes: a client process compiles a model through the cluster (`cluster` in
conftest.py); a second client process, a new machine with an empty local cache, gets the pre-AOT
entry and the artifact from the service and never calls AOTAutograd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.child_scripts import COUNT_AOT

pytestmark = pytest.mark.e2e

# AOTAutograd is counted by fxcc and through a wrapper around torch's aot_module_simplified.
CLIENT = COUNT_AOT + """
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).eval()
x = torch.randn(4, 16)
with torch.no_grad():
    got = torch.compile(model, backend="fxcc")(x)
    torch.testing.assert_close(got, model(x))
    err = (got - model(x)).abs().max().item()
print(json.dumps({"aot_module_simplified": len(calls), "aot_runs": backend.aot_runs(), "max_abs_err": err,
                  "events": [[e.source, e.pre_aot, e.key] for e in backend.events()]}))
"""


def _client(env: dict[str, str], cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CLIENT], env=dict(env, FXCC_CACHE_DIR=str(cache)),
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_machine_skips_aot_autograd_through_the_service(client_env, redis_url, redis_prefix, tmp_path):
    a = _client(client_env, tmp_path / "machine-a")
    assert (a["aot_module_simplified"], a["aot_runs"]) == (1, 1)
    ((source, how, key),) = a["events"]
    assert (source, how) == ("remote-compiled", "ran; stored for the next process")
    # The entry is the token's principal's, in the service's Redis under the cluster's prefix.
    r = redis.Redis.from_url(redis_url)
    assert len(list(r.scan_iter(match=f"{redis_prefix}preaot:FXCC_TOKEN:*"))) == 1

    assert not (tmp_path / "machine-b").exists()
    b = _client(client_env, tmp_path / "machine-b")
    assert (b["aot_module_simplified"], b["aot_runs"]) == (0, 0)
    assert b["events"] == [["remote-hit", "skipped: pre-AOT cache hit from the service", key]]
    assert b["max_abs_err"] <= 1e-5
    assert len(list((tmp_path / "machine-b" / "pre_aot").glob("*.json"))) == 1
