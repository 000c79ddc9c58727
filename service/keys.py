"""Every Redis key and stream name fxcc uses, in one place (as rq/arq keep theirs)."""

from __future__ import annotations

# ---- cache (FXCC_CACHE_REDIS_URL, which defaults to the queue's Redis)
BLOB = "blob:{digest}"  # raw bytes of one content-addressed blob
MANIFEST = "manifest:{key}"  # ArtifactManifest JSON; written last, after every blob it names
SIGNATURE = "sig:{key}"  # the Ed25519 signature of the manifest (compiler_core/signing.py), set with it
MANIFEST_INDEX = "manifests"  # set of the keys that have a manifest (for listing and counting)
# a bundle: several artifacts framed as one value (compiler_core/bundle.py), under the key of their
# sorted artifact keys; written only while each member's manifest is the one framed, and deleted
# when one of them is replaced or deleted (routes/bundles.py). Expires after bundle_ttl_s.
BUNDLE = "bundle:{key}"
BUNDLES_OF = "bundles:of:{key}"  # set: the bundle keys holding an artifact key (to delete them with it)
CACHE_COUNTERS = "stats:cache"  # hash of counters: hits, misses, puts, rejected, bytes
STATS_MINUTE = "stats:minute:{minute}"  # JSON counters at the start of one Unix minute (SET NX, 2 h; the dashboard's charts)
# a pre-AOT entry (a Dynamo graph's pre-AOT key -> the artifact it compiled to) of one principal, as
# JSON; expires after pre_aot_ttl_s unless written again (routes/pre_aot.py)
PRE_AOT = "preaot:{principal}:{key}"
# a Dynamo package (opaque bytes, client code signed by the principal; routes/packages.py), same TTL
PACKAGE = "package:{principal}:{key}"

# a built kernel (an encoded compiler_core.build_tasks.BuiltKernel: metadata, then the cubin) under its
# build task's content key, read by workers only; expires after kernel_build_ttl_s unless built again
KERNEL_BUILD = "kbuild:{key}"

# ---- queue and jobs (FXCC_REDIS_URL)
# hash: stage, stage times, worker, attempt, principals (comma-separated), request bytes, error, stats
JOB = "job:{job_id}"
# the request JSON of a queued or running job, apart from its record so that polls never read it;
# deleted when the job ends (done, failed, cancelled)
REQUEST = "request:{job_id}"
# hash per principal: `jobs` and `bytes` of its unfinished jobs (the quotas); a job charges every
# principal attached to it, and releases them when it ends or they detach
QUOTA = "quota:{principal}"
PRINCIPAL_JOBS = "jobs:of:{principal}"  # sorted set: the principal's job ids by creation time
INFLIGHT = "inflight:{key}"  # single flight: compile key -> id of the job compiling it, or that compiled it (kept when done)
STREAM_INTERACTIVE = "jobs:interactive"  # read before precompile: a user is waiting on these
STREAM_PRECOMPILE = "jobs:precompile"
TUNE_STREAM = "tune:sm_{arch}"  # tune jobs of one GPU arch; read only by GPU workers of that arch
TUNE_ARCHS = "tune:archs"  # set of the archs that have a tune stream (for stats)
TUNE_INFLIGHT = "tuneflight:{key}"  # single flight: artifact key -> id of the job tuning it
BUILD_STREAM = "builds"  # build tasks (worker/builds.py): one kernel each; every worker reads it
BUILD_INFLIGHT = "buildflight:{key}"  # single flight: build task key -> id of the task building it
BUILD_ARCHS = "builds:archs"  # set of the archs build tasks were queued for
BUILDS_RECENT = "builds:recent"  # sorted set: build task id by creation time (kept out of jobs:recent)
DEAD_LETTER = "jobs:dead"  # stream of jobs that failed job_max_attempts times, with their error
RECENT_JOBS = "jobs:recent"  # sorted set: job id scored by creation time (GET /v1/jobs)
WORKER = "worker:{worker_id}"  # heartbeat: JSON info, expires unless renewed
LIVE_WORKERS = "workers:live"  # sorted set: worker id scored by its last heartbeat (no SCAN needed)
TOKENS = "tokens"  # hash: sha256 of a token made over the API -> JSON TokenRecord (never the token)

GROUP = "workers"  # the one consumer group every worker reads the compile streams through
TUNE_GROUP = "tuners"  # the consumer group of each tune stream (GPU workers of its arch)
STREAM_FIELD = "job_id"  # a stream entry carries only the job id; the request lives in REQUEST


class RedisKeys:
    """The templates above, rendered under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.interactive = prefix + STREAM_INTERACTIVE
        self.precompile = prefix + STREAM_PRECOMPILE
        self.dead_letter = prefix + DEAD_LETTER
        self.recent_jobs = prefix + RECENT_JOBS
        self.cache_counters = prefix + CACHE_COUNTERS
        self.manifest_index = prefix + MANIFEST_INDEX
        self.tokens = prefix + TOKENS
        self.live_workers = prefix + LIVE_WORKERS
        self.tune_archs = prefix + TUNE_ARCHS
        self.build_stream = prefix + BUILD_STREAM
        self.build_archs = prefix + BUILD_ARCHS
        self.builds_recent = prefix + BUILDS_RECENT

    def blob(self, digest: str) -> str:
        return self.prefix + BLOB.format(digest=digest)

    def manifest(self, key: str) -> str:
        return self.prefix + MANIFEST.format(key=key)

    def signature(self, key: str) -> str:
        return self.prefix + SIGNATURE.format(key=key)

    def bundle(self, key: str) -> str:
        return self.prefix + BUNDLE.format(key=key)

    def bundles_of(self, key: str) -> str:
        return self.prefix + BUNDLES_OF.format(key=key)

    def stats_minute(self, minute: int) -> str:
        return self.prefix + STATS_MINUTE.format(minute=minute)

    def pre_aot(self, principal: str, key: str) -> str:
        return self.prefix + PRE_AOT.format(principal=principal, key=key)

    def package(self, principal: str, key: str) -> str:
        return self.prefix + PACKAGE.format(principal=principal, key=key)

    def job(self, job_id: str) -> str:
        return self.prefix + JOB.format(job_id=job_id)

    def request(self, job_id: str) -> str:
        return self.prefix + REQUEST.format(job_id=job_id)

    def quota(self, principal: str) -> str:
        return self.prefix + QUOTA.format(principal=principal)

    def principal_jobs(self, principal: str) -> str:
        return self.prefix + PRINCIPAL_JOBS.format(principal=principal)

    def inflight(self, key: str) -> str:
        return self.prefix + INFLIGHT.format(key=key)

    def tune_stream(self, arch: int) -> str:
        return self.prefix + TUNE_STREAM.format(arch=arch)

    def kernel_build(self, key: str) -> str:
        return self.prefix + KERNEL_BUILD.format(key=key)

    def build_inflight(self, key: str) -> str:
        return self.prefix + BUILD_INFLIGHT.format(key=key)

    def tune_inflight(self, key: str) -> str:
        return self.prefix + TUNE_INFLIGHT.format(key=key)

    def group(self, stream: str) -> str:
        """The consumer group of `stream`: tune streams have their own."""
        return TUNE_GROUP if stream.startswith(self.prefix + "tune:") else GROUP

    def worker(self, worker_id: str) -> str:
        return self.prefix + WORKER.format(worker_id=worker_id)

    def stream(self, priority: str) -> str:
        return self.interactive if priority == "interactive" else self.precompile

    def streams(self) -> tuple[str, str]:
        """The job streams in the order workers read them."""
        return (self.interactive, self.precompile)
