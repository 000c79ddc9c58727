"""`fxcc worker`: a process that compiles jobs from the Redis streams until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING

import redis
from pydantic import ValidationError

from fxcc.service.settings import ServiceSettings, redacted_url

if TYPE_CHECKING:
    from fxcc.service.store import Store
    from fxcc.worker.builds import BuildConsumer
    from fxcc.worker.loop import Consumer, JobPolicy

log = logging.getLogger("fxcc.worker")

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "N")
# Build processes a worker runs when FXCC_BUILD_PROCESSES is 0: one per core, up to this many (each
# holds about 0.2 GB at rest; a bigger host sets the setting).
DEFAULT_MAX_BUILDERS = 32
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d{1,3})?|\d{1,3}")


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
    if not _DEVICE_RE.fullmatch(device) or concurrency < 1:
        log.error("bad worker options: device must be one of %s, concurrency >= 1 (got %r, %d)",
                  DEVICES, device, concurrency)
        sys.exit(2)

    from fxcc.compiler_core.signing import SigningKeyError
    from fxcc.service.redis_store import RedisStore
    from fxcc.worker.loop import Consumer, JobPolicy, heartbeat_loop
    from fxcc.worker.process import on_device

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
    stop, hard_stop = threading.Event(), threading.Event()
    install_signal_handlers(stop, hard_stop)
    names = [worker_id] if concurrency == 1 else [f"{worker_id}-{i}" for i in range(concurrency)]
    resolved = resolve_device(device)
    # Note: a GPU worker tunes the CUDA targets of its GPU's arch (and takes that arch's tune jobs);
    # a CPU worker stores heuristic configs and never reads a tune queue.
    try:
        policy = on_device(JobPolicy.from_settings(settings), resolved)
    except SigningKeyError as e:
        log.error("fxcc worker: %s", e)
        sys.exit(2)
    if policy.signer is None:
        log.warning("fxcc worker has no signing key (FXCC_SIGNING_KEY or FXCC_SIGNING_KEY_FILE; fxcc keygen "
                    "makes one): it stores unsigned artifacts, which clients refuse unless they set "
                    "FXCC_ALLOW_UNSIGNED=1")
    consumers = [Consumer(store, n, stop, block_ms=settings.claim_block_ms, policy=policy) for n in names]
    builders = start_builders(store, worker_id, settings, policy, stop)
    info = {"id": worker_id, "device": resolved, "concurrency": concurrency, "build_processes": len(builders),
            "tune_arch": policy.tune_arch, "started_at": time.time()}
    log.info("worker %s: %d consumer(s), device %s%s, redis %s, prefix %r%s; a compile may take %g s "
             "and %d MB", worker_id, concurrency, info["device"],
             f" (tunes sm_{policy.tune_arch})" if policy.tune_arch else "",
             redacted_url(settings.redis_url), settings.redis_prefix,
             f", signing with key {policy.signer.public.id}" if policy.signer else ", NOT signing",
             policy.limits.timeout_s, policy.limits.memory_mb)
    beats_stop = threading.Event()
    beats = threading.Thread(target=heartbeat_loop, name="fxcc-heartbeat", daemon=True,
                             args=(store, worker_id, [*consumers, *builders], beats_stop, settings.heartbeat_s, info))
    beats.start()
    for c in consumers:
        c.thread.start()
    while not stop.wait(0.5):
        pass
    abandoned = finish_or_requeue(store, [*consumers, *builders], settings.shutdown_grace_s, hard_stop)
    beats_stop.set()
    beats.join(timeout=10)
    try:
        store.forget_worker(worker_id)  # else its heartbeat key lingers until the TTL runs out
    except redis.RedisError:
        pass
    store.close()
    log.info("worker %s: stopped after %d jobs and %d build tasks%s", worker_id, sum(c.jobs_done for c in consumers),
             sum(b.jobs_done for b in builders),
             f", {abandoned} requeued" if abandoned else "")
    if abandoned:
        logging.shutdown()
        os._exit(0)  # a compile thread is still running: do not wait for it


def start_builders(store: Store, worker_id: str, settings: ServiceSettings, policy: JobPolicy,
                   stop: threading.Event, *, warm: bool = True) -> list[BuildConsumer]:
    """The worker's build consumers (worker/builds.py): FXCC_BUILD_PROCESSES of them (0: one per
    core, at most DEFAULT_MAX_BUILDERS), each with a build process, started now when `warm` (and
    FXCC_COMPILE_PROCESS_WARM) else at its first task; none with FXCC_BUILD_TASKS=0."""
    if not policy.build_tasks:
        return []
    from fxcc.worker.builds import start_build_consumers

    count = settings.build_processes or min(os.cpu_count() or 1, DEFAULT_MAX_BUILDERS)
    limits = replace(policy.build_limits, warm_start=policy.build_limits.warm_start and warm)
    return start_build_consumers(store, worker_id, count, stop, limits=limits,
                                 max_attempts=policy.max_attempts, block_ms=settings.claim_block_ms,
                                 delay_s=policy.build_delay_s)


def finish_or_requeue(store: Store, consumers: Sequence[Consumer | BuildConsumer], grace_s: float,
                      hard_stop: threading.Event) -> int:
    """Let the consumers finish their jobs for up to `grace_s` (heartbeats go on meanwhile), then
    put the jobs still running back in the queue. A second signal cuts the grace short."""
    deadline = time.monotonic() + grace_s
    while any(c.thread.is_alive() for c in consumers) and time.monotonic() < deadline:
        if hard_stop.wait(0.1):
            break
    stuck = [claim for c in consumers if c.thread.is_alive() for claim in c.current]
    for claim in stuck:
        try:
            store.requeue(claim)
            log.warning("job %s requeued: the worker is stopping before it finished", claim.job_id)
        except redis.RedisError as e:
            log.warning("job %s could not be requeued (%s); it is reclaimed after the claim timeout",
                        claim.job_id, e)
    return len(stuck)


def install_signal_handlers(stop: threading.Event, hard_stop: threading.Event) -> None:
    """SIGTERM/SIGINT: stop claiming, finish the job in hand (or requeue it after the grace
    period, or at a second signal), then exit 0."""

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.info("got %s again: requeueing the current job", name)
            hard_stop.set()
            return
        log.info("got %s: finishing the current job, then exiting", name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def resolve_device(device: str) -> str:
    """`auto` → cuda or cpu; a bare GPU index N → cuda:N (one worker per GPU)."""
    if device.isdigit():
        return f"cuda:{device}"
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
