"""Prepare packaged models once: join their GGUF (parted models), dequantize and cache them as safetensors.

    python -m speclab.prepare qwen2.5-coder-1.5b qwen2.5-coder-0.5b

Loading a model does the same on first use; this makes the slow first time explicit (``make qwen``)
and reports what was prepared: the cache folder, its size, the parameter count and the seconds taken.
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from speclab.model_size import model_size  # noqa: E402
from speclab.models import PACKAGED_GGUF, PARTED_GGUF, _cache_folder, load_model  # noqa: E402


def prepare(name: str) -> str:
    """One line on the prepared model (loading it builds the cache when it is missing)."""
    start = time.perf_counter()
    model, _ = load_model(name, torch.device("cpu"), torch.float32)
    folder = _cache_folder(name)
    size = sum(f.stat().st_size for f in folder.iterdir())
    size_in_memory = model_size(model)
    return (f"{name}: {size_in_memory.params / 1e6:,.0f}M parameters, {size_in_memory.layers} layers, cache {folder} "
            f"({size / 2**30:.2f} GiB), ready in {time.perf_counter() - start:.0f} s")


def main(names: list[str]) -> None:
    allowed = sorted([*PACKAGED_GGUF, *PARTED_GGUF])
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        sys.exit(f"unknown packaged model {unknown[0]!r}: allowed are {allowed}" if unknown
                 else f"name the models to prepare: {allowed}")
    for name in names:
        print(prepare(name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
