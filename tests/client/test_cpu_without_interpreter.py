"""A CPU-only client without Triton's interpreter: its graphs run as they are, said once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, torch
    from fxcc.client import backend

    def f(x):
        return torch.sin(x).cos() + x.sum(-1, keepdim=True)

    def g(x):
        return torch.relu(x) * 2

    x = torch.randn(64, 32)
    out = {"f": bool(torch.equal(torch.compile(f, backend="fxcc")(x), f(x))),
           "g": bool(torch.equal(torch.compile(g, backend="fxcc")(x), g(x))),
           "compiled": [e.source for e in backend.events()]}
    print(json.dumps(out))
""")


def test_graphs_run_uncompiled_and_it_is_said_once(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FXCC_URL")}
    env.update(FXCC_CACHE_DIR=str(tmp_path / "cache"), FXCC_DYNAMO_CACHE="0")
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"f": True, "g": True, "compiled": []}
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("fxcc: this graph runs on the CPU")]
    assert len(said) == 1 and "TRITON_INTERPRET=1" in said[0], p.stderr[-3000:]
    assert "failed to run" not in p.stderr and "InterpreterError" not in p.stderr
