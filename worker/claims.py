"""What every consumer thread of a worker does: start its helper process, claim, handle, and ride out
store outages. The compile consumers (worker/loop.py) and the build consumers (worker/builds.py) differ
only in what they claim and how they handle it."""

from __future__ import annotations

import logging
import threading

import redis

from fxcc.service.store import Claim, Store
from fxcc.service.subproc import WarmProcess

log = logging.getLogger("fxcc.worker")


class ClaimingThread:
    """One thread that claims work and handles it until `stop` is set; it finishes what it holds
    first. Its work runs in `process`, a warm helper process started with the thread (unless
    `warm_start` is off: then at the first claim).

    Note: the process is started from this thread, so that the kernel kills it when the thread goes
    (PR_SET_PDEATHSIG follows the thread that started a child): a worker that exits or is killed
    mid-job leaves no helper process behind."""

    kind = "job"

    def __init__(self, store: Store, name: str, stop: threading.Event, process: WarmProcess, *,
                 block_ms: int, warm_start: bool) -> None:
        self.store = store
        self.name = name
        self.stop = stop
        self.block_ms = block_ms
        self.process = process
        self.warm_start = warm_start
        self.current: list[Claim] = []  # read by the heartbeat thread; replaced, never mutated
        self.jobs_done = 0
        self.thread = threading.Thread(target=self.run, name=f"fxcc-{name}", daemon=True)

    @property
    def ready(self) -> bool:
        """Whether its process is started and ready (the worker's heartbeat counts these)."""
        return self.process.ready

    def claim(self) -> list[Claim]:
        """The next claims for this thread (empty after the store's block time)."""
        raise NotImplementedError

    def handle(self, claim: Claim) -> None:
        """Run one claim and record its outcome; a store error propagates (the claim is reclaimed later)."""
        raise NotImplementedError

    def run(self) -> None:
        if self.warm_start:
            try:
                self.process.start()  # it warms up while the thread waits for work
            except OSError as e:  # the first claim tries again (and fails as a crash if it still cannot)
                log.error("%s: could not start its %s: %s", self.name, self.process.name, e)
        try:
            self._claim_and_run()
        finally:
            self.process.close()

    def _claim_and_run(self) -> None:
        backoff_s = 0.5
        while not self.stop.is_set():
            try:
                claims = self.claim()
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
                try:
                    self.handle(claim)
                    self.jobs_done += 1
                except Exception:  # unacked, the claim is reclaimed after claim_idle_ms
                    log.exception("%s: %s %s could not be recorded", self.name, self.kind, claim.job_id)
            self.current = []
