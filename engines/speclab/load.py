"""speclab's own batched loop (speclab.decoding.batch) serving a load: waves of ``concurrency`` requests decoded as
one batch, the next wave sent when the last one ends. A static batch, not continuous batching: a request waits for
its wave's longest, which is what the loop users can deploy does (the engines' servers refill a slot at once).
Same concept, other floors: ``pipeline/stages/load.py``, ``analysis/load.py``.
"""
from __future__ import annotations

import time

from pipeline.engines.base import LoadRefused, RequestResult
from pipeline.engines.closed_loop import LoadRun, Sent
from pipeline.jobs.context import StageContext, generator, sampling_config
from speclab.decoding.batch import BatchResult, batch_plain_generate, batch_speculative_generate
from speclab.specs.arms import Arm


def wave(ctx: StageContext, arm: Arm, ids: list, gen) -> BatchResult:
    """One batch of requests through plain decoding or the arm's chain."""
    pair, cfg = ctx.pair, ctx.cfg
    n_new, sampling = int(cfg.max_new_tokens), sampling_config(cfg)
    if arm.method == "plain":
        return batch_plain_generate(pair.target, ids, n_new, sampling, pair.eos_token_id, gen)
    if not arm.ours or arm.is_tree:
        raise LoadRefused(f"speclab's batched loop serves chains of its own drafters only, not {arm.label}: "
                          "give stage.arms entries of drafter model, prompt_lookup or hybrid")
    s = ctx.strategy(arm.k, arm.drafter, arm.k_policy)
    return batch_speculative_generate(pair.target, s.drafter, ids, n_new, s.policy, sampling, pair.eos_token_id, gen,
                                      merge_prefill=bool(cfg.merge_prefill))


def serve_waves(ctx: StageContext, arm: Arm, inputs: list, concurrency: int) -> LoadRun:
    """``inputs`` in waves of ``concurrency``; every request of a wave starts and ends with it. Ctrl-C ends the load:
    the wave in flight is one batch, lost with it; the waves done are kept."""
    gen = generator(ctx)
    wave(ctx, arm, [inputs[0]], gen)  # warm: first calls allocate and pick kernels
    run = LoadRun(concurrency)
    began = time.perf_counter()
    try:
        for first in range(0, len(inputs), concurrency):
            index = list(range(first, min(first + concurrency, len(inputs))))
            start = time.perf_counter() - began
            res = wave(ctx, arm, [inputs[i] for i in index], gen)
            end = time.perf_counter() - began
            run.most_in_flight = max(run.most_in_flight, len(index))
            for row, i in enumerate(index):
                toks = res.tokens[row]
                run.sent.append(Sent(i, row, start, end, RequestResult(
                    toks, end - start, res.prefill_s, res.wall_s - res.prefill_s, drafted=res.proposed[row],
                    accepted=res.accepted[row], passes=len(res.iterations) if arm.method != "plain" else None)))
    except KeyboardInterrupt:
        run.stopped = "interrupted (Ctrl-C): the wave in flight is lost, the waves before it kept"
    if run.sent:
        run.wall_s = max(s.ended_s for s in run.sent) - min(s.started_s for s in run.sent)
    return run
