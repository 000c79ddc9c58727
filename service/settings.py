"""Service and worker settings: the one typed place that reads FXCC_* environment variables."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """Everything the service, its embedded worker and `fxcc worker` can be configured with."""

    model_config = SettingsConfigDict(env_prefix="FXCC_", extra="ignore")

    # None means embedded mode: artifacts on local disk, jobs in memory, an in-process worker.
    redis_url: str | None = None
    # Every Redis key lives under this prefix, so several deployments (or tests) share one Redis.
    redis_prefix: str = "fxcc:"
    data_dir: Path = Field(default_factory=lambda: Path("~/.cache/fxcc/service").expanduser())
    # When set, every /v1 request must carry `Authorization: Bearer <token>` (FXCC_TOKEN, the
    # variable the client reads too). /healthz stays open for load balancers.
    token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    job_wait_max_s: float = Field(default=60.0, ge=0)
    job_max_attempts: int = Field(default=3, ge=1)
    # A stream entry claimed but not acknowledged (nor touched by a heartbeat) for this long
    # belongs to a dead worker and is handed to another one.
    claim_idle_ms: int = Field(default=60_000, ge=1)
    claim_block_ms: int = Field(default=1_000, ge=1)
    heartbeat_s: float = Field(default=5.0, gt=0)
    worker_ttl_s: int = Field(default=30, ge=1)
    # Single-flight entries and job records expire so that Redis does not grow without bound.
    inflight_ttl_s: int = Field(default=3_600, ge=1)
    job_ttl_s: int = Field(default=7 * 86_400, ge=1)
    embedded_workers: int = Field(default=1, ge=1)


def redacted_url(url: str) -> str:
    """`url` with any password replaced by ***, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
