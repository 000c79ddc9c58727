"""EmbeddedStore: artifacts on local disk, jobs and the queues (compile, and tune per GPU arch) in memory,
for `fxcc serve` without Redis; the jobs in flight (compile and tune) are also kept on disk, for the
next process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fxcc.compiler_core.artifact import (
    Artifact,
    ArtifactManifest,
    atomic_write,
    load_artifact,
    save_artifact,
    supersedes,
)
from fxcc.service.store import (
    ANONYMOUS,
    MINUTES_KEPT,
    PRIORITIES,
    RUNNING_STAGES,
    ArtifactTooLarge,
    BuildEntry,
    CancelOutcome,
    Claim,
    Hit,
    JobError,
    JobRecord,
    JobStage,
    JobState,
    Priority,
    QueueFull,
    QuotaExceeded,
    StoredArtifact,
    Submitted,
    TokenRecord,
    aborted_by,
    now_s,
    state_of,
)

log = logging.getLogger("fxcc.service.embedded")

RECENT_WINDOW = 1000  # jobs counted per state for /v1/stats, as RedisStore counts them


JOB_FOLDERS = {"tune": "tune", "compile": "queue"}  # where a job kind's jobs in flight are kept on disk


def tune_queue(arch: int) -> str:
    return f"tune:sm_{arch}"


BUILD_QUEUE = "builds"  # the build tasks of every compile (worker/builds.py)


def queue_of(job: JobRecord) -> str:
    """The queue a job waits in: its priority's, its arch's tune queue, or the build queue."""
    if job.kind == "build":
        return BUILD_QUEUE
    return tune_queue(job.arch) if job.kind == "tune" and job.arch is not None else job.priority


class TuneRecord(BaseModel):
    """A job in flight as kept in data_dir/tune/<key>.json (tune jobs) or data_dir/queue/<key>.json
    (compile jobs): the job as it stands, and its request."""

    job: JobRecord
    request: str


class EmbeddedStore:
    """One process's store. A single lock guards jobs, queues and single flight."""

    mode = "embedded"

    def __init__(self, data_dir: Path, job_ttl_s: float = 7 * 86_400,
                 max_artifact_bytes: int = 256 * 1024 * 1024, stream_max_len: int = 100_000,
                 quota_queued_jobs: int = 1_000, quota_queued_bytes: int = 1024 * 1024 * 1024) -> None:
        self.root = Path(data_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition()
        self._put_lock = threading.Lock()
        self._jobs: dict[str, JobRecord] = {}
        self._minutes: dict[int, dict[str, int]] = {}  # the dashboard's per-minute counters (in memory)
        self._requests: dict[str, str] = {}
        self._inflight: dict[str, str] = {}
        self._tune_inflight: dict[str, str] = {}  # artifact key -> its tune job (one in flight per key)
        self._build_inflight: dict[str, str] = {}  # build task key -> the task building it (kept in memory only)
        # Queues by name: the priorities, and "tune:sm_<arch>" per GPU arch (as the Redis streams).
        self._queues: defaultdict[str, deque[str]] = defaultdict(deque, {p: deque() for p in PRIORITIES})
        self._counters: Counter[str] = Counter()
        self._dead: deque[dict[str, str]] = deque(maxlen=1000)
        self._job_ttl_s = job_ttl_s
        self._running: Counter[str] = Counter({p: 0 for p in PRIORITIES})
        self._jobs_done = 0  # by the in-process workers, since the service started
        self.max_artifact_bytes = max_artifact_bytes
        self.stream_max_len = stream_max_len  # the queue cap, per queue, as the Redis streams have it
        self.quota_queued_jobs = quota_queued_jobs
        self.quota_queued_bytes = quota_queued_bytes
        # What the in-process workers run on, and the arch of the tune jobs they take (set at start).
        self.worker_device = "cpu"
        self.worker_tune_arch: int | None = None
        self._restore_jobs()

    def ping(self) -> None:
        if not self.root.is_dir():
            raise OSError(f"data dir {self.root} is gone")

    def close(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------ artifacts

    def _manifest_path(self, key: str) -> Path:
        return self.root / "manifests" / f"{key}.json"

    def get_manifest(self, key: str) -> ArtifactManifest | None:
        try:
            return ArtifactManifest.model_validate_json(self._manifest_path(key).read_bytes())
        except (FileNotFoundError, ValueError):
            return None

    def lookup_manifest(self, key: str) -> ArtifactManifest | None:
        found = self.fetch_artifact(key, blobs=False)
        return None if found is None else found.manifest

    def get_artifact(self, key: str) -> Artifact | None:
        art = load_artifact(self.root, key)
        self.count("hits" if art is not None else "misses")
        return art

    def fetch_artifact(self, key: str, *, blobs: bool = True, count: bool = True) -> StoredArtifact | None:
        try:
            data = self._manifest_path(key).read_bytes()
        except FileNotFoundError:
            data = None
        art = load_artifact(self.root, key) if data is not None else None  # None too when a blob is gone
        if art is None:
            if count:
                self.count("misses")
            return None
        if count:
            self.count("hits")
        return StoredArtifact(art.manifest, data or b"", art.blobs if blobs else None, self.get_signature(key))

    async def fetch_hits_async(self, keys: list[str], *, blobs: bool = True) -> list[Hit | None]:
        # Note: files on a local disk, one user: these hits are parsed and checked (fetch_artifact),
        # which Redis's hot path skips.
        return await asyncio.to_thread(lambda: [self._hit(key, blobs) for key in keys])

    def _hit(self, key: str, blobs: bool) -> Hit | None:
        found = self.fetch_artifact(key, blobs=blobs)
        if found is None:
            return None
        return Hit(found.manifest_json, found.signature, None if found.blobs is None else list(found.blobs.items()))

    async def aclose(self) -> None:
        """Nothing to close: files only."""

    # Note: one user's local service keeps no bundles: each is assembled from the files when asked
    # (POST /v1/bundles), and GET /v1/bundles/{key} is a 404.
    async def get_bundle_async(self, key: str) -> bytes | None:
        return None

    async def put_bundle_async(self, key: str, data: bytes, members: list[tuple[str, bytes]], ttl_s: int) -> bool:
        return False

    def count_hits_async(self, n: int) -> None:
        self.count("hits", n)

    def get_signature(self, key: str) -> str | None:
        try:
            return (self.root / "manifests" / f"{key}.sig").read_text()
        except FileNotFoundError:
            return None

    def put_artifact(self, artifact: Artifact, signature: str | None = None) -> None:
        key = artifact.manifest.key
        size = len(artifact.manifest_json()) + sum(len(b) for b in artifact.blobs.values())
        if size > self.max_artifact_bytes:
            self.count("rejected")
            raise ArtifactTooLarge(f"artifact {key[:12]} has {size} bytes, over the limit of "
                                   f"{self.max_artifact_bytes} (FXCC_MAX_ARTIFACT_BYTES)")
        # Note: check and write under one lock, so that an untuned put racing a tuned one of the
        # same key cannot land last (the embedded store is the only writer of its data dir).
        with self._put_lock:
            if not supersedes(artifact.manifest, self.get_manifest(key)):
                return  # a tuned artifact supersedes an untuned one, never the other way round
            sig_path = self.root / "manifests" / f"{key}.sig"
            if signature is None:
                sig_path.unlink(missing_ok=True)
            else:
                atomic_write(sig_path, signature.encode())
            save_artifact(self.root, artifact)  # blobs first, manifest last
        self.count("puts")

    def list_artifacts(self, limit: int) -> list[str]:
        paths = sorted((self.root / "manifests").glob("*.json")) if (self.root / "manifests").is_dir() else []
        return [p.stem for p in paths[:limit]]

    def delete_artifact(self, key: str) -> bool:
        (self.root / "manifests" / f"{key}.sig").unlink(missing_ok=True)
        try:
            self._manifest_path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def purge_cache(self) -> int:
        n = len(self.list_artifacts(1 << 62))
        for sub in ("manifests", "blobs", "pre_aot", "packages"):  # pre-AOT entries name only artifacts now gone
            shutil.rmtree(self.root / sub, ignore_errors=True)
        return n

    def count(self, counter: str, n: int = 1) -> None:
        with self._cond:
            self._counters[counter] += n

    def counters(self) -> dict[str, int]:
        with self._cond:
            out = dict(self._counters)
        out["bytes"] = sum(p.stat().st_size for sub in ("manifests", "blobs")
                           for p in (self.root / sub).rglob("*") if p.is_file())
        return out

    def cache_entries(self) -> int:
        return len(self.list_artifacts(1 << 62))

    def record_minute(self, minute: int, counters: dict[str, int]) -> None:
        with self._cond:
            self._minutes.setdefault(minute, dict(counters))
            for old in [m for m in self._minutes if m <= minute - MINUTES_KEPT]:
                del self._minutes[old]

    def minutes(self, first: int, last: int) -> list[dict[str, int]]:
        with self._cond:
            return [dict(c, minute=m) for m, c in sorted(self._minutes.items()) if first <= m <= last]

    # ------------------------------------------------------------ pre-AOT entries

    def _pre_aot_path(self, principal: str, key: str) -> Path:
        # One folder per principal, named by a hash: a principal's name never becomes a path.
        folder = hashlib.sha256(principal.encode()).hexdigest()[:32]
        return self.root / "pre_aot" / folder / f"{key}.json"

    def put_pre_aot(self, principal: str, key: str, artifact_key: str, entry_json: bytes) -> bool:
        if not self._manifest_path(artifact_key).is_file():
            return False
        atomic_write(self._pre_aot_path(principal, key), entry_json)
        return True

    def get_pre_aot(self, principal: str, key: str) -> bytes | None:
        try:
            return self._pre_aot_path(principal, key).read_bytes()
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------ Dynamo packages (opaque bytes)

    def _package_path(self, principal: str, key: str) -> Path:
        folder = hashlib.sha256(principal.encode()).hexdigest()[:32]  # a name never becomes a path
        return self.root / "packages" / folder / f"{key}.pkg"

    def put_package(self, principal: str, key: str, data: bytes) -> None:
        atomic_write(self._package_path(principal, key), data)

    def get_package(self, principal: str, key: str) -> bytes | None:
        try:
            return self._package_path(principal, key).read_bytes()
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------ jobs

    def submit(self, key: str, request_json: str, priority: Priority, principal: str = ANONYMOUS) -> Submitted:
        found = self.fetch_artifact(key, blobs=False, count=False)
        if found is not None:
            return Submitted(manifest=found.manifest)
        with self._cond:
            existing = self._jobs.get(self._inflight.get(key, ""))
            if existing is not None and not existing.finished:
                if (existing.stage is JobStage.QUEUED and priority == "interactive"
                        and existing.priority == "precompile"):
                    # A user now waits on a background job: move it to the front queue.
                    self._queues["precompile"].remove(existing.id)
                    self._queues["interactive"].append(existing.id)
                    self._jobs[existing.id] = existing.model_copy(update={"priority": "interactive"})
                    self._cond.notify_all()
                self._attach(existing.id, principal)
                return Submitted(job_id=existing.id)
            # Note: looked for again under the lock, after the live job: a job done since the look
            # above had stored its artifact before its mark_done took the lock.
            found = self.fetch_artifact(key, blobs=False, count=False)
            if found is not None:
                return Submitted(manifest=found.manifest)
            size = len(request_json.encode())
            self._check_quotas(principal, size)
            self._check_cap(priority)
            job_id = uuid.uuid4().hex
            if len(self._jobs) % 1024 == 1023:
                self._forget_old_jobs()
            created = now_s()
            self._jobs[job_id] = JobRecord(id=job_id, key=key, state=JobState.QUEUED, stage=JobStage.QUEUED,
                                           stages={"queued": created}, priority=priority, created_at=created,
                                           principals=[principal], request_bytes=size)
            self._requests[job_id] = request_json
            self._inflight[key] = job_id
            self._save_job(self._jobs[job_id])
            self._queues[priority].append(job_id)
            self._cond.notify_all()
            return Submitted(job_id=job_id, created=True)

    def _attach(self, job_id: str, principal: str) -> None:
        """A request that joins a live job: its principal is attached (and charged; never refused)."""
        job = self._jobs[job_id]
        if principal not in job.principals:
            job = self._jobs[job_id] = job.model_copy(update={"principals": [*job.principals, principal]})
            self._save_job(job)

    def _check_quotas(self, principal: str, size: int) -> None:
        held = [j for j in self._jobs.values() if not j.finished and principal in j.principals]
        if len(held) + 1 > self.quota_queued_jobs:
            raise QuotaExceeded(principal, "jobs", len(held) + 1, self.quota_queued_jobs,
                                "FXCC_QUOTA_QUEUED_JOBS")
        held_bytes = sum(j.request_bytes for j in held) + size
        if held_bytes > self.quota_queued_bytes:
            raise QuotaExceeded(principal, "request bytes", held_bytes, self.quota_queued_bytes,
                                "FXCC_QUOTA_QUEUED_BYTES")

    def _check_cap(self, queue: str) -> None:
        """The queue cap (FXCC_STREAM_MAX_LEN) as a Redis stream has it: jobs waiting and running."""
        if len(self._queues[queue]) + self._running[queue] >= self.stream_max_len:
            raise QueueFull(f"the {queue} queue holds {self.stream_max_len} jobs (FXCC_STREAM_MAX_LEN); "
                            "retry later")

    def submit_tune(self, key: str, arch: int, request_json: str) -> Submitted:
        with self._cond:
            existing = self._jobs.get(self._tune_inflight.get(key, ""))
            if existing is not None and not existing.finished:
                return Submitted(job_id=existing.id)
            self._check_cap(tune_queue(arch))
            job_id = uuid.uuid4().hex
            created = now_s()
            self._jobs[job_id] = JobRecord(id=job_id, key=key, kind="tune", arch=arch, state=JobState.QUEUED,
                                           stage=JobStage.QUEUED, stages={"queued": created},
                                           priority="precompile", created_at=created,
                                           request_bytes=len(request_json.encode()))
            self._requests[job_id] = request_json
            self._tune_inflight[key] = job_id
            self._save_job(self._jobs[job_id])
            self._queues[tune_queue(arch)].append(job_id)
            self._cond.notify_all()
            return Submitted(job_id=job_id, created=True)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._cond:
            return self._jobs.get(job_id)

    def get_request(self, job_id: str) -> str | None:
        with self._cond:
            return self._requests.get(job_id)

    def list_jobs(self, state: JobState | None, limit: int, principal: str | None = None) -> list[JobRecord]:
        with self._cond:
            jobs = sorted((j for j in self._jobs.values() if j.kind != "build"), key=lambda j: j.created_at,
                          reverse=True)
        return [j for j in jobs if (state is None or j.state is state)
                and (principal is None or principal in j.principals)][:limit]

    def job_counts(self) -> dict[str, int]:
        with self._cond:
            recent = sorted((j for j in self._jobs.values() if j.kind != "build"), key=lambda j: j.created_at,
                            reverse=True)[:RECENT_WINDOW]
            counts = Counter(j.state.value for j in recent)
        return {s.value: counts.get(s.value, 0) for s in JobState}

    def _forget_old_jobs(self) -> None:
        """Drop finished jobs older than job_ttl_s (what EXPIRE does for Redis job hashes)."""
        horizon = time.time() - self._job_ttl_s
        for job_id in [j.id for j in self._jobs.values() if j.finished and (j.finished_at or 0) < horizon]:
            del self._jobs[job_id]

    def mark_started(self, job_id: str, worker: str, *, takeover: bool = False,
                     stage: JobStage = JobStage.LOWERING) -> JobRecord | None:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or not (job.stage is JobStage.QUEUED or (takeover and job.state is JobState.RUNNING)):
                return None
            return self._move(job_id, stage, started_at=now_s(), worker=worker,
                              attempt=job.attempt + 1)

    def mark_stage(self, job_id: str, stage: JobStage) -> None:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is not None and job.state is JobState.RUNNING and stage in RUNNING_STAGES:
                self._move(job_id, stage)

    def mark_done(self, job_id: str, stats: dict[str, Any]) -> None:
        with self._cond:
            if self._move_unfinished(job_id, JobStage.DONE, finished_at=now_s(), stats=stats, error=None):
                self._jobs_done += 1

    def mark_failed(self, job_id: str, error: JobError, *, dead_letter: bool = False) -> None:
        job = self._move_unfinished(job_id, JobStage.FAILED, finished_at=now_s(), error=error, stats=None)
        if dead_letter and job is not None:
            self._dead.appendleft({"job_id": job_id, "key": job.key, "kind": job.kind, "attempts": str(job.attempt),
                                   "error": error.model_dump_json(), "at": repr(now_s())})

    def retry(self, claim: Claim, error: JobError) -> None:
        self._back_to_queue(claim, error=error)

    def requeue(self, claim: Claim) -> None:
        self._back_to_queue(claim, attempt_change=-1)

    def _back_to_queue(self, claim: Claim, error: JobError | None = None, attempt_change: int = 0) -> None:
        with self._cond:
            job = self._jobs.get(claim.job_id)
            if job is not None and job.state is JobState.RUNNING:
                self._move(job.id, JobStage.QUEUED, worker=None, attempt=job.attempt + attempt_change,
                           error=error or job.error)
                self._queues[queue_of(job)].append(job.id)
            self.ack(claim)

    def cancel(self, job_id: str, principal: str | None = None) -> CancelOutcome:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or (principal is not None and principal not in job.principals):
                return "missing"
            if principal is not None and job.principals != [principal]:
                if job.finished:
                    return "conflict"
                kept = [p for p in job.principals if p != principal]
                self._jobs[job_id] = job.model_copy(update={"principals": kept})
                self._save_job(self._jobs[job_id])
                return "detached"
            if job.stage is not JobStage.QUEUED:
                return "conflict"
            self._unqueue(job_id)
            self._move(job_id, JobStage.CANCELLED, finished_at=now_s())
            return "cancelled"

    def abort(self, job_id: str, admin: str) -> CancelOutcome:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None:
                return "missing"
            if job.finished:
                return "conflict"
            self._unqueue(job_id)  # a running job is its worker's: the worker sees cancelled and stops
            self._move(job_id, JobStage.CANCELLED, finished_at=now_s(), error=aborted_by(admin))
            return "cancelled"

    def _unqueue(self, job_id: str) -> None:
        for q in self._queues.values():
            if job_id in q:
                q.remove(job_id)

    def dead_letters(self, limit: int) -> list[dict[str, str]]:
        with self._cond:
            return list(self._dead)[:limit]

    def _move_unfinished(self, job_id: str, stage: JobStage, **fields: Any) -> JobRecord | None:
        """_move, unless the job is finished (an admin aborted it while its worker ran it)."""
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or job.finished:
                return None
            return self._move(job_id, stage, **fields)

    def _move(self, job_id: str, stage: JobStage, **fields: Any) -> JobRecord | None:
        """Put a job in `stage`, stamping the time it entered it."""
        with self._cond:  # re-entrant: a Condition wraps an RLock
            before = self._jobs.get(job_id)
            if before is None:
                return None
            stages = {**{k: v for k, v in before.stages.items() if k != stage.value}, stage.value: now_s()}
            job = self._jobs[job_id] = before.model_copy(update={
                "stage": stage, "state": state_of(stage), "stages": stages, **fields})
            # Only what a restart needs is written: queued or running, and the attempts (a move
            # between running stages changes neither, and a request may be megabytes).
            if (job.state, job.attempt) != (before.state, before.attempt):
                self._save_job(job)
            if job.finished:
                self._requests.pop(job_id, None)
                inflight = self._inflight_of(job.kind)
                if inflight.get(job.key) == job_id:
                    del inflight[job.key]
            self._cond.notify_all()
            return job

    # ------------------------------------------------------------ the jobs in flight on disk

    # Note: the jobs in flight (queued or running) are kept on disk, one file per key (single flight
    # keeps one compile job and one tune job per key in flight): tune jobs in data_dir/tune, compile
    # jobs in data_dir/queue. A file is rewritten when its job goes between queued and running or
    # its attempts or principals change, and removed when the job finishes. A later process on the
    # data dir queues them again (_restore_jobs). A tune job is also the only record of an untuned
    # artifact's request (manifests do not hold it).

    def _job_path(self, kind: str, key: str) -> Path:
        return self.root / JOB_FOLDERS[kind] / f"{key}.json"

    def _inflight_of(self, kind: str) -> dict[str, str]:
        """The single-flight map of a job kind."""
        return {"tune": self._tune_inflight, "build": self._build_inflight}.get(kind, self._inflight)

    def _save_job(self, job: JobRecord) -> None:
        """Write the key's job in flight to disk, or remove it once the job is finished.

        Note: build tasks stay in memory: a restarted service queues their compile jobs again, and
        those queue the tasks of the kernels not built yet."""
        if job.kind == "build":
            return
        inflight = self._inflight_of(job.kind)
        if inflight.get(job.key) != job.id:
            return  # not the key's job in flight: the file is another job's
        path = self._job_path(job.kind, job.key)
        try:
            if job.finished:
                path.unlink(missing_ok=True)
            else:
                atomic_write(path, TuneRecord(job=job, request=self._requests[job.id]).model_dump_json().encode())
        except OSError as e:  # the job goes on in memory; only a restart would lose it
            log.warning("%s job %s could not be %s on disk: %s", job.kind, job.id,
                        "removed" if job.finished else "kept", e)

    def _restore_jobs(self) -> None:
        """Queue again the jobs that an earlier process left in flight under data_dir/queue and
        data_dir/tune, oldest first; a running one goes back to queued with its attempts counted
        (its worker died with that process)."""
        records = []
        for kind, folder in JOB_FOLDERS.items():
            paths = sorted((self.root / folder).glob("*.json"))
            records += [r for r in (self._read_record(kind, p) for p in paths) if r is not None]
        for record in sorted(records, key=lambda r: r.job.created_at):
            job = record.job
            self._jobs[job.id] = job
            self._requests[job.id] = record.request
            (self._tune_inflight if job.kind == "tune" else self._inflight)[job.key] = job.id
            if job.state is JobState.RUNNING:
                self._move(job.id, JobStage.QUEUED, worker=None)
            self._queues[queue_of(job)].append(job.id)
        if records:
            log.info("queue: %d job(s) restored from %s", len(records), self.root)

    def _read_record(self, kind: str, path: Path) -> TuneRecord | None:
        """The job in flight of `kind` that `path` holds, when its artifact still waits for it (a
        compile: none stored; a tune: stored untuned). None for a file that holds no such job
        (logged, and left there), and for a job whose work is done meanwhile (its file removed)."""
        try:
            record = TuneRecord.model_validate_json(path.read_bytes())
        except (OSError, ValueError) as e:
            log.warning("queue: skipping %s, which is not a %s job: %s", path, kind, str(e)[:500])
            return None
        job = record.job
        if (job.kind != kind or (kind == "tune" and job.arch is None) or job.key != path.stem or job.finished
                or job.id in self._jobs):
            log.warning("queue: skipping %s, which holds no %s job in flight for its key", path, kind)
            return None
        try:
            manifest = self.get_manifest(job.key)
            if kind == "compile" and manifest is None or kind == "tune" and manifest is not None and not manifest.tuned:
                return record
            log.info("queue: dropping %s job %s: artifact %s is %s", kind, job.id, job.key[:12],
                     "stored" if kind == "compile" else "gone" if manifest is None else "tuned")
            path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("queue: skipping %s: %s", path, e)
        return None

    # ------------------------------------------------------------ build tasks

    def submit_builds(self, parent_id: str, tasks: list[BuildEntry]) -> list[str]:
        ids = []
        with self._cond:
            for t in tasks:
                existing = self._jobs.get(self._build_inflight.get(t.key, ""))
                if existing is not None and not existing.finished:
                    ids.append(existing.id)
                    continue
                self._check_cap(BUILD_QUEUE)
                job_id = uuid.uuid4().hex
                created = now_s()
                self._jobs[job_id] = JobRecord(id=job_id, key=t.key, kind="build", arch=t.arch, name=t.name,
                                               parent=parent_id, state=JobState.QUEUED, stage=JobStage.QUEUED,
                                               stages={"queued": created}, priority="precompile",
                                               created_at=created, request_bytes=len(t.task_json))
                self._requests[job_id] = t.task_json
                self._build_inflight[t.key] = job_id
                self._queues[BUILD_QUEUE].append(job_id)
                ids.append(job_id)
            parent = self._jobs.get(parent_id)
            if parent is not None:
                self._jobs[parent_id] = parent.model_copy(update={"tasks": ids})
            self._cond.notify_all()
        return ids

    def get_jobs(self, job_ids: list[str]) -> list[JobRecord | None]:
        with self._cond:
            return [self._jobs.get(job_id) for job_id in job_ids]

    def _kernel_build_path(self, key: str) -> Path:
        return self.root / "kernels" / key[:2] / f"{key}.bin"

    def get_kernel_builds(self, keys: list[str]) -> dict[str, bytes]:
        found = {}
        for key in keys:
            try:
                found[key] = self._kernel_build_path(key).read_bytes()
            except FileNotFoundError:
                pass
        return found

    def put_kernel_build(self, key: str, data: bytes) -> None:
        atomic_write(self._kernel_build_path(key), data)

    def claim_builds(self, consumer: str, block_ms: int) -> list[Claim]:
        deadline = time.monotonic() + block_ms / 1000
        with self._cond:
            while not self._queues[BUILD_QUEUE]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)
            self._running[BUILD_QUEUE] += 1
            return [Claim(job_id=self._queues[BUILD_QUEUE].popleft(), stream=BUILD_QUEUE, consumer=consumer)]

    # ------------------------------------------------------------ queue

    def claim(self, consumer: str, block_ms: int, tune_arch: int | None = None) -> list[Claim]:
        deadline = time.monotonic() + block_ms / 1000
        names = PRIORITIES + ((tune_queue(tune_arch),) if tune_arch is not None else ())
        with self._cond:
            while True:
                for name in names:
                    if self._queues[name]:
                        self._running[name] += 1
                        return [Claim(job_id=self._queues[name].popleft(), stream=name, consumer=consumer)]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)

    def ack(self, claim: Claim) -> None:
        with self._cond:
            self._running[claim.stream] -= 1

    def queue_depths(self) -> dict[str, dict[str, int]]:
        with self._cond:
            out = {p: {"waiting": len(self._queues[p]), "running": self._running[p]} for p in PRIORITIES}
            tune = self.tune_depths().values()
            out["tune"] = {"waiting": sum(t["waiting"] for t in tune), "running": sum(t["running"] for t in tune)}
            out["builds"] = {"waiting": len(self._queues[BUILD_QUEUE]), "running": self._running[BUILD_QUEUE]}
            out["dead_letter"] = {"waiting": len(self._dead), "running": 0}
            return out

    def tune_depths(self) -> dict[str, dict[str, int]]:
        with self._cond:
            names = sorted(n for n in self._queues if n.startswith("tune:"))
            return {n.removeprefix("tune:"): {"waiting": len(self._queues[n]), "running": self._running[n]}
                    for n in names}

    def workers(self) -> list[dict[str, Any]]:
        with self._cond:
            done = self._jobs_done
        return [{"id": "embedded", "device": self.worker_device, "tune_arch": self.worker_tune_arch,
                 "in_process": True, "beat_at": time.time(), "jobs_done": done}]

    def heartbeat(self, worker: str, info: dict[str, Any], claims: list[Claim]) -> None:
        """Nothing to do: embedded workers live and die with the service process."""

    # ------------------------------------------------------------ tokens (kept in data_dir/tokens.json)

    def _tokens_path(self) -> Path:
        return self.root / "tokens.json"

    def api_tokens(self) -> list[TokenRecord]:
        try:
            return [TokenRecord.model_validate(t) for t in json.loads(self._tokens_path().read_text())]
        except FileNotFoundError:
            return []

    def find_token(self, sha256: str) -> TokenRecord | None:
        return next((t for t in self.api_tokens() if t.sha256 == sha256), None)

    def add_token(self, token: TokenRecord) -> bool:
        with self._cond:
            tokens = self.api_tokens()
            if any(t.name == token.name or t.sha256 == token.sha256 for t in tokens):
                return False
            self._save_tokens([*tokens, token])
            return True

    def delete_token(self, name: str) -> bool:
        with self._cond:
            tokens = self.api_tokens()
            kept = [t for t in tokens if t.name != name]
            self._save_tokens(kept)
            return len(kept) != len(tokens)

    def _save_tokens(self, tokens: list[TokenRecord]) -> None:
        atomic_write(self._tokens_path(), json.dumps([t.model_dump() for t in tokens]).encode())
