"""flex_attention on the wire and in the worker: its mods travel as restricted aten graphs that the
worker checks like any graph (allow-list, sizes), its outputs are derived by the worker, and its mods
render to Triton text inlined into the template (compiler_core.flex, codegen.flex_mods)."""

from __future__ import annotations

import re

import pytest
import torch
from functorch.compile import make_boxed_func
from pydantic import ValidationError
from torch._dynamo.backends.common import aot_autograd
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.flex import fill_order_strides
from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node

BIAS = torch.randn(4)


def alibi(score, b, h, m, n):
    return score + BIAS[h] * (m - n)


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv <= 20)


def _forward_spec(mask_mod=causal, score_mod=alibi) -> GraphSpec:
    """The forward graph of a flex_attention call as the client sends it."""
    specs: list[GraphSpec] = []

    def fw(gm, example_inputs):
        specs.append(capture_graph(gm, example_inputs).spec)
        return make_boxed_func(gm.forward)

    mask = create_block_mask(mask_mod, 1, 2, 64, 64, device="cpu", BLOCK_SIZE=32)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=mask).cos(),
                       backend=aot_autograd(fw_compiler=fw))
    with torch.no_grad():
        fn(*(torch.randn(1, 2, 64, 16) for _ in range(3)))
    torch._dynamo.reset()
    (spec,) = specs
    return spec


@pytest.fixture(scope="module")
def spec() -> GraphSpec:
    return _forward_spec()


def _flex(spec: GraphSpec) -> Node:
    (node,) = [n for n in spec.nodes if n.flex is not None]
    return node


def _with_flex(spec: GraphSpec, **changes) -> GraphSpec:
    node = _flex(spec)
    new = node.model_copy(update={"flex": node.flex.model_copy(update=changes)})
    return spec.model_copy(update={"nodes": [new if n is node else n for n in spec.nodes]})


def test_the_mods_travel_as_aten_graphs_and_survive_json(spec):
    node = _flex(spec)
    assert node.target == "higher_order.flex_attention" and node.flex.kind == "forward"
    assert [n.target for n in node.flex.score_mod.nodes] == ["aten.index.Tensor", "aten.sub.Tensor",
                                                             "aten.mul.Tensor", "aten.add.Tensor"]
    assert [n.target for n in node.flex.mask_mod.nodes] == ["aten.ge.Tensor"]
    # the captured bias is a graph input of the outer graph, passed to the node as a score buffer
    assert len(node.args[5].items) == 1 and node.args[5].items[0].kind == "node"
    again = GraphSpec.model_validate_json(spec.model_dump_json())
    assert again == spec


def test_the_worker_derives_the_outputs(spec):
    gm = rebuild_graph(spec)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and repr(n.target).startswith("flex")]
    out, lse, *_ = node.meta["val"]
    assert tuple(out.shape) == (1, 2, 64, 16) and out.dtype == torch.float32
    assert tuple(lse.shape) == (1, 2, 64) and lse.dtype == torch.float32
    # q's layout, last dim innermost: a transposed q gives a transposed out
    assert fill_order_strides((2, 3, 5, 7), (105, 7, 21, 1)) == (105, 7, 21, 1)
    assert fill_order_strides((2, 3, 5, 7), (105, 35, 7, 1)) == (105, 35, 7, 1)


def test_a_mod_op_outside_the_allow_list_is_refused(spec):
    mod = _flex(spec).flex.score_mod
    bad = mod.model_copy(update={"nodes": [mod.nodes[0].model_copy(update={"target": "aten.copy_.default"}),
                                           *mod.nodes[1:]]})
    with pytest.raises(InvalidGraph, match="copy_"):
        rebuild_graph(_with_flex(spec, score_mod=bad))
    worse = mod.model_copy(update={"nodes": [mod.nodes[0].model_copy(update={"target": "os.system.default"}),
                                             *mod.nodes[1:]]})
    with pytest.raises(InvalidGraph, match="os.system"):
        rebuild_graph(_with_flex(spec, score_mod=worse))


def test_a_node_of_another_form_is_a_validation_error(spec):
    node = _flex(spec)
    with pytest.raises(ValidationError, match="joint graph"):
        Node.model_validate({**node.model_dump(), "flex": {**node.flex.model_dump(), "joint": node.flex.mask_mod.model_dump()}})
    with pytest.raises(ValidationError, match="flex_attention forward node"):
        Node.model_validate({**node.model_dump(), "target": "higher_order.flex_attention_backward"})
    many = node.flex.mask_mod.model_dump()
    first = many["nodes"][0]
    many["nodes"] = [first] + [{**first, "name": f"ge{i}"} for i in range(300)]
    with pytest.raises(ValidationError, match="more than 256 nodes"):
        Node.model_validate({**node.model_dump(), "flex": {**node.flex.model_dump(), "mask_mod": many}})


def test_inputs_that_do_not_fit_are_refused(spec):
    k_name = _flex(spec).args[1].name
    places = [p.model_copy(update={"spec": p.spec.model_copy(update={"sizes": [1, 2, 64, 32], "strides": [4096, 2048, 32, 1]})})
              if p.name == k_name else p for p in spec.placeholders]
    with pytest.raises(InvalidGraph, match="do not fit"):
        rebuild_graph(spec.model_copy(update={"placeholders": places}))


def test_the_template_inlines_both_mods_and_reads_the_captured_tensor(spec):
    art = compile_request(CompileRequest(graph=spec))
    assert art.manifest.stats.extern_ops == []
    sources = [art.blobs[k.source.digest].decode() for k in art.manifest.kernels if k.name.startswith("fxcc_flex_")]
    (source,) = sources
    # alibi: bias[h] is a load of the captured tensor at the program's head, masked to its range
    assert "tl.load(SB0 + (" in source and "mask=" in source.split("tl.load(SB0")[1].split("\n")[0]
    assert "(m_idx - n_idx)" in source  # q_idx - kv_idx over the tile
    assert "(m_idx >= n_idx)" in source  # causal's mask_mod, in the partial blocks' loop only
    assert source.count("(m_idx >= n_idx)") == 1 and source.count("for it in range") == 2


def test_a_static_launch_reads_its_strides_and_lengths_as_literals(spec):
    """As Inductor specializes its templates on static strides: the body names no integer
    parameter (the launch still passes them all, in order)."""
    from fxcc.compiler_core.codegen.flex_attention import FWD_INTS

    art = compile_request(CompileRequest(graph=spec))
    (info,) = [k for k in art.manifest.kernels if k.name.startswith("fxcc_flex_")]
    source = art.blobs[info.source.digest].decode()
    body = source[source.index("):\n", source.index(f"def {info.name}(")):]
    (launch,) = [st for st in art.manifest.plan.steps if st.kind == "kernel" and st.kernel == info.name]
    signature = source[source.index(f"def {info.name}("):source.index("BLOCK_M: tl.constexpr")]
    names = [n for n in FWD_INTS if re.search(rf"\b{n}\b", signature)]
    assert [a.kind for a in launch.args].count("int") == len(names) > 20  # still passed, in order
    for name in names:
        assert re.search(rf"\b{name}\b", body) is None, name
    assert "tl.cdiv(64, BLOCK_M)" in body  # q_len


def test_the_mods_are_in_the_key(spec):
    """A sliding window's graph is a causal one's but for its mask_mod (the block lists are inputs of
    the same sizes): the two are two artifacts, as are two score_mods or kernel options; the key
    still ignores the names the tracer chose."""
    def key(graph: GraphSpec) -> str:
        return compile_key(CompileRequest(graph=graph))

    window = _forward_spec(mask_mod=sliding)
    no_bias = _forward_spec(score_mod=lambda score, b, h, m, n: score * 2)
    assert [n.target for n in window.nodes] == [n.target for n in spec.nodes]
    assert _flex(window).args == _flex(spec).args and _flex(window).flex.mask_mod != _flex(spec).flex.mask_mod
    keys = {key(spec), key(window), key(no_bias), key(_with_flex(spec, kernel_options={"BLOCK_M": 64}))}
    assert len(keys) == 4
    mod = _flex(spec).flex.mask_mod
    renamed = mod.model_copy(update={"nodes": [mod.nodes[0].model_copy(update={"name": "ge_9"})],
                                     "outputs": [mod.outputs[0].model_copy(update={"name": "ge_9"})]})
    assert key(_with_flex(spec, mask_mod=renamed)) == key(spec)


def _mma_loop_waits(ttgir: str) -> list[list[int]]:
    """For each innermost scf.for of `ttgir` that runs an MMA (sm_90's warp_group_dot), the number
    of copies each async wait in its body leaves in flight."""
    loops, stack = [], []
    for line in ttgir.splitlines():
        indent = len(line) - len(line.lstrip())
        while stack and indent <= stack[-1][0] and line.strip().startswith("}"):
            _, waits, mma = stack.pop()
            if mma:
                loops.append(waits)
        if "scf.for " in line:
            stack.append((indent, [], False))
        elif stack and "ttng.warp_group_dot " in line:
            stack[-1] = (*stack[-1][:2], True)
        elif stack and "ttg.async_wait" in line:
            stack[-1][1].append(int(line.split("num = ")[1].split(" ")[0]))
    return loops


def test_the_cuda_templates_build_for_sm90(monkeypatch):
    """The forward and backward templates at the tiles they take on CUDA (bf16, head dim 64: 64x64
    forward tiles, 64/64/64/64 backward ones) cross-compile to sm_90 cubins, and Triton pipelines
    every block walk: each loop's wait for its copies leaves the next tiles' in flight (the walk
    that loaded each trip's block index in that trip got, in the full-block loops, one buffer
    ahead and a wait for every copy)."""
    import torch.nn.attention.flex_attention as flex_module

    from fxcc.compiler_core.build import build_artifact, build_tasks, compile_task
    from fxcc.compiler_core.codegen.flex_attention import KERNEL_PREFIX
    from fxcc.compiler_core.wire import CompileOptions, Target

    monkeypatch.setattr(flex_module, "_validate_device", lambda *a: None)
    specs: list[GraphSpec] = []

    def keep(gm, example_inputs):
        specs.append(capture_graph(gm, example_inputs).spec)
        return make_boxed_func(gm.forward)

    mask = create_block_mask(sliding, 1, 2, 256, 256, device="cpu")
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=alibi, block_mask=mask),
                       backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    inputs = [torch.randn(1, 2, 256, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    fn(*inputs).sum().backward()
    torch._dynamo.reset()
    assert len(specs) == 2
    for spec in specs:
        request = CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90)))
        art = compile_request(request)
        built = build_artifact(art, request, 90)
        (flex,) = [k for k in built.manifest.kernels if k.name.startswith(KERNEL_PREFIX)]
        assert "sm_90" in flex.binaries, flex.metadata
        assert flex.constexprs in ({"BLOCK_M": 64, "BLOCK_N": 64},
                                   {"BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64})
        (task,) = [t for t in build_tasks(art, request, 90) if t.name == flex.name]
        loops = _mma_loop_waits(compile_task(task).asm["ttgir"])
        # forward: the kv and full kv walks; backward: q, full q (dk/dv) and kv, full kv (dq)
        assert len(loops) == (2 if "BLOCK_M" in flex.constexprs else 4), loops
        assert all(waits and min(waits) > 0 for waits in loops), loops
