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
