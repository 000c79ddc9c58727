"""fxcc's first call through a running service: fresh client processes against `fxcc serve`.

    python -m bench.service_first_call --workload transformer_block        # on the GPU machine
    TRITON_INTERPRET=1 python -m bench.service_first_call --workload cos_sin --tiny   # CPU check

Starts `fxcc serve` with its embedded default (no Redis: artifacts under a fresh FXCC_DATA_DIR,
one in-process worker that compiles and, for a CUDA target, builds cubins) on a free loopback
port, with an empty TRITON_CACHE_DIR of its own; then, one after the other, two fresh client
processes (`bench.first_call --compiler fxcc` with FXCC_URL set, FXCC_FALLBACK=error):
- cold: empty FXCC_CACHE_DIR and TRITON_CACHE_DIR; the service has never seen the graphs, so
  each is a compile job for the worker (sources `remote-compiled`);
- warm: another new process, again with empty local caches; the artifacts are in the service's
  cache (sources `remote-hit`).
Prints one JSON line: fxcc_cold_s, fxcc_warm_s, each run's details, and an error per run that
failed or was not served as described.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.run import _python
from fxcc.client.demo import free_port, wait_healthy

# Where each run's graphs may come from; `local-hit`: a graph that appears twice in one process.
EXPECTED = {"fxcc_cold_s": ({"remote-compiled"}, {"remote-compiled", "remote-hit", "local-hit"}),
            "fxcc_warm_s": ({"remote-hit"}, {"remote-hit", "local-hit"})}


def service_first_call(workload: str, tiny: bool = False, timeout_s: float = 300.0) -> dict[str, Any]:
    """fxcc_cold_s and fxcc_warm_s (None where a run failed, with `fxcc_cold_error` / `fxcc_warm_error` saying why)."""
    with tempfile.TemporaryDirectory(prefix=f"fxcc-bench-service-{workload}-") as tmp:
        t = Path(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
        env.update(PYTHONUNBUFFERED="1", FXCC_DATA_DIR=str(t / "service"), TRITON_CACHE_DIR=str(t / "service-triton"))
        log_path = t / "service.log"
        with log_path.open("w") as log:
            server = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_healthy(url, server, timeout_s=min(timeout_s, 120.0))
                res = _client_runs(workload, tiny, timeout_s, env, url, t)
            except RuntimeError as e:
                res = {f: None for f in EXPECTED} | {_error_field(f): str(e) for f in EXPECTED}
            finally:
                _stop(server)
        if any(_error_field(f) in res for f in EXPECTED):
            res["service_log_tail"] = log_path.read_text().splitlines()[-20:]
    return res


def _client_runs(workload: str, tiny: bool, timeout_s: float, env: dict[str, str], url: str,
                 t: Path) -> dict[str, Any]:
    """The cold run, then the warm one, each in a fresh process with empty local caches."""
    res: dict[str, Any] = {}
    # --split: each run's detail also says where its time went (imports, Dynamo, AOTAutograd, fxcc, run)
    args = ["bench.first_call", "--workload", workload, "--compiler", "fxcc", "--split",
            *(["--tiny"] if tiny else [])]
    for field, (must, allowed) in EXPECTED.items():
        run = field.removesuffix("_s")
        cenv = dict(env, FXCC_URL=url, FXCC_FALLBACK="error", FXCC_BLOCKING="1",
                    FXCC_CACHE_DIR=str(t / f"{run}-fxcc"), TRITON_CACHE_DIR=str(t / f"{run}-triton"),
                    TORCHINDUCTOR_CACHE_DIR=str(t / f"{run}-inductor"))
        r, err = _python(args, cenv, timeout_s)
        sources = set(r.get("sources", [])) if r else set()
        if r and not (must <= sources <= allowed):
            err = f"graphs came from {sorted(sources)}; expected {sorted(must)} (at most {sorted(allowed)})"
        res[field] = r["first_call_s"] if r and not err else None
        if r:
            res[f"{run}_detail"] = r
        if err:
            res[_error_field(field)] = err
    return res


def _error_field(field: str) -> str:
    """fxcc_cold_s -> fxcc_cold_error (as bench.run names the other runs' errors)."""
    return field.removesuffix("_s") + "_error"


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True)
    p.add_argument("--tiny", action="store_true", help="a CPU-sized workload on the CPU (set TRITON_INTERPRET=1)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per client process")
    a = p.parse_args()
    print(json.dumps({"name": a.workload, **service_first_call(a.workload, a.tiny, a.timeout_s)}))


if __name__ == "__main__":
    main()
