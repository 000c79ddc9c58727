"""The Dynamo-skip cache (client/dynamo_cache.py): a new process's first call runs from the saved,
signed package without tracing; every guard that fails there (shape, dtype, grad mode, module
attribute, global, a global function or a module's function replaced by another (identity
guards, which packages carry in another form); torch and fxcc versions and fxcc's settings through the package's key; device
on a GPU machine only) traces and compiles as usual; a package not signed by this principal's key is a miss.

Three child processes for the module (tests/client/dynamo_skip_child.py): one saves, one checks the
guards, one the versions and signatures. Devices: these machines have only a CPU, so the device
case runs only where CUDA is available (a cuda input fails the same tensor guard a dtype does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHILD = Path(__file__).with_name("dynamo_skip_child.py")
REPO = Path(__file__).parents[2]


def _child(phase: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, str(CHILD), phase], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict]:
    root = tmp_path_factory.mktemp("dynamo-skip")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_CACHE_DIR=str(root / "cache"), FXCC_PACKAGE_KEY_FILE=str(root / "keys" / "package.key"),
               FXCC_DYNAMO_CACHE="1", TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])))
    return env, _child("save", env)


def test_the_first_process_traces_and_saves_a_signed_package(saved):
    env, out = saved
    for case in out.values():
        assert (case["traced"], case["graphs"]) == (1, 1)
    assert out["with_options"]["counters"] == {"misses": 8, "saved": 8}
    packages = sorted((Path(env["FXCC_CACHE_DIR"]) / "dynamo").glob("*.pkg"))
    assert len(packages) == 11
    assert all(p.read_bytes().startswith(b"FXCCPKG1\n") for p in packages)
    key = Path(env["FXCC_PACKAGE_KEY_FILE"])
    assert key.stat().st_mode & 0o077 == 0 and Path(f"{key}.pub").is_file()


def test_a_new_process_skips_tracing_and_every_failing_guard_traces(saved):
    env, _ = saved
    out = _child("guards", env)
    # the saved state: no frame traced, no graph handed to fxcc's backend (no AOTAutograd, no compile)
    aot_compile = ("aot_compile_loaded",) if hasattr(torch.compile(lambda x: x, fullgraph=True), "aot_compile") else ()
    assert ("aot_compile_loaded" in out) == bool(aot_compile)  # torch 2.11 has no aot_compile
    for name in ("hit", "pointwise_hit", "back_to_saved", "decorated_hit", *aot_compile):
        assert (out[name]["traced"], out[name]["graphs"]) == (0, 0), name
    assert out["hit"]["counters"] == {"hits": 1}
    # each guard that fails traces and compiles as usual (the child checked every result against eager)
    for name in ("shape", "grad_mode", "module_attribute", "global", "dtype") + (("device",) if "device" in out else ()):
        assert out[name]["traced"] == 1 and out[name]["graphs"] >= 1, name
    assert out["grad_mode"]["graphs"] == 2  # a training graph: forward and backward
    assert out["dtype"]["counters"]["hits"] == 2
    # identity guards, kept in another form: another global function or a module's other function
    # where the package saw one traces; the saved function again runs from the package
    assert out["rebound_function"]["traced"] == 1 and out["rebound_function"]["counters"]["hits"] == 3
    assert out["function_back"]["traced"] == 0 and out["function_back"]["graphs"] == 0
    assert out["module_function_other"]["traced"] == 1
    assert out["module_function_other"]["counters"]["hits"] == 5
    assert out["other_backend"] == {"noticed": True, "first_right": True}


def test_other_versions_and_foreign_or_tampered_packages_are_misses(saved):
    env, _ = saved
    out = _child("trust", env)
    for name in ("fxcc_version", "torch_version", "foreign_key", "tampered"):
        assert (out[name]["traced"], out[name]["graphs"]) == (1, 1), name
    assert out["torch_version"]["counters"]["misses"] == 2  # other versions: another package key
    assert out["tampered"]["counters"]["refused"] == 2  # another principal's key; bytes changed
    assert "hits" not in out["tampered"]["counters"]
    assert (out["same_options"]["traced"], out["same_options"]["graphs"]) == (0, 0)
    assert out["same_options"]["counters"]["hits"] == 1
    assert (out["other_mode"]["traced"], out["other_mode"]["graphs"]) == (1, 1)
    # a package whose artifact cannot be loaded is uninstalled and traced (its placeholder never runs)
    assert (out["lost_artifact"]["traced"], out["lost_artifact"]["graphs"]) == (1, 1)
    before, after = out["same_options"]["counters"], out["lost_artifact"]["counters"]
    assert after.get("errors", 0) == before.get("errors", 0) + 1 and after["hits"] == before["hits"]
