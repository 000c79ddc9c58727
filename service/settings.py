"""Service and worker settings: the one typed place that reads FXCC_* environment variables."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Role = Literal["client", "admin"]


class TokenEntry(BaseModel):
    """One API token from FXCC_TOKENS: give `sha256` (hex of the token) or the plain `token`,
    which is hashed at load and never kept."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    role: Role = "client"
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    token: SecretStr | None = None

    @model_validator(mode="after")
    def _one_form(self) -> TokenEntry:
        if (self.sha256 is None) == (self.token is None):
            raise ValueError(f"token {self.name!r}: give exactly one of sha256 and token")
        return self


class ServiceSettings(BaseSettings):
    """Everything the service, its embedded worker and `fxcc worker` can be configured with."""

    model_config = SettingsConfigDict(env_prefix="FXCC_", extra="ignore")

    # None means embedded mode: artifacts (and tune jobs in flight) on local disk, other jobs in memory,
    # an in-process worker.
    redis_url: str | None = None
    # The artifact cache may live in another Redis (allkeys-lru) than the queue (noeviction, AOF).
    cache_redis_url: str | None = None
    # Every Redis key lives under this prefix, so several deployments (or tests) share one Redis.
    redis_prefix: str = "fxcc:"
    data_dir: Path = Field(default_factory=lambda: Path("~/.cache/fxcc/service").expanduser())

    # ---- auth. FXCC_TOKEN (the variable the client sends too) is one admin token. FXCC_TOKENS is
    # a JSON list of TokenEntry. More tokens are made with POST /v1/admin/tokens.
    token: SecretStr | None = None
    tokens: list[TokenEntry] = Field(default_factory=list)
    # None: anonymous requests are allowed only by the embedded default (no Redis, loopback host,
    # no token configured), as admin. True: allowed everywhere, with `anonymous_role`.
    anonymous: bool | None = None
    anonymous_role: Role = "client"
    # ---- signatures (compiler_core/signing.py). Workers sign every manifest they store with an
    # Ed25519 private key: FXCC_SIGNING_KEY (the key's text, `fxcc keygen` makes one) or
    # FXCC_SIGNING_KEY_FILE (a file holding it). Clients hold the public key only. Embedded mode
    # with neither makes its own pair under data_dir/keys. FXCC_TRUSTED_KEYS: other workers' public
    # keys (keys or files, comma-separated) whose artifacts a GPU worker may tune and re-sign, for
    # key rotation; the worker's own key is always trusted.
    signing_key: SecretStr | None = None
    signing_key_file: Path | None = None
    trusted_keys: str = ""

    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    # ---- serving cache hits (issue 24). API processes of `fxcc serve` with Redis: 0 is half the
    # CPUs (at least 1, at most 8), leaving the rest to Redis and the network; embedded mode is one.
    api_processes: int = Field(default=0, ge=0, le=64)
    access_log: bool = False  # uvicorn's access log, one line per request (about 7% of a hit's cost)
    # A token made over the API and looked up in the store is trusted (or refused) this long per
    # process: a revoked one is refused everywhere within it.
    token_cache_s: float = Field(default=5.0, ge=0, le=300)
    # POST /v1/artifacts/batch: at most this many keys a request, and this many bytes of artifacts
    # streamed (the keys past it are listed as not sent, for another request).
    batch_max_keys: int = Field(default=512, ge=1, le=10_000)
    batch_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # GET /v1/bundles/{key}: a bundle holds artifacts up to this many bytes (the keys past it go to
    # the next bundle, `rest`), and is kept this long in the cache's Redis after it was assembled.
    bundle_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    bundle_ttl_s: int = Field(default=86_400, ge=1)
    # Each API process keeps the bundles it served this long, up to this many bytes (0: off): a
    # thousand ranks starting at once then cost Redis a read a second. A bundle dropped in Redis
    # (a member tuned or deleted) is still served within it, as a revoked token is.
    bundle_cache_s: float = Field(default=1.0, ge=0, le=60)
    bundle_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)

    # ---- limits
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    max_nodes: int = Field(default=20_000, ge=1)
    max_artifact_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    # Beyond this many waiting jobs a stream refuses new ones (503); XADD also trims at ~this length.
    stream_max_len: int = Field(default=100_000, ge=1)
    dead_letter_max_len: int = Field(default=10_000, ge=1)
    recent_jobs_max: int = Field(default=10_000, ge=1)

    job_wait_max_s: float = Field(default=60.0, ge=0)
    job_events_max_s: float = Field(default=600.0, gt=0)
    # A job whose compile crashes this many times (or whose workers die this often) is failed and
    # copied to the dead-letter stream.
    job_max_attempts: int = Field(default=3, ge=1)
    # A stream entry claimed but not acknowledged (nor touched by a heartbeat) for this long
    # belongs to a dead worker and is handed to another one.
    claim_idle_ms: int = Field(default=60_000, ge=1)
    claim_block_ms: int = Field(default=1_000, ge=1)
    heartbeat_s: float = Field(default=5.0, gt=0)
    worker_ttl_s: int = Field(default=30, ge=1)
    # After SIGTERM a worker finishes its job for up to this long, then requeues it and exits.
    shutdown_grace_s: float = Field(default=90.0, ge=0)
    # Single-flight entries and job records expire so that Redis does not grow without bound;
    # heartbeats renew the single-flight entry of a job that is being compiled.
    inflight_ttl_s: int = Field(default=3_600, ge=1)
    job_ttl_s: int = Field(default=7 * 86_400, ge=1)
    # A pre-AOT entry in Redis expires this long after it was last written (embedded: never).
    pre_aot_ttl_s: int = Field(default=30 * 86_400, ge=1)
    embedded_workers: int = Field(default=1, ge=1)
    # What embedded mode's in-process workers run on: `auto` (a CUDA GPU when torch sees one),
    # `cpu` (never tune), `cuda`, `cuda:N` or `N`. On a GPU they autotune as `fxcc worker` does.
    embedded_device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d{1,3})?|\d{1,3})$")

    # ---- principals: per-principal quotas and the embedded default's browser guards (issue 17)
    # A principal (a token's name, or `anonymous`) may have at most this many jobs queued or running,
    # and request bodies of at most this many bytes in them; one more is a 429 for it alone.
    quota_queued_jobs: int = Field(default=1_000, ge=1)
    quota_queued_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    # Seconds a 429 (quota) tells the client to wait (Retry-After); a 503 (queue full, store down) says 5.
    quota_retry_after_s: int = Field(default=10, ge=1)
    # With anonymous access on and a loopback `host`, only these Host names are served besides
    # localhost, 127.0.0.1 and [::1] (any port): a DNS-rebound name or a local proxy gets 421.
    allowed_hosts: list[str] = Field(default_factory=list)

    # Test hook, off by default: a worker sleeps this long before each compile (and tune), so that tests can
    # kill or stop it mid-job. Never set it in production.
    test_only_compile_delay_s: float = Field(default=0.0, ge=0)

    # compile limits (worker)
    # Every compile job runs in a warm compile process of its worker (one per consumer, `fxcc
    # worker` and the embedded worker alike), killed when it runs past job_timeout_s of wall clock
    # or over job_memory_mb of resident memory (RSS, sampled every 0.1 s; torch and triton alone
    # take about 300 MB). Such a job fails for good (CompileTimeout, CompileMemoryLimit).
    job_timeout_s: float = Field(default=600.0, gt=0)
    job_memory_mb: int = Field(default=8192, ge=256)
    # Start each consumer's compile process with the worker, and the API's request checkers with
    # the service (1, default: the first job finds them warm) or at their first use (0: a service that may never compile, such as one a
    # test starts to check its HTTP answers, spends no CPU importing the compiler a second time).
    compile_process_warm: bool = True
    # Kernel builds (worker/builds.py): a compile job for a CUDA target builds its kernels as build
    # tasks on the queue, which every worker takes (`fxcc worker` and the embedded worker alike)
    # in build_processes warm build processes of its own (0: one per core of its machine, at most 32). Each
    # build is killed past build_timeout_s of wall clock or over build_memory_mb of resident
    # memory (and retried, as a crashed attempt). Built kernels are kept by content key (source,
    # config, signature, arch, Triton version) for kernel_build_ttl_s, so that other graphs, jobs
    # and models that share a kernel reuse its binary. build_tasks=0: each compile builds its
    # kernels itself, one after another, in its compile process (as before issue 25).
    build_tasks: bool = True
    build_processes: int = Field(default=0, ge=0, le=256)
    build_timeout_s: float = Field(default=300.0, gt=0)
    build_memory_mb: int = Field(default=4096, ge=256)
    kernel_build_ttl_s: int = Field(default=30 * 86_400, ge=1)
    # Request checks (service/checker.py): a POST /v1/compile is parsed, its ops, key and shapes
    # checked in one of check_processes warm checker processes of the API, never in the API process
    # itself (a large graph would stall every other answer, the health check's included); in each
    # API process (FXCC_API_PROCESSES). A check
    # past check_timeout_s or over check_memory_mb of resident memory is a 422 (the graph is too
    # costly to accept); a principal with check_per_principal different requests in the checkers
    # gets 429 for one more. compile_process_warm starts them with the service too.
    check_processes: int = Field(default=0, ge=0, le=64)  # 0: 2 with one API process, else 1 in each
    check_timeout_s: float = Field(default=60.0, gt=0)
    check_memory_mb: int = Field(default=4096, ge=256)
    check_per_principal: int = Field(default=4, ge=1)
    # Test hook, off by default: a compile process allocates (and writes) this many MB before it
    # compiles, so that tests can go over job_memory_mb. Never set it in production.
    test_only_compile_alloc_mb: int = Field(default=0, ge=0)
    # Test hook, off by default: a build process sleeps this long before each build task, so that
    # tests can kill a worker mid-task. Never set it in production.
    test_only_build_delay_s: float = Field(default=0.0, ge=0)
    # Test hook, off by default: tune jobs record a made-up tuning ("Fake GPU") instead of running
    # kernels, so that tests can drive the tune queue without a GPU. Never set it in production.
    test_only_fake_tune: bool = False

    @property
    def cache_url(self) -> str | None:
        return self.cache_redis_url or self.redis_url

    @property
    def anonymous_allowed(self) -> bool:
        if self.anonymous is not None:
            return self.anonymous
        return self.redis_url is None and is_loopback(self.host) and not (self.token or self.tokens)

    @property
    def loopback_guard(self) -> bool:
        """Whether the Host and Origin checks apply: anonymous access on a service bound to loopback,
        where reaching the port is the only credential (handlers.LoopbackGuard)."""
        return self.anonymous_allowed and is_loopback(self.host)

    @property
    def effective_anonymous_role(self) -> Role:
        """Explicit anonymous mode gets `anonymous_role`; the embedded loopback default is one user's."""
        return self.anonymous_role if self.anonymous else "admin"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def api_processes(settings: ServiceSettings, cpus: int | None = None) -> int:
    """How many API processes serve: one in embedded mode (its jobs and worker live in the process),
    else FXCC_API_PROCESSES, or half the CPUs (1 to 8) when that is 0."""
    if not settings.redis_url:
        return 1
    if settings.api_processes:
        return settings.api_processes
    return max(1, min(8, (cpus or os.cpu_count() or 1) // 2))
