"""A node that repeats an earlier one of its graph takes that one's outputs' metadata instead of
running its op on FakeTensors again (compiler_core.graph.Repeats): same values, fewer dispatches."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.graph import Repeats, propagate_shapes, rebuild_graph
from fxcc.compiler_core.wire import NodeRef

from .helpers import _core_aten_table


def _block(x, w, b, ln_w, ln_b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), ln_w, ln_b)  # native_layer_norm: a tuple
    y = torch.nn.functional.gelu(torch.addmm(b, h.view(-1, h.shape[-1]), w)).view(x.shape)
    q, k = y.split(y.shape[-1] // 2, dim=-1)  # views of one storage, as a list
    s = (q.transpose(-1, -2) @ k).softmax(-1)
    return x + y * s.sum(), s


def _layers(n):
    def fn(x, w, b, ln_w, ln_b):
        outs = []
        for _ in range(n):
            x, s = _block(x, w, b, ln_w, ln_b)
            outs.append(s)
        return x, *outs
    return fn


def _inputs():
    return (torch.randn(2, 6, 8), torch.randn(8, 8), torch.randn(8), torch.randn(8), torch.randn(8))


def _spec(fn, *inputs):
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=dict(_core_aten_table()))(*inputs)
    return capture_graph(gm, list(inputs)).spec


def _metas(gm):
    """Each node's value as (sizes, strides, offset, dtype, device, storage number), storages numbered
    in order of first appearance: two rebuilds agree where their values and aliasing do."""
    storages: dict[int, int] = {}

    def one(v):
        if isinstance(v, torch.Tensor):
            s = storages.setdefault(v.untyped_storage()._cdata, len(storages))
            return tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device, s
        if isinstance(v, (list, tuple)):
            return tuple(one(x) for x in v)
        return repr(v)

    return [(n.name, one(n.meta.get("val"))) for n in gm.graph.nodes if n.op != "output"]


def test_repeated_layers_take_the_first_layers_metadata_and_agree_with_running_every_op():
    specs = {n: _spec(_layers(n), *_inputs()) for n in (2, 3)}
    full = rebuild_graph(specs[3], repeat=False)
    fast = rebuild_graph(specs[3])
    assert full.meta["fxcc_repeats"] == 0
    assert _metas(fast) == _metas(full)  # sizes, strides, offsets, dtypes, devices and aliasing
    # every node of the third layer repeats one of the second's, except getitems (not ops of aten)
    layer = len(specs[3].nodes) - len(specs[2].nodes)
    getitems = sum(n.target == "getitem" for n in specs[3].nodes) - sum(n.target == "getitem" for n in specs[2].nodes)
    assert rebuild_graph(specs[3]).meta["fxcc_repeats"] - rebuild_graph(specs[2]).meta["fxcc_repeats"] \
        == layer - getitems > 0
    assert propagate_shapes(specs[3]) == fast.meta["fxcc_repeats"]


def test_a_repeated_view_is_a_view_of_its_own_argument_and_outputs_get_storages_of_their_own():
    def fn(x, y):
        return x.t(), y.t(), x + 1, y + 1  # same metadata: the second of each pair repeats the first

    gm = rebuild_graph(_spec(fn, torch.randn(4, 3), torch.randn(4, 3)))
    assert gm.meta["fxcc_repeats"] == 2
    vals = {n.name: n.meta["val"] for n in gm.graph.nodes if n.op != "output"}
    x, y, tx, ty, x1, y1 = vals.values()
    assert tx.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert ty.untyped_storage()._cdata == y.untyped_storage()._cdata
    assert len({t.untyped_storage()._cdata for t in (x, y, x1, y1)}) == 4
    assert ty.shape == (3, 4) and ty.stride() == (1, 3) and y1.stride() == (3, 1)


def test_arguments_that_differ_in_value_or_type_do_not_repeat():
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(4, 3)
        xt = torch.empty_strided((4, 3), (1, 4))
    r = Repeats(mode)
    sum_dim = torch.ops.aten.sum.dim_IntList
    keys = {r.key(sum_dim, (x, [0]), {}), r.key(sum_dim, (x, [1]), {}), r.key(sum_dim, (x, [1], True), {}),
            r.key(sum_dim, (x, [1], 1), {}), r.key(sum_dim, (xt, [1]), {})}
    assert None not in keys and len(keys) == 5
    # ops that write, whose sizes depend on data, or outside aten/prims, are always run
    assert r.key(torch.ops.aten.add_.Tensor, (x, x), {}) is None
    assert r.key(torch.ops.aten.nonzero.default, (x,), {}) is None
    assert r.key(torch.ops.aten.add.Tensor, (x, torch.ones(2)), {}) is None  # a real tensor


def test_a_node_that_breaks_the_graph_is_still_rejected_after_nodes_of_its_op_that_fit():
    def fn(a, b):
        return a @ b, a @ b

    spec = _spec(fn, torch.randn(4, 3), torch.randn(3, 5))
    mms = [n for n in spec.nodes if n.target.startswith("aten.mm")]
    assert len(mms) == 2
    mms[1].args[1] = NodeRef(name=mms[1].args[0].name)  # [4, 3] @ [4, 3]
    with pytest.raises(InvalidGraph) as e:
        propagate_shapes(spec)
    assert e.value.node == mms[1].name
    with pytest.raises(InvalidGraph):
        rebuild_graph(spec)


def test_graphs_with_size_symbols_run_every_op():
    from fxcc.compiler_core.wire import SymbolSpec

    def fn(x):
        return (x + 1).t(), (x + 1).t()

    spec = _spec(fn, torch.randn(5, 3))
    assert rebuild_graph(spec).meta["fxcc_repeats"] == 2
    p = spec.placeholders[0]
    sym = type(spec).model_validate(spec.model_copy(update={
        "symbols": [SymbolSpec(name="s0", lo=2)],
        "placeholders": [p.model_copy(update={"spec": p.spec.model_copy(update={"sizes": ["s0", 3]})})]}).model_dump())
    gm = rebuild_graph(sym, {"s0": 5})
    assert gm.meta["fxcc_repeats"] == 0 and propagate_shapes(sym) == 0
    assert [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "call_function"][-1][0] == 3


def test_arguments_with_a_conj_bit_are_not_repeated_so_a_view_of_one_is_still_rejected():
    """A conj view's dtype view is an error in eager; repeating the same view of a plain tensor of
    the same sizes must not let it through the check (a reviewer's case)."""
    def fn(x, y):
        return torch.ops.aten.view.dtype(x, torch.float32), torch.ops.aten.view.dtype(y, torch.float32)

    x, y = torch.randn(4, dtype=torch.complex64), torch.randn(4, dtype=torch.complex64)
    spec = _spec(fn, x, y)
    views = [n for n in spec.nodes if n.target == "aten.view.dtype"]
    conj = spec.model_copy(deep=True)
    # y's view reads _conj(y): add the node and point the second view at it
    from fxcc.compiler_core.wire import Node

    at = next(i for i, n in enumerate(conj.nodes) if n.name == views[1].name)
    conj.nodes.insert(at, Node(name="yc", target="aten._conj.default", args=[views[1].args[0]], kwargs={}))
    conj.nodes[at + 1].args[0] = NodeRef(name="yc")
    with pytest.raises(InvalidGraph):
        propagate_shapes(conj)
    with pytest.raises(InvalidGraph):
        rebuild_graph(conj)
    assert propagate_shapes(spec) == 2  # without the conj, the second view (and its alias) repeat the first
