"""A Redis restart under a running service (no worker alive): 503 with Retry-After while Redis is
down, then the service makes its consumer groups again; never a 500. A redis-server of this test's
own, stopped and started again on its port (the shared one of tests/conftest.py is left alone)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings
from tests.service.redis_server import RedisServer

PATHS = ("/v1/status", "/v1/stats", "/metrics")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path)
    s.start()
    yield s
    s.stop()


def test_a_redis_restart_gives_503_then_groups_are_made_again(server: RedisServer, tmp_path: Path,
                                                              make_unary) -> None:
    settings = ServiceSettings(redis_url=server.url, data_dir=tmp_path / "data", anonymous=True,
                               anonymous_role="admin", allowed_hosts=["testserver"])
    json_ = {"Content-Type": "application/json"}
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        assert client.post("/v1/compile", content=make_unary().model_dump_json(), headers=json_).status_code == 202
        for path in PATHS:
            assert client.get(path).status_code == 200

        server.stop()
        for path in PATHS:
            r = client.get(path)
            assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0, (path, r.text)
            assert r.json()["error"] == "StoreUnavailable"

        server.start()  # empty: the streams and their consumer groups are gone (NOGROUP)
        seen = []
        for _ in range(5):
            seen = [client.get(path).status_code for path in PATHS]
            assert set(seen) <= {200, 503}, seen  # never a 500
            if seen == [200, 200, 200]:
                break
        assert seen == [200, 200, 200]
        assert client.get("/v1/status").json()["queue"]["interactive"] == {"waiting": 0, "running": 0}
        # The groups are back: a job queued now reaches a worker.
        r = client.post("/v1/compile", content=make_unary("aten.cos.default").model_dump_json(), headers=json_)
        assert r.status_code == 202
        [claim] = client.app.state.store.claim("w", block_ms=100)
        assert claim.job_id == r.json()["job_id"]


def test_groups_deleted_under_a_live_service_are_made_again(redis_settings: ServiceSettings, make_unary) -> None:
    with TestClient(create_app(redis_settings), raise_server_exceptions=False) as client:
        client.post("/v1/compile", content=make_unary().model_dump_json(),
                    headers={"Content-Type": "application/json"})
        store = client.app.state.store
        for stream in store.k.streams():
            store.r.xgroup_destroy(stream, "workers")
        for path in PATHS:
            assert client.get(path).status_code == 200, path
        assert client.get("/v1/status").json()["queue"]["interactive"]["waiting"] == 1
