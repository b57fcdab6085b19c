"""Batched decoding: our batched loops against the batch-1 loop, model.generate() and each other.

Every block is one batch of B consecutive prompts; its arms run back to back in an order that
rotates from block to block, and every ratio compares two runs of the same block:

- B = 1 parity: the batched speculative loop over the batch-1 loop (``speculative_generate``) on
  the same prompt at each k (goal: within 3%), and batched plain over ``plain_greedy``;
- batched plain over ``model.generate()`` on the same left-padded batch (goal: at least as fast);
- batched speculative over batched plain (throughput summed over rows) at each B and k, with the
  share of iteration time spent on the ragged layout (masks, positions, rollback, realignment).

EOS is off so that every arm makes max_new_tokens per row. Rows go to
outputs/benchmarks/batch.parquet; the table printed at the end holds medians.

    python -m benchmarks.bench_batch --rounds 2 --max-new-tokens 32 --batch-sizes 1,2,4 --ks 2,4
"""
from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from speclab.decoding.batch import BatchResult, batch_plain_generate, batch_speculative_generate  # noqa: E402
from speclab.decoding.loop import plain_greedy, speculative_generate  # noqa: E402
from speclab.models.loading import load_pair  # noqa: E402
from speclab.decoding.timing import synchronize  # noqa: E402

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "pipeline" / "prompts" / "default.yaml"
SCHEMA = pa.schema([
    ("round", pa.int32()), ("block", pa.int32()), ("batch_size", pa.int32()), ("prompt_ids", pa.string()),
    ("arm", pa.string()), ("k", pa.int32()), ("position", pa.int32()), ("new_tokens", pa.int64()),
    ("wall_s", pa.float64()), ("tokens_per_s", pa.float64()), ("iterations", pa.int32()),
    ("acceptance_rate", pa.float64()), ("iter_s", pa.float64()), ("layout_s_per_iter", pa.float64()),
    ("mask_s_per_iter", pa.float64()), ("rollback_s_per_iter", pa.float64()), ("realign_s_per_iter", pa.float64()),
    ("layout_share", pa.float64()), ("masked_share", pa.float64()), ("identical_to_plain", pa.bool_()),
])


def load_prompt_texts(path: Path) -> list[tuple[str, str]]:
    """(id, text) of each prompt in a prompt YAML file (a list of entries with id, kind, text)."""
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("text") for e in entries):
        raise ValueError(f"{path}: expected a list of entries with 'id' and a non-empty 'text'")
    return [(str(e.get("id", i)), str(e["text"])) for i, e in enumerate(entries)]


def left_pad(ids: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The padded batch generate() gets: input ids and attention mask, padding on the left."""
    n = max(x.shape[0] for x in ids)
    out = torch.zeros((len(ids), n), dtype=torch.long, device=ids[0].device)
    mask = torch.zeros_like(out)
    for b, x in enumerate(ids):
        out[b, n - x.shape[0]:] = x
        mask[b, n - x.shape[0]:] = 1
    return out, mask


def hf_generate_batch(model: torch.nn.Module, ids: list[torch.Tensor], n_new: int) -> tuple[list[list[int]], float]:
    """model.generate() greedy on the left-padded batch, EOS off: new tokens per row, synchronised seconds."""
    inp, mask = left_pad(ids)
    gc = copy.deepcopy(model.generation_config)
    gc.update(do_sample=False, max_new_tokens=n_new, min_new_tokens=None, eos_token_id=None, pad_token_id=0,
              temperature=None, top_p=None, top_k=None)
    synchronize(inp.device)
    t0 = time.perf_counter()
    out = model.generate(inp, attention_mask=mask, generation_config=gc)
    synchronize(inp.device)
    return out[:, inp.shape[1]:].tolist(), time.perf_counter() - t0


def batch_columns(res: BatchResult) -> dict:
    its = res.iterations
    n = max(1, len(its))
    total = sum(i.total_s for i in its)
    return {"iterations": len(its), "acceptance_rate": res.acceptance_rate, "iter_s": total / n,
            "layout_s_per_iter": sum(i.layout_s for i in its) / n, "mask_s_per_iter": sum(i.mask_s for i in its) / n,
            "rollback_s_per_iter": sum(i.rollback_s for i in its) / n,
            "realign_s_per_iter": sum(i.realign_s for i in its) / n, "layout_share": res.layout_share,
            "masked_share": sum(i.masked_share for i in its) / n}


def run_arm(arm: str, k: int, pair, ids: list[torch.Tensor], n_new: int) -> tuple[list[list[int]], float, dict]:
    """Tokens per row, synchronised wall seconds and statistics of one arm on one batch."""
    if arm == "plain":
        r = batch_plain_generate(pair.target, ids, n_new)
        return r.tokens, r.wall_s, batch_columns(r)
    if arm == "speculative":
        r = batch_speculative_generate(pair.target, pair.draft, ids, n_new, k)
        return r.tokens, r.wall_s, batch_columns(r)
    if arm == "hf_generate":
        toks, wall = hf_generate_batch(pair.target, ids, n_new)
        return toks, wall, {}
    if arm == "loop_plain":  # batch 1 only
        r1 = plain_greedy(pair.target, ids[0][None], n_new)
        return [r1.tokens], r1.wall_s, {"iterations": len(r1.step_s)}
    if arm == "loop_speculative":  # batch 1 only
        r1 = speculative_generate(pair.target, pair.draft, ids[0][None], n_new, k=k)
        its = r1.iterations
        return [r1.tokens], r1.wall_s, {"iterations": len(its), "acceptance_rate": r1.acceptance_rate,
                                        "iter_s": sum(i.total_s for i in its) / max(1, len(its))}
    raise ValueError(f"unknown arm {arm!r}")


def arms_for(b: int, ks: list[int]) -> list[tuple[str, int]]:
    arms = [("plain", 0), ("hf_generate", 0)] + [("speculative", k) for k in ks]
    if b == 1:
        arms += [("loop_plain", 0)] + [("loop_speculative", k) for k in ks]
    return arms


def ratios(df: pd.DataFrame, num: tuple[str, int], den: tuple[str, int]) -> pd.Series:
    """Within-block tokens/s ratios num / den."""
    wide = df.pivot_table(index="block", columns=["arm", "k"], values="tokens_per_s")
    if num not in wide.columns or den not in wide.columns:
        return pd.Series(dtype=float)
    return (wide[num] / wide[den]).dropna()


def summary(df: pd.DataFrame, ks: list[int]) -> list[str]:
    def q(s: pd.Series) -> str:
        return f"{s.median():.3f} [{s.quantile(.25):.3f}, {s.quantile(.75):.3f}]" if len(s) else "n/a"

    lines = []
    for b, at_b in df.groupby("batch_size", sort=True):
        med = at_b.groupby(["arm", "k"]).tokens_per_s.median()
        vs_hf = q(ratios(at_b, ("plain", 0), ("hf_generate", 0)))
        lines.append(f"B={b} ({at_b.block.nunique()} blocks): tokens/s summed over rows: plain {med[('plain', 0)]:.1f}, "
                     f"generate() {med[('hf_generate', 0)]:.1f}; plain / generate() {vs_hf}")
        for k in ks:
            spec = at_b[(at_b.arm == "speculative") & (at_b.k == k)]
            ms = {c: 1e3 * spec[c].median() for c in ("layout_s_per_iter", "iter_s", "mask_s_per_iter",
                                                       "rollback_s_per_iter", "realign_s_per_iter")}
            lines.append(f"  k={k}: speculative {med[('speculative', k)]:.1f} tok/s, over plain "
                         f"{q(ratios(at_b, ('speculative', k), ('plain', 0)))}, alpha {spec.acceptance_rate.mean():.2f}, "
                         f"layout {100 * spec.layout_share.median():.2f}% of iteration time "
                         f"({ms['layout_s_per_iter']:.2f} ms of {ms['iter_s']:.1f} ms; masks/positions "
                         f"{ms['mask_s_per_iter']:.2f}, rollback {ms['rollback_s_per_iter']:.2f}, realign "
                         f"{ms['realign_s_per_iter']:.2f}), masked KV share {100 * spec.masked_share.median():.1f}%")
        if b == 1:
            lines.append(f"  B=1 parity: batched plain / plain_greedy {q(ratios(at_b, ('plain', 0), ('loop_plain', 0)))}")
            for k in ks:
                r = ratios(at_b, ("speculative", k), ("loop_speculative", k))
                ok = "within 3%" if len(r) and abs(r.median() - 1) <= 0.03 else "NOT within 3%"
                lines.append(f"  B=1 parity k={k}: batched speculative / speculative_generate {q(r)} ({ok})")
    lines.append(f"runs identical to batched plain: {df[df.arm != 'plain'].identical_to_plain.mean():.0%}")
    return lines


def write(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(df[SCHEMA.names], schema=SCHEMA, preserve_index=False)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)  # a reader never sees a half-written file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="int8")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="prompt YAML (list of id/kind/text entries)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--blocks-per-size", type=int, default=2, help="batches of consecutive prompts per B and round")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default="outputs/benchmarks/batch.parquet")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    ks = [int(x) for x in args.ks.split(",")]

    pair = load_pair(args.target, args.draft, args.device)
    texts = load_prompt_texts(Path(args.prompts))
    if pair.tokenizer is None:  # tiny random models: bytes stand in for tokens
        vocab = pair.target.config.vocab_size
        inputs = [torch.tensor([c % vocab for c in t.encode()[:64]], device=pair.device) for _, t in texts]
    else:
        inputs = [pair.tokenizer(t, return_tensors="pt").input_ids[0].to(pair.device) for _, t in texts]
    for arm, k in arms_for(1, ks) + arms_for(2, ks)[2:]:  # warm-up: every code path once
        run_arm(arm, k, pair, inputs[:1] if arm.startswith("loop") else inputs[:2], 8)

    rows, block = [], 0
    for rnd in range(args.rounds):
        for b in sizes:
            arms = arms_for(b, ks)
            for j in range(args.blocks_per_size):
                start = (rnd * args.blocks_per_size + j) * b  # a different group of prompts in every block
                group = [(start + i) % len(texts) for i in range(b)]
                ids = [inputs[i] for i in group]
                shift = block % len(arms)
                order = arms[shift:] + arms[:shift]
                results = {a: run_arm(a[0], a[1], pair, ids, args.max_new_tokens) for a in order}
                ref = results[("plain", 0)][0]
                for pos, a in enumerate(order):
                    toks, wall, cols = results[a]
                    n = sum(len(t) for t in toks)
                    rows.append({"round": rnd, "block": block, "batch_size": b,
                                 "prompt_ids": ",".join(texts[i][0] for i in group), "arm": a[0], "k": a[1],
                                 "position": pos, "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall,
                                 **{c: float("nan") for c in ("acceptance_rate", "iter_s", "layout_s_per_iter",
                                                              "mask_s_per_iter", "rollback_s_per_iter",
                                                              "realign_s_per_iter", "layout_share", "masked_share")},
                                 "iterations": 0, **cols, "identical_to_plain": toks == ref})
                print(f"round {rnd} B={b} block {block}: " + " ".join(
                    f"{a[0]}{a[1] or ''}={sum(map(len, results[a][0])) / results[a][1]:.1f}" for a in arms), flush=True)
                block += 1
    df = pd.DataFrame(rows)
    write(df, Path(args.out))
    print(f"\nmedians of within-block ratios [q25, q75], {args.rounds} rounds, {args.max_new_tokens} new tokens "
          f"per row, torch threads {torch.get_num_threads()}:")
    for line in summary(df, ks):
        print(line)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
