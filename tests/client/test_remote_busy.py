"""The client's submit against a busy service (the real app on a real Redis, in this process): a
429 over the principal's quota is asked again after Retry-After until the service takes the job,
and a service still busy when the wait is up is a ServiceError naming the 429."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fxcc.client.remote import RemoteService, ServiceError
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings
from tests.service.conftest import TESTCLIENT_HOST, unary_request


def test_a_busy_service_is_asked_again_after_retry_after(
        tmp_path: Path, redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    # No worker: a job stays queued, holding the quota of one, until it is cancelled.
    settings = ServiceSettings(redis_url=redis_url, redis_prefix=redis_prefix, data_dir=tmp_path / "data",
                               anonymous=True, anonymous_role="admin", allowed_hosts=[TESTCLIENT_HOST],
                               quota_queued_jobs=1, quota_retry_after_s=1)
    caplog.set_level(logging.WARNING, logger="fxcc.remote")
    with TestClient(create_app(settings)) as http:
        remote = RemoteService("http://testserver")
        remote.http = http  # the app itself, over ASGI
        first = remote.submit(unary_request("aten.sin.default"))
        assert first["status"] == "queued"
        with pytest.raises(ServiceError, match="429"):
            remote.submit(unary_request("aten.cos.default"), busy_wait_s=0.5)
        threading.Timer(1.5, http.delete, (f"/v1/jobs/{first['job_id']}",)).start()
        second = remote.submit(unary_request("aten.exp.default"), busy_wait_s=60)  # once the first is gone
        assert second["status"] == "queued" and second["job_id"] != first["job_id"]
        assert "is busy (429 FXCC_QUOTA_QUEUED_JOBS)" in caplog.text
        assert http.get(f"/v1/jobs/{first['job_id']}").json()["state"] == "cancelled"
