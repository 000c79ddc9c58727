"""Make the embedded in-process compile (no FXCC_URL) build cubins too, for benchmarks and GPU tests.

Note: until compiler_core.compile (or the worker) calls compiler_core.build itself, this swaps
`compiler_core.compile.compile_request` for `compile_and_build` in this process only. The
client looks the function up at call time, so the swap takes effect for every later compile.
"""

from __future__ import annotations

import compiler_core.compile as _compile
from compiler_core.artifact import Artifact
from compiler_core.build import build_artifact, cuda_build_unavailable
from compiler_core.wire import CompileRequest

_original = _compile.compile_request


def enable_cubin_build() -> bool:
    """True once in-process compiles for CUDA targets come with cubins; False if Triton can't build."""
    if cuda_build_unavailable() is not None:
        return False

    def compile_and_build(request: CompileRequest) -> Artifact:
        artifact = _original(request)
        target = request.options.target
        if target.kind == "cuda" and artifact.manifest.kernels and not _has_binaries(artifact, target.arch):
            artifact = build_artifact(artifact, request, target.arch)
        return artifact

    _compile.compile_request = compile_and_build
    return True


def disable_cubin_build() -> None:
    _compile.compile_request = _original


def _has_binaries(artifact: Artifact, arch: int) -> bool:
    return all(f"sm_{arch}" in k.binaries for k in artifact.manifest.kernels)
