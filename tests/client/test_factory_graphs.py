"""A graph without tensor inputs (factory ops alone, such as torch.arange(n, device=...)): its
target comes from the tensors it makes, and its plan allocates where that target runs. On a GPU
the H200 OpInfo sweep found such graphs compiled for the interpreter and run on the CPU."""

from __future__ import annotations

import torch

from fxcc.client.backend import target_for
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.wire import Target
from tests.compiler_core.helpers import compile_fn


def test_a_graph_without_inputs_allocates_where_its_target_runs() -> None:
    art = compile_fn(lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2)
    runner = load_plan(art)
    assert runner._no_input_device() == torch.device("cpu")
    torch.testing.assert_close(runner([])[0], torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2)
    cuda = Artifact(art.manifest.model_copy(update={"target": Target(kind="cuda", arch=90)}), art.blobs)
    if torch.cuda.is_available():
        assert load_plan(cuda)._no_input_device().type == "cuda"


def test_the_target_of_a_graph_without_inputs_is_read_from_what_it_makes() -> None:
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda: torch.ones(3) + 1)()
    assert target_for([], gm) == Target(kind="interpret")
    if torch.cuda.is_available():
        made = torch.fx.experimental.proxy_tensor.make_fx(lambda: torch.ones(3, device="cuda") + 1)()
        assert target_for([], made).kind == "cuda"
