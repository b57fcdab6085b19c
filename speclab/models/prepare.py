"""Prepare packaged models once: join their GGUF (parted models), dequantize and cache them as safetensors.

    python -m speclab.models.prepare qwen2.5-coder-1.5b qwen2.5-coder-0.5b

Loading a model does the same on first use; this makes the slow first time explicit (``make qwen``)
and reports what was prepared: the cache folder, its size, the parameter count and the seconds taken.
It then checks the cache's every byte against the sha256 recorded at conversion (a load checks crc32 by
default, speclab/models/cache_files.py) and says how long that took. A cache that fails a load's check is
rebuilt by that load, so this command also rebuilds a damaged or unrecorded cache.
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from speclab.models.cache_files import check_folder  # noqa: E402
from speclab.models.size import model_size  # noqa: E402
from speclab.models.loading import PACKAGED_GGUF, PARTED_GGUF, _cache_folder, load_model  # noqa: E402


def prepare(name: str) -> str:
    """One line on the prepared model (loading it builds the cache when it is missing)."""
    start = time.perf_counter()
    model, _ = load_model(name, torch.device("cpu"), torch.float32)
    folder = _cache_folder(name)
    size = sum(f.stat().st_size for f in folder.iterdir())
    size_in_memory = model_size(model)
    checked = time.perf_counter()
    found = check_folder(folder, "sha256")
    if found.state != "ok":
        raise ValueError(f"weights cache {str(folder)!r} of model {name!r} fails its sha256 check right after "
                         f"loading ({found.detail or found.state}): delete that folder and run "
                         f"python -m speclab.models.prepare {name} again")
    return (f"{name}: {size_in_memory.params / 1e6:,.0f}M parameters, {size_in_memory.layers} layers, cache {folder} "
            f"({size / 2**30:.2f} GiB, sha256 of every file checked in {time.perf_counter() - checked:.1f} s), "
            f"ready in {time.perf_counter() - start:.0f} s")


def main(names: list[str]) -> None:
    allowed = sorted([*PACKAGED_GGUF, *PARTED_GGUF])
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        sys.exit(f"unknown packaged model {unknown[0]!r}: allowed are {allowed}" if unknown
                 else f"name the models to prepare: {allowed}")
    for name in names:
        try:
            print(prepare(name), flush=True)
        except (ValueError, FileNotFoundError) as err:  # one line: a damaged part, a missing package, ...
            sys.exit(f"speclab.models.prepare: error: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])
