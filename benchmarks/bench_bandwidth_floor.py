"""How close does each engine's plain decoding come to the machine's memory bandwidth?

A plain decoding step reads every weight of the target once, so its time is at least the weights' bytes over the
machine's read bandwidth: a ceiling on plain tokens/s. This measures the bandwidth here (the best of torch summing a
1 GiB tensor on every core, bf16 and fp32, and numpy on one, median of repeats each) and sets each engine's
measured plain decoding speed from a campaign's speed rows (the median over plain runs of new tokens over the
request's time after its prompt) against the ceiling of the weights that engine reads: speclab's loop and vLLM the
pair's target in its dtype (parameters x bytes per parameter), llama.cpp its GGUF file. Writes
outputs/benchmarks/bandwidth_floor.parquet and prints one line per engine.

    python -m benchmarks.bench_bandwidth_floor --campaign engines --pair qwen25_coder_bf16
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from store.records import write_parquet

OUT = Path("outputs/benchmarks/bandwidth_floor.parquet")
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SCHEMA = pa.schema([("engine", pa.string()), ("pair", pa.string()), ("weights", pa.string()),
                    ("weight_bytes", pa.int64()), ("bandwidth_gb_s", pa.float64()), ("floor_step_ms", pa.float64()),
                    ("ceiling_tokens_per_s", pa.float64()), ("plain_decode_tokens_per_s", pa.float64()),
                    ("plain_runs", pa.int32()), ("share_of_ceiling", pa.float64())])


def bandwidth(repeats: int = 7) -> dict[str, float]:
    """GB/s read by each method (median of ``repeats`` after one warm-up): torch sums and matrix-vector products
    (a decode step's shape) on every core, numpy's sum on one; 1 GiB each."""
    out = {}
    x32, x16 = torch.ones(2**14), torch.ones(2**14, dtype=torch.bfloat16)
    for name, make, reduce in (
            ("torch_bf16_sum", lambda: torch.ones(2**29, dtype=torch.bfloat16), lambda t: t.sum()),
            ("torch_fp32_sum", lambda: torch.ones(2**28, dtype=torch.float32), lambda t: t.sum()),
            ("torch_fp32_gemv", lambda: torch.ones(2**14, 2**14), lambda w: w @ x32),  # a decode step's shape
            ("torch_bf16_gemv", lambda: torch.ones(2**15, 2**14, dtype=torch.bfloat16), lambda w: w @ x16),
            ("numpy_fp32_sum", lambda: np.ones(2**28, dtype=np.float32), lambda a: a.sum())):
        data = make()
        size = data.element_size() * data.numel() if hasattr(data, "element_size") else data.nbytes
        times = []
        for i in range(repeats + 1):
            start = time.perf_counter()
            reduce(data)
            if i:
                times.append(time.perf_counter() - start)
        out[name] = size / statistics.median(times) / 1e9
        del data
    return out


def target_bytes(engine: str, rows: pd.DataFrame, target: str) -> tuple[str, int]:
    """The weights the engine reads per step and their bytes."""
    from speclab.models.loading import packaged_folder, packaged_gguf_path
    if engine == "llama_cpp":
        path = packaged_gguf_path(target)
        return f"gguf {path.name}", path.stat().st_size
    dtype = str(rows.dtype.iloc[0]).removeprefix("vllm:")
    folder = packaged_folder(target)
    config = json.loads((folder / "config.json").read_text())
    from safetensors import safe_open
    shapes = {}
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            shapes.update({key: int(np.prod(st.get_slice(key).get_shape())) for key in st.keys()})
    params = sum(shapes.values())
    # a step reads one row of the input embedding; the head reads its whole matrix (the embedding's, when tied)
    embed = sum(v for k, v in shapes.items() if k.endswith("embed_tokens.weight"))
    has_head = any(k.endswith("lm_head.weight") for k in shapes) or not config.get("tie_word_embeddings", True)
    read = params - embed if has_head else params
    return f"{dtype} ({read / 1e9:.2f}B parameters read per step)", read * BYTES.get(dtype, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign", default="engines")
    ap.add_argument("--pair", default="qwen25_coder_bf16")
    ap.add_argument("--outputs", default="outputs")
    args = ap.parse_args()
    files = sorted(Path(args.outputs, "campaigns", args.campaign, "speed").glob(f"{args.pair}-*.parquet"))
    if not files:
        raise SystemExit(f"no speed rows of {args.pair} in campaign {args.campaign}")
    speed = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    plain = speed[(speed.arm == "plain") & ~speed.do_sample.astype(bool)]
    bw = bandwidth()
    best = max(bw.values())
    print("read bandwidth: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in bw.items()) + f"; the floor uses {best:.1f}")
    rows = []
    for engine, g in plain.groupby("engine", sort=True):
        weights, size = target_bytes(engine, g, str(g.target.iloc[0]))
        decode = (g.new_tokens / (g.wall_s - g.prefill_s)).median()
        ceiling = best * 1e9 / size
        rows.append({"engine": engine, "pair": args.pair, "weights": weights, "weight_bytes": size,
                     "bandwidth_gb_s": best, "floor_step_ms": 1e3 * size / (best * 1e9),
                     "ceiling_tokens_per_s": ceiling, "plain_decode_tokens_per_s": float(decode),
                     "plain_runs": len(g), "share_of_ceiling": float(decode) / ceiling})
        r = rows[-1]
        print(f"{engine}: {weights}, {size / 1e9:.2f} GB per step: floor {r['floor_step_ms']:.0f} ms, ceiling "
              f"{ceiling:.1f} tok/s; plain decoding {decode:.1f} tok/s ({len(g)} runs) = "
              f"{100 * r['share_of_ceiling']:.0f}% of it")
    write_parquet(pd.DataFrame(rows), SCHEMA, OUT)
    print(f"rows: {OUT}")


if __name__ == "__main__":
    main()
