"""What the benchmark scripts share: the model-pair options of their command lines, and the shipped
prompts' plain greedy continuations (what the exact lookup replays run on)."""
from __future__ import annotations

import argparse
from collections.abc import Iterator


def add_pair_arguments(ap: argparse.ArgumentParser, device: str = "auto") -> None:
    """--target, --draft, --device, --dtype and --draft-dtype, with the embedded default pair
    (speclab.models.loading.load_pair)."""
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="int8")
    ap.add_argument("--device", default=device)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft-dtype", default="", help="a draft loaded by name: its own dtype (empty: --dtype)")


def greedy_continuations(pair, prompts_file: str, max_new_tokens: int) -> Iterator[tuple[object, list[int], list[int]]]:
    """(prompt, its token ids, its plain greedy continuation) for each prompt of every kind in ``prompts_file``.

    Greedy speculative output equals plain greedy, so a drafter without a model can be replayed on these
    exactly, without timing anything."""
    from pipeline.prompts.sets import encode, load_prompts
    from speclab.decoding.loop import plain_greedy

    for p in load_prompts(prompts_file, ["prose", "code", "structured"]):
        ids = encode(p, pair.tokenizer, pair.target.config.vocab_size, pair.device)
        yield p, ids[0].tolist(), plain_greedy(pair.target, ids, max_new_tokens, pair.eos_token_id).tokens


def stage_prompt_requests(target: str, per_kind: int) -> list[tuple[str, str, list[int]]]:
    """The speed stage's prompts as (id, kind, token ids), made as the stage makes them (the target's tokenizer, the
    default set's raw texts, ``per_kind`` of each kind)."""
    from pipeline.prompts.sets import encode, load_prompts
    from speclab.models.loading import load_tokenizer

    tok = load_tokenizer(target)
    prompts = load_prompts("default.yaml", ["prose", "code", "structured"], per_kind)
    return [(p.id, p.kind, encode(p, tok, len(tok), "cpu")[0].tolist()) for p in prompts]


def print_adjacent_ratios(df, comparisons: list[tuple[str, str, str]]) -> None:
    """Per comparison (arm a, arm b, what): each arm's median tokens/s and the median of the per-prompt ratios a / b
    within a round, with a bootstrap interval."""
    import numpy as np

    from analysis.common import bootstrap_ci

    wide = df.pivot_table(index=["round", "prompt_id"], columns="arm", values="tokens_per_s")
    for a, b, what in comparisons:
        ratio = (wide[a] / wide[b]).dropna().to_numpy()
        lo, hi = bootstrap_ci(ratio, np.median)
        print(f"{what}: {a} {df[df.arm == a].tokens_per_s.median():.2f} tok/s, {b} "
              f"{df[df.arm == b].tokens_per_s.median():.2f} tok/s; ratio median {np.median(ratio):.3f} "
              f"(95% CI {lo:.3f}-{hi:.3f}, n={len(ratio)})")


def alternating_rounds(rounds: int, other: str, stage_rows, other_rows, interleaved_rows) -> list[dict]:
    """Per round, the whole stage job (``stage_rows(r)``: its speed rows) and the other arm (``other_rows()``) in
    alternating order, then ``interleaved_rows(r)``; each request a row with its round, arm and position."""
    import numpy as np

    rows = []
    for r in range(rounds):
        order = ("stage", other) if r % 2 == 0 else (other, "stage")
        for position, arm in enumerate(order):
            if arm == "stage":
                got = [{"prompt_id": p.prompt_id, "kind": p.kind, "new_tokens": int(p.new_tokens),
                        "wall_s": float(p.wall_s), "tokens_per_s": float(p.tokens_per_s)}
                       for p in stage_rows(r).itertuples()]
            else:
                got = other_rows()
            rows += [{"round": r, "arm": arm, "position": position, **g} for g in got]
            print(f"round {r} {arm}: median {np.median([g['tokens_per_s'] for g in got]):.2f} tok/s", flush=True)
        rows += interleaved_rows(r)
    return rows
