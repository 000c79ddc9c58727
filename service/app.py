"""The FastAPI application: `create_app(settings)` wires settings, store, routers and error handlers."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from service.deps import require_token
from service.handlers import BodySizeLimit, install_handlers
from service.routes import artifacts, compile, health, jobs, status
from service.settings import ServiceSettings
from service.store import Store

log = logging.getLogger("fxcc.service")


def build_store(settings: ServiceSettings) -> Store:
    """A RedisStore when FXCC_REDIS_URL is set, else an EmbeddedStore under data_dir."""
    if settings.redis_url:
        from service.redis_store import RedisStore

        return RedisStore(settings)
    from service.embedded_store import EmbeddedStore

    return EmbeddedStore(settings.data_dir, job_ttl_s=settings.job_ttl_s)


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else ServiceSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = build_store(settings)
        app.state.settings = settings
        app.state.store = store
        stop = threading.Event()
        consumers = start_embedded_workers(store, settings, stop) if store.mode == "embedded" else []
        try:
            yield
        finally:
            stop.set()
            store.close()
            for c in consumers:
                c.thread.join(timeout=60)
            log.info("service stopped")

    app = FastAPI(title="fxcc", version="1", lifespan=lifespan)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    install_handlers(app)
    for router in (compile.router, jobs.router, artifacts.router, status.router):
        app.include_router(router, dependencies=[Depends(require_token)])
    app.include_router(health.router)
    return app


def start_embedded_workers(store: Store, settings: ServiceSettings, stop: threading.Event) -> list:
    """In-process worker threads for embedded mode (the same job loop as `fxcc worker`)."""
    # Imported here: only embedded mode runs the compiler inside the service process.
    from worker.loop import Consumer

    consumers = [Consumer(store, f"embedded-{i}", stop, block_ms=min(settings.claim_block_ms, 250),
                          max_attempts=settings.job_max_attempts)
                 for i in range(settings.embedded_workers)]
    for c in consumers:
        c.thread.start()
    return consumers
