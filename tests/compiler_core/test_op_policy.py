"""op_policy: the functional-op rule over torch's schemas, the ops the test suite's graphs use, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.op_policy import DENIED, FUNCTIONAL_RNG, refusal
from fxcc.compiler_core.wire import resolve_target

# Every aten/prims target that a graph of tests/compiler_core, tests/opinfo, tests/models and
# tests/client/test_backend*.py resolved (recorded by wrapping wire.resolve_target over a run of
# those suites, 2026-12-01; the refusal tests' own targets left out). Each must stay allowed.
SUITE_GRAPH_OPS = [
    'aten._log_softmax.default', 'aten._native_batch_norm_legit_functional.default',
    'aten._native_batch_norm_legit_no_training.default',
    'aten._scaled_dot_product_efficient_attention.default',
    'aten._scaled_dot_product_flash_attention_for_cpu.default',
    'aten._scaled_dot_product_flash_attention_for_cpu_backward.default', 'aten._softmax.default',
    'aten._to_copy.default', 'aten._unsafe_view.default', 'aten.abs.default', 'aten.acos.default',
    'aten.acosh.default', 'aten.add.Scalar', 'aten.add.Tensor', 'aten.add_.Scalar', 'aten.add_.Tensor',
    'aten.addmm.default', 'aten.alias.default', 'aten.amax.default', 'aten.amin.default', 'aten.any.default',
    'aten.any.dim', 'aten.any.dims', 'aten.arange.default', 'aten.arange.start', 'aten.arange.start_step',
    'aten.argmax.default', 'aten.argmin.default', 'aten.as_strided.default', 'aten.asin.default',
    'aten.asinh.default', 'aten.atan.default', 'aten.atan2.default', 'aten.atanh.default',
    'aten.avg_pool2d.default', 'aten.bitwise_and.Scalar', 'aten.bitwise_and.Tensor',
    'aten.bitwise_not.default', 'aten.bitwise_or.Tensor', 'aten.bitwise_xor.Tensor', 'aten.bmm.default',
    'aten.cat.default', 'aten.ceil.default', 'aten.clamp.Tensor', 'aten.clamp.default', 'aten.clone.default',
    'aten.constant_pad_nd.default', 'aten.convolution.default', 'aten.convolution_backward.default',
    'aten.copy_.default', 'aten.cos.default', 'aten.cosh.default', 'aten.cumprod.default',
    'aten.cumsum.default', 'aten.diagonal.default', 'aten.div.Scalar', 'aten.div.Tensor',
    'aten.div.Tensor_mode', 'aten.elu.default', 'aten.embedding.default', 'aten.empty.memory_format',
    'aten.empty_strided.default', 'aten.eq.Scalar', 'aten.eq.Tensor', 'aten.erf.default', 'aten.exp.default',
    'aten.exp2.default', 'aten.expand.default', 'aten.expm1.default', 'aten.flip.default',
    'aten.floor.default', 'aten.fmax.default', 'aten.fmin.default', 'aten.fmod.Scalar', 'aten.fmod.Tensor',
    'aten.full.default', 'aten.full_like.default', 'aten.gather.default', 'aten.ge.Scalar', 'aten.ge.Tensor',
    'aten.gelu.default', 'aten.gt.Scalar', 'aten.gt.Tensor', 'aten.hardtanh.default', 'aten.hypot.default',
    'aten.index.Tensor', 'aten.index_select.default', 'aten.isinf.default', 'aten.isnan.default',
    'aten.le.Scalar', 'aten.le.Tensor', 'aten.leaky_relu.default', 'aten.lift_fresh_copy.default',
    'aten.linalg_vector_norm.default', 'aten.log.default', 'aten.log10.default', 'aten.log1p.default',
    'aten.log2.default', 'aten.logical_and.default', 'aten.logical_not.default', 'aten.logical_or.default',
    'aten.logical_xor.default', 'aten.lt.Scalar', 'aten.lt.Tensor', 'aten.max.default', 'aten.max.dim',
    'aten.max_pool2d_with_indices.default', 'aten.maximum.default', 'aten.mean.default', 'aten.mean.dim',
    'aten.min.default', 'aten.min.dim', 'aten.minimum.default', 'aten.mm.default', 'aten.mul.Scalar',
    'aten.mul.Tensor', 'aten.native_batch_norm.default', 'aten.native_dropout.default',
    'aten.native_group_norm.default', 'aten.native_layer_norm.default', 'aten.ne.Scalar', 'aten.ne.Tensor',
    'aten.neg.default', 'aten.permute.default', 'aten.pow.Scalar', 'aten.pow.Tensor_Scalar',
    'aten.pow.Tensor_Tensor', 'aten.prod.default', 'aten.prod.dim_int', 'aten.reciprocal.default',
    'aten.relu.default', 'aten.relu_.default', 'aten.remainder.Scalar', 'aten.remainder.Tensor',
    'aten.repeat.default', 'aten.round.decimals', 'aten.round.default', 'aten.rsqrt.default',
    'aten.scalar_tensor.default', 'aten.scatter.value', 'aten.select.int', 'aten.sigmoid.default',
    'aten.sign.default', 'aten.sin.default', 'aten.sinh.default', 'aten.slice.Tensor',
    'aten.slice_scatter.default', 'aten.split.Tensor', 'aten.split_with_sizes.default', 'aten.sqrt.default',
    'aten.squeeze.dims', 'aten.sub.Tensor', 'aten.sum.default', 'aten.sum.dim_IntList', 'aten.t.default',
    'aten.tan.default', 'aten.tanh.default', 'aten.transpose.int', 'aten.trunc.default',
    'aten.type_as.default', 'aten.unfold.default', 'aten.unsqueeze.default', 'aten.var.correction',
    'aten.var_mean.correction', 'aten.view.default', 'aten.where.self', 'prims.convert_element_type.default',
]


@pytest.mark.parametrize("target", SUITE_GRAPH_OPS)
def test_every_op_the_suite_graphs_use_is_allowed(target: str) -> None:
    assert refusal(resolve_target(target)) is None


@pytest.mark.parametrize("target, reason", [
    ("aten.from_file.default", "it reads a file"),
    ("aten._local_scalar_dense.default", "to the host"),
    ("aten._print.default", "stdout"),
    ("aten.set_.source_Tensor", "storage"),
    ("aten.resize_.default", "storage"),
    ("aten._fused_adam_.default", "writes its arguments self, grads"),
    ("aten._native_batch_norm_legit.default", "writes its arguments running_mean, running_var"),
    ("aten.uniform_.default", "RNG state"),  # in place, and it samples
    ("aten._fused_dropout.default", "RNG state"),
    ("aten.lstm.input", "RNG state"),
    ("prims._sink_tokens.default", "only for a side effect"),
    ("prims.copy_to.default", "writes its argument a"),
])
def test_refused_ops_are_invalid_graphs_naming_op_node_and_reason(target: str, reason: str) -> None:
    with pytest.raises(InvalidGraph) as info:
        resolve_target(target, node="n7")
    e = info.value
    assert e.kind == "invalid" and e.op == target and e.node == "n7"
    assert target in e.message and reason in e.message


@pytest.mark.parametrize("target", [
    "aten.add_.Tensor", "aten.relu_.default", "aten.copy_.default",  # in-place forms of functional ops
    "aten.add.out", "aten.sin.out",  # write only their out= argument
    "aten.native_dropout.default", "aten.bernoulli.p", "aten.rand.default", "aten.randn_like.default",
    "aten._assert_async.msg", "aten._assert_scalar.default",
    "aten._scaled_dot_product_flash_attention.default",
])
def test_allowed_beyond_the_suite(target: str) -> None:
    assert refusal(resolve_target(target)) is None


def _all_overloads() -> list[Any]:
    out = []
    for namespace in (torch.ops.aten, torch.ops.prims):
        for name in dir(namespace):
            packet = getattr(namespace, name, None) if not name.startswith("__") else None
            if isinstance(packet, torch._ops.OpOverloadPacket):
                out += [getattr(packet, overload) for overload in packet.overloads()]
    return out


def test_the_rule_over_every_overload() -> None:
    """The invariants the rule promises, checked on every aten/prims overload of this torch."""
    allowed = [op for op in _all_overloads() if refusal(op) is None]
    assert len(allowed) > 1500  # the rule refuses what it names, not aten at large
    for op in allowed:
        name = f"{op.namespace}.{op._opname}"
        assert name not in DENIED
        written = [a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write and not a.is_out]
        assert written in ([], ["self"]), op
        assert not written or op._opname.endswith("_"), op
        if torch.Tag.nondeterministic_seeded in op.tags:
            assert name in FUNCTIONAL_RNG, op


def test_training_graphs_with_dropout_and_batch_norm_are_allowed() -> None:
    """AOTAutograd's forward and backward of a training step (native_dropout, functional batch
    norm) resolve op by op."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph

    targets: set[str] = set()

    def compiler(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        from functorch.compile import make_boxed_func

        targets.update(n.target for n in capture_graph(gm, inputs).spec.nodes)
        return make_boxed_func(gm)

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        return aot_module_simplified(gm, inputs, fw_compiler=compiler, bw_compiler=compiler,
                                     decompositions=decomposition_table())

    model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 4)).train()
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend)(torch.randn(2, 4, 8, 8)).sum().backward()
    finally:
        torch._dynamo.reset()
    assert "aten.native_dropout.default" in targets or "aten.bernoulli.p" in targets
    assert any("batch_norm" in t for t in targets)
    for target in targets:
        resolve_target(target, node="n")  # raises InvalidGraph for a refused op
