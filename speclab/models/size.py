"""How big a model is as held in memory: parameter count, weight bytes, decoder layers.

A draft's cost over the target's is often guessed from their sizes; the timing stage records these so the
analysis can set the measured cost ratio beside the bytes and layer ratios.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelSize:
    """``params``: weight elements (float and quantized); ``bytes``: what they occupy; ``layers``: decoder
    layers (``config.num_hidden_layers``, None when the model has no such config)."""

    params: int
    bytes: int
    layers: int | None


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors in a state_dict value: a tensor, or (int8 dynamic Linear's packed params) a tuple of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _key(t: torch.Tensor) -> tuple:
    """Identity of a tensor's memory, so tied weights (one storage, two names) count once."""
    try:
        return (t.device.type, t.data_ptr(), t.numel(), t.element_size())
    except RuntimeError:  # a tensor kind without a data pointer: count it by object
        return ("object", id(t))


def model_size(model: torch.nn.Module) -> ModelSize:
    """Parameter count, weight bytes and decoder layers of ``model`` as it sits in memory.

    Read from ``state_dict()`` rather than ``parameters()``: a dynamically quantized Linear keeps its int8
    weight and its bias in packed params (a tuple in the state_dict), which ``parameters()`` never lists,
    so an int8 draft would look like its embeddings and norms alone. Buffers a model persists are counted
    with the weights (they are held in memory too); shared storage counts once.
    """
    # A quantized module's own scale and zero point describe its output, not a weight.
    quantized = {f"{name}.{attr}" for name, m in model.named_modules() if hasattr(m, "_packed_params")
                 for attr in ("scale", "zero_point")}
    seen: set[tuple] = set()
    params = n_bytes = 0
    for name, value in model.state_dict(keep_vars=False).items():
        if name in quantized:
            continue
        for t in _tensors(value):
            if not (t.is_floating_point() or t.is_quantized):
                continue  # integer bookkeeping (counters, indices) is not a weight
            key = _key(t)
            if key in seen:
                continue
            seen.add(key)
            params += t.numel()
            n_bytes += t.numel() * t.element_size()
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    return ModelSize(params=int(params), bytes=int(n_bytes), layers=int(layers) if layers is not None else None)
