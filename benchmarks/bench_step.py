"""Batch-1 speed of this tree's speculative loop against a base git revision's.

The base revision is checked out into a temporary git worktree; each run is a subprocess that
imports one tree's ``speclab``, loads the pair once, warms up, then runs ``speculative_generate``
(greedy, fixed k) over the shipped prompts. Runs come in adjacent pairs (base and new, the order
alternating from pair to pair), and the speed-up is the median over pairs of the within-pair ratio
new / base of tokens per second (summed over prompts), with a bootstrap 95% interval. Every run's
tokens must equal the base run's of its pair. Writes one row per run to
outputs/benchmarks/step_speed.parquet and prints one line.

    python -m benchmarks.bench_step --pairs 10                 # the default pair, k=4, 48 new tokens
    python -m benchmarks.bench_step --tiny --pairs 2           # smoke test on tiny random models
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
from scipy import stats  # noqa: E402

from benchmarks.common import add_pair_arguments  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([
    ("pair", pa.int32()), ("arm", pa.string()), ("revision", pa.string()), ("position", pa.int32()),
    ("prompts", pa.int32()), ("new_tokens", pa.int64()), ("wall_s", pa.float64()), ("tokens_per_s", pa.float64()),
    ("identical_to_base", pa.bool_()),
])


def worker(args: argparse.Namespace) -> None:
    """One run in the tree this process imports: prints one JSON line per prompt."""
    import torch

    from pipeline.prompts.sets import encode, load_prompts
    from speclab.decoding.loop import speculative_generate
    from speclab.models.loading import load_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.draft, args.device, args.dtype)
    prompts = load_prompts("default.yaml", ["prose", "code", "structured"], args.per_kind)
    inputs = [encode(p, pair.tokenizer, pair.target.config.vocab_size, pair.device) for p in prompts]
    speculative_generate(pair.target, pair.draft, inputs[0], 8, k=args.k)  # warm-up
    for p, ids in zip(prompts, inputs):
        r = speculative_generate(pair.target, pair.draft, ids, args.max_new_tokens, k=args.k)
        print(json.dumps({"prompt_id": p.id, "tokens": r.tokens, "wall_s": r.wall_s}), flush=True)


def run(tree: Path, args: argparse.Namespace) -> list[dict]:
    """One subprocess importing ``tree``'s code (EOS off: every prompt makes max_new_tokens tokens)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--target", args.target, "--draft", args.draft,
           "--device", args.device, "--dtype", args.dtype, "--k", str(args.k), "--max-new-tokens",
           str(args.max_new_tokens), "--per-kind", str(args.per_kind), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(ap, device="cpu")
    ap.add_argument("--base", default="ee0ffea", help="the git revision to compare against")
    ap.add_argument("--pairs", type=int, default=10, help="adjacent (base, new) run pairs")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--per-kind", type=int, default=0, help="prompts of each kind (0: all)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny random models, 2 prompts per kind, 16 tokens")
    ap.add_argument("--out", default="outputs/benchmarks/step_speed.parquet")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.tiny:
        args.target, args.draft, args.per_kind, args.max_new_tokens = "tiny-random", "int8", 2, 16
    from store.records import write_parquet

    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), base_rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            rows = []
            for i in range(args.pairs):
                arms = [("base", base_tree, base_rev), ("new", ROOT, "working tree")]
                order = arms if i % 2 == 0 else arms[::-1]
                res = {name: run(tree, args) for name, tree, _ in order}
                same = [a["tokens"] == b["tokens"] for a, b in zip(res["new"], res["base"])]
                for pos, (name, _, rev) in enumerate(order):
                    n = sum(len(r["tokens"]) for r in res[name])
                    wall = sum(r["wall_s"] for r in res[name])
                    rows.append({"pair": i, "arm": name, "revision": rev, "position": pos, "prompts": len(res[name]),
                                 "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall,
                                 "identical_to_base": all(same)})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, args.out)
    wide = df.pivot(index="pair", columns="arm", values="tokens_per_s")
    ratio = (wide["new"] / wide["base"]).to_numpy()
    lo, hi = (np.nan, np.nan)
    if len(ratio) > 1:
        ci = stats.bootstrap((ratio,), np.median, n_resamples=2000, method="percentile",
                             rng=np.random.default_rng(0)).confidence_interval
        lo, hi = ci.low, ci.high
    print(f"batch-1 speed new/base ({base_rev}): median {np.median(ratio):.3f} (95% CI {lo:.3f}-{hi:.3f}) over "
          f"{len(ratio)} pairs, {args.target}/{args.draft} k={args.k} {args.max_new_tokens} tokens; "
          f"tokens/s base {wide['base'].median():.1f}, new {wide['new'].median():.1f}; "
          f"identical outputs {bool(df.identical_to_base.all())}; wrote {args.out}")


if __name__ == "__main__":
    main()
