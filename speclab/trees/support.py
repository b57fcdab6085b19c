"""Whether a model can verify a tree in one pass: its attention must take a custom 4-D mask and explicit
position ids. Decided from the model's class and config, so a pipeline can ask before any weights load.

ALiBi models (Bloom, MPT, Falcon with ``alibi``) build their position biases from a 2-D padding mask and the
column order: Bloom and Falcon fail inside transformers on a 4-D mask, MPT silently scores every node as if
the tree were one sequence. A model whose forward takes no ``position_ids`` cannot place siblings at one depth.
"""
from __future__ import annotations

import inspect
from typing import Any

ALIBI_TYPES = ("bloom", "mpt")  # ALiBi by architecture, whatever their config says
# Model types whose causal LM takes position_ids and a 4-D mask (tests/test_shape_bounds.py checks each against
# transformers' class): asked before a load, they answer without importing the modeling code (about a second).
TREE_READY_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2", "gpt_neox")


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def uses_alibi(config: Any) -> bool:
    return bool(_get(config, "model_type") in ALIBI_TYPES or _get(config, "alibi")
                or _get(_get(config, "attn_config") or {}, "alibi")
                or _get(config, "position_embedding_type") == "alibi")


def tree_mask_problem(cls: type, config: Any) -> str | None:
    """Why a ``cls`` model with ``config`` cannot verify a tree (one clause naming its architecture), or None."""
    kind = _get(config, "model_type") or "?"
    if uses_alibi(config):
        return (f"{cls.__name__} ({kind}) adds ALiBi position biases built from a 2-D attention mask and takes no "
                "4-D tree mask")
    forward = getattr(cls, "forward", None)
    try:
        params = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        params = {}
    if "position_ids" not in params:
        return f"{cls.__name__} ({kind}) takes no position_ids, so a tree's siblings cannot share a position"
    return None


def known_tree_ready(config: Any) -> bool:
    """Whether ``config``'s architecture is known to verify trees, so its class need not be imported to ask."""
    return _get(config, "model_type") in TREE_READY_TYPES and not uses_alibi(config)


def causal_lm_class(config: dict[str, Any]) -> type | None:
    """The transformers class a config's causal LM loads as (its ``architectures``, else its model type's
    AutoModelForCausalLM entry); None when transformers has none."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = [*(config.get("architectures") or []), MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(config.get("model_type")))]
    for name in names:
        if name:
            try:
                cls = getattr(transformers, name, None)
            except (ImportError, AttributeError):
                cls = None
            if isinstance(cls, type):
                return cls
    return None
