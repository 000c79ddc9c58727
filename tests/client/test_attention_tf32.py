"""TF32 and fxcc's attention kernel through torch.compile: the flag is read at compile time, is part
of the key, Dynamo recompiles when it flips, and the plan follows it (template with TF32, aten without)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fxcc.client import backend
from fxcc.client.cache import LocalCache
from fxcc.client.examples import GPT2, TransformerBlock
from fxcc.client.precision import matmul_allows_tf32
from fxcc.client.settings import ClientSettings
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.codegen.attention import is_template_kernel

CPU_SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles: None) -> Iterator[None]:
    matmul = torch.backends.cuda.matmul  # the real one (tests below patch it)
    saved = matmul.allow_tf32
    yield
    matmul.allow_tf32 = saved


def artifacts() -> list[Artifact]:
    cache = LocalCache(ClientSettings.from_env().cache_dir)
    out = []
    for e in backend.events():
        assert e.source == "compiled-in-process", (e.source, e.error)
        art = cache.get(e.key)
        assert art is not None
        out.append(art)
    return out


def templates(art: Artifact) -> list[str]:
    return [k.name for k in art.manifest.kernels if is_template_kernel(k.name)]


def run(model: Any, x: torch.Tensor, tf32: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    with torch.no_grad():
        got = model(x)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        want = model._orig_mod(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["transformer_block", "gpt2"])
def test_flipping_tf32_recompiles_with_another_key_and_the_plan_follows_it(name: str) -> None:
    torch.manual_seed(0)
    if name == "transformer_block":
        model, x = TransformerBlock(64, 4).eval(), torch.randn(2, 24, 64)
    else:
        model, x = GPT2(vocab=96, d=64, layers=2, heads=4, max_seq=64).eval(), torch.randint(0, 96, (2, 20))
    compiled = torch.compile(model, backend=backend.fxcc_backend)
    run(compiled, x, tf32=True)
    run(compiled, x, tf32=False)
    run(compiled, x, tf32=True)  # Dynamo's cached graph for the flag: no third compile
    on, off = artifacts()
    assert on.manifest.key != off.manifest.key
    assert templates(on) and CPU_SDPA not in on.manifest.stats.extern_ops
    assert not templates(off) and CPU_SDPA in off.manifest.stats.extern_ops
    layers = 2 if name == "gpt2" else 1
    launches = [s for s in on.manifest.plan.steps if s.kind == "kernel" and is_template_kernel(s.kernel)]
    assert len(launches) == layers


def test_the_newer_precision_api_is_read_first(monkeypatch: pytest.MonkeyPatch) -> None:
    for precision, legacy, want in [("tf32", False, True), ("ieee", True, False), ("none", True, True),
                                    ("none", False, False)]:
        fake = types.SimpleNamespace(fp32_precision=precision, allow_tf32=legacy)
        monkeypatch.setattr(torch.backends.cuda, "matmul", fake)
        assert matmul_allows_tf32() is want
    monkeypatch.setattr(torch.backends.cuda, "matmul", types.SimpleNamespace(allow_tf32=True))  # torch < 2.9
    assert matmul_allows_tf32() is True


def test_an_unreadable_flag_means_exact_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    class Mixed:
        fp32_precision = "none"

        @property
        def allow_tf32(self) -> bool:
            raise RuntimeError("mix of the legacy and new APIs")

    monkeypatch.setattr(torch.backends.cuda, "matmul", Mixed())
    assert matmul_allows_tf32() is False


@pytest.mark.parametrize("block", ["transformer", "gpt2"])
def test_dynamic_sequence_lengths_run_the_template_with_a_symbolic_grid(block: str) -> None:
    """Dynamo's dynamic graph (the second length) keeps fxcc's kernel: its sizes and strides are
    kernel arguments, its grid a size expression; every length matches eager."""
    from fxcc.client.examples import GPT2Block

    torch.manual_seed(0)
    model = (TransformerBlock(64, 4) if block == "transformer" else GPT2Block(64, 4)).eval()
    compiled = torch.compile(model, backend="fxcc")
    torch.backends.cuda.matmul.allow_tf32 = True
    with torch.no_grad():
        for seq in (8, 9, 23, 5):
            x = torch.randn(2, seq, 64)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-5, rtol=2e-5)
    static, dynamic = artifacts()
    assert templates(static) and templates(dynamic) and dynamic.manifest.plan.symbols
    (launch,) = [s for s in dynamic.manifest.plan.steps if s.kind == "kernel" and is_template_kernel(s.kernel)]
    assert isinstance(launch.grid[0], str) and any(a.kind == "sym" for a in launch.args)


@pytest.mark.parametrize(("family", "cls", "field"), [("gpt2", "GPT2LMHeadModel", "logits"),
                                                      ("bert", "BertModel", "last_hidden_state")])
def test_real_models_with_a_padding_mask_run_the_template_with_the_mask_as_its_bias(
        family: str, cls: str, field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' GPT-2 and BERT (tiny configs, SDPA attention) with a padding mask: SDPA gets the
    mask as a float bias, which fxcc's kernel reads (before, a masked SDPA kept aten's kernel: on the
    H200 the fp32 memory-efficient one, 38% of GPT-2's device time)."""
    pytest.importorskip("transformers")
    from bench import model_zoo
    from fxcc.compiler_core.codegen.attention import source_facts

    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = model_zoo._transformers_model(cls, model_zoo._config(family, True)).eval()
    compiled = torch.compile(model, backend=backend.fxcc_backend)
    for seq in (40, 31, 17):  # the second length compiles Dynamo's dynamic graph: symbolic bias strides
        ids = torch.randint(0, 256, (2, seq), generator=torch.Generator().manual_seed(seq))
        mask = torch.ones(2, seq, dtype=torch.long)
        mask[1, seq - 7:] = 0  # the second sequence is padded
        with torch.no_grad():
            got = getattr(compiled(ids, attention_mask=mask), field)
            want = getattr(model(ids, attention_mask=mask), field)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    facts = []
    arts = artifacts()  # one static plan, one dynamic plan for every later length (no variant)
    assert len(arts) == 2 and arts[1].manifest.plan.symbols
    for art in arts:
        assert CPU_SDPA not in art.manifest.stats.extern_ops
        facts += [source_facts(art.blobs[k.source.digest].decode()) for k in art.manifest.kernels
                  if is_template_kernel(k.name)]
    assert facts and all(f["bias"] == "1" for f in facts)
