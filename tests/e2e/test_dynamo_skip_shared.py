"""End to end, real processes: a client process compiles a model through the cluster (`cluster` in
conftest.py: `fxcc serve` on Redis with a token, a signing worker); its Dynamo package goes to the
service, signed by the principal's package key. A second client process, a new machine with an
empty local cache and the same principal's key file, runs its first call from the service's
package without tracing; a third, holding the principal's key but trusting another worker's key,
loads the package, refuses its artifact and traces (the package is uninstalled: nothing of it
runs); a fourth, holding another package key, refuses the package and traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from fxcc.compiler_core.signing import write_key_pair

pytestmark = pytest.mark.e2e

# A file, not `python -c`: torch hashes the source of what Dynamo inlined when it loads a package.
CLIENT = """
import json, torch
import torch._dynamo.utils as dynamo_utils
from torch import nn
from fxcc.client import backend, dynamo_cache

class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))

    def forward(self, x):
        return self.body(x).softmax(-1)

torch.manual_seed(0)
model = Head().eval()
x = torch.randn(4, 16)
with torch.no_grad():
    got = torch.compile(model, backend="fxcc")(x)
    torch.testing.assert_close(got, model(x))
print(json.dumps({"traced": dynamo_utils.counters["frames"]["ok"], "aot_runs": backend.aot_runs(),
                  "events": [[e.source, e.pre_aot] for e in backend.events()],
                  "counters": dynamo_cache.counters()}))
"""


def _client(env: dict[str, str], script: Path, cache: Path, key: Path, **extra: str) -> dict:
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                         env=dict(env, FXCC_CACHE_DIR=str(cache), FXCC_PACKAGE_KEY_FILE=str(key),
                                  FXCC_DYNAMO_CACHE="1", **extra), check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_machine_skips_dynamo_through_the_service(client_env, redis_url, redis_prefix, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    key = tmp_path / "principal" / "package.key"
    a = _client(client_env, script, tmp_path / "machine-a", key)
    assert (a["traced"], a["aot_runs"]) == (1, 1)
    assert a["counters"] == {"misses": 1, "saved": 1, "shared": 1}
    # The package is the token's principal's, in the service's Redis under the cluster's prefix.
    r = redis.Redis.from_url(redis_url)
    (stored,) = list(r.scan_iter(match=f"{redis_prefix}package:FXCC_TOKEN:*"))
    assert r.get(stored).startswith(b"FXCCPKG1\n")

    b = _client(client_env, script, tmp_path / "machine-b", key)
    assert (b["traced"], b["aot_runs"]) == (0, 0)  # no tracing, no AOTAutograd
    assert b["events"] == [["remote-hit", "skipped: Dynamo package"]]  # the artifact from the service
    assert b["counters"] == {"hits": 1}
    assert len(list((tmp_path / "machine-b" / "dynamo").glob("*.pkg"))) == 1  # kept for the next process

    other_worker = tmp_path / "other-worker" / "signing.key"
    write_key_pair(other_worker, other_worker.with_name("signing.pub"))
    d = _client(client_env, script, tmp_path / "machine-d", key,
                FXCC_TRUSTED_KEYS=str(other_worker.with_name("signing.pub")))
    assert d["traced"] == 1 and d["counters"].get("errors") == 1 and "hits" not in d["counters"]
    # (before c: what c traces is saved under its own key, and shared in the package's place)

    c = _client(client_env, script, tmp_path / "machine-c", tmp_path / "another" / "package.key")
    assert c["traced"] == 1 and c["counters"]["refused"] == 1 and "hits" not in c["counters"]
    assert c["events"] == [["remote-hit", "skipped: pre-AOT cache hit from the service"]]
