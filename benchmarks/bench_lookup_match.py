"""How often prompt lookup's proposals are accepted, by the length of the n-gram that matched.

The evidence behind ``k_policy.condition_on=match``: greedy speculative output equals plain greedy, so
on each prompt's plain greedy continuation every position's lookup proposal (up to ``--k`` tokens,
longest n-gram first, as ``PromptLookupDrafter``) and how many of its tokens greedy decoding accepts
are known exactly, without timing anything. Writes one row per (kind, matched n-gram length) to
outputs/benchmarks/lookup_match_acceptance.parquet and prints it.

    python -m benchmarks.bench_lookup_match --max-new-tokens 48 --k 8
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import add_pair_arguments, greedy_continuations  # noqa: E402
from store.records import write_parquet  # noqa: E402
from speclab.decoding.drafters import lookup_match  # noqa: E402
from speclab.models.loading import load_pair  # noqa: E402

SCHEMA = pa.schema([
    ("kind", pa.string()), ("ngram", pa.int32()), ("positions", pa.int32()), ("prompts", pa.int32()),
    ("first_accepted", pa.float64()), ("mean_accepted", pa.float64()), ("k", pa.int32()),
])


def positions(prompt: list[int], new: list[int], k: int, max_ngram: int) -> list[tuple[int, int]]:
    """(matched n-gram length, proposals greedy decoding accepts) at every position of the continuation."""
    seq, out = torch.tensor(prompt + new), []
    for length in range(len(prompt), len(prompt) + len(new) - 1):
        n, start = lookup_match(seq[:length], max_ngram)
        proposal = seq[start: min(start + k, length)] if n else seq.new_empty(0)
        truth = seq[length: length + len(proposal)]
        proposal = proposal[: len(truth)]
        out.append((n, int(torch.cumprod((proposal == truth).int(), 0).sum()) if len(proposal) else 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(ap)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-ngram", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", default="default.yaml", help="a file in pipeline/prompts/ or a path")
    ap.add_argument("--out", default="outputs/benchmarks/lookup_match_acceptance.parquet")
    args = ap.parse_args()
    pair = load_pair(args.target, args.draft, args.device, args.dtype)
    rows = []
    for p, prompt, new in greedy_continuations(pair, args.prompts, args.max_new_tokens):
        rows += [{"kind": p.kind, "prompt_id": p.id, "ngram": n, "accepted": a}
                 for n, a in positions(prompt, new, args.k, args.max_ngram)]
    df = pd.DataFrame(rows)
    table = pd.concat([df, df.assign(kind="all")]).groupby(["kind", "ngram"]).agg(
        positions=("accepted", "size"), prompts=("prompt_id", "nunique"),
        first_accepted=("accepted", lambda a: float((a > 0).mean())),
        mean_accepted=("accepted", "mean")).reset_index().assign(k=args.k)
    write_parquet(table, SCHEMA, args.out)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {args.out} (n-gram 0: no earlier match, no proposal)")


if __name__ == "__main__":
    main()
