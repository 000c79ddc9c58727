"""The Store protocol (artifacts, jobs, queue, single flight) and the job record both stores share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from compiler_core.artifact import Artifact, ArtifactManifest

Priority = Literal["interactive", "precompile"]


class JobState(str, Enum):
    """Where a compile job is. A job only moves forward: queued → compiling → done | failed."""

    QUEUED = "queued"  # in a stream, waiting for a worker
    COMPILING = "compiling"  # claimed by a worker (again, with attempt + 1, after a worker died)
    DONE = "done"  # the artifact is stored under the job's key
    FAILED = "failed"  # the compile raised; `error` says why


FINISHED = (JobState.DONE, JobState.FAILED)


class JobError(BaseModel):
    error: str
    message: str
    op: str | None = None
    node: str | None = None


class JobRecord(BaseModel):
    """A job as stored and as GET /v1/jobs/{id} returns it. Times are Unix seconds."""

    id: str
    key: str
    state: JobState
    priority: Priority
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    attempt: int = 0
    error: JobError | None = None
    stats: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


@dataclass(frozen=True)
class Claim:
    """One job handed to one consumer; `entry_id` is its stream entry (empty in embedded mode)."""

    job_id: str
    stream: str
    entry_id: str = ""
    consumer: str = ""
    reclaimed: bool = False  # taken over from a worker that stopped answering


@dataclass(frozen=True)
class Submitted:
    """What submitting a request gave: the cached manifest, or the job that will produce it."""

    manifest: ArtifactManifest | None = None
    job_id: str | None = None
    created: bool = False


class Store(Protocol):
    """Artifacts, job records, the job queue and single flight. Thread-safe."""

    mode: str  # "redis" or "embedded"

    def ping(self) -> None: ...

    def close(self) -> None: ...

    # ---- artifacts
    def get_manifest(self, key: str) -> ArtifactManifest | None: ...

    def get_artifact(self, key: str) -> Artifact | None: ...

    def put_artifact(self, artifact: Artifact) -> None:
        """Store the blobs first and the manifest last, so that no reader sees a torn entry."""
        ...

    def count(self, counter: str) -> None: ...

    def counters(self) -> dict[str, int]: ...

    # ---- jobs
    def submit(self, key: str, request_json: str, priority: Priority) -> Submitted:
        """Queue a job for `key` unless the artifact exists or a job for it is queued/compiling."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def get_request(self, job_id: str) -> str | None: ...

    def mark_compiling(self, job_id: str, worker: str, *, takeover: bool = False) -> JobRecord | None:
        """queued → compiling (attempt + 1); with `takeover` also compiling → compiling.

        None when the job is unknown or not in a state this claim may start.
        """
        ...

    def mark_done(self, job_id: str, stats: dict[str, Any]) -> None: ...

    def mark_failed(self, job_id: str, error: JobError) -> None: ...

    # ---- queue
    def claim(self, consumer: str, block_ms: int) -> list[Claim]:
        """Jobs for `consumer`: stuck ones first, then interactive, then precompile."""
        ...

    def ack(self, claim: Claim) -> None: ...

    def heartbeat(self, worker: str, info: dict[str, Any], claims: list[Claim]) -> None: ...

    # ---- status
    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per priority: jobs waiting for a worker and jobs a worker holds."""
        ...

    def workers(self) -> list[dict[str, Any]]:
        """The info of every worker whose heartbeat is current."""
        ...


def now_s() -> float:
    return round(time.time(), 6)
