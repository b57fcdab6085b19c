"""Keeping only the accepted root path of a tree in a KV cache: a per-layer gather of its slots, then a crop."""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from speclab.decoding.cache import crop_to


def check_plain_cache(cache: DynamicCache, model: torch.nn.Module) -> None:
    """Slot surgery is exact only on plain full-attention layers (sliding or linear layers keep other state)."""
    odd = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
    if odd:
        raise ValueError(f"{type(model).__name__} has cache layers {odd}: a tree draft needs plain full-attention "
                         "layers (DynamicLayer); use a chain (drafter model, prompt_lookup or hybrid)")


@torch.inference_mode()  # the cache's tensors were made in inference mode (the loops): updated in place only there
def keep_path(cache: DynamicCache, start: int, slots: list[int]) -> None:
    """Keep the cache's first ``start`` positions followed by the positions ``slots`` (ascending, each
    >= start), moved to ``start, start + 1, ...``; everything after them goes."""
    if slots != list(range(start, start + len(slots))):
        for layer in cache.layers:
            if layer.keys is None or layer.keys.numel() == 0:
                continue
            idx = torch.tensor(slots, dtype=torch.long, device=layer.keys.device)
            end = start + len(slots)
            # Advanced indexing copies first, so overlapping source and destination are safe.
            layer.keys[:, :, start:end] = layer.keys[:, :, idx]
            layer.values[:, :, start:end] = layer.values[:, :, idx]
    crop_to(cache, start + len(slots))
