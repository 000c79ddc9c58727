"""The Dynamo backend: torch.compile(model, backend="fxcc").

Dynamo's graph goes through AOTAutograd (core-aten decompositions); each aten graph (forward,
backward or inference) is captured as a GraphSpec, keyed, and served from the local cache, the
service's shared cache, a remote compile, or — with no FXCC_URL — an in-process compile.

Note: the user's program never dies because of fxcc. Whatever fails (capture, service,
compile, loading, a first run), the graph runs eagerly and fxcc warns once per cause.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from fxcc.client.graphs import (
    CompileEvent,
    GraphCompiler,
    _can_run,
    _cause,
    _cause_text,
    _log,
    aot_runs,
    clear_events,
    events,
    reset,
    target_for,
    warn_once,
)
from fxcc.client.settings import ClientSettings, compile_options

log = logging.getLogger("fxcc.client")

__all__ = ["CompileEvent", "GraphCompiler", "aot_runs", "clear_events", "decomposition_table", "events",
           "fxcc_backend", "partition_joint_graph", "reset", "target_for"]


# Ops kept whole (extern aten calls) instead of decomposed: attention runs faster as one library
# call, and torch 2.13's core-aten decomposition of causal SDPA gives wrong gradients under
# AOTAutograd (tests/models shows it).
KEEP_WHOLE = ("scaled_dot_product", "_flash_attention", "_efficient_attention")


# Decomposed in training graphs only, before the partition, as Inductor's table does: kept whole,
# log_softmax's output is what the min-cut partition must save for its backward (a cross-entropy
# loss over GPT-2's vocabulary: a [tokens, 50257] fp32 tensor, 393 MB at batch 4 x 512, held from
# the forward to the backward); decomposed (max, exp, sum, log, subtractions), it saves the two
# per-row statistics and the backward recomputes from the logits, which it reads anyway. The
# worker lowers the decomposition to the kernels of its own log_softmax lowering (the same max and
# sum reductions). `_softmax` stays whole: the attention pass matches it (passes/attention.py),
# and its output is what softmax's backward reads in any case.
TRAINING_DECOMPOSITIONS = ("_log_softmax",)

# Decomposed beyond core aten, as Inductor's table does (torch._decomp's own decompositions): the
# batch-norm entry points that newer torch and CUDA tracing reach (F.batch_norm's
# _batch_norm_with_update, its backward batch_norm_backward), which core aten keeps whole, so a
# worker saw them as one opaque aten call each (on CUDA: batch_norm_collect_statistics and
# transform_input kernels). fxcc's worker lowers what they decompose to: the functional batch
# norm, var_mean and pointwise ops. Names missing in an older torch are skipped.
NORM_DECOMPOSITIONS = (
    "_batch_norm_with_update", "_batch_norm_with_update_functional", "_batch_norm_no_update",
    "batch_norm_backward", "native_batch_norm", "cudnn_batch_norm", "cudnn_batch_norm_backward",
    "miopen_batch_norm", "miopen_batch_norm_backward", "native_batch_norm_backward",
    "native_group_norm_backward", "native_layer_norm_backward",
)


# (the registrations it was built from, the table): see decomposition_table.
_decomposition_cache: tuple[tuple[Any, ...], dict[Any, Callable]] | None = None


def decomposition_table(training: bool = False) -> dict[Any, Callable]:
    """Core-aten decompositions and the batch norms' (NORM_DECOMPOSITIONS), minus the ops fxcc
    keeps whole; for `training` graphs also TRAINING_DECOMPOSITIONS. A fresh dict each call (the
    caller may change it), copied from a cached table.

    Note: building the table costs ~70 ms (torch walks every op namespace for
    CompositeImplicitAutograd ops, uncached because custom ops can be registered at any time),
    and every compile asks for it. So it is kept, together with what it was built from: the
    dispatcher's CompositeImplicitAutograd registrations (a custom op registered later), torch's
    Python decompositions (a `register_decomposition` later) and the op namespaces loaded. Any
    change of those rebuilds it (~0.3 ms to check).
    """
    global _decomposition_cache
    state = _decomposition_state()
    cached = _decomposition_cache
    if cached is None or cached[0] != state:
        table = _build_decomposition_table()  # loads ops into their namespaces: the state after it
        cached = _decomposition_cache = (_decomposition_state(), table)
    table = dict(cached[1])
    if training:
        from torch._decomp import get_decompositions

        table.update(get_decompositions([getattr(torch.ops.aten, name) for name in TRAINING_DECOMPOSITIONS]))
    return table


def _decomposition_state() -> tuple[Any, ...]:
    """What decomposition_table's result depends on besides this module's constants."""
    from torch._decomp import global_decomposition_table

    cia = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    namespaces = tuple((name, len(getattr(torch.ops, name)._dir)) for name in torch.ops._dir if name != "aten")
    return tuple(cia), tuple(global_decomposition_table["post_autograd"].items()), namespaces


def _build_decomposition_table() -> dict[Any, Callable]:
    from torch._decomp import core_aten_decompositions, get_decompositions

    ops = [getattr(torch.ops.aten, name) for name in NORM_DECOMPOSITIONS if hasattr(torch.ops.aten, name)]
    table = {**core_aten_decompositions(), **get_decompositions(ops)}
    return {op: fn for op, fn in table.items() if not any(k in str(op) for k in KEEP_WHOLE)}


def partition_joint_graph(joint: fx.GraphModule, joint_inputs: Any,
                          **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Split AOTAutograd's joint graph into forward and backward, choosing the saved activations
    by min-cut as Inductor's default partitioner does.

    Note: min-cut saves the cheapest set of tensors that cuts the forward from the backward and
    recomputes cheap pointwise chains in the backward instead of saving their intermediates. That
    pays off because fxcc, like Inductor, fuses those recomputed ops into the backward's kernels.
    It needs networkx (a dependency of torch) and is torch's most intricate partitioner: if it
    fails, the joint graph is split by torch's default partitioner (which saves what the backward
    reads) and fxcc warns once, so training never stops because of the partition.
    """
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    try:
        _shape_only_inputs(joint)
    except Exception as e:  # noqa: BLE001 - only a saving: the ops keep their inputs
        log.debug("fxcc: max pool backwards keep their inputs (%s)", _cause_text(e))
    try:
        return min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
    except Exception as e:  # noqa: BLE001 - the user's program must keep running
        warn_once(f"partition:{_cause(e)}", f"min-cut partition failed ({_cause_text(e)}); "
                  "saving activations with torch's default partition")
        return default_partition(joint, joint_inputs, **kwargs)


# Backward ops that read one input for its sizes and strides alone (the gradient's shape): a max
# pool's backward reads the pool's input so, and the indices for the values.
SHAPE_ONLY_ARG = {"max_pool2d_with_indices_backward": 1, "max_pool3d_with_indices_backward": 1}


def _shape_only_inputs(joint: fx.GraphModule) -> int:
    """Give each SHAPE_ONLY_ARG op of the joint graph an uninitialized tensor of that input's
    layout in its place, so that the partition saves nothing for it: a conv net's stem ReLU
    output, which its max pool's backward read only for its shape (torchvision ResNet-18 at batch
    32: 103 MB saved from the forward to the backward). Inductor's low-memory max pool does
    without that input too. Static sizes only; returns how many it replaced."""
    aten = torch.ops.aten
    done = 0
    for node in list(joint.graph.nodes):
        if node.op != "call_function" or not hasattr(node.target, "overloadpacket"):
            continue
        at = SHAPE_ONLY_ARG.get(node.target.overloadpacket.__name__)
        if at is None or len(node.args) <= at or not isinstance(node.args[at], fx.Node):
            continue
        val = node.args[at].meta.get("val")
        if not isinstance(val, torch.Tensor) or val.device.type not in ("cpu", "cuda") \
                or not all(isinstance(d, int) for d in (*val.shape, *val.stride())):
            continue  # (another device's kernel may read the values: MPS recomputes the argmax)
        with joint.graph.inserting_before(node):
            empty = joint.graph.call_function(aten.empty_strided.default, (list(val.shape), list(val.stride())),
                                              {"dtype": val.dtype, "device": val.device})
        empty.meta["val"] = val.new_empty_strided(val.shape, val.stride())
        node.update_arg(at, empty)
        done += 1
    if done:
        joint.graph.lint()
        joint.recompile()
    return done


def fxcc_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The `fxcc` backend for torch.compile (registered as a torch_dynamo_backends entry point).

    A graph the pre-AOT cache knows (client/pre_aot.py) is served from it without AOTAutograd;
    otherwise AOTAutograd runs, and a plain inference graph gets an entry for the next process.
    """
    t0 = time.perf_counter()
    try:
        settings = ClientSettings.from_env().with_options(compile_options(kwargs))
    except ValueError as e:
        raise ValueError(f"fxcc: {e}") from None
    if not _can_run(example_inputs, gm):
        return gm.forward
    compiler = GraphCompiler(settings)
    inference = GraphCompiler(settings, inference=True)
    served, recorder, entry = _pre_aot(gm, example_inputs, settings, inference, t0)
    if served is None:
        served, entry = _run_aot(gm, example_inputs, compiler, inference, recorder)
    if entry is None:
        return served
    # A plain inference graph: serializable by its artifact's key (torch's precompile, aot_compile).
    from fxcc.client import dynamo_cache

    return dynamo_cache.wrap(served, entry, gm, example_inputs, settings)


def _pre_aot(gm: fx.GraphModule, example_inputs: list[Any], settings: ClientSettings,
             inference: GraphCompiler, t0: float) -> tuple[Callable | None, Any, Any]:
    """(the pre-AOT cache's callable on a hit, else None; a recorder for AOTAutograd's run, or
    None when the graph cannot be cached; the entry served). Never raises: any failure is a miss."""
    if not settings.pre_aot_cache or settings.precompile:
        return None, None, None
    from fxcc.client import pre_aot

    try:
        key = pre_aot.graph_key(gm, example_inputs, settings)
    except pre_aot.Ineligible as e:
        log.debug("fxcc: pre-AOT cache: not for this graph: %s", e)
        return None, None, None
    except Exception as e:  # noqa: BLE001 - only an optimisation
        pre_aot.log_once(f"key:{_cause(e)}", "no key for a graph (%s)", _cause_text(e))
        return None, None, None
    # With a service, a local miss asks it, and what AOTAutograd stores is shared through it.
    store = pre_aot.Shared(settings.cache_dir, settings) if settings.url else pre_aot.Store(settings.cache_dir)
    try:
        entry = store.get(key)
        if entry is not None:
            served = pre_aot.serve(entry, gm, example_inputs, inference, t0)
            if served is not None:
                return served, None, entry
        if isinstance(store, pre_aot.Shared):
            served = store.serve(key, gm, example_inputs, inference, t0)
            if served is not None:
                return served, None, store.served_entry
        return None, pre_aot.Recorder(key, gm, example_inputs, store), None
    except Exception as e:  # noqa: BLE001 - only an optimisation; AOTAutograd runs as usual
        pre_aot.log_once(f"serve:{_cause(e)}", "falling back to AOTAutograd (%s)", _cause_text(e))
        return None, None, None


def _run_aot(gm: fx.GraphModule, example_inputs: list[Any], compiler: GraphCompiler,
             inference: GraphCompiler, recorder: Any) -> tuple[Callable, Any]:
    """AOTAutograd over Dynamo's graph, fxcc compiling each aten graph it produces."""
    from torch._dynamo.backends.common import aot_autograd

    inference_compiler: Callable = inference
    if recorder is not None:
        inference.on_ready = recorder.ready
        inference_compiler = recorder.inference_compiler(inference)
    # AOTAutograd's own test for a joint (training) graph: grad mode on and an input needing grad.
    training = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in [*example_inputs, *gm.parameters()])
    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                           inference_compiler=inference_compiler,
                           partition_fn=partition_joint_graph,
                           decompositions=decomposition_table(training),
                           keep_inference_input_mutations=True)
    with _log.lock:
        _log.aot_runs += 1
        first_event = len(_log.events)
    import torch._functorch.config as functorch_config

    # Note: torch's aot_compile forces AOTAutograd's cache, which holds only Inductor's output
    # code; fxcc's compiled graphs serialize themselves (client/dynamo_cache.py) instead.
    forced = {k: False for k in ("force_autograd_cache", "bundled_autograd_cache") if hasattr(functorch_config, k)}
    with functorch_config.patch(forced):
        fn = backend(gm, example_inputs)
    direct: Callable | None = None
    if recorder is not None:
        try:
            recorder.store()
        except Exception as e:  # noqa: BLE001 - only an optimisation
            log.info("fxcc: pre-AOT cache: could not store an entry (%s)", _cause_text(e))
        if recorder.plain() and recorder.compiled is not None:
            # Note: in the plain case AOTAutograd's runtime wrapper only turns grad mode off and
            # lists the outputs; calling the plan as a pre-AOT hit does skips that wrapper's host
            # work on every call in this process too.
            from fxcc.client.pre_aot import as_aot_runtime

            direct = as_aot_runtime(recorder.compiled, len(recorder.outputs))
    with _log.lock:
        for event in _log.events[first_event:]:
            if event.aot_wrapper is None:
                event.aot_wrapper = direct is None or event is not recorder.event
    return (fn, None) if direct is None else (direct, recorder.entry)


def _enable_dynamo_cache() -> None:
    """Torch's caching precompile with fxcc's signed package store, unless FXCC_DYNAMO_CACHE=0.

    Note: here, at import, because torch decides whether a torch.compile gets a package right
    after looking up its backend (this module, through the entry point), before any call."""
    try:
        if not ClientSettings.from_env().dynamo_cache:
            return
        from fxcc.client import dynamo_precompile

        dynamo_precompile.enable()
    except Exception as e:  # noqa: BLE001 - only an optimisation
        log.info("fxcc: Dynamo package cache off (%s)", _cause_text(e))


def _register() -> None:
    """Register "fxcc" with torch's backend registry when this module is imported first (`import
    fxcc.client.backend` before torch.compile): torch.compile(backend="fxcc") then finds it without
    importing every backend module torch ships (0.66 s on a CPU) to find the entry point. When the
    entry point imports this module, torch registers it itself."""
    try:
        from torch._dynamo.backends import registry

        if "fxcc" not in registry._BACKENDS and "fxcc" not in registry._COMPILER_FNS:
            registry.register_backend(compiler_fn=_BACKEND, name="fxcc")
    except Exception as e:  # noqa: BLE001 - the entry point still works
        log.debug("fxcc: not registered ahead of the entry point (%s)", _cause_text(e))


def _ready() -> None:
    """Register with torch and turn the Dynamo package cache on, once."""
    if not _started:
        _started.append(True)
        _register()
        _enable_dynamo_cache()


# Note: `fxcc_backend` is served by the module's __getattr__ until first asked for, so that importing
# this module (`fxcc.explain` does) imports no torch._dynamo, while torch's entry-point load (inside
# torch.compile, before it decides whether the function gets a package) and any user's
# `from fxcc.client.backend import fxcc_backend` first turn the Dynamo package cache on. Where
# torch._dynamo is already imported, that happens now.
_BACKEND = fxcc_backend
_BACKEND._is_fxcc_backend = True  # type: ignore[attr-defined]  # what client/dynamo_precompile.py recognizes
del fxcc_backend
_started: list[bool] = []


def __getattr__(name: str) -> Any:
    if name == "fxcc_backend":
        _ready()
        globals()["fxcc_backend"] = _BACKEND
        return _BACKEND
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if "torch._dynamo" in sys.modules:
    _ready()
