"""`fxcc worker`: a process that compiles jobs from the Redis streams until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType

from pydantic import ValidationError

from service.settings import ServiceSettings, redacted_url

log = logging.getLogger("fxcc.worker")

DEVICES = ("auto", "cpu", "cuda")


def worker_main(concurrency: int = 1, device: str = "auto") -> None:
    """Run `concurrency` consumers against FXCC_REDIS_URL. Exits 2 on bad configuration, 0 on a signal."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ServiceSettings()
    except ValidationError as e:
        log.error("bad FXCC_* settings: %s", "; ".join(f"{err['loc'][0]}: {err['msg']}" for err in e.errors()))
        sys.exit(2)
    if not settings.redis_url:
        log.error("fxcc worker needs a Redis to take jobs from: set FXCC_REDIS_URL (e.g. redis://host:6379/0)")
        sys.exit(2)
    if device not in DEVICES or concurrency < 1:
        log.error("bad worker options: device must be one of %s, concurrency >= 1 (got %r, %d)",
                  DEVICES, device, concurrency)
        sys.exit(2)

    import redis

    from service.redis_store import RedisStore
    from worker.loop import Consumer, heartbeat_loop

    store = RedisStore(settings)
    try:
        store.ping()
    except (redis.AuthenticationError, redis.exceptions.AuthorizationError) as e:
        log.error("Redis at %s refused fxcc worker's credentials: %s", redacted_url(settings.redis_url), e)
        sys.exit(2)
    except redis.RedisError as e:
        # Not fatal: in a cluster Redis may come up after the workers; the loop keeps retrying.
        log.warning("Redis at %s is unreachable for now (%s); retrying", redacted_url(settings.redis_url), e)
    worker_id = f"{socket.gethostname()}-{os.getpid()}"
    stop = threading.Event()
    install_signal_handlers(stop)
    names = [worker_id] if concurrency == 1 else [f"{worker_id}-{i}" for i in range(concurrency)]
    consumers = [Consumer(store, n, stop, block_ms=settings.claim_block_ms,
                          max_attempts=settings.job_max_attempts) for n in names]
    info = {"id": worker_id, "device": resolve_device(device), "concurrency": concurrency,
            "started_at": time.time()}
    log.info("worker %s: %d consumer(s), device %s, redis %s, prefix %r", worker_id, concurrency,
             info["device"], redacted_url(settings.redis_url), settings.redis_prefix)
    for c in consumers:
        c.thread.start()
    heartbeat_loop(store, worker_id, consumers, stop, settings.heartbeat_s, info)
    for c in consumers:
        c.thread.join()
    try:
        store.forget_worker(worker_id)  # else its heartbeat key lingers until the TTL runs out
    except redis.RedisError:
        pass
    store.close()
    log.info("worker %s: stopped after %d jobs", worker_id, sum(c.jobs_done for c in consumers))


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT: stop claiming, finish the job in hand, then exit 0."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("got %s: finishing the current job, then exiting", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
