"""The Store protocol (artifacts, jobs, queue, single flight, tokens) and the job record both stores share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from fxcc.compiler_core.artifact import Artifact, ArtifactManifest
from fxcc.compiler_core.errors import FxccError

Priority = Literal["interactive", "precompile"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "precompile")


JobKind = Literal["compile", "tune", "build"]


class JobStage(str, Enum):
    """Where a job is. A job moves forward only, except that a crashed attempt (or a worker
    stopped by SIGTERM) sends it back to queued. A compile job starts at lowering; a tune job
    (an untuned artifact to tune on a GPU of its arch) starts at autotuning; a build task (one
    kernel of a compile job to build) starts at building."""

    QUEUED = "queued"  # in a stream, waiting for a worker
    LOWERING = "lowering"  # a worker claimed it: rebuilding the graph and lowering it to loop IR
    BUILDING = "building"  # generating Triton source and binaries
    AUTOTUNING = "autotuning"  # benchmarking kernel configs on a GPU
    STORING = "storing"  # writing blobs, then the manifest
    DONE = "done"  # the artifact is stored under the job's key
    FAILED = "failed"  # the compile raised (or failed job_max_attempts times); `error` says why
    # DELETE /v1/jobs/{id} removed it from the queue before a worker took it (its last principal's
    # DELETE), or an admin aborted it, queued or running (`error` then says "aborted by <admin>").
    # A worker still compiling an aborted job polls get_job, sees this stage and stops; its later
    # mark_stage/mark_done/mark_failed are refused: no finished stage is ever left.
    CANCELLED = "cancelled"


class JobState(str, Enum):
    """The coarse state clients branch on; `stage` refines running."""

    QUEUED = "queued"  # waiting for a worker
    RUNNING = "running"  # a worker holds it (stage lowering, building, autotuning or storing)
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUNNING_STAGES = (JobStage.LOWERING, JobStage.BUILDING, JobStage.AUTOTUNING, JobStage.STORING)
FINISHED_STAGES = (JobStage.DONE, JobStage.FAILED, JobStage.CANCELLED)


def state_of(stage: JobStage) -> JobState:
    return JobState.RUNNING if stage in RUNNING_STAGES else JobState(stage.value)


class JobError(BaseModel):
    error: str
    message: str
    op: str | None = None
    node: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> JobError:
        if isinstance(exc, FxccError):
            return cls(**exc.to_dict())
        return cls(error=type(exc).__name__, message=str(exc)[:2000])


class JobRecord(BaseModel):
    """A job as stored and as GET /v1/jobs/{id} returns it. Times are Unix seconds.

    `stages` holds when the job entered each stage (the latest time, for a retried job). A tune
    job (`kind` "tune") tunes the stored untuned artifact of `key` on a GPU of sm_`arch`. A build
    task (`kind` "build") builds kernel `name` for sm_`arch`; `key` is the task's content key
    (compiler_core/build_tasks.py) and `parent` the compile job that queued it first. A compile
    job lists the build tasks it waits on in `tasks`.
    """

    id: str
    key: str
    kind: JobKind = "compile"
    arch: int | None = None  # tune jobs: the SM arch whose GPUs may take it
    state: JobState
    stage: JobStage
    stages: dict[str, float] = {}
    priority: Priority
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    attempt: int = 0
    error: JobError | None = None
    stats: dict[str, Any] | None = None
    # Who asked: the names of the principals attached to the job (one per token that submitted it
    # while it was queued or running: single flight shares a job). Clients see only their own name.
    principals: list[str] = []
    request_bytes: int = 0  # the size of the request body (kept apart from the record, until the job ends)
    name: str | None = None  # build tasks: the kernel's name
    parent: str | None = None  # build tasks: the compile job that queued it
    tasks: list[str] = []  # compile jobs: the ids of the build tasks it queued (its latest attempt)

    @property
    def finished(self) -> bool:
        return self.stage in FINISHED_STAGES


class TokenRecord(BaseModel):
    """An API token as stored: its name, role and the sha256 of the token, never the token."""

    name: str
    role: Literal["client", "admin"]
    sha256: str
    created_at: float | None = None
    source: Literal["settings", "api"] = "api"


@dataclass(frozen=True)
class BuildEntry:
    """One build task to queue: its content key, its task as JSON and the kernel's name."""

    key: str
    task_json: str
    name: str
    arch: int


@dataclass(frozen=True)
class Claim:
    """One job handed to one consumer; `entry_id` is its stream entry (empty in embedded mode)."""

    job_id: str
    stream: str
    entry_id: str = ""
    consumer: str = ""
    reclaimed: bool = False  # taken over from a worker that stopped answering


@dataclass(frozen=True)
class StoredArtifact:
    """A cache hit as the artifacts route serves it: the manifest's stored JSON is passed on as is."""

    manifest: ArtifactManifest
    manifest_json: bytes
    blobs: dict[str, bytes] | None  # None when only the manifest was asked for
    signature: str | None


@dataclass(frozen=True)
class Hit:
    """A cache hit as the artifacts routes serve it: the stored bytes, unparsed and unchecked.

    Note: the service never needs to parse or verify what it serves: the client checks the
    signature over `manifest_json`, then every blob against the manifest's digests, before it
    decodes anything. A manifest whose blobs are not all there is a miss, never a Hit."""

    manifest_json: bytes
    signature: str | None
    blobs: list[tuple[str, bytes]] | None  # (digest, bytes); None when only the manifest was asked for


@dataclass(frozen=True)
class Submitted:
    """What submitting a request gave: the cached manifest, or the job that will produce it."""

    manifest: ArtifactManifest | None = None
    job_id: str | None = None
    created: bool = False


class QueueFull(FxccError):
    """A job stream holds stream_max_len entries: the service refuses more until workers catch up."""

    kind = "unavailable"


def aborted_by(admin: str) -> JobError:
    """The error an admin's abort leaves on a job."""
    return JobError(error="Aborted", message=f"aborted by {admin}")


class QuotaExceeded(FxccError):
    """A principal holds as many unfinished jobs (or request bytes) as its quota allows: 429 for it
    alone, until some of its jobs finish."""

    kind = "quota"

    def __init__(self, principal: str, what: str, would_hold: int, limit: int, setting: str) -> None:
        super().__init__(f"principal {principal!r} would have {would_hold} {what} queued or running with this "
                         f"job, over its quota of {limit} ({setting}); retry when some of its jobs finish")
        self.quota = setting  # the setting that names the quota: the 429's X-Fxcc-Quota header


class ArtifactTooLarge(FxccError):
    """An artifact over max_artifact_bytes: it is not stored."""


# cancelled: the job is cancelled; detached: the caller left a job other principals still wait on;
# conflict: the job is running (and the caller no admin) or finished; missing: no such job (for a
# principal: none of its own).
CancelOutcome = Literal["cancelled", "detached", "conflict", "missing"]
MINUTES_KEPT = 120  # how long the per-minute counters of the dashboard's charts are kept
ANONYMOUS = "anonymous"  # the principal of requests without a token, where anonymous access is on


class Store(Protocol):
    """Artifacts, job records, the job queue, single flight and API tokens. Thread-safe."""

    mode: str  # "redis" or "embedded"

    def ping(self) -> None: ...

    def close(self) -> None: ...

    # ---- artifacts
    def get_manifest(self, key: str) -> ArtifactManifest | None: ...

    def lookup_manifest(self, key: str) -> ArtifactManifest | None:
        """get_manifest, counted as a cache hit or miss."""
        ...

    def get_artifact(self, key: str) -> Artifact | None:
        """The verified artifact, counted as a cache hit or miss."""
        ...

    def get_signature(self, key: str) -> str | None: ...

    async def fetch_hits_async(self, keys: list[str], *, blobs: bool = True) -> list[Hit | None]:
        """The stored hits of `keys` (None for a miss), in order, for the event loop, counted as
        hits and misses: one Redis round trip for all of them, nothing parsed (see Hit)."""
        ...

    async def aclose(self) -> None:
        """Close what fetch_hits_async opened (from the event loop that used it)."""
        ...

    async def get_bundle_async(self, key: str) -> bytes | None:
        """The stored bundle `key` (compiler_core/bundle.py) as stored, unparsed; None when absent."""
        ...

    async def put_bundle_async(self, key: str, data: bytes, members: list[tuple[str, bytes]], ttl_s: int) -> bool:
        """Store a bundle for `ttl_s` while each (key, manifest JSON) in `members` is still what the
        cache holds; it goes when one of them is replaced or deleted. Whether it was stored."""
        ...

    def count_hits_async(self, n: int) -> None:
        """Count `n` cache hits from the event loop, without waiting for the store."""
        ...

    def fetch_artifact(self, key: str, *, blobs: bool = True, count: bool = True) -> StoredArtifact | None:
        """Manifest, verified blobs (if asked) and signature, counted as a cache hit or miss (if
        asked). A manifest whose blobs are gone is a miss."""
        ...

    def put_artifact(self, artifact: Artifact, signature: str | None = None) -> None:
        """Store the blobs first and the manifest last, so that no reader sees a torn entry.

        Raises ArtifactTooLarge over max_artifact_bytes."""
        ...

    def list_artifacts(self, limit: int) -> list[str]: ...

    def delete_artifact(self, key: str) -> bool: ...

    def purge_cache(self) -> int:
        """Delete every manifest and blob; returns how many manifests went."""
        ...

    def count(self, counter: str, n: int = 1) -> None: ...

    def counters(self) -> dict[str, int]: ...

    def cache_entries(self) -> int: ...

    def record_minute(self, minute: int, counters: dict[str, int]) -> None:
        """Keep `counters` as they were at the start of Unix minute `minute` (for MINUTES_KEPT
        minutes), unless that minute is kept already (several API processes sample it)."""
        ...

    def minutes(self, first: int, last: int) -> list[dict[str, int]]:
        """The kept minutes from `first` to `last`, oldest first, each with its `minute`."""
        ...

    # ---- pre-AOT entries, one namespace per principal (routes/pre_aot.py)
    def put_pre_aot(self, principal: str, key: str, artifact_key: str, entry_json: bytes) -> bool:
        """Store `entry_json` as `principal`'s entry for `key`, but only while the artifact
        `artifact_key` is stored; False (nothing written) when it is not."""
        ...

    def get_pre_aot(self, principal: str, key: str) -> bytes | None:
        """`principal`'s entry for `key` as stored (the artifact it names may be gone since)."""
        ...

    # ---- Dynamo packages, opaque bytes, one namespace per principal (routes/packages.py)
    def put_package(self, principal: str, key: str, data: bytes) -> None:
        """Store `data` as `principal`'s package for `key` (never opened: it is client code)."""
        ...

    def get_package(self, principal: str, key: str) -> bytes | None:
        """`principal`'s package for `key` as stored; None when it has none."""
        ...

    # ---- jobs
    def submit(self, key: str, request_json: str, priority: Priority, principal: str = ANONYMOUS) -> Submitted:
        """Queue a job for `key` unless the artifact exists or a job for it is queued/running (then
        `principal` is attached to that one). A new job counts against `principal`'s quotas
        (QuotaExceeded) and the queue cap (QueueFull)."""
        ...

    def submit_tune(self, key: str, arch: int, request_json: str) -> Submitted:
        """Queue a tune job for the stored untuned artifact of `key` on the sm_`arch` tune queue,
        unless a tune job for `key` is queued or running (then that one's id, created False)."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def get_request(self, job_id: str) -> str | None:
        """The request body of an unfinished job (None once it ended: the body is deleted then)."""
        ...

    def list_jobs(self, state: JobState | None, limit: int, principal: str | None = None) -> list[JobRecord]:
        """The most recent jobs first, optionally only those in `state`, or those `principal` is attached to."""
        ...

    def job_counts(self) -> dict[str, int]:
        """The most recent 1000 jobs, counted per state."""
        ...

    def mark_started(self, job_id: str, worker: str, *, takeover: bool = False,
                     stage: JobStage = JobStage.LOWERING) -> JobRecord | None:
        """queued → `stage` (attempt + 1); with `takeover` also a running stage → `stage`.

        None when the job is unknown or not in a state this claim may start.
        """
        ...

    def mark_stage(self, job_id: str, stage: JobStage) -> None: ...

    def mark_done(self, job_id: str, stats: dict[str, Any]) -> None: ...

    def mark_failed(self, job_id: str, error: JobError, *, dead_letter: bool = False) -> None: ...

    def retry(self, claim: Claim, error: JobError) -> None:
        """A running job back to queued with a new stream entry, keeping its attempt count."""
        ...

    def requeue(self, claim: Claim) -> None:
        """Like retry, for a job its worker gave back (SIGTERM): the attempt is not counted."""
        ...

    def cancel(self, job_id: str, principal: str | None = None) -> CancelOutcome:
        """Without `principal`: cancel a queued job. With one: only a job it is attached to (else
        missing); when other principals remain attached it is only detached, else as without."""
        ...

    def abort(self, job_id: str, admin: str) -> CancelOutcome:
        """An admin's cancel: a queued or running job goes to cancelled, error "aborted by <admin>"."""
        ...

    def dead_letters(self, limit: int) -> list[dict[str, str]]: ...

    # ---- build tasks (worker/builds.py) and the kernels they built, by content key
    def submit_builds(self, parent_id: str, tasks: list[BuildEntry]) -> list[str]:
        """Queue a build task for each entry (unless one for its key is queued or running: then
        that one's id), in the build queue every worker reads; the ids, in order, are also
        recorded as the parent job's `tasks`. Raises QueueFull over the queue cap."""
        ...

    def get_jobs(self, job_ids: list[str]) -> list[JobRecord | None]:
        """get_job of each id, in order, in one round trip."""
        ...

    def get_kernel_builds(self, keys: list[str]) -> dict[str, bytes]:
        """The built kernels stored under these content keys (those that are), as put."""
        ...

    def put_kernel_build(self, key: str, data: bytes) -> None:
        """Keep a built kernel (an encoded compiler_core.build_tasks.BuiltKernel) under its content key."""
        ...

    # ---- queue
    def claim(self, consumer: str, block_ms: int, tune_arch: int | None = None) -> list[Claim]:
        """Jobs for `consumer`: stuck ones first, then interactive, then precompile, then (only
        for a consumer with a GPU of sm_`tune_arch`) tune jobs of that arch."""
        ...

    def claim_builds(self, consumer: str, block_ms: int) -> list[Claim]:
        """A build task for `consumer`: a stuck one (its worker died) first, else a waiting one."""
        ...

    def ack(self, claim: Claim) -> None: ...

    def heartbeat(self, worker: str, info: dict[str, Any], claims: list[Claim]) -> None:
        """Say the worker lives; keep its claims and their single-flight entries from expiring."""
        ...

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per priority, and `tune` (every arch's tune queue together): jobs waiting for a worker
        and jobs a worker holds."""
        ...

    def tune_depths(self) -> dict[str, dict[str, int]]:
        """Per arch key ("sm_90") that ever had a tune job: waiting and running tune jobs."""
        ...

    def workers(self) -> list[dict[str, Any]]:
        """The info of every worker whose heartbeat is current (with `beat_at`, Unix seconds)."""
        ...

    # ---- API tokens made over the API (those from settings never reach the store)
    def api_tokens(self) -> list[TokenRecord]: ...

    def find_token(self, sha256: str) -> TokenRecord | None: ...

    def add_token(self, token: TokenRecord) -> bool:
        """False when a token of that name exists."""
        ...

    def delete_token(self, name: str) -> bool: ...


def now_s() -> float:
    return round(time.time(), 6)
