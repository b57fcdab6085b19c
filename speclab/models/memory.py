"""Memory a decoding shape needs, estimated from a model's dimensions before anything is allocated (no torch).

A shape is one forward pass (a tree's verification, a chain's, a batch's, a timed pass) plus the caches it
grows. The estimate is deliberately on the high side: one layer's attention scores and softmax in float32
(what the eager and CPU math paths materialise), the tree's boolean visibility matrix beside the additive
4D mask transformers takes, the logits and their probabilities in float32, the whole KV cache after the pass
and one layer's copy while it grows. It answers "could this take the machine down?", not "how much will it use".
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

GIB = 2**30
FLOAT32 = 4
PY_CANDIDATE = 120  # bytes of one dynamic-tree candidate in the drafter's Python lists (ints, a float, list slots)


@dataclass(frozen=True)
class ModelDims:
    """What a model's memory scales with. ``exact``: read from its config; False: a conservative stand-in."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    positions: int | None  # the model's context (max_position_embeddings); None: unknown
    dtype_bytes: float = 4.0
    tied: bool = False
    exact: bool = True

    @property
    def kv_per_token(self) -> float:
        """KV-cache bytes one position adds over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return (self.layers * (attn + mlp) + (1 if self.tied else 2) * self.vocab * self.hidden) * self.dtype_bytes

    def with_bytes(self, dtype_bytes: float) -> "ModelDims":
        return replace(self, dtype_bytes=dtype_bytes)


# A model whose config cannot be read before it loads: sizes of a large model, for the per-shape terms only
# (its weights are then not counted).
CONSERVATIVE = ModelDims(vocab=262144, hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128,
                         intermediate=28672, positions=None, dtype_bytes=4.0, exact=False)


@dataclass(frozen=True)
class PassCost:
    """The bytes of one forward pass over ``rows`` x ``queries`` new tokens on top of a cache, by part."""

    mask: float
    scores: float
    activations: float
    logits: float
    cache: float

    @property
    def total(self) -> float:
        return self.mask + self.scores + self.activations + self.logits + self.cache

    def parts(self) -> str:
        named = (("attention mask", self.mask), ("attention scores", self.scores), ("logits", self.logits),
                 ("KV cache", self.cache), ("activations", self.activations))
        return ", ".join(f"{name} {size(b)}" for name, b in sorted(named, key=lambda x: -x[1]) if b >= 0.05 * GIB)


def pass_cost(d: ModelDims, rows: int, queries: int, columns: int, logits: int, tree: bool = False) -> PassCost:
    """One pass of ``rows`` x ``queries`` tokens over ``columns`` cache columns (the new ones included), with
    logits at ``logits`` positions per row. ``tree``: a custom visibility matrix is built besides the 4D mask."""
    cells = float(rows) * queries * columns
    return PassCost(
        mask=cells * ((1 if tree else 0) + d.dtype_bytes),
        scores=cells * d.heads * FLOAT32 * 2,
        activations=float(rows) * queries * (6 * d.hidden + 3 * d.intermediate) * d.dtype_bytes,
        logits=float(rows) * logits * d.vocab * FLOAT32 * 2,
        cache=float(rows) * columns * d.kv_per_token + float(rows) * columns * d.kv_per_token / max(d.layers, 1))


def size(n: float) -> str:
    """Bytes as a short human figure: 48 GiB, 1.2 TiB, 310 MiB."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 10 else f"{v:,.0f} {unit}"
    return f"{n / 1024:.0f} KiB"


def available_memory(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """The machine's available memory (MemAvailable: free plus what the kernel can reclaim), in bytes; None
    where it cannot be read."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def saturating_product(values: list[int], cap: int = 10**18) -> int:
    out = 1
    for v in values:
        out = min(out * v, cap)
    return out


def _first(config: dict, *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def dims_from_config(config: dict | None, dtype_bytes: float = 4.0) -> ModelDims | None:
    """A model's dimensions from its config (transformers' keys and the older GPT-style ones); None when a
    size it needs is missing. A multimodal config is sized by its text model."""
    if not config:
        return None
    text = config.get("text_config")
    c = {**config, **text} if isinstance(text, dict) else config
    vocab, hidden = _first(c, "vocab_size", "padded_vocab_size"), _first(c, "hidden_size", "n_embd", "d_model")
    layers = _first(c, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = _first(c, "num_attention_heads", "n_head", "n_heads")
    if not (vocab and hidden and layers and heads):
        return None
    return ModelDims(vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                     kv_heads=_first(c, "num_key_value_heads", "n_head_kv", "num_kv_heads") or heads,
                     head_dim=_first(c, "head_dim") or max(hidden // heads, 1),
                     intermediate=_first(c, "intermediate_size", "n_inner", "ffn_hidden_size") or 4 * hidden,
                     positions=_first(c, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
                     dtype_bytes=dtype_bytes, tied=bool(c.get("tie_word_embeddings", False)))
