"""What the benchmark scripts share: the model-pair options of their command lines."""
from __future__ import annotations

import argparse


def add_pair_arguments(ap: argparse.ArgumentParser, device: str = "auto") -> None:
    """--target, --draft, --device and --dtype, with the embedded default pair (speclab.models.load_pair)."""
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="int8")
    ap.add_argument("--device", default=device)
    ap.add_argument("--dtype", default="float32")
