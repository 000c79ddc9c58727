"""The compiling part of a compile job — the pipeline (compiler_core/pipeline.py), its stages reported as
the job's — as the worker's compile process runs it (worker/child.py), or in-process for callers of
process_claim that pass no child."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fxcc.compiler_core import pipeline
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.build_tasks import BuildTask
from fxcc.compiler_core.errors import AutotuneError
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec
from fxcc.service.store import JobStage

log = logging.getLogger("fxcc.worker")

StageCallback = Callable[[JobStage], None]


@dataclass(frozen=True)
class CompileWork:
    """One compile: the request as its JSON text, the GPU to tune on before building (None: no
    tuning), whether its kernels are left to build tasks (lower_steps) and the test-only hooks (a
    delay, an allocation held while it lasts)."""

    request_json: str
    tune_device: str | None = None
    defer_build: bool = False
    delay_s: float = 0.0  # FXCC_TEST_ONLY_COMPILE_DELAY_S
    alloc_mb: int = 0  # FXCC_TEST_ONLY_COMPILE_ALLOC_MB

    def header(self) -> dict[str, Any]:
        """Everything but the request, as JSON-able values (the request travels as its own frame)."""
        return {k: v for k, v in asdict(self).items() if k != "request_json"}

    @classmethod
    def from_header(cls, header: dict[str, Any], request_json: str) -> CompileWork:
        return cls(request_json=request_json, tune_device=header.get("tune_device"),
                   defer_build=bool(header.get("defer_build", False)),
                   delay_s=float(header.get("delay_s", 0.0)), alloc_mb=int(header.get("alloc_mb", 0)))


# The pipeline's stages (compiler_core.pipeline.STAGES) that a job's record shows as stages of its own; the
# others (rebuild to codegen, and package) are all "lowering", the stage a compile job starts at.
JOB_STAGES = {"tune": JobStage.AUTOTUNING, "build": JobStage.BUILDING}


def job_stages(on_stage: StageCallback, reported: tuple[str, ...] = tuple(JOB_STAGES)) -> Callable[[str], None]:
    """The pipeline's stage callback that tells `on_stage` of the job stages among `reported` as they start."""
    def heard(stage: str) -> None:
        if stage in reported:
            on_stage(JOB_STAGES[stage])
    return heard


def compile_steps(work: CompileWork, on_stage: StageCallback) -> Artifact:
    """The artifact of `work`'s request through the whole pipeline in this process: lowered, scheduled
    and rendered, tuned first where a GPU is given (so that the cubins are built for the winning
    configs), then built for a CUDA target kernel after kernel. `on_stage` hears of the autotuning
    and building stages as they start."""
    return _compile(work, on_stage, "here")[0]


def lower_steps(work: CompileWork, on_stage: StageCallback) -> tuple[Artifact, list[BuildTask] | None]:
    """compile_steps with the build left to build tasks: the artifact and the tasks of its kernels for
    the CUDA target (worker/builds.py spreads them over the cluster), or None where nothing is built.
    `on_stage` hears of the autotuning stage (the worker marks the building stage itself)."""
    return _compile(work, on_stage, "tasks")


def _compile(work: CompileWork, on_stage: StageCallback, build: str) -> tuple[Artifact, list[BuildTask] | None]:
    request = CompileRequest.model_validate_json(work.request_json)
    held = b"\xff" * (work.alloc_mb << 20) if work.alloc_mb else b""  # written, so resident
    if work.delay_s:
        time.sleep(work.delay_s)
    reported = ("tune", "build") if build == "here" else ("tune",)
    c = pipeline.run(pipeline.Compilation(request, tune_device=work.tune_device, build=build,  # type: ignore[arg-type]
                                          on_stage=job_stages(on_stage, reported), tune_lock=gpu_tuning_lock))
    del held
    return c.artifact, c.tasks


def tune_steps(request_json: str, artifact: Artifact, device: str, on_stage: StageCallback,
               fake: bool = False, delay_s: float = 0.0) -> Artifact:
    """A tune job's work on a stored untuned artifact (compiler_core.pipeline.retune): its kernels
    tuned on GPU `device`, then the cubins of the kernels whose config changed rebuilt. The test
    hooks: `fake` (FXCC_TEST_ONLY_FAKE_TUNE) records a made-up tuning instead of running a kernel,
    for tests of the tune queue on a machine without a GPU; `delay_s`
    (FXCC_TEST_ONLY_COMPILE_DELAY_S) sleeps first."""
    request = CompileRequest.model_validate_json(request_json)
    if delay_s:
        time.sleep(delay_s)
    if fake:
        with gpu_tuning_lock(device):
            tuned = fake_tuning(artifact, device)
    else:  # the tune job started at autotuning: only building is news
        tuned = pipeline.retune(request, artifact, device, on_stage=job_stages(on_stage, ("build",)),
                                tune_lock=gpu_tuning_lock)
    if not tuned.manifest.tuned:
        raise AutotuneError(f"no kernel of {artifact.manifest.key[:12]} could be tuned on {device} "
                            "(see the worker's log)")
    return tuned


def fake_tuning(artifact: Artifact, device: str) -> Artifact:
    """`artifact` with every kernel marked tuned on a "Fake GPU" at `device` (test hook)."""
    from fxcc.compiler_core.artifact import TuningRecord

    artifact.verify()
    record = TuningRecord(device=f"Fake GPU at {device}", heuristic="h", winner="h", timings_ms={"h": 1.0})
    kernels = [k.model_copy(update={"tuning": record}) for k in artifact.manifest.kernels]
    return Artifact(artifact.manifest.model_copy(update={"kernels": kernels, "tuned": True}), artifact.blobs)


def warm_up() -> None:
    """Compile sin(x) of a 4×4 tensor (interpreter target) and throw it away: a fresh compile
    process pays its lazy imports and first-use set-up (seconds) here, before it takes a job."""
    x = Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[4, 4], strides=[4, 1]))
    graph = GraphSpec(placeholders=[x], nodes=[Node(name="y", target="aten.sin.default", args=[NodeRef(name="x")])],
                      outputs=[NodeRef(name="y")])
    pipeline.compile_request(CompileRequest(graph=graph))


@contextmanager
def gpu_tuning_lock(device: str) -> Iterator[None]:
    """Hold the host-wide lock of GPU `device` while tuning on it.

    Note: timings taken while another compile benchmarks on the same GPU would pick wrong winners.
    compiler_core serialises tuning within one process; a worker's consumers each compile in a
    process of their own (and several workers may share a GPU), so they also take this flock,
    which the kernel releases when a killed compile process goes.
    """
    name = re.sub(r"[^a-z0-9]", "", "cuda:0" if device == "cuda" else device)
    try:
        fd = os.open(Path(tempfile.gettempdir()) / f"fxcc-tune-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        log.warning("tuning on %s without the host-wide lock: %s", device, e)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
