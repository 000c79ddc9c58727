"""The compiling part of a compile job — lower, tune on a GPU, build — as the worker's compile process
runs it (worker/child.py), or in-process for callers of process_claim that pass no child."""

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

from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.autotune import autotune_for_target
from fxcc.compiler_core.build import build_artifact, cuda_build_unavailable
from fxcc.compiler_core.compile import compile_request
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec
from fxcc.service.store import JobStage

log = logging.getLogger("fxcc.worker")

StageCallback = Callable[[JobStage], None]


@dataclass(frozen=True)
class CompileWork:
    """One compile: the request as its JSON text, the GPU to tune on before building (None: no
    tuning) and the test-only hooks (a delay, an allocation held while it lasts)."""

    request_json: str
    tune_device: str | None = None
    delay_s: float = 0.0  # FXCC_TEST_ONLY_COMPILE_DELAY_S
    alloc_mb: int = 0  # FXCC_TEST_ONLY_COMPILE_ALLOC_MB

    def header(self) -> dict[str, Any]:
        """Everything but the request, as JSON-able values (the request travels as its own frame)."""
        return {k: v for k, v in asdict(self).items() if k != "request_json"}

    @classmethod
    def from_header(cls, header: dict[str, Any], request_json: str) -> CompileWork:
        return cls(request_json=request_json, tune_device=header.get("tune_device"),
                   delay_s=float(header.get("delay_s", 0.0)), alloc_mb=int(header.get("alloc_mb", 0)))


def compile_steps(work: CompileWork, on_stage: StageCallback) -> Artifact:
    """The artifact of `work`'s request: lowered, scheduled and rendered, tuned first where a GPU
    is given (so that the cubins are built for the winning configs), then built for a CUDA target.
    `on_stage` hears of the autotuning and building stages as they start."""
    request = CompileRequest.model_validate_json(work.request_json)
    held = b"\xff" * (work.alloc_mb << 20) if work.alloc_mb else b""  # written, so resident
    if work.delay_s:
        time.sleep(work.delay_s)
    artifact = compile_request(request)
    target = request.options.target
    if artifact.manifest.kernels and work.tune_device is not None:
        on_stage(JobStage.AUTOTUNING)
        with gpu_tuning_lock(work.tune_device):
            artifact = autotune_for_target(artifact, request, work.tune_device)
    if target.kind == "cuda" and artifact.manifest.kernels and cuda_build_unavailable() is None:
        on_stage(JobStage.BUILDING)
        artifact = build_artifact(artifact, request, target.arch)
    del held
    return artifact


def warm_up() -> None:
    """Compile sin(x) of a 4×4 tensor (interpreter target) and throw it away: a fresh compile
    process pays its lazy imports and first-use set-up (seconds) here, before it takes a job."""
    x = Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[4, 4], strides=[4, 1]))
    graph = GraphSpec(placeholders=[x], nodes=[Node(name="y", target="aten.sin.default", args=[NodeRef(name="x")])],
                      outputs=[NodeRef(name="y")])
    compile_request(CompileRequest(graph=graph))


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
