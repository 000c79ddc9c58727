"""serve_main under real uvicorn in a subprocess: it logs its store mode and port, serves, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def test_serve_main_embedded(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env["FXCC_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "serve.log"
    code = f"from fxcc.service.server import serve_main; serve_main('127.0.0.1', {port})"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, "service did not start"
                    time.sleep(0.1)
            assert r.json() == {"ok": True, "store": "embedded"}
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
    text = log.read_text()
    assert rc == 0, text
    assert "embedded store in" in text and str(tmp_path / "data") in text and f":{port}" in text
