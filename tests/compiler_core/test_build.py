"""Build on a CPU-only machine: generated kernels cross-compile to sm_90 cubins with launch metadata, masked and
indirect loads and every op family's lowerings included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from bench.handmade import cos_sin_artifact, cos_sin_request
from fxcc.client.capture import capture_graph
from fxcc.compiler_core.artifact import Artifact, KernelStep, Plan, digest, load_artifact, save_artifact
from fxcc.compiler_core.build import (
    arch_key,
    build_artifact,
    cuda_build_unavailable,
    int_type,
    kernel_signatures,
)
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, IntArg, Target

_reason = cuda_build_unavailable()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"cannot cross-compile for CUDA: {_reason}")

N_ODD = (1 << 16) + 3  # not a multiple of 16
N_EVEN = 1 << 16


def _generated(n: int, dtype: str = "float32") -> tuple[Artifact, object]:
    """The codegen's artifact for cos(sin(x)) when it fuses, else the hand-written equivalent."""
    request = cos_sin_request(n, dtype)
    art = compile_request(request)
    if not art.manifest.kernels:
        art = cos_sin_artifact(request)
    return art, request


@pytest.fixture(scope="module")
def built_odd() -> tuple[Artifact, Artifact]:
    art, request = _generated(N_ODD)
    return art, build_artifact(art, request, 90)


def test_cubin_blob_and_launch_metadata(built_odd):
    before, after = built_odd
    after.verify()
    assert after.manifest.key == before.manifest.key
    for k in after.manifest.kernels:
        ref = k.binaries["sm_90"]
        cubin = after.blobs[ref.digest]
        assert cubin[:4] == b"\x7fELF" and digest(cubin) == ref.digest and len(cubin) == ref.size
        md = k.metadata
        assert md["sm_90.name"] == k.name
        assert md["sm_90.num_warps"] == k.num_warps
        assert isinstance(md["sm_90.shared"], int) and md["sm_90.shared"] >= 0
        assert md["sm_90.scratch_params"] in (1, 2)
        sig = str(md["sm_90.signature"]).split(",")
        assert len(sig) == len(str(md["sm_90.params"]).split(","))
        pointers = [i for i, t in enumerate(sig) if t.startswith("*")]
        assert md["sm_90.guard_align16"] == ",".join(map(str, pointers))
    assert after.manifest.kernels[0].metadata["sm_90.signature"] == "*fp32,*fp32,i32"


def test_int_divisibility_is_a_recorded_guard():
    art, request = _generated(N_EVEN)
    md = build_artifact(art, request, 90).manifest.kernels[0].metadata
    assert md["sm_90.guard_div16"] == "2"


def test_odd_size_declares_no_int_divisibility(built_odd):
    assert built_odd[1].manifest.kernels[0].metadata["sm_90.guard_div16"] == ""


def test_bf16_signature_comes_from_placeholder_spec():
    art, request = _generated(N_ODD, "bfloat16")
    k = build_artifact(art, request, 90).manifest.kernels[0]
    assert k.metadata["sm_90.signature"] == "*bf16,*bf16,i32" and "sm_90" in k.binaries


def test_binaries_are_additive_and_survive_the_disk_cache(built_odd, tmp_path):
    _, after = built_odd
    request = cos_sin_request(N_ODD)
    both = build_artifact(after, request, 80)
    k = both.manifest.kernels[0]
    assert set(k.binaries) == {"sm_80", "sm_90"}
    assert k.binaries["sm_90"] == after.manifest.kernels[0].binaries["sm_90"]
    save_artifact(tmp_path, both)
    loaded = load_artifact(tmp_path, both.manifest.key)
    assert loaded is not None and loaded.manifest == both.manifest


def test_inconsistent_launches_get_no_binary_and_say_why():
    art, request = _generated(N_ODD)
    plan = art.manifest.plan
    step = next(s for s in plan.steps if isinstance(s, KernelStep))
    wide = step.model_copy(update={"args": step.args[:-1] + [IntArg(value=1 << 40)]})
    plan2 = Plan(inputs=plan.inputs, steps=list(plan.steps) + [wide], outputs=plan.outputs)
    assert step.kernel not in kernel_signatures(plan2, request)
    odd = Artifact(art.manifest.model_copy(update={"plan": plan2}), dict(art.blobs))
    k = build_artifact(odd, request, 90).manifest.kernels[0]
    assert not k.binaries and "consistent signature" in str(k.metadata["sm_90.error"])


def test_int_types_follow_tritons_rule():
    assert int_type(7) == "i32" and int_type(-(1 << 31)) == "i32"
    assert int_type(1 << 31) == "i64" and int_type((1 << 63) - 1) == "i64"
    assert int_type(1 << 63) == "u64"
    assert arch_key(90) == "sm_90"


def test_control_flow_subgraph_kernels_get_cubins():
    """A cond's branches are plans of their own: their kernels' signatures come from those plans."""
    from fxcc.compiler_core.wire import (
        CompileOptions,
        CompileRequest,
        ControlFlow,
        GraphSpec,
        Node,
        NodeRef,
        Placeholder,
        Target,
        TensorSpec,
    )

    x = TensorSpec(dtype="float32", sizes=[1024], strides=[1], device="cuda")
    pred = TensorSpec(dtype="bool", sizes=[], strides=[], device="cuda")

    def branch(op: str) -> GraphSpec:
        return GraphSpec(placeholders=[Placeholder(name="a", spec=x)],
                         nodes=[Node(name="b", target=op, args=[NodeRef(name="a")])], outputs=[NodeRef(name="b")])

    graph = GraphSpec(
        placeholders=[Placeholder(name="p", spec=pred), Placeholder(name="x", spec=x)],
        nodes=[Node(name="c", target="control.cond", args=[NodeRef(name="p"), NodeRef(name="x")],
                    control=ControlFlow(kind="cond", graphs=[branch("aten.sin.default"), branch("aten.cos.default")],
                                        outputs=[x])),
               Node(name="y", target="getitem", args=[NodeRef(name="c"), IntArg(value=0)])],
        outputs=[NodeRef(name="y")],
    )
    request = CompileRequest(graph=graph, options=CompileOptions(target=Target(kind="cuda", arch=90)))
    art = compile_request(request)
    assert len(art.manifest.kernels) == 2 and not any(isinstance(s, KernelStep) for s in art.manifest.plan.steps)
    built = build_artifact(art, request, 90)
    assert all("sm_90" in k.binaries for k in built.manifest.kernels), [k.metadata for k in built.manifest.kernels]


# ---------------------------------------------------------------- The cuda target's source for masked and indirect loads and the newer lowerings cross-compiles

X = torch.randn(6, 8)
CASES = {
    "cat_pad": (lambda p: torch.cat([F.pad(p, (1, 2)), p[:, :3].sin()], 1), [X]),
    "index": (lambda p, q: p[q] + p[:, q].sum(), [X, torch.tensor([0, 3, -1])]),
    "gather_embedding": (lambda p, q: torch.gather(p, 1, q) + F.embedding(q, p.t()).sum(-1),
                         [X, torch.randint(0, 8, (6, 4))]),
    "pointwise": (lambda p: torch.remainder(p, 1.5) + torch.div(p, 0.7, rounding_mode="floor") + p.sign()
                  + p.isnan() + torch.fmax(p, p.flip(0)) + p.abs() ** p + torch.round(p), [X]),
    "reductions": (lambda p: (p.argmax(1), p.max(0), (p > 0).any(1), p.cumsum(1),
                              torch.linalg.vector_norm(p, 3, dim=1)), [X]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_new_lowerings_build_for_sm90(name):
    fn, inputs = CASES[name]
    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    request = CompileRequest(graph=capture_graph(gm, inputs).spec,
                             options=CompileOptions(target=Target(kind="cuda", arch=90)))
    art = compile_request(request)
    assert art.manifest.stats.nodes_extern == 0 and art.manifest.kernels
    built = build_artifact(art, request, 90)
    for k in built.manifest.kernels:
        assert "sm_90.error" not in k.metadata, k.metadata["sm_90.error"]
        assert "sm_90" in k.binaries
