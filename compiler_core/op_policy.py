"""Which aten/prims overloads a graph may name: functional ops, by one rule over torch's schemas.

A graph comes from the network, and its ops run under FakeTensors in the service and the worker,
then as extern calls in the client. So an op must compute values only: no I/O, no effect on the
process, no write into a tensor it did not create, and no read of the RNG state except by the
sampling ops a model's graph is made of. `refusal(op)` says why an overload is refused, or None
when it is allowed; the rule, in order:

1. DENIED names: ops that do I/O or need a tensor's data on the host (from_file reads a file;
   _local_scalar_dense and item copy a value to the host; _print writes to stdout), and those
   that swap or resize a tensor's storage (set_, resize_, ...).
2. An op that writes one of its arguments other than an `out=` one (schema `a!` on a non-out
   argument) is refused, unless it is the in-place form of a functional op: named `foo_`,
   writing only `self`, with a `foo` beside it (add_, relu_, copy_: a graph that mutates runs
   as extern calls in the client, see lowering; AOTAutograd's graphs end with copy_ when they
   write a mutated input back). Fused optimizer steps, batch norm's running-stat updates and
   prims that write (copy_to, resize) are refused.
3. An op that returns nothing and writes nothing exists only for its side effect: refused, except
   the ASSERTS (they raise on a false condition and change nothing).
4. An op tagged `nondeterministic_seeded` (it reads the global RNG state) must be one of
   FUNCTIONAL_RNG: out-of-place sampling ops (native_dropout, rand, bernoulli, ...) and the
   attention kernels whose dropout samples. Recurrent-network kernels, fused dropout and the
   like are refused.

Everything else in `torch.ops.aten` / `torch.ops.prims` is allowed: a functional op either has a
fake kernel (shape propagation) or fails shape propagation, a 422 naming the node either way.
"""

from __future__ import annotations

import functools
from typing import Any

# Packet names (namespace.op, every overload); DENIED with the reason each is refused.
DENIED: dict[str, str] = {
    "aten.from_file": "it reads a file",
    "aten._print": "it writes to stdout",
    "aten._local_scalar_dense": "it copies a tensor's value to the host",
    "aten.item": "it copies a tensor's value to the host",
    "aten.set_": "it swaps a tensor's storage",
    "aten.resize_": "it resizes a tensor's storage",
    "aten.resize_as_": "it resizes a tensor's storage",
    "aten._resize_output_": "it resizes a tensor's storage",
}
ASSERTS: frozenset[str] = frozenset({
    "aten._assert_async", "aten._assert_scalar", "aten._assert_tensor_metadata",
    "aten.sym_constrain_range", "aten.sym_constrain_range_for_size",
})
FUNCTIONAL_RNG: frozenset[str] = frozenset({
    "aten.native_dropout", "aten.bernoulli", "aten.normal", "aten.uniform", "aten.rand",
    "aten.rand_like", "aten.randn", "aten.randn_like", "aten.randint", "aten.randint_like",
    "aten.randperm", "aten.multinomial", "aten.poisson", "aten.exponential", "aten.geometric",
    "aten.cauchy", "aten.log_normal", "aten._standard_gamma", "aten.rrelu_with_noise_functional",
    "prims.normal", "prims.uniform",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_fused_attention_overrideable", "aten._flash_attention_forward",
    "aten._efficient_attention_forward", "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_cudnn_attention_backward",
})


def packet_name(op: Any) -> str:
    """`aten.add` for aten.add.Tensor."""
    return f"{op.namespace}.{op._opname}"


@functools.lru_cache(maxsize=4096)
def refusal(op: Any) -> str | None:
    """Why the aten/prims OpOverload `op` may not appear in a graph, or None if it may."""
    import torch

    name = packet_name(op)
    schema = op._schema
    if name in DENIED:
        return DENIED[name]
    written = [a.name for a in schema.arguments
               if a.alias_info is not None and a.alias_info.is_write and not a.is_out]
    if written and not _in_place_form(op, written):
        return f"it writes its argument{'s' if len(written) > 1 else ''} {', '.join(written)} in place"
    if not schema.returns and not written and not any(a.is_out for a in schema.arguments) and name not in ASSERTS:
        return "it returns nothing, so it exists only for a side effect"
    if torch.Tag.nondeterministic_seeded in op.tags and name not in FUNCTIONAL_RNG:
        return "it reads the RNG state and is not one of the functional sampling ops"
    return None


def _in_place_form(op: Any, written: list[str]) -> bool:
    """Whether `op` is `foo_` writing only `self`, beside a functional `foo` in its namespace."""
    import torch

    functional = op._opname.removesuffix("_")
    if written != ["self"] or functional == op._opname:
        return False
    namespace = torch.ops.aten if op.namespace == "aten" else torch.ops.prims
    return hasattr(namespace, functional)
