"""Hand-written artifacts (a fused pointwise kernel) that exercise build and loader without codegen.

They have the shape the codegen's artifacts have: a plan of AllocStep + KernelStep over buffers
and int arguments, the kernel's @triton.jit source in a digest-checked blob.
"""

from __future__ import annotations

from fxcc.compiler_core.artifact import (
    AllocStep,
    Artifact,
    ArtifactManifest,
    CompileStats,
    KernelInfo,
    KernelStep,
    Plan,
    add_blob,
)
from fxcc.compiler_core.compile import local_versions
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import (
    CompileOptions,
    CompileRequest,
    GraphSpec,
    IntArg,
    Node,
    NodeRef,
    Placeholder,
    Target,
    TensorSpec,
)

COS_SIN_SOURCE = b'''import triton
import triton.language as tl


@triton.jit
def fxcc_cos_sin(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0).to(tl.int64) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x = tl.load(in_ptr0 + xindex, xmask).to(tl.float32)
    y = tl.cos(tl.sin(x))
    tl.store(out_ptr0 + xindex, y.to(out_ptr0.dtype.element_ty), xmask)
'''


def cos_sin_request(n: int, dtype: str = "float32", device: str = "cuda", arch: int = 90) -> CompileRequest:
    """The aten graph of cos(sin(x)) over `n` elements, for a CUDA (or interpret) target."""
    spec = TensorSpec(dtype=dtype, sizes=[n], strides=[1], device=device)
    graph = GraphSpec(
        placeholders=[Placeholder(name="arg0_1", spec=spec)],
        nodes=[Node(name="sin", target="aten.sin.default", args=[NodeRef(name="arg0_1")]),
               Node(name="cos", target="aten.cos.default", args=[NodeRef(name="sin")])],
        outputs=[NodeRef(name="cos")],
    )
    target = Target(kind="cuda", arch=arch) if device == "cuda" else Target(kind="interpret")
    return CompileRequest(graph=graph, options=CompileOptions(target=target))


def cos_sin_artifact(request: CompileRequest, xblock: int = 1024, num_warps: int = 4) -> Artifact:
    """A one-kernel artifact for `cos_sin_request`: what pointwise fusion should produce."""
    spec = request.graph.placeholders[0].spec
    n = spec.sizes[0]
    blobs: dict[str, bytes] = {}
    info = KernelInfo(name="fxcc_cos_sin", source=add_blob(blobs, COS_SIN_SOURCE),
                      num_warps=num_warps, constexprs={"XBLOCK": xblock})
    plan = Plan(
        inputs=["arg0_1"],
        steps=[
            AllocStep(out="cos", spec=spec),
            KernelStep(kernel=info.name, grid=[max(1, -(-n // xblock))],
                       args=[NodeRef(name="arg0_1"), NodeRef(name="cos"), IntArg(value=n)]),
        ],
        outputs=[NodeRef(name="cos")],
    )
    stats = CompileStats(nodes=2, nodes_lowered=2, kernels=1, ops_fused=2)
    manifest = ArtifactManifest(key=compile_key(request), versions=local_versions(),
                                target=request.options.target, plan=plan, kernels=[info], stats=stats)
    return Artifact(manifest, blobs)
