"""The fxcc command line, run as a real process."""

import json
import os
import subprocess
import sys


def fxcc(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "client.cli", *args], check=False, capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_precompile_runs_the_script_and_reports_graphs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "f = torch.compile(lambda x: torch.cos(torch.sin(x)) * float(sys.argv[1]), backend='fxcc')\n"
        "print('result', f(torch.ones(8)).sum().item())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1")
    r = fxcc("precompile", str(script), "3", env=env)
    assert r.returncode == 0, r.stderr
    assert "result" in r.stdout and "precompile-compiled" in r.stdout
    assert "1 graph(s) submitted or already cached" in r.stdout
    assert list((tmp_path / "cache" / "artifacts" / "manifests").glob("*.json"))


def test_doctor_json_and_bad_usage():
    r = fxcc("doctor", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["torch"] and "cuda" in info
    bad = fxcc("no-such-command")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    status = fxcc("status", "abc", env={k: v for k, v in os.environ.items() if k != "FXCC_URL"})
    assert status.returncode == 2 and "no service URL" in status.stderr
