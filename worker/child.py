"""The worker's compile process: one per consumer, a warm helper process (service/subproc.py:
`python -m fxcc.worker.child`, never a fork of the threaded worker), kept warm across jobs, and
killed (then replaced) when a compile runs past its time or memory limit or its job is cancelled.

A job goes to the child as a JSON header plus the request's JSON text; the artifact comes back as
its manifest JSON and one frame per blob; an error as the JobError the child recorded. The parent
re-validates all of it.
"""

from __future__ import annotations

import logging
import os
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from fxcc.compiler_core.artifact import Artifact, manifest_from_json
from fxcc.compiler_core.build_tasks import BuildTask
from fxcc.service.store import JobError, JobStage, Store
from fxcc.service.subproc import (
    GaveUp,
    HelperCrashed,
    OverMemory,
    OverTime,
    WarmProcess,
    answer_requests,
    child_connection,
    freeze_heap,
    send,
)
from fxcc.worker.limits import (
    CompileCrashed,
    CompileFailed,
    CompileMemoryLimit,
    CompileTimeout,
    JobCancelled,
    JobLimits,
    is_final,
)

if TYPE_CHECKING:
    from fxcc.worker.steps import CompileWork, StageCallback

log = logging.getLogger("fxcc.worker")


# ---------------------------------------------------------------- the child


def main() -> None:
    """`python -m fxcc.worker.child FD PARENT_PID`: the compile process on socket FD."""
    child_main(child_connection())


def child_main(conn: Connection) -> None:
    """The compile process: import the compiler once, then compile one job at a time until told
    to stop or the pipe closes."""
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s [compile process {os.getpid()}]: %(message)s")
    from fxcc.worker.steps import warm_up  # torch and triton: seconds

    try:
        warm_up()
    except Exception:  # the jobs will say what is wrong
        log.warning("the warm-up compile failed", exc_info=True)
    freeze_heap()  # what the imports and the warm-up left lives as long as the process
    answer_requests(conn, ("compile", "tune"), lambda header, frames: _answer(conn, header, frames))


def _answer(conn: Connection, header: dict[str, Any], frames: list[bytes]) -> None:
    """Compile (or tune) one request and send the artifact back, or the error it raised."""
    from fxcc.worker.steps import (  # imported by child_main
        CompileWork,
        compile_steps,
        lower_steps,
        tune_steps,
    )

    on_stage = lambda stage: send(conn, {"type": "stage", "stage": stage.value})
    tasks: list[BuildTask] = []
    try:
        if header["type"] == "compile":
            work = CompileWork.from_header(header, frames[0].decode())
            if work.defer_build:
                artifact, deferred = lower_steps(work, on_stage)
                tasks = deferred or []
            else:
                artifact = compile_steps(work, on_stage)
        else:
            stored = Artifact(manifest_from_json(frames[1]), dict(zip(header["blobs"], frames[2:], strict=True)))
            artifact = tune_steps(frames[0].decode(), stored, str(header["device"]), on_stage,
                                  fake=bool(header.get("fake")), delay_s=float(header.get("delay_s", 0.0)))
    except Exception as e:  # any crash of the compiler is the job's outcome
        if not is_final(e):
            log.warning("compile failed", exc_info=True)
        send(conn, {"type": "error", "error": JobError.of(e).model_dump(), "final": is_final(e)})
        return
    digests = list(artifact.blobs)
    send(conn, {"type": "done", "blobs": digests, "tasks": len(tasks)},
         [artifact.manifest_json(), *(artifact.blobs[d] for d in digests),
          *(t.model_dump_json().encode() for t in tasks)])


# ---------------------------------------------------------------- the parent's handle


class CompileProcess(WarmProcess):
    """One consumer's warm compile process. `compile` runs a job there under `limits` and watches it:
    memory every 0.1 s, the job's record every second. A process that is killed or dies is
    replaced at once, so that the next job finds a warm one."""

    def __init__(self, limits: JobLimits, name: str) -> None:
        super().__init__("fxcc.worker.child", "compile process", logger=log)
        self.limits = limits
        self.consumer = name

    def compile(self, work: CompileWork, *, job_id: str, store: Store, on_stage: StageCallback) -> Artifact:
        """`work`'s artifact, compiled in the process. Raises CompileTimeout or CompileMemoryLimit
        (over a limit), JobCancelled (the job's record says cancelled), CompileFailed (the compiler
        raised) or CompileCrashed (the process died)."""

        return self._run({"type": "compile", **work.header()}, [work.request_json.encode()],
                         job_id=job_id, store=store, on_stage=on_stage)[0]

    def lower(self, work: CompileWork, *, job_id: str, store: Store,
              on_stage: StageCallback) -> tuple[Artifact, list[BuildTask]]:
        """`work`'s artifact without binaries, and the build tasks of its kernels (worker/steps.lower_steps),
        from the process, as `compile` raises."""
        header = {"type": "compile", **work.header(), "defer_build": True}
        return self._run(header, [work.request_json.encode()], job_id=job_id, store=store, on_stage=on_stage)

    def tune(self, request_json: str, stored: Artifact, device: str, *, job_id: str, store: Store,
             on_stage: StageCallback, fake: bool = False, delay_s: float = 0.0) -> Artifact:
        """A tune job's tuned artifact, tuned (and its changed cubins rebuilt) in the process under
        the same limits as a compile: worker/steps.tune_steps, with its test hooks."""
        digests = list(stored.blobs)
        header = {"type": "tune", "device": device, "fake": fake, "delay_s": delay_s, "blobs": digests}
        frames = [request_json.encode(), stored.manifest_json(), *(stored.blobs[d] for d in digests)]
        return self._run(header, frames, job_id=job_id, store=store, on_stage=on_stage)[0]

    def _run(self, request: dict[str, Any], request_frames: list[bytes], *, job_id: str, store: Store,
             on_stage: StageCallback) -> tuple[Artifact, list[BuildTask]]:

        def interim(header: dict[str, Any]) -> bool:
            if header["type"] != "stage":
                return False
            on_stage(JobStage(header["stage"]))
            return True

        try:
            header, frames = self.call(
                request, request_frames, timeout_s=self.limits.timeout_s, memory_mb=self.limits.memory_mb,
                limits_named=("FXCC_JOB_TIMEOUT_S", "FXCC_JOB_MEMORY_MB"),
                on_message=interim, give_up=lambda: _cancelled(store, job_id))
        except OverTime as e:
            raise CompileTimeout(e.message) from None
        except OverMemory as e:
            raise CompileMemoryLimit(e.message) from None
        except HelperCrashed as e:
            raise CompileCrashed(e.message) from None
        except GaveUp:
            raise JobCancelled(job_id) from None
        if header["type"] == "error":
            raise CompileFailed(JobError.model_validate(header["error"]), bool(header["final"]))
        manifest = manifest_from_json(frames[0])
        n_blobs = len(header["blobs"])
        artifact = Artifact(manifest, dict(zip(header["blobs"], frames[1:1 + n_blobs], strict=True)))
        artifact.verify()  # every blob present, with its digest
        tasks = [BuildTask.model_validate_json(f) for f in frames[1 + n_blobs:]]
        return artifact, tasks


def _cancelled(store: Store, job_id: str) -> bool:
    """Whether the job's record says cancelled; a store error says no (the compile goes on)."""
    try:
        job = store.get_job(job_id)
    except Exception as e:  # noqa: BLE001 - Redis away for a moment: ask again in a second
        log.warning("job %s: could not read its record (%s: %s)", job_id, type(e).__name__, e)
        return False
    return job is not None and job.stage is JobStage.CANCELLED


if __name__ == "__main__":
    main()
