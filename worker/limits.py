"""A compile job's limits (wall clock, resident memory) and the outcomes a limited compile can have."""

from __future__ import annotations

from dataclasses import dataclass

from fxcc.compiler_core.errors import FINAL_KINDS, FxccError
from fxcc.service.store import ArtifactTooLarge, JobError


@dataclass(frozen=True)
class JobLimits:
    """What one compile may cost: `timeout_s` of wall clock and `memory_mb` of resident memory
    (the compile process's RSS, the interpreter and torch/triton included)."""

    timeout_s: float = 600.0
    memory_mb: int = 8192
    warm_start: bool = True  # start the compile process with its consumer, not at the first job


class CompileTimeout(FxccError):
    """The compile ran past FXCC_JOB_TIMEOUT_S; its process was killed. Final: a retry would too."""


class CompileMemoryLimit(FxccError):
    """The compile's process went over FXCC_JOB_MEMORY_MB of resident memory and was killed. Final."""


class CompileCrashed(FxccError):
    """The compile process died (a signal, the kernel's OOM killer, a crash in native code) or never
    started. Not final: the job is retried like any crashed attempt."""


class CompileFailed(Exception):
    """The compile raised inside the compile process: `error` as the child recorded it, and
    whether a retry could help (`final`, decided there by `is_final`)."""

    def __init__(self, error: JobError, final: bool) -> None:
        super().__init__(f"{error.error}: {error.message}")
        self.error = error
        self.final = final


class JobCancelled(Exception):
    """The job's record moved to cancelled (an admin's DELETE) while it compiled: its process was
    killed and nothing is stored."""


def is_final(exc: BaseException) -> bool:
    """Errors a retry cannot fix: the graph is bad, the artifact is over the size limit, or the
    compile is over a job limit."""
    if isinstance(exc, CompileFailed):
        return exc.final
    if isinstance(exc, (CompileTimeout, CompileMemoryLimit, ArtifactTooLarge)):
        return True
    return isinstance(exc, FxccError) and exc.kind in FINAL_KINDS


def job_error(exc: BaseException) -> JobError:
    """The error to record for `exc`; a child's error as the child recorded it."""
    return exc.error if isinstance(exc, CompileFailed) else JobError.of(exc)
