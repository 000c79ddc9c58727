"""The worker loop shared by `fxcc worker` and the service's embedded worker: claim, process, ack."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from fxcc.service.store import Claim, Store
from fxcc.worker.child import CompileProcess
from fxcc.worker.claims import ClaimingThread
from fxcc.worker.process import DEFAULT_POLICY, JobPolicy, process_claim

if TYPE_CHECKING:
    from fxcc.worker.builds import BuildConsumer

log = logging.getLogger("fxcc.worker")

__all__ = ["Consumer", "JobPolicy", "heartbeat_loop"]


class Consumer(ClaimingThread):
    """One thread that claims and runs jobs until `stop` is set; it finishes the job in hand first.

    Its compiles run in a compile process of its own (worker/child.py), started with the thread
    (or at the first job, without policy.limits.warm_start) and replaced whenever a job kills it,
    under policy.limits."""

    def __init__(self, store: Store, name: str, stop: threading.Event, *, block_ms: int = 1000,
                 policy: JobPolicy = DEFAULT_POLICY) -> None:
        super().__init__(store, name, stop, CompileProcess(policy.limits, name), block_ms=block_ms,
                         warm_start=policy.limits.warm_start)
        self.policy = policy

    @property
    def child(self) -> CompileProcess:
        assert isinstance(self.process, CompileProcess)
        return self.process

    def claim(self) -> list[Claim]:
        return self.store.claim(self.name, self.block_ms, tune_arch=self.policy.tune_arch)

    def handle(self, claim: Claim) -> None:
        process_claim(self.store, claim, worker=self.name, policy=self.policy, child=self.child)


def heartbeat_loop(store: Store, worker: str, consumers: Sequence[Consumer | BuildConsumer], stop: threading.Event,
                   interval_s: float, info: dict[str, Any]) -> None:
    """Renew the worker's heartbeat and its claims every `interval_s` until `stop` is set."""
    while True:
        try:
            claims = [c for cons in consumers for c in cons.current]
            busy = {"jobs": [c.job_id for c in claims], "jobs_done": sum(cons.jobs_done for cons in consumers),
                    "ready": sum(1 for cons in consumers if cons.ready), "processes": len(consumers)}
            store.heartbeat(worker, {**info, **busy}, claims)
        except redis.RedisError as e:
            log.warning("%s: heartbeat failed: %s: %s", worker, type(e).__name__, e)
        except Exception:
            log.warning("%s: heartbeat failed", worker, exc_info=True)
        if stop.wait(interval_s):
            return
