"""`fxcc serve`: run the service under uvicorn (uvloop and httptools where installed), in one
process or, with Redis, several (FXCC_API_PROCESSES) sharing one listening socket."""

from __future__ import annotations

import gc
import importlib.util
import logging
import logging.config
import os
import signal
import threading
from typing import Any

from fxcc.service.settings import ServiceSettings, api_processes, redacted_url

log = logging.getLogger("fxcc.service")

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# For uvicorn's child processes too (each configures logging from this in its own interpreter).
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": _FORMAT}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
}


def serve_main(host: str | None = None, port: int | None = None) -> None:
    """Serve create_app(ServiceSettings()) on host:port (the arguments override the settings)."""
    import uvicorn

    logging.config.dictConfig(LOG_CONFIG)
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = ServiceSettings(**overrides)
    processes = api_processes(settings)
    if settings.redis_url:
        where = f"redis store at {redacted_url(settings.redis_url)} (prefix {settings.redis_prefix!r})"
    else:
        where = f"embedded store in {settings.data_dir} with {settings.embedded_workers} in-process worker(s)"
        if settings.api_processes > 1:
            log.warning("FXCC_API_PROCESSES=%d ignored: the embedded store serves from one process",
                        settings.api_processes)
    log.info("fxcc service: %s, listening on http://%s:%d with %d API process(es)", where, settings.host,
             settings.port, processes)
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal at the
        # handler that was there before it; a no-op there makes a clean stop exit 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: None)
    stack = {"loop": "uvloop" if _has("uvloop") else "asyncio",
             "http": "httptools" if _has("httptools") else "h11",
             "access_log": settings.access_log, "log_level": "info", "log_config": LOG_CONFIG}
    if processes == 1:
        uvicorn.run(app_factory(settings), host=settings.host, port=settings.port, **stack)
    else:
        # Each process builds its app from the environment: pass on what the arguments overrode.
        os.environ.update({f"FXCC_{k.upper()}": str(v) for k, v in overrides.items()})
        uvicorn.run("fxcc.service.server:app_factory", factory=True, host=settings.host, port=settings.port,
                    workers=processes, **stack)
    log.info("fxcc service on port %d stopped", settings.port)


def app_factory(settings: ServiceSettings | None = None) -> Any:
    """create_app, with the heap as imported frozen out of the garbage collector's way.

    Note: the service imports torch (through compiler_core's wire format): about 250k objects,
    which every full collection walked, 100-200 ms each, several times a second under load: the
    99th percentile of a cache hit. Frozen, a collection sees only what requests allocate."""
    from fxcc.service.app import create_app

    app = create_app(settings)
    gc.collect()
    gc.freeze()
    return app


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
