"""The worker loop shared by `fxcc worker` and the service's embedded worker: claim, process, ack."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from fxcc.service.store import Claim, Store
from fxcc.worker.child import CompileProcess
from fxcc.worker.process import DEFAULT_POLICY, JobPolicy, process_claim

if TYPE_CHECKING:
    from fxcc.worker.builds import BuildConsumer

log = logging.getLogger("fxcc.worker")

__all__ = ["Consumer", "JobPolicy", "heartbeat_loop"]


class Consumer:
    """One thread that claims and runs jobs until `stop` is set; it finishes the job in hand first.

    Its compiles run in a compile process of its own (worker/child.py), started with the thread
    (or at the first job, without policy.limits.warm_start) and replaced whenever a job kills it,
    under policy.limits."""

    def __init__(self, store: Store, name: str, stop: threading.Event, *, block_ms: int = 1000,
                 policy: JobPolicy = DEFAULT_POLICY) -> None:
        self.store = store
        self.name = name
        self.stop = stop
        self.block_ms = block_ms
        self.policy = policy
        self.current: list[Claim] = []  # read by the heartbeat thread; replaced, never mutated
        self.jobs_done = 0
        self.child = CompileProcess(policy.limits, name)
        self.thread = threading.Thread(target=self.run, name=f"fxcc-{name}", daemon=True)

    def run(self) -> None:
        # Note: started from this thread, so that the kernel kills the process when the thread
        # goes (PR_SET_PDEATHSIG follows the thread that started a child): a worker that exits
        # or is killed mid-compile leaves no compile behind.
        if self.policy.limits.warm_start:
            try:
                self.child.start()
            except OSError as e:  # the first job tries again (and fails as a crash if it still cannot)
                log.error("%s: could not start its compile process: %s", self.name, e)
        try:
            self._claim_and_run()
        finally:
            self.child.close()

    def _claim_and_run(self) -> None:
        backoff_s = 0.5
        while not self.stop.is_set():
            try:
                claims = self.store.claim(self.name, self.block_ms, tune_arch=self.policy.tune_arch)
            except redis.RedisError as e:  # an outage must not kill the worker: wait it out
                backoff_s = min(backoff_s * 2, 10.0)
                log.warning("%s: store unavailable (%s: %s); retrying in %.0f s", self.name,
                            type(e).__name__, e, backoff_s)
                self.stop.wait(backoff_s)
                continue
            except Exception:
                log.exception("%s: claiming failed; retrying", self.name)
                self.stop.wait(1.0)
                continue
            backoff_s = 0.5
            self.current = claims
            for claim in claims:
                self.handle(claim)
            self.current = []

    def handle(self, claim: Claim) -> None:
        try:
            process_claim(self.store, claim, worker=self.name, policy=self.policy, child=self.child)
            self.jobs_done += 1
        except Exception:  # unacked, the job is reclaimed after claim_idle_ms
            log.exception("%s: job %s could not be recorded", self.name, claim.job_id)


def heartbeat_loop(store: Store, worker: str, consumers: Sequence[Consumer | BuildConsumer], stop: threading.Event,
                   interval_s: float, info: dict[str, Any]) -> None:
    """Renew the worker's heartbeat and its claims every `interval_s` until `stop` is set."""
    while True:
        try:
            claims = [c for cons in consumers for c in cons.current]
            busy = {"jobs": [c.job_id for c in claims],
                    "jobs_done": sum(cons.jobs_done for cons in consumers)}
            store.heartbeat(worker, {**info, **busy}, claims)
        except redis.RedisError as e:
            log.warning("%s: heartbeat failed: %s: %s", worker, type(e).__name__, e)
        except Exception:
            log.warning("%s: heartbeat failed", worker, exc_info=True)
        if stop.wait(interval_s):
            return
