"""KV-cache creation and rollback, isolated from the loop so version differences live in one place."""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty cache laid out for ``model`` that can be cut back after any pass.

    Sliding-window layers (Gemma 3) drop old states unless told to record them, and
    a cache that has dropped states cannot be rolled back past the window.
    """
    cache = DynamicCache(config=model.config)
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        cache.activate_past_recording()
    return cache


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of ``cache``.

    transformers 5 ``crop`` takes a negative number of tokens to remove (a positive
    argument is rejected); that form also works in 4.x, so it is the only one used.
    """
    n_remove = cache.get_seq_length() - length
    if n_remove < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} positions to {length}")
    if n_remove:
        cache.crop(-n_remove)


@torch.inference_mode()
def forward_logits(model: torch.nn.Module, ids: torch.Tensor, cache: DynamicCache, n_logits: int) -> torch.Tensor:
    """Run ``ids`` ([1, n]) through ``model`` on top of ``cache``; logits of the last ``n_logits`` positions [n_logits, V]."""
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=n_logits)
    return out.logits[0]
