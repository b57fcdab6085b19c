"""Our loops against transformers' own: generate() and generate(assistant_model=...).

Five arms per (round, prompt), run back to back in an order that rotates from block to
block: our plain greedy, HF generate(), our speculative loop (the prompt merged into the first
draft call and verification pass, as HF does), the same loop prefilling the prompt apart first
(``merge_prefill=False``: one pass more for each model), HF assisted generation (constant
schedule, same k, confidence threshold off). Every ratio compares two runs of
the same block, never runs taken at different times. Writes one row per run to
outputs/benchmarks/generate_comparison.parquet and prints medians of the ratios.

    python -m benchmarks.bench_generate --rounds 3 --k 4 --max-new-tokens 48
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from analysis.common import bootstrap_ci  # noqa: E402
from benchmarks.common import add_pair_arguments  # noqa: E402
from store.records import write_parquet  # noqa: E402
from pipeline.prompts.sets import encode, load_prompts  # noqa: E402
from speclab.decoding.loop import plain_greedy, speculative_generate  # noqa: E402
from speclab.models.loading import load_pair  # noqa: E402
from speclab.measures.peer import hf_generate  # noqa: E402

ARMS = ("ours_plain", "hf_generate", "ours_speculative", "ours_speculative_apart", "hf_assisted")
SCHEMA = pa.schema([
    ("round", pa.int32()), ("prompt_id", pa.string()), ("kind", pa.string()), ("arm", pa.string()),
    ("position", pa.int32()), ("k", pa.int32()), ("new_tokens", pa.int32()), ("wall_s", pa.float64()),
    ("tokens_per_s", pa.float64()), ("identical_to_ours_plain", pa.bool_()),
])


def run_arm(arm: str, pair, ids: torch.Tensor, n_new: int, k: int) -> tuple[list[int], float]:
    """New tokens and synchronised wall seconds of one arm (EOS off so every arm makes n_new tokens)."""
    if arm == "ours_plain":
        r = plain_greedy(pair.target, ids, n_new)
        return r.tokens, r.wall_s
    if arm in ("ours_speculative", "ours_speculative_apart"):
        r = speculative_generate(pair.target, pair.draft, ids, n_new, k=k, merge_prefill=arm == "ours_speculative")
        return r.tokens, r.wall_s
    return hf_generate(pair.target, ids, n_new, assistant=pair.draft if arm == "hf_assisted" else None, k=k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(ap)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--per-kind", type=int, default=2, help="prompts of each kind (0: all)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default="outputs/benchmarks/generate_comparison.parquet")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    pair = load_pair(args.target, args.draft, args.device, args.dtype, args.draft_dtype or None)
    prompts = load_prompts("default.yaml", ["prose", "code", "structured"], args.per_kind)
    vocab = pair.target.config.vocab_size
    inputs = {p.id: encode(p, pair.tokenizer, vocab, pair.device) for p in prompts}
    for arm in ARMS:  # warm-up every code path once
        run_arm(arm, pair, inputs[prompts[0].id], 8, args.k)

    rows, block = [], 0
    for rnd in range(args.rounds):
        for p in prompts:
            order = ARMS[block % len(ARMS):] + ARMS[: block % len(ARMS)]
            block += 1
            results = {arm: run_arm(arm, pair, inputs[p.id], args.max_new_tokens, args.k) for arm in order}
            ref = results["ours_plain"][0]
            for arm in order:
                toks, wall = results[arm]
                rows.append({"round": rnd, "prompt_id": p.id, "kind": p.kind, "arm": arm,
                             "position": order.index(arm), "k": args.k, "new_tokens": len(toks), "wall_s": wall,
                             "tokens_per_s": len(toks) / wall, "identical_to_ours_plain": toks == ref})
            print(f"round {rnd} {p.id:24s} " + " ".join(f"{a}={len(results[a][0]) / results[a][1]:.1f}" for a in ARMS),
                  flush=True)
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, args.out)

    wide = df.pivot_table(index=["round", "prompt_id", "kind"], columns="arm", values="tokens_per_s").reset_index()
    ratios = {
        "hf_generate / ours_plain": wide.hf_generate / wide.ours_plain,
        "ours_speculative / ours_plain": wide.ours_speculative / wide.ours_plain,
        "hf_assisted / hf_generate": wide.hf_assisted / wide.hf_generate,
        "ours_speculative / hf_assisted": wide.ours_speculative / wide.hf_assisted,
        "ours_speculative_apart / hf_assisted": wide.ours_speculative_apart / wide.hf_assisted,
        "ours_speculative / ours_speculative_apart": wide.ours_speculative / wide.ours_speculative_apart,
    }
    print(f"\nmedians over {len(wide)} blocks (each ratio within one block of adjacent runs), k={args.k}:")
    for name, r in ratios.items():
        by_kind = ", ".join(f"{kind} {r[wide.kind == kind].median():.2f}" for kind in sorted(wide.kind.unique()))
        lo, hi = bootstrap_ci(r.to_numpy())
        print(f"  {name:40s} {r.median():.3f}  [95% CI {lo:.3f}, {hi:.3f}; q25 {r.quantile(0.25):.3f}, "
              f"q75 {r.quantile(0.75):.3f}]  ({by_kind})")
    print("median tokens/s: " + ", ".join(f"{a} {df[df.arm == a].tokens_per_s.median():.1f}" for a in ARMS))
    same = df[df.arm != "ours_plain"].groupby("arm").identical_to_ours_plain.mean()
    print("share of runs identical to our plain greedy: " + ", ".join(f"{a} {v:.2f}" for a, v in same.items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
