"""A model's config read by name without loading its weights: what a check before the load can size it by.

Sources, by how a model is named (``speclab.models.loading.model_source``): a tiny random model's own config; a
local folder's or a cached hub id's ``config.json``; a packaged model's converted cache folder, or before
its first conversion the header of its GGUF file (the first part of a parted one). None where nothing can be
read cheaply (a packaged model whose GGUF must first be assembled and was never converted).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speclab.models.gguf_header import config_from_gguf
from speclab.models.loading import PACKAGED_GGUF, PARTED_GGUF, cache_root, model_source, tiny_random_fields

GGUF_TYPES = {"gemma3": "gemma3_text"}  # a GGUF architecture -> transformers' model type, where they differ


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _packaged_header(name: str) -> Path | None:
    """A packaged model's GGUF (or its first part), found without importing or assembling anything."""
    import importlib.util

    try:
        if name in PARTED_GGUF:
            return PARTED_GGUF[name].part_path(1)
        _, module, filename = PACKAGED_GGUF[name]
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if filename is None or spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / filename


def model_config(name: str) -> tuple[dict[str, Any] | None, str]:
    """The config of the model ``name`` as a dict, and where it was read; (None, why) when it cannot be read
    before the model loads. A bad name raises model_source's one-line ValueError."""
    kind, source = model_source(name)
    if kind == "tiny":
        return ({**tiny_random_fields(), "model_type": "llama", "architectures": ["LlamaForCausalLM"]},
                "the tiny random model's config")
    if kind == "folder":
        return _json(Path(source) / "config.json"), f"{source}/config.json"
    if kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(name, "config.json")
        if isinstance(path, str):
            return _json(Path(path)), "its cached config.json"
        return None, "no cached config.json"
    for path in sorted(cache_root().glob(f"{name}-*/config.json")):
        found = _json(path)
        if found:
            return found, str(path)
    header = _packaged_header(name)
    if header is not None and header.is_file():
        try:
            config = config_from_gguf(header)
        except (OSError, ValueError):
            return None, f"unreadable GGUF header {header}"
        config["model_type"] = GGUF_TYPES.get(config.get("model_type", ""), config.get("model_type"))
        return config, f"the GGUF header of {header.name}"
    return None, "not converted yet"
