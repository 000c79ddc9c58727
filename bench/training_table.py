"""Training through fxcc vs eager: a small MLP, the GPT-2-style block and a ResNet bottleneck, with
SGD and AdamW, from identical initial weights and data; writes docs/training.md.

`TRITON_INTERPRET=1 .venv/bin/python -m bench.training_table` (20 steps, CPU, about a minute);
`--steps N`, `--out PATH`. tests/models/test_training.py runs the same loop with fewer steps.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fxcc.client import backend
from fxcc.client.examples import Bottleneck, GPT2Block

MODELS = ("mlp", "gpt2", "bottleneck")
OPTIMIZERS = ("sgd", "adamw")
REPORT_STEPS = (1, 5, 10, 15, 20)

# The tolerances the test asserts and the table states (float32 on CPU). fxcc's kernels sum in
# another order than eager's (fused reductions, recomputed activations), so results differ in the
# last bits at step 1, and the two trajectories drift apart slowly from there.
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-5}
PARAM_TOL = {"sgd": {"rtol": 1e-4, "atol": 1e-5}, "adamw": {"rtol": 1e-4, "atol": 1e-3}}
# Note: AdamW's final parameters get a tolerance of one step's update (lr = 1e-3). Adam divides
# each gradient by its own running magnitude, so where a gradient is zero up to rounding noise it
# moves the parameter by a sizeable part of lr in the noise's direction: the GPT-2 block's key
# bias (attention's softmax ignores it, so its exact gradient is 0; both runs see noise of about
# 1e-9) and any weight whose first gradient is below Adam's eps (1e-8). Eager against eager with
# another summation order would differ the same way; losses and gradients stay within the tight
# tolerances above at every step.


class WithLoss(nn.Module):
    """The model and its loss in one module, so that the loss and its gradient are compiled too."""

    def __init__(self, model: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x), y)


def make_model(name: str, seed: int = 0) -> WithLoss:
    """A fresh model with its loss; the same weights for the same seed."""
    torch.manual_seed(seed)
    if name == "mlp":
        mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
        return WithLoss(mlp, F.cross_entropy)
    if name == "gpt2":
        return WithLoss(GPT2Block(64, 4), F.mse_loss)
    if name == "bottleneck":
        return WithLoss(Bottleneck(32, 8, 2), F.mse_loss)
    raise ValueError(f"unknown model {name!r}; one of {MODELS}")


def make_batches(name: str, steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (input, target) batch per step, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
                for _ in range(steps)]
    shape, out = {"gpt2": ((2, 16, 64), (2, 16, 64)), "bottleneck": ((2, 32, 8, 8), (2, 32, 4, 4))}[name]
    return [(torch.randn(shape, generator=g), torch.randn(out, generator=g)) for _ in range(steps)]


def make_optimizer(name: str, params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    raise ValueError(f"unknown optimizer {name!r}; one of {OPTIMIZERS}")


@dataclass
class Run:
    """One training run: the loss per step, every step's gradients, the final state."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    fw_graphs: int = 0  # graphs fxcc was given while forwards ran
    bw_graphs: int = 0  # ... and while backwards ran
    sources: list[str] = field(default_factory=list)


def train(model: str, optimizer: str, steps: int, compiled: bool) -> Run:
    """Train `model` for `steps` optimizer steps, eagerly or through fxcc."""
    module = make_model(model)
    module.train()
    opt = make_optimizer(optimizer, module.parameters())
    fn = torch.compile(module, backend="fxcc") if compiled else module
    run = Run()
    for x, y in make_batches(model, steps):
        opt.zero_grad(set_to_none=True)
        before = len(backend.events())
        loss = fn(x, y)
        between = len(backend.events())
        loss.backward()
        after = len(backend.events())
        run.fw_graphs += between - before
        run.bw_graphs += after - between
        run.losses.append(loss.item())
        run.grads.append({n: p.grad.detach().clone() for n, p in module.named_parameters()})
        opt.step()
    run.state = {n: t.detach().clone() for n, t in module.state_dict().items()}
    run.sources = [e.source for e in backend.events()]
    return run


def train_both(model: str, optimizer: str, steps: int) -> tuple[Run, Run]:
    """The eager run and the fxcc run of the same model, optimizer, weights and data."""
    eager = train(model, optimizer, steps, compiled=False)
    torch._dynamo.reset()
    backend.clear_events()
    return eager, train(model, optimizer, steps, compiled=True)


def max_diff(a: list[dict[str, torch.Tensor]] | dict[str, torch.Tensor],
             b: list[dict[str, torch.Tensor]] | dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between matching tensors (floating point ones only)."""
    pairs = zip(a, b) if isinstance(a, list) else [(a, b)]
    return max(((x[k].double() - y[k].double()).abs().max().item()
                for x, y in pairs for k in x if x[k].is_floating_point()), default=0.0)


@dataclass
class Saved:
    """What a partition keeps from the forward for the backward: tensors and their bytes."""

    tensors: int
    nbytes: int


def saved_activations(model: str, partition: Callable) -> Saved:
    """The activations the forward of `model` (with its loss) saves under `partition`, on fxcc's
    aten graphs (same decompositions), without compiling anything."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    found: list[Saved] = []

    def forward(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return make_boxed_func(gm)

    def backward(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        saved = [t for n, t in zip(gm.graph.find_nodes(op="placeholder"), example_inputs)
                 if isinstance(t, torch.Tensor) and not n.name.startswith("tangents")]
        found.append(Saved(len(saved), sum(t.nbytes for t in saved)))
        return make_boxed_func(gm)

    split = aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=partition,
                         decompositions=backend.decomposition_table(training=True))
    module = make_model(model)
    module.train()
    torch._dynamo.reset()
    x, y = make_batches(model, 1)[0]
    torch.compile(module, backend=split)(x, y).backward()
    torch._dynamo.reset()
    return Saved(sum(s.tensors for s in found), sum(s.nbytes for s in found))


def partition_table() -> str:
    """Saved activations per model: fxcc's min-cut partition against torch's default one."""
    from torch._functorch.partitioners import default_partition

    lines = ["| model | min-cut (fxcc): tensors, bytes | default partition: tensors, bytes |",
             "|---|---|---|"]
    for model in MODELS:
        ours, theirs = (saved_activations(model, p) for p in (backend.partition_joint_graph,
                                                                default_partition))
        lines.append(f"| {model} | {ours.tensors}, {ours.nbytes:,} | {theirs.tensors}, {theirs.nbytes:,} |")
    return "\n".join(lines)


@contextmanager
def fxcc_settings(cache_dir: str) -> Iterator[None]:
    """In-process compiles into `cache_dir`; a graph that falls back runs eagerly (and is counted)."""
    keys = ("FXCC_URL", "FXCC_CACHE_DIR", "FXCC_FALLBACK", "FXCC_BLOCKING", "FXCC_PRECOMPILE")
    saved = {k: os.environ.pop(k, None) for k in keys}
    os.environ["FXCC_CACHE_DIR"] = cache_dir
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def table(rows: list[tuple[str, str, Run, Run]], steps: int) -> str:
    """The markdown table: losses at REPORT_STEPS for eager and fxcc, differences, graph counts."""
    shown = [s for s in REPORT_STEPS if s <= steps]
    head = ["model", "optimizer", "run", *(f"loss @{s}" for s in shown), "max abs Δloss",
            "max abs Δgrad (max abs grad)", "max abs Δparam", "fxcc graphs fw/bw (from)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, opt, eager, fx in rows:
        for label, run in (("eager", eager), ("fxcc", fx)):
            cells = [model, opt, label, *(f"{run.losses[s - 1]:.6f}" for s in shown)]
            if run is fx:
                dloss = max(abs(a - b) for a, b in zip(eager.losses, fx.losses))
                scale = max(g.abs().max().item() for step in eager.grads for g in step.values())
                cells += [f"{dloss:.1e}", f"{max_diff(eager.grads, fx.grads):.1e} ({scale:.2g})",
                          f"{max_diff(eager.state, fx.state):.1e}", f"{fx.fw_graphs}/{fx.bw_graphs} ({', '.join(sorted(set(fx.sources)))})"]
            else:
                cells += ["", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="docs/training.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache, fxcc_settings(cache):
        for model in MODELS:
            for opt in OPTIMIZERS:
                backend.reset()
                eager, fx = train_both(model, opt, args.steps)
                fallbacks = fx.sources.count("fallback")
                print(f"{model:10} {opt:5}  final loss eager {eager.losses[-1]:.6f} fxcc {fx.losses[-1]:.6f}  "
                      f"graphs fw/bw {fx.fw_graphs}/{fx.bw_graphs}  fallbacks {fallbacks}", flush=True)
                rows.append((model, opt, eager, fx))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report(rows, args.steps))
    print(f"wrote {args.out}")


def report(rows: list[tuple[str, str, Run, Run]], steps: int) -> str:
    return f"""# Training through fxcc vs eager

Written by `TRITON_INTERPRET=1 .venv/bin/python -m bench.training_table` ({steps} optimizer steps,
CPU, float32, Triton kernels in the interpreter, torch {torch.__version__}). Each row pair trains
the same model from the same initial weights on the same batches, once eagerly and once compiled
with `torch.compile(model_with_loss, backend="fxcc")` (forward, loss and backward through fxcc;
the optimizer step is eager). Models: an MLP (Linear-GELU-Linear-Tanh-Linear, cross-entropy,
batch 16×32), `GPT2Block(64, 4)` on 2×16×64 and `Bottleneck(32, 8, stride 2)` on 2×32×8×8 (both
MSE against a random target; the bottleneck's BatchNorms in training mode). SGD: lr 0.05,
momentum 0.9; AdamW: lr 1e-3, weight decay 0.01.

Δloss is over every step; Δgrad over every step's gradients of every parameter (in brackets the
largest gradient magnitude, for scale); Δparam over the final parameters and buffers (BatchNorm's
running statistics included). "fxcc graphs fw/bw" counts the graphs fxcc was handed while
forwards and backwards ran: 1/1 means one forward and one backward graph, no recompiles (the
backward is compiled at the first `backward()`); in brackets where they came from (the AdamW
run trains the same graphs as the SGD run before it, so they are local cache hits).

The test (tests/models/test_training.py, the same loop for fewer steps) asserts:

- losses at every step within rtol {LOSS_TOL["rtol"]:g}, atol {LOSS_TOL["atol"]:g};
- gradients at every step within rtol {GRAD_TOL["rtol"]:g}, atol {GRAD_TOL["atol"]:g};
- final parameters and buffers within rtol {PARAM_TOL["sgd"]["rtol"]:g}, atol {PARAM_TOL["sgd"]["atol"]:g} (SGD) or
  atol {PARAM_TOL["adamw"]["atol"]:g} (AdamW: one step's update). Adam turns rounding noise in a gradient
  that is exactly zero into steps of a sizeable part of lr: the GPT-2 block's key bias (softmax
  ignores it) gets gradients of about 1e-9 in both runs, and there lies the GPT-2 AdamW run's
  largest Δparam.

{table(rows, steps)}

## Saved activations

What the forward keeps for the backward (the backward graph's inputs other than incoming
gradients; parameters and inputs it reads count too), on the same graphs, with fxcc's min-cut
partition (`fxcc.client.backend.partition_joint_graph`, torch's `min_cut_rematerialization_partition`
as Inductor uses it) and with torch's default partition, which saves what the backward reads:

{partition_table()}
"""


if __name__ == "__main__":
    main()
