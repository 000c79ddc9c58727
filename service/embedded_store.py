"""EmbeddedStore: artifacts on local disk, jobs and the queue in memory, for `fxcc serve` without Redis."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, deque
from pathlib import Path
from typing import Any

from compiler_core.artifact import Artifact, ArtifactManifest, load_artifact, save_artifact
from service.store import Claim, JobError, JobRecord, JobState, Priority, Submitted, now_s

log = logging.getLogger("fxcc.service.embedded")

_PRIORITIES: tuple[Priority, ...] = ("interactive", "precompile")


class EmbeddedStore:
    """One process's store. A single lock guards jobs, queues and single flight."""

    mode = "embedded"

    def __init__(self, data_dir: Path, job_ttl_s: float = 7 * 86_400) -> None:
        self.root = Path(data_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition()
        self._jobs: dict[str, JobRecord] = {}
        self._requests: dict[str, str] = {}
        self._inflight: dict[str, str] = {}
        self._queues: dict[str, deque[str]] = {p: deque() for p in _PRIORITIES}
        self._counters: Counter[str] = Counter()
        self._job_ttl_s = job_ttl_s
        self._running: dict[str, int] = {p: 0 for p in _PRIORITIES}

    def ping(self) -> None:
        if not self.root.is_dir():
            raise OSError(f"data dir {self.root} is gone")

    def close(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------ artifacts

    def get_manifest(self, key: str) -> ArtifactManifest | None:
        try:
            return ArtifactManifest.model_validate_json((self.root / "manifests" / f"{key}.json").read_bytes())
        except (FileNotFoundError, ValueError):
            return None

    def get_artifact(self, key: str) -> Artifact | None:
        return load_artifact(self.root, key)

    def put_artifact(self, artifact: Artifact) -> None:
        old = self.get_manifest(artifact.manifest.key)
        if old is not None and old.tuned and not artifact.manifest.tuned:
            return  # a tuned artifact supersedes an untuned one, never the other way round
        save_artifact(self.root, artifact)  # blobs first, manifest last
        self.count("puts")

    def count(self, counter: str) -> None:
        with self._cond:
            self._counters[counter] += 1

    def counters(self) -> dict[str, int]:
        with self._cond:
            return dict(self._counters)

    # ------------------------------------------------------------ jobs

    def submit(self, key: str, request_json: str, priority: Priority) -> Submitted:
        manifest = self.get_manifest(key)
        if manifest is not None:
            return Submitted(manifest=manifest)
        with self._cond:
            existing = self._jobs.get(self._inflight.get(key, ""))
            if existing is not None and not existing.finished:
                if (existing.state is JobState.QUEUED and priority == "interactive"
                        and existing.priority == "precompile"):
                    # A user now waits on a background job: move it to the front queue.
                    self._queues["precompile"].remove(existing.id)
                    self._queues["interactive"].append(existing.id)
                    self._jobs[existing.id] = existing.model_copy(update={"priority": "interactive"})
                    self._cond.notify_all()
                return Submitted(job_id=existing.id)
            job_id = uuid.uuid4().hex
            if len(self._jobs) % 1024 == 1023:
                self._forget_old_jobs()
            self._jobs[job_id] = JobRecord(id=job_id, key=key, state=JobState.QUEUED,
                                           priority=priority, created_at=now_s())
            self._requests[job_id] = request_json
            self._inflight[key] = job_id
            self._queues[priority].append(job_id)
            self._cond.notify_all()
            return Submitted(job_id=job_id, created=True)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._cond:
            return self._jobs.get(job_id)

    def get_request(self, job_id: str) -> str | None:
        with self._cond:
            return self._requests.get(job_id)

    def _forget_old_jobs(self) -> None:
        """Drop finished jobs older than job_ttl_s (what EXPIRE does for Redis job hashes)."""
        horizon = time.time() - self._job_ttl_s
        for job_id in [j.id for j in self._jobs.values() if j.finished and (j.finished_at or 0) < horizon]:
            del self._jobs[job_id]

    def mark_compiling(self, job_id: str, worker: str, *, takeover: bool = False) -> JobRecord | None:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or not (job.state is JobState.QUEUED
                                   or (takeover and job.state is JobState.COMPILING)):
                return None
            attempt = job.attempt + 1
            return self._update(job_id, state=JobState.COMPILING, started_at=now_s(), worker=worker,
                                attempt=attempt)

    def mark_done(self, job_id: str, stats: dict[str, Any]) -> None:
        self._update(job_id, state=JobState.DONE, finished_at=now_s(), stats=stats, error=None)

    def mark_failed(self, job_id: str, error: JobError) -> None:
        self._update(job_id, state=JobState.FAILED, finished_at=now_s(), error=error, stats=None)

    def _update(self, job_id: str, **fields: Any) -> JobRecord | None:
        with self._cond:  # re-entrant: a Condition wraps an RLock
            job = self._jobs.get(job_id)
            if job is None:
                return None
            job = self._jobs[job_id] = job.model_copy(update=fields)
            if job.finished:
                self._requests.pop(job_id, None)
                if self._inflight.get(job.key) == job_id:
                    del self._inflight[job.key]
            self._cond.notify_all()
            return job

    # ------------------------------------------------------------ queue

    def claim(self, consumer: str, block_ms: int) -> list[Claim]:
        deadline = time.monotonic() + block_ms / 1000
        with self._cond:
            while True:
                for p in _PRIORITIES:
                    if self._queues[p]:
                        self._running[p] += 1
                        return [Claim(job_id=self._queues[p].popleft(), stream=p, consumer=consumer)]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)

    def ack(self, claim: Claim) -> None:
        with self._cond:
            self._running[claim.stream] -= 1

    def queue_depths(self) -> dict[str, dict[str, int]]:
        with self._cond:
            return {p: {"waiting": len(self._queues[p]), "running": self._running[p]} for p in _PRIORITIES}

    def workers(self) -> list[dict[str, Any]]:
        return [{"id": "embedded", "device": "cpu", "in_process": True}]

    def heartbeat(self, worker: str, info: dict[str, Any], claims: list[Claim]) -> None:
        """Nothing to do: embedded workers live and die with the service process."""
