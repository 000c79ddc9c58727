"""A real `fxcc serve`: while a 27-MB request is being checked the health check and other requests
are answered, the check is stopped at FXCC_CHECK_TIMEOUT_S with a 422, and the service goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from fxcc.client.demo import free_port, wait_healthy
from tests.service.conftest import unary_request
from tests.service.test_checker import wide_cat_body

pytestmark = pytest.mark.e2e

JSON = {"Content-Type": "application/json"}


def test_a_huge_request_stalls_nobody_and_is_stopped_at_its_limit(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_DATA_DIR=str(tmp_path / "data"), FXCC_CHECK_TIMEOUT_S="4",
               FXCC_CHECK_PROCESSES="2", FXCC_COMPILE_PROCESS_WARM="0")
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    http = httpx.Client(timeout=120)
    try:
        wait_healthy(url, proc)
        # Warm the checkers (the first request waits for them to import torch).
        assert http.post(f"{url}/v1/compile", content=unary_request().model_dump_json(), headers=JSON).status_code == 202
        big = wide_cat_body()
        answer: list[httpx.Response] = []
        t = threading.Thread(target=lambda: answer.append(http.post(f"{url}/v1/compile", content=big, headers=JSON)))
        t.start()
        health, other = [], None
        while t.is_alive():
            health.append(httpx.get(f"{url}/healthz", timeout=10).status_code)
            if other is None:
                other = httpx.post(f"{url}/v1/compile", timeout=30, headers=JSON,
                                   content=unary_request("aten.cos.default").model_dump_json()).status_code
            time.sleep(0.05)
        t.join()
        assert health and set(health) == {200}, health  # answered all along, while the check ran
        assert other == 202  # a small request went by on the other checker
        r = answer[0]
        assert r.status_code == 422 and r.json()["error"] == "TooCostly", r.text[:300]
        assert "FXCC_CHECK_TIMEOUT_S" in r.json()["message"]
        # The stopped checker was replaced: the service goes on checking.
        r = http.post(f"{url}/v1/compile", content=unary_request("aten.exp.default").model_dump_json(), headers=JSON)
        assert r.status_code == 202 and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        http.close()
