"""The models of bench.models: real definitions from transformers, timm and torchvision, random
weights, configs built in code (nothing is downloaded), each with its inputs and loss.

Each entry builds a `Built`: an nn.Module that returns one tensor (inference: the logits or last
hidden state; training: the loss), and its inputs. `tiny=True` shrinks every config and input to a
size the CPU runs in seconds (the smoke test), keeping the model's own code.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Skip(Exception):
    """The model cannot be built here (its library is missing): the row records why."""


@dataclass
class Built:
    module: nn.Module
    inputs: tuple[Any, ...]
    batch: int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # transformers | timm | torchvision
    kind: str  # inference | training
    dtype: str  # float32 (TF32 on) | bfloat16
    build: Callable[[str, bool], Built]  # (device, tiny) -> Built
    note: str = ""


def _lib(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - a broken install is a missing one
        raise Skip(f"{name} is not importable: {type(e).__name__}: {e}") from None


class Picked(nn.Module):
    """A transformers model called with its one input by keyword, returning one field of its output."""

    def __init__(self, model: nn.Module, input_name: str, field: str) -> None:
        super().__init__()
        self.model, self.input_name, self.field = model, input_name, field
        self.fixed = {"use_cache": False} if _takes(model, "use_cache") else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**{self.input_name: x}, **self.fixed), self.field)


class LmLoss(nn.Module):
    """A transformers language model's own loss (labels = its inputs)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.fixed = {"use_cache": False} if _takes(model, "use_cache") else {}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, labels=ids, **self.fixed).loss


class ClassifierLoss(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(x), y)


def _takes(model: nn.Module, arg: str) -> bool:
    """Whether the model's forward takes `arg` (a KV cache is off in every row: no cache objects out)."""
    return arg in inspect.signature(model.forward).parameters


def _ids(batch: int, seq: int, vocab: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def _images(batch: int, size: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, 3, size, size, generator=g).to(device, dtype)


def _dtype(spec_dtype: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec_dtype]


# ---------------------------------------------------------------- transformers

_NO_DROPOUT = {
    "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "t5": {"dropout_rate": 0.0},
    "vit": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "llama": {"attention_dropout": 0.0},
    "qwen2": {"attention_dropout": 0.0},
}


def _config(family: str, tiny: bool, **full: Any) -> Any:
    tf = _lib("transformers")
    cls = {"gpt2": "GPT2Config", "bert": "BertConfig", "t5": "T5Config", "vit": "ViTConfig",
           "llama": "LlamaConfig", "qwen2": "Qwen2Config"}[family]
    small = {
        "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 64},
        "bert": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
                     "vocab_size": 256, "max_position_embeddings": 64},
        "t5": {"num_layers": 2, "d_model": 64, "d_kv": 16, "num_heads": 4, "d_ff": 128, "vocab_size": 256},
        "vit": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
                    "image_size": 32, "patch_size": 8},
        "llama": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64},
        "qwen2": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64},
    }[family]
    kwargs = {**_NO_DROPOUT[family], **(small if tiny else full)}
    return getattr(tf, cls)(**kwargs)


def _transformers_model(cls: str, config: Any) -> nn.Module:
    tf = _lib("transformers")
    torch.manual_seed(0)
    try:  # sdpa where this transformers knows the argument: what a user's from_pretrained gets
        return getattr(tf, cls)._from_config(config, attn_implementation="sdpa")
    except Exception:  # noqa: BLE001 - older or newer API: the default implementation
        return getattr(tf, cls)(config)


def _lm(family: str, cls: str, batch: int, seq: int, dtype: str, field: str = "logits",
        **full: Any) -> Callable[[str, bool], Built]:
    def build(device: str, tiny: bool) -> Built:
        config = _config(family, tiny, **full)
        model = _transformers_model(cls, config).to(device, _dtype(dtype))
        b, s = (2, 16) if tiny else (batch, seq)
        return Built(Picked(model, "input_ids", field), (_ids(b, s, config.vocab_size, device),), b)
    return build


def _vit(batch: int, dtype: str) -> Callable[[str, bool], Built]:
    def build(device: str, tiny: bool) -> Built:
        config = _config("vit", tiny)
        tf = _lib("transformers")
        torch.manual_seed(0)
        model = tf.ViTModel(config, add_pooling_layer=False).to(device, _dtype(dtype))
        b = 2 if tiny else batch
        return Built(Picked(model, "pixel_values", "last_hidden_state"), (_images(b, config.image_size, _dtype(dtype), device),), b)
    return build


def _lm_train(family: str, cls: str, batch: int, seq: int, **full: Any) -> Callable[[str, bool], Built]:
    def build(device: str, tiny: bool) -> Built:
        config = _config(family, tiny, **full)
        model = _transformers_model(cls, config).to(device)
        b, s = (2, 16) if tiny else (batch, seq)
        return Built(LmLoss(model), (_ids(b, s, config.vocab_size, device),), b)
    return build


# ---------------------------------------------------------------- torchvision and timm

def _vision(lib: str, arch: str, batch: int, dtype: str, train: bool = False,
            size: int = 224) -> Callable[[str, bool], Built]:
    def build(device: str, tiny: bool) -> Built:
        torch.manual_seed(0)
        if lib == "torchvision":
            model = getattr(_lib("torchvision.models"), arch)(weights=None)
        else:
            b, s = (2, 64) if tiny else (batch, size)
            extra = {"img_size": s} if tiny and "vit" in arch else {}
            model = _lib("timm").create_model(arch, pretrained=False, **extra)
        b, s = (2, 64) if tiny else (batch, size)
        x = _images(b, s, _dtype(dtype), device)
        model = model.to(device, _dtype(dtype))
        if not train:
            return Built(model, (x,), b)
        y = torch.randint(0, 1000, (b,), generator=torch.Generator().manual_seed(1)).to(device)
        return Built(ClassifierLoss(model), (x, y), b)
    return build


def _specs() -> dict[str, ModelSpec]:
    gpt2_6 = {"n_layer": 6}
    llama = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
                 "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 1024}
    qwen2 = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
                 "num_key_value_heads": 2, "max_position_embeddings": 1024}  # its own 151936-token vocabulary
    specs = [
        # inference, transformers
        ModelSpec("gpt2", "transformers", "inference", "float32",
                  _lm("gpt2", "GPT2LMHeadModel", 4, 512, "float32"), "GPT2Config(): 12 layers; batch 4, seq 512"),
        ModelSpec("bert", "transformers", "inference", "float32",
                  _lm("bert", "BertModel", 8, 512, "float32", field="last_hidden_state"),
                  "BertConfig(): base; batch 8, seq 512"),
        ModelSpec("t5_encoder", "transformers", "inference", "float32",
                  _lm("t5", "T5EncoderModel", 8, 512, "float32", field="last_hidden_state"),
                  "T5Config(): t5-small's encoder; batch 8, seq 512"),
        ModelSpec("llama_bf16", "transformers", "inference", "bfloat16",
                  _lm("llama", "LlamaForCausalLM", 4, 512, "bfloat16", **llama),
                  "LlamaConfig 4 layers, hidden 1024, GQA 16/4; batch 4, seq 512"),
        ModelSpec("qwen2_bf16", "transformers", "inference", "bfloat16",
                  _lm("qwen2", "Qwen2ForCausalLM", 2, 512, "bfloat16", **qwen2),
                  "Qwen2Config 4 layers, hidden 1024, GQA 16/2, vocab 151936; batch 2, seq 512"),
        ModelSpec("vit", "transformers", "inference", "float32", _vit(16, "float32"),
                  "ViTConfig(): base/16 at 224; batch 16"),
        # inference, torchvision
        ModelSpec("resnet18", "torchvision", "inference", "float32", _vision("torchvision", "resnet18", 32, "float32"),
                  "batch 32, 224"),
        ModelSpec("resnet50", "torchvision", "inference", "float32", _vision("torchvision", "resnet50", 32, "float32"),
                  "batch 32, 224"),
        ModelSpec("resnet50_bf16", "torchvision", "inference", "bfloat16",
                  _vision("torchvision", "resnet50", 32, "bfloat16"), "batch 32, 224"),
        ModelSpec("densenet121", "torchvision", "inference", "float32",
                  _vision("torchvision", "densenet121", 32, "float32"), "batch 32, 224"),
        ModelSpec("mobilenet_v3_large", "torchvision", "inference", "float32",
                  _vision("torchvision", "mobilenet_v3_large", 32, "float32"), "batch 32, 224"),
        ModelSpec("efficientnet_b0", "torchvision", "inference", "float32",
                  _vision("torchvision", "efficientnet_b0", 32, "float32"), "batch 32, 224"),
        ModelSpec("convnext_tiny", "torchvision", "inference", "float32",
                  _vision("torchvision", "convnext_tiny", 32, "float32"), "batch 32, 224"),
        # inference, timm
        ModelSpec("timm_efficientnet_b0", "timm", "inference", "float32",
                  _vision("timm", "efficientnet_b0", 32, "float32"), "batch 32, 224"),
        ModelSpec("timm_vit_small_bf16", "timm", "inference", "bfloat16",
                  _vision("timm", "vit_small_patch16_224", 32, "bfloat16"), "batch 32, 224"),
        ModelSpec("timm_resnet50d_bf16", "timm", "inference", "bfloat16",
                  _vision("timm", "resnet50d", 32, "bfloat16"), "batch 32, 224"),
        # training steps: forward, backward, AdamW
        ModelSpec("gpt2_train", "transformers", "training", "float32",
                  _lm_train("gpt2", "GPT2LMHeadModel", 4, 512, **gpt2_6),
                  "GPT2Config(n_layer=6); batch 4, seq 512; its LM loss"),
        ModelSpec("bert_train", "transformers", "training", "float32",
                  _lm_train("bert", "BertForMaskedLM", 8, 256, num_hidden_layers=6),
                  "BertConfig(num_hidden_layers=6), masked-LM head; batch 8, seq 256; labels = inputs"),
        ModelSpec("resnet18_train", "torchvision", "training", "float32",
                  _vision("torchvision", "resnet18", 32, "float32", train=True), "batch 32, 224; cross entropy"),
        ModelSpec("mobilenet_v3_small_train", "torchvision", "training", "float32",
                  _vision("torchvision", "mobilenet_v3_small", 32, "float32", train=True),
                  "batch 32, 224; cross entropy"),
    ]
    return {s.name: s for s in specs}


ZOO = _specs()
GROUPS = {
    "all": tuple(ZOO),
    "inference": tuple(n for n, s in ZOO.items() if s.kind == "inference"),
    "training": tuple(n for n, s in ZOO.items() if s.kind == "training"),
    "transformers": tuple(n for n, s in ZOO.items() if s.source == "transformers" and s.kind == "inference"),
    "vision": tuple(n for n, s in ZOO.items() if s.source != "transformers" and s.kind == "inference"),
}
