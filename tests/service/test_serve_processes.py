"""`fxcc serve` with several API processes (FXCC_API_PROCESSES) on a real Redis, as real processes:
the processes serve hits (single and batched, through the client's RemoteService over real HTTP),
a token is honoured by all of them, and SIGTERM stops them all with status 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fxcc.client.remote import RemoteService
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.signing import Signer, TrustedKeys, generate
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings, api_processes
from tests.service.conftest import unary_request

REPO = Path(__file__).resolve().parents[2]
TOKEN = "serve-processes-token"


def test_api_processes_default() -> None:
    redis_url = "redis://127.0.0.1:1/0"
    assert api_processes(ServiceSettings(redis_url=None, api_processes=4)) == 1  # embedded: one process
    assert api_processes(ServiceSettings(redis_url=redis_url), cpus=2) == 1
    assert api_processes(ServiceSettings(redis_url=redis_url), cpus=16) == 8
    assert api_processes(ServiceSettings(redis_url=redis_url), cpus=64) == 8
    assert api_processes(ServiceSettings(redis_url=redis_url, api_processes=3), cpus=64) == 3


def test_serve_with_two_processes(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    signer = Signer(generate()[0])
    base = compile_request(unary_request())
    store = RedisStore(ServiceSettings(redis_url=redis_url, redis_prefix=redis_prefix))
    keys = []
    for n in range(3):
        art = Artifact(base.manifest.model_copy(update={"key": f"{n + 40:064x}"}), base.blobs)
        store.put_artifact(art, signer.sign(art.manifest))
        keys.append(art.manifest.key)
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_REDIS_URL=redis_url, FXCC_REDIS_PREFIX=redis_prefix, FXCC_API_PROCESSES="2",
               FXCC_TOKEN=TOKEN, FXCC_DATA_DIR=str(tmp_path / "data"))
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fxcc", "serve", "--port", str(port)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while log.read_text().count("Application startup complete") < 2:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the API processes did not start: " + log.read_text()
                time.sleep(0.2)
            service = RemoteService(f"http://127.0.0.1:{port}", TOKEN, trusted=TrustedKeys([signer.public]))
            try:
                found = service.get_artifacts(keys + ["5" * 64])
                assert sorted(found) == sorted(keys)
                for _ in range(20):  # new connections, spread over the processes by the kernel
                    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as fresh:
                        r = fresh.get(f"/v1/artifacts/{keys[0]}", headers={"Authorization": f"Bearer {TOKEN}"})
                        assert r.status_code == 200 and r.headers["cache-control"].endswith("immutable")
                        assert fresh.get(f"/v1/artifacts/{keys[0]}").status_code == 401
                assert service.get_artifact(keys[1]).manifest.key == keys[1]
            finally:
                service.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
    text = log.read_text()
    assert rc == 0, text
    assert "with 2 API process(es)" in text and text.count("Started server process") == 2
    assert "stopped" in text
