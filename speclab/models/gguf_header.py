"""A GGUF file's model dimensions, read from its header without touching its tensors (no torch).

Only the metadata at the start of the file is read; arrays (the tokenizer's tokens and merges) are skipped
but for their length, which is the vocabulary. The header sits at the start, so the first part of a file
split into parts holds it too.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
# value type -> struct format of a scalar (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_KEYS = 10_000


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def take(self, fmt: str) -> Any:
        n = struct.calcsize("<" + fmt)
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("the header ends early")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self.take("Q")
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("the header ends early")
        return data.decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == STRING:
                for _ in range(count):
                    self.f.seek(self.take("Q"), 1)
            elif item in SCALARS:
                self.f.seek(count * struct.calcsize("<" + SCALARS[item]), 1)
            else:
                raise ValueError(f"array of value type {item}")
            return ("array", count)
        raise ValueError(f"value type {kind}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The header's key/value pairs (an array's value: ``("array", length)``). ValueError on a file that is
    not GGUF or ends inside its header."""
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        r = _Reader(f)
        version = r.take("I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not read here")
        r.take("Q")  # tensors
        n_keys = r.take("Q")
        if n_keys > MAX_KEYS:
            raise ValueError(f"{n_keys} header keys")
        out = {}
        for _ in range(n_keys):
            key = r.string()
            out[key] = r.value(r.take("I"))
        return out


def config_from_gguf(path: str | Path) -> dict[str, Any]:
    """The transformers config keys that size a model, from a GGUF header (the keys it lacks are left out)."""
    meta = read_metadata(path)
    arch = str(meta.get("general.architecture", ""))

    def get(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = get("vocab_size") or (tokens[1] if isinstance(tokens, tuple) else None)
    heads = get("attention.head_count")
    config = {"model_type": arch, "vocab_size": vocab, "hidden_size": get("embedding_length"),
              "num_hidden_layers": get("block_count"), "num_attention_heads": heads,
              "num_key_value_heads": get("attention.head_count_kv") or heads,
              "head_dim": get("attention.key_length"), "intermediate_size": get("feed_forward_length"),
              "max_position_embeddings": get("context_length"), "sliding_window": get("attention.sliding_window")}
    return {k: v for k, v in config.items() if v is not None and not isinstance(v, tuple)}
