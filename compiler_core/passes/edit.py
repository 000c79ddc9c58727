"""Editing the one FX graph in place: new nodes with their FakeTensors, old ones replaced, the values after them re-derived.

Note: every FakeTensor of a graph comes from its one FakeTensorMode, and a symbolic graph's sizes
from the compilation's one ShapeEnv (graph.SymValues). What a pass asks of symbolic sizes while it
matches or adds nodes (a guard or a replacement the ShapeEnv records) stays there, and the plan
checks it at run time (compile.shape_env_guards): a rewrite that holds only for some sizes runs
only for those, and the others compile a variant of their own. A guard recorded by a match that
then did not fire stays too: the plan serves fewer sizes than it could, never a size it is wrong for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

_VIEWS = frozenset({torch.ops.aten.permute.default, torch.ops.aten.transpose.int, torch.ops.aten.view.default,
                    torch.ops.aten.expand.default, torch.ops.aten.reshape.default,
                    torch.ops.aten._unsafe_view.default, torch.ops.aten.unsqueeze.default,
                    torch.ops.aten.squeeze.dim, torch.ops.aten.t.default})


class GraphEdit:
    """One pass's edits of `gm`: nodes added (each with its value, run on its arguments'), old
    nodes replaced by new ones (their readers then read the new ones, the old names kept), and at
    `finish` the values of the nodes after a replaced one whose value changed, derived again.

    A rewrite that fails while it adds its nodes is taken back (`rollback`) before it replaced
    anything: the graph stays as it was, but for what the ShapeEnv recorded on the way.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.mode = gm.meta["fxcc_fake_mode"]
        self.taken = {n.name for n in gm.graph.nodes}
        self.changed: set[fx.Node] = set()  # nodes whose value is not the one their readers saw
        self.replaced: dict[fx.Node, fx.Node] = {}
        self.pending: list[fx.Node] = []

    def add(self, before: fx.Node, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
            name: str = "fx") -> fx.Node:
        """A node `target(*args, **kwargs)` before `before`, named `name` (made unique), with its FakeTensor."""
        args, kwargs = fx.node.map_arg((args, kwargs or {}), self.current)
        vals = fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        val = run_op(self.gm, target, vals[0], vals[1])
        with self.gm.graph.inserting_before(before):
            node = self.gm.graph.call_function(target, args, kwargs)
        node.name = fresh_name(self.taken, name)
        node.meta["val"] = val
        self.pending.append(node)
        return node

    def current(self, node: fx.Node) -> fx.Node:
        """`node`, or what replaced it (a match may read a node an earlier rewrite replaced)."""
        while node in self.replaced:
            node = self.replaced[node]
        return node

    def replace(self, old: fx.Node, new: fx.Node, erase: Iterable[fx.Node] = ()) -> None:
        """`old`'s readers read `new`, which takes old's name; `old` and `erase` (which nothing
        else reads by then) leave the graph; the rewrite's added nodes are kept. Raises before it
        changes anything (the rewrite may be rolled back) when a node of `erase` is read elsewhere."""
        gone = {old, *erase}
        read = [n.name for n in gone if n is not old and any(u not in gone for u in n.users)]
        if read:
            raise RuntimeError(f"nodes {read} are read outside the rewrite")
        old.replace_all_uses_with(new)
        if not same_value(old.meta.get("val"), new.meta.get("val")):
            self.changed.add(new)
        self.replaced[old] = new
        todo = list(dict.fromkeys([old, *erase]))
        while todo:  # readers before what they read
            dead = [n for n in todo if not n.users]
            if not dead:
                raise RuntimeError(f"nodes {[n.name for n in todo]} are still read")
            for node in dead:
                self.changed.discard(node)
                self.gm.graph.erase_node(node)
            todo = [n for n in todo if n not in dead]
        new.name = old.name
        self.pending.clear()

    def reroute(self, old: fx.Node, new: fx.Node, readers: Iterable[fx.Node]) -> None:
        """`readers` of `old` read `new` instead (`old` stays: `new` may read it); their values are
        derived again at `finish`. The rewrite's added nodes are kept."""
        for reader in readers:
            reader.replace_input_with(old, new)
        self.changed.add(new)
        self.pending.clear()

    def rollback(self) -> None:
        for node in reversed(self.pending):
            self.gm.graph.erase_node(node)
        self.pending.clear()

    def finish(self) -> None:
        """Dead views dropped, the values after the changed nodes derived again, the module's code stale."""
        for node in reversed(list(self.gm.graph.nodes)):
            if node.op == "call_function" and node.target in _VIEWS and not node.users:
                self.gm.graph.erase_node(node)
        if self.changed:
            repropagate(self.gm, {user for node in self.changed for user in node.users})
        self.gm.recompile()


def rewrite_each(gm: fx.GraphModule, nodes: Iterable[fx.Node], build: Any, log: Any, what: str) -> int:
    """Each of `nodes` replaced by the node `build(edit, node)` adds before it; a node whose rewrite
    fails is left as it was (its new nodes taken back, the failure logged as `what` left alone).
    The edit finished; how many nodes were rewritten."""
    edit = GraphEdit(gm)
    rewritten = 0
    for node in nodes:
        try:
            edit.replace(node, build(edit, node))
            rewritten += 1
        except Exception as e:  # noqa: BLE001 - this node's new nodes are taken back
            edit.rollback()
            log.warning("%s left as it is at %s: %s: %s", what, node.name, type(e).__name__, e)
    edit.finish()
    return rewritten


def fresh_name(taken: set[str], stem: str) -> str:
    """`stem` (cut to a wire name's length), numbered where `taken` has it; then taken too."""
    base = stem[:120]
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}{i}"
    taken.add(name)
    return name


def repropagate(gm: fx.GraphModule, stale: set[fx.Node]) -> None:
    """The `stale` nodes (their arguments changed), and each node reading one whose value then
    changed, run again on their arguments' FakeTensors, in graph order; a node whose value comes out
    the same keeps its FakeTensor and stops the wave there."""
    dirty: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or (node not in stale and not dirty.intersection(node.all_input_nodes)):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        val = run_op(gm, node.target, args, kwargs)
        if not same_value(val, node.meta.get("val")):
            node.meta["val"] = val
            dirty.add(node)


def run_op(gm: fx.GraphModule, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """`target` run on FakeTensors of `gm`'s mode, or the outputs of the earlier call it repeats
    (graph.Repeats, where rebuild_graph made one)."""
    repeats = gm.meta.get("fxcc_repeat_memo")
    if repeats is not None:
        return repeats.run(target, args, kwargs)
    with gm.meta["fxcc_fake_mode"]:
        return target(*args, **kwargs)


def same_value(a: Any, b: Any) -> bool:
    """Whether two FakeTensors (or tuples of them, or sizes) have the same dtype, device, sizes,
    strides and offset; symbolic sizes compared as expressions, so the question records no guard."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.dtype == b.dtype and a.device == b.device and a.dim() == b.dim()
                and all(map(_same_size, (*a.shape, *a.stride(), a.storage_offset()),
                            (*b.shape, *b.stride(), b.storage_offset()))))
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return _same_size(a, b)
    return a is b or (type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b)


def _same_size(x: Any, y: Any) -> bool:
    if isinstance(x, torch.SymInt) or isinstance(y, torch.SymInt):
        return isinstance(x, torch.SymInt) and isinstance(y, torch.SymInt) and x.node.expr == y.node.expr
    return x == y

