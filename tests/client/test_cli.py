"""The fxcc command line, run as a real process."""

import json
import os
import subprocess
import sys


def fxcc(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "fxcc.client.cli", *args], check=False, capture_output=True,
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    r = fxcc("doctor", "--json", env=env)
    assert r.returncode == 0, r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["torch"]["ok"] and checks["cache dir"]["ok"]
    assert checks["service"]["ok"] is None  # no FXCC_URL: in-process
    down = fxcc("doctor", env=dict(env, FXCC_URL="http://127.0.0.1:9"))
    assert down.returncode == 1 and "FAIL" in down.stdout and "unreachable" in down.stdout
    bad = fxcc("no-such-command")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    status = fxcc("status", "abc", env=env)
    assert status.returncode == 2 and "no service URL" in status.stderr
    unreachable = fxcc("jobs", "--url", "http://127.0.0.1:9", env=env)
    assert unreachable.returncode == 3 and "unreachable" in unreachable.stderr
    purge = fxcc("cache", "purge", "--url", "http://127.0.0.1:9", env=env)
    assert purge.returncode == 2 and "--yes" in purge.stderr


def test_jobs_table_names_tune_jobs_by_their_arch():
    from fxcc.client.cli_service import _job_kind

    assert _job_kind({"kind": "tune", "arch": 90, "priority": "precompile"}) == "tune sm_90"
    assert _job_kind({"kind": "compile", "priority": "interactive"}) == "interactive"
    assert _job_kind({"priority": "precompile"}) == "precompile"  # a record from before job kinds
