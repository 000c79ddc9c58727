"""The FastAPI application: `create_app(settings)` wires settings, store, auth, routers and error handlers."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from fxcc.service import stats
from fxcc.service.auth import Authenticator
from fxcc.service.handlers import BodySizeLimit, LoopbackGuard, install_handlers
from fxcc.service.routes import (
    admin,
    artifacts,
    bundles,
    cache,
    compile,
    dashboard,
    dead_letters,
    explorer,
    health,
    hits,
    jobs,
    metrics,
    packages,
    pre_aot,
    status,
)
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import Store

log = logging.getLogger("fxcc.service")


def build_store(settings: ServiceSettings) -> Store:
    """A RedisStore when FXCC_REDIS_URL is set, else an EmbeddedStore under data_dir."""
    if settings.redis_url:
        from fxcc.service.redis_store import RedisStore

        return RedisStore(settings)
    from fxcc.service.embedded_store import EmbeddedStore

    return EmbeddedStore(settings.data_dir, job_ttl_s=settings.job_ttl_s,
                         max_artifact_bytes=settings.max_artifact_bytes, stream_max_len=settings.stream_max_len,
                         quota_queued_jobs=settings.quota_queued_jobs,
                         quota_queued_bytes=settings.quota_queued_bytes)


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else ServiceSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = build_store(settings)
        app.state.settings = settings
        app.state.store = store
        app.state.auth = Authenticator(settings, store)
        log_auth_mode(settings, app.state.auth)
        stop = threading.Event()
        consumers = start_embedded_workers(store, settings, stop) if store.mode == "embedded" else []
        if settings.compile_process_warm:
            compile.checker_pool(settings).start()  # they import torch meanwhile
        sampling = asyncio.Event()
        sampler = asyncio.create_task(stats.sample_minutes(store, sampling))
        try:
            yield
        finally:
            sampling.set()
            await sampler
            stop.set()
            await store.aclose()
            store.close()
            for c in consumers:
                c.thread.join(timeout=60)
            log.info("service stopped")

    app = FastAPI(title="fxcc", version="1", lifespan=lifespan,
                  description="Compiler-as-a-service for PyTorch 2. Bearer tokens with roles client and admin.")
    app.add_middleware(hits.FastHits)  # innermost: the guards below check a hit first
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    if settings.loopback_guard:  # added last, so it runs first: a refused request costs nothing more
        app.add_middleware(LoopbackGuard, allowed_hosts=settings.allowed_hosts)
    install_handlers(app, quota_retry_after_s=settings.quota_retry_after_s)
    for router in (compile.router, jobs.router, explorer.router, artifacts.router, bundles.router, pre_aot.router, packages.router, status.router, cache.router,
                   dead_letters.router, admin.router, metrics.router, health.router, dashboard.router):
        app.include_router(router)  # each router declares the role it needs
    document_raw_bodies(app)
    return app


def document_raw_bodies(app: FastAPI) -> None:
    """Add the schemas of the bodies that routes read raw (POST /v1/compile's CompileRequest) to the
    OpenAPI document's components, where those routes' requestBody points."""
    from fastapi.openapi.utils import get_openapi

    from fxcc.compiler_core.wire import CompileRequest

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema = CompileRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(schema.pop("$defs", {}))
            schemas["CompileRequest"] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def log_auth_mode(settings: ServiceSettings, auth: Authenticator) -> None:
    """Say at start-up who may call the API, and warn when nobody can."""
    if settings.anonymous_allowed:
        log.warning("anonymous requests are allowed (role %s, but never the token routes)%s",
                    settings.effective_anonymous_role,
                    "; only loopback Host names and same-origin browser writes are served"
                    if settings.loopback_guard else "")
    elif not auth.configured:
        log.warning("no API token is configured (FXCC_TOKEN, FXCC_TOKENS) and anonymous access is off "
                    "(FXCC_ANONYMOUS): /v1 answers 401 to everyone but tokens made earlier over the API")
    else:
        log.info("API tokens from settings: %s", ", ".join(f"{t.name} ({t.role})" for t in auth.configured))


def start_embedded_workers(store: Store, settings: ServiceSettings, stop: threading.Event) -> list:
    """In-process worker threads for embedded mode (the same job loop as `fxcc worker`). On a GPU
    (FXCC_EMBEDDED_DEVICE, `auto` by default) they tune as a GPU worker does: compiles for its arch,
    and the tune jobs of its arch."""
    # Imported here: only embedded mode runs the compiler inside the service process.
    from fxcc.worker.loop import Consumer, JobPolicy
    from fxcc.worker.main import resolve_device, start_builders
    from fxcc.worker.process import on_device

    policy = on_device(JobPolicy.from_settings(settings), resolve_device(settings.embedded_device))
    if policy.tune_device is not None:
        log.info("embedded worker tunes on %s (sm_%d)", policy.tune_device, policy.tune_arch)
    if policy.signer is not None:
        log.info("embedded worker signs artifacts with key %s (clients of this machine trust %s)",
                 policy.signer.public.id, settings.data_dir / "keys" / "signing.pub")
    from fxcc.service.embedded_store import EmbeddedStore

    if isinstance(store, EmbeddedStore):
        store.worker_device = policy.tune_device or "cpu"  # what /v1/stats says the workers run on
        store.worker_tune_arch = policy.tune_arch
    consumers = [Consumer(store, f"embedded-{i}", stop, block_ms=min(settings.claim_block_ms, 250), policy=policy)
                 for i in range(settings.embedded_workers)]
    for c in consumers:
        c.thread.start()
    # Note: the build processes start warm only where the service has a GPU: elsewhere a user's
    # embedded service may never build a cubin, and one process per core would cost seconds of CPU
    # and 0.2 GB each for nothing.
    return [*consumers, *start_builders(store, "embedded", settings, policy, stop,
                                        warm=policy.tune_device is not None)]
