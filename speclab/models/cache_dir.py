"""The speclab cache folder (converted weights, joined GGUF files, llama.cpp builds): torch-free, so that a build
step or a header read does not pay for importing torch."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The folder for converted weights: SPECLAB_CACHE, else ~/.cache/speclab (created when first needed)."""
    env = os.environ.get("SPECLAB_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "speclab"
    # The nearest existing folder on the way must be a folder, or every later mkdir fails deep inside.
    blocker = next((p for p in (root, *root.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = f"SPECLAB_CACHE={env!r}" if env else f"the weights cache {str(root)!r}"
        raise ValueError(f"{where} cannot be used: {str(blocker)!r} is a file; the cache needs a folder "
                         "(an existing one or a path that can be created)")
    return root
