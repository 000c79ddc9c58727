"""`fxcc serve`: run the service under uvicorn."""

from __future__ import annotations

import logging
import signal
import threading

from fxcc.service.settings import ServiceSettings, redacted_url

log = logging.getLogger("fxcc.service")


def serve_main(host: str | None = None, port: int | None = None) -> None:
    """Serve create_app(ServiceSettings()) on host:port (the arguments override the settings)."""
    import uvicorn

    from fxcc.service.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = ServiceSettings(**overrides)
    if settings.redis_url:
        where = f"redis store at {redacted_url(settings.redis_url)} (prefix {settings.redis_prefix!r})"
    else:
        where = f"embedded store in {settings.data_dir} with {settings.embedded_workers} in-process worker(s)"
    log.info("fxcc service: %s, listening on http://%s:%d", where, settings.host, settings.port)
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal at the
        # handler that was there before it; a no-op there makes a clean stop exit 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: None)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info",
                log_config=None)
    log.info("fxcc service on port %d stopped", settings.port)
