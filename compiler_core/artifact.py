"""Artifacts: a manifest (plan + kernel metadata, pure data) tying together content-addressed blobs.

Note: the plan is data, not Python. A client runs it with a small interpreter: extern steps name
aten ops (resolved like graph nodes), kernel steps name kernels whose code lives in blobs whose
sha256 the client checks before loading anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from fxcc.compiler_core.errors import ArtifactError
from fxcc.compiler_core.wire import (
    Arg,
    FlexAttention,
    IntArg,
    Name,
    NodeRef,
    OpaqueOp,
    SizeText,
    SymArg,
    Target,
    TensorSpec,
    UserKernel,
)

# Note: 2 lets AllocStep.reuse name a fresh extern result, taken at its data pointer (a kernel
# writing in place of torch's tensor). A version-1 plan means the same under version 2 (it reuses
# only its own buffers, which start at offset 0), so both load; a runtime that knows only 1
# rejects a version-2 manifest as malformed (its client then runs the graph eagerly) instead of
# taking storage from the wrong address.
MANIFEST_VERSION = 2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BlobRef(_Model):
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


KernelArg = Annotated[NodeRef | IntArg | SymArg, Field(discriminator="kind")]


class KernelStep(_Model):
    """Launch kernel `kernel` over `grid` with buffers / ints as positional arguments."""

    kind: Literal["kernel"] = "kernel"
    kernel: str
    args: list[KernelArg]
    grid: list[int | SizeText] = Field(min_length=1, max_length=3)


class ExternStep(_Model):
    """Call an aten op (or getitem) on buffers; its result is bound to `out`."""

    kind: Literal["extern"] = "extern"
    op: str
    args: list[Arg]
    kwargs: dict[str, Arg] = Field(default_factory=dict)
    out: Name
    # Strides the plan's kernels assume for the result (fresh tensors only): the client copies a
    # result laid out otherwise into them, so a layout the op chose differently never misreads.
    expect_strides: list[int | SizeText] | None = Field(default=None, max_length=64)
    # An op outside aten/prims: the client resolves `op` from its own registry, refuses one whose
    # schema differs from this one's and checks its results against `opaque.outputs`.
    opaque: OpaqueOp | None = None
    # A user's Triton kernel: the client launches its own function of that identity (client/user_kernels.py).
    triton: UserKernel | None = None
    control: ControlPlan | None = None  # torch.cond / while_loop: its subgraphs' plans (client/control_flow.py)
    # flex_attention (or its backward) run eagerly: its mods rebuilt from their graphs (client/flex_attention.py)
    flex: FlexAttention | None = None


class AllocStep(_Model):
    """Allocate an uninitialised buffer (torch.empty_strided) for a kernel to write.

    With `reuse`, take instead the storage of that buffer (a buffer of the plan's, or a fresh
    extern result) from its data pointer on, and drop its name: no FreeStep drops it, this step
    does. It has the same dtype and device and enough bytes from there (the runtime checks, and
    allocates where torch gave it less). The buffer is dead, or the next kernel's input that it
    reads only where it writes this one (written in place: that kernel reads this name for it).
    """

    kind: Literal["alloc"] = "alloc"
    out: Name
    spec: TensorSpec
    reuse: Name | None = None


class FreeStep(_Model):
    """Drop the plan's references to buffers whose last use has passed."""

    kind: Literal["free"] = "free"
    names: list[Name]


Step = Annotated[KernelStep | ExternStep | AllocStep | FreeStep, Field(discriminator="kind")]


MAX_INPUTS = 20_000


class SymbolBinding(_Model):
    """Where a size symbol's value comes from at run time: dim `dim` of input `input`, or the
    input itself when it is an integer (dim None). `lo`/`hi` is the range the plan serves."""

    name: str = Field(pattern=r"^s[0-9]{1,4}$")
    input: int = Field(ge=0)
    dim: int | None = Field(default=None, ge=0, lt=64)
    lo: int = Field(default=0, ge=0)
    hi: int | None = None


def _guard_text(v: str) -> str:
    from fxcc.compiler_core.symexpr import Rel, SymExprError, parse

    try:
        expr = parse(v)
    except SymExprError as e:
        raise ValueError(f"bad guard: {e}") from None
    if not isinstance(expr, Rel):
        raise ValueError(f"guard {v!r} is not a relation")  # noqa: TRY004 - pydantic wants ValueError
    return v


GuardText = Annotated[str, Field(max_length=4096), AfterValidator(_guard_text)]


class Plan(_Model):
    """Steps over named values. With size symbols, `symbols` says how to read them from the
    inputs and `guards` are the relations between them that the plan's code assumes; the client
    checks both before each run (client/runtime.py, SymbolReader)."""

    inputs: list[Name]
    steps: list[Step]
    outputs: list[Arg]
    symbols: list[SymbolBinding] = Field(default_factory=list, max_length=256)
    guards: list[GuardText] = Field(default_factory=list, max_length=1024)
    # With size symbols: each input's strides as the plan's code assumes them (None: an integer
    # input), checked per call with the guards (dims of size 1 excepted).
    input_strides: list[list[int | SizeText] | None] = Field(default_factory=list, max_length=MAX_INPUTS)
    # For a graph with free_layout_outputs: each output's strides as the plan returns it (None:
    # as traced), which the client reports to AOTAutograd for the backward's inputs.
    output_strides: list[list[int] | None] = Field(default_factory=list, max_length=MAX_INPUTS)


class ControlPlan(_Model):
    """A control flow step (wire.ControlFlow) with its subgraphs compiled as plans of their own, over
    the artifact's kernels: cond runs plans[0] or plans[1] on its operands as its predicate says;
    while_loop runs its body plans[1] while its cond plans[0] gives true, carrying `carried` values."""

    kind: Literal["cond", "while_loop"]
    plans: list[Plan] = Field(min_length=2, max_length=2)
    carried: int = Field(default=0, ge=0)
    outputs: list[TensorSpec]


ExternStep.model_rebuild()
Plan.model_rebuild()


class TuningRecord(_Model):
    """How a GPU worker chose a kernel's launch config (compiler_core.autotune).

    Configs are named by labels such as `x4_r2048_w8_s1_looped`. Every candidate that ran and
    matched the heuristic config's output has a time; the others say in `rejected` why not.
    """

    device: str  # the GPU that measured, e.g. "NVIDIA H200"
    heuristic: str  # launch_config's choice, the reference every candidate is checked against
    winner: str
    timings_ms: dict[str, float] = Field(default_factory=dict)  # median of triton.testing.do_bench
    rejected: dict[str, str] = Field(default_factory=dict)
    sizes: list[int] = Field(default_factory=list)  # xnumel (and rnumel) it was measured at


class KernelInfo(_Model):
    """One generated kernel: the @triton.jit function `name` in source blob `source`.

    `constexprs`, `num_warps` and `num_stages` are the config every launch uses: the codegen
    heuristic's, or the autotuner's winner when `tuning` is set.
    """

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    source: BlobRef
    num_warps: int = 4
    num_stages: int = 1
    constexprs: dict[str, int] = Field(default_factory=dict)
    # Per target arch ("sm_90"): the cubin blob and its launch metadata (filled by the build step).
    binaries: dict[str, BlobRef] = Field(default_factory=dict)
    metadata: dict[str, int | str] = Field(default_factory=dict)
    tuning: TuningRecord | None = None  # None: untuned (the heuristic config)

    @property
    def tuned(self) -> bool:
        return self.tuning is not None


class CompileStats(_Model):
    nodes: int = 0
    nodes_lowered: int = 0
    nodes_extern: int = 0
    extern_ops: list[str] = Field(default_factory=list)
    kernels: int = 0
    ops_fused: int = 0
    intermediate_bytes_avoided: int = 0
    compile_s: float = 0.0
    tune_s: float = 0.0  # benchmarking configs on a GPU (compiler_core.autotune); 0 when untuned


class Versions(_Model):
    compiler_core: str
    torch: str
    triton: str


class ArtifactManifest(_Model):
    schema_version: Literal[1, 2] = MANIFEST_VERSION
    key: str
    versions: Versions
    target: Target
    tuned: bool = False  # a GPU worker benchmarked the kernels' configs (see KernelInfo.tuning)
    plan: Plan
    kernels: list[KernelInfo] = Field(default_factory=list)
    stats: CompileStats = Field(default_factory=CompileStats)
    # What the compile did, stage by stage, for the service's compile explorer (a JSON blob of
    # compiler_core.stage_logs: the aten graph, the schedule's fusion decisions, the plan, the
    # guards). Data to show, never run; clients ignore it.
    stage_log: BlobRef | None = None

    def blob_refs(self) -> list[BlobRef]:
        refs = [k.source for k in self.kernels]
        refs += [b for k in self.kernels for b in k.binaries.values()]
        if self.stage_log is not None:
            refs.append(self.stage_log)
        return refs


def supersedes(new: ArtifactManifest, old: ArtifactManifest | None) -> bool:
    """Whether a store may replace `old` by `new` under one key: a tuned artifact supersedes an
    untuned one, never the other way round (between equals, the newer one wins)."""
    return old is None or new.tuned or not old.tuned


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Artifact:
    """A manifest and the blobs it references, keyed by sha256 hex digest."""

    manifest: ArtifactManifest
    blobs: dict[str, bytes] = field(default_factory=dict)

    def verify(self) -> None:
        """Raise ArtifactError unless every referenced blob is present with the right digest."""
        for ref in self.manifest.blob_refs():
            data = self.blobs.get(ref.digest)
            if data is None:
                raise ArtifactError(f"blob {ref.digest[:12]} is missing")
            if len(data) != ref.size or digest(data) != ref.digest:
                raise ArtifactError(f"blob {ref.digest[:12]} does not match its digest")

    def manifest_json(self) -> bytes:
        return self.manifest.model_dump_json().encode()


def add_blob(blobs: dict[str, bytes], data: bytes) -> BlobRef:
    d = digest(data)
    blobs[d] = data
    return BlobRef(digest=d, size=len(data))


# ---------------------------------------------------------------- on-disk form


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def save_artifact(root: Path, artifact: Artifact) -> None:
    """Store under `root`: blobs first (content-addressed), the manifest last."""
    artifact.verify()
    for d, data in artifact.blobs.items():
        p = root / "blobs" / d[:2] / d
        if not p.exists():
            atomic_write(p, data)
    atomic_write(root / "manifests" / f"{artifact.manifest.key}.json", artifact.manifest_json())


def load_artifact(root: Path, key: str) -> Artifact | None:
    """The artifact stored under `root` for `key`, verified; None when absent or broken."""
    mpath = root / "manifests" / f"{key}.json"
    try:
        manifest = ArtifactManifest.model_validate_json(mpath.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    blobs: dict[str, bytes] = {}
    for ref in manifest.blob_refs():
        try:
            blobs[ref.digest] = (root / "blobs" / ref.digest[:2] / ref.digest).read_bytes()
        except FileNotFoundError:
            return None
    art = Artifact(manifest, blobs)
    try:
        art.verify()
    except ArtifactError:
        return None
    return art


def manifest_from_json(data: bytes | str) -> ArtifactManifest:
    try:
        return ArtifactManifest.model_validate_json(data)
    except ValueError as e:
        raise ArtifactError(f"malformed manifest: {e}") from None


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
