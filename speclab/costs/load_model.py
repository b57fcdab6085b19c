"""The time model under a load of concurrent requests: speculation's latency and throughput gains at B requests
decoded together, from measured costs and acceptance.

An engine that batches B requests runs one pass over the new tokens of all of them: a plain step is a pass over B
tokens (one per request), a speculative iteration k draft steps over B tokens and a check over B x (k + 1). Each
pass is priced by the engine's own pass over that many new tokens on one sequence (``PassCurve``: the weights are
read once per pass whatever the batch; what grows is the compute over its tokens), on the straight line between the
lengths timed, and beyond the longest on the line through its last two. Where the plain step at that load is
measured (``plain_step_s``: plain decoding's time per output token at B requests), every pass is scaled by its ratio
to the curve's T(B): what the engine adds per step for B sequences (sampling, scheduling) is added to speculation's
passes alike. A request takes its time to first token plus (n - 1) steps:

    plain:        ttft + (n - 1) * P(B)
    speculative:  ttft * (1 + D(L) / T(L)) + (n - 1) * s * (k * D(B) + T(B * (k + 1))) / tau

with P(B) the plain step (measured, else T(B)), s = P(B) / T(B), tau the tokens a target pass yields (the engine's
counters: tokens over passes), D the draft's pass curve (none for a drafter that runs no model), whose model also
reads the prompt: at the ratio of the two models' longest passes timed (L), a prompt's read. The latency gain is
plain over speculative; in a closed loop each client's throughput is its tokens over its latency (Little's law sums
the clients), so the throughput gain is the same ratio. At B = 1 this is the batch-1 model: the gain falls as B
grows because T(B (k + 1)) grows faster than T(B) once a pass is no longer bound by reading the weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PassCurve:
    """Seconds of one pass over n new tokens, at the lengths timed."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) < 2 or len(self.tokens) != len(self.seconds) or min(self.tokens) < 1:
            raise ValueError(f"a pass curve needs two pass lengths >= 1 or more with a time each: got "
                             f"{list(self.tokens)} and {list(self.seconds)}")

    def __call__(self, n: float) -> float:
        x, y = np.asarray(self.tokens, float), np.asarray(self.seconds, float)
        order = np.argsort(x)
        x, y = x[order], y[order]
        if n <= x[-1]:
            return float(np.interp(n, x, y))
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
        return float(y[-1] + slope * (n - x[-1]))


@dataclass(frozen=True)
class LoadPrediction:
    load: int
    plain_step_s: float      # one plain step of the batch: a request's time per output token
    spec_token_s: float      # a speculative iteration over the tokens it yields a request
    latency_gain: float
    throughput_gain: float
    plain_latency_s: float   # a request's time to first token plus its steps, plain
    spec_latency_s: float    # and speculative


def predict_load(target: PassCurve, draft: PassCurve | None, load: int, k: int, tokens_per_pass: float,
                 new_tokens: float, ttft_s: float, plain_step_s: float | None = None) -> LoadPrediction:
    """The gains at ``load`` requests decoded together (see the module's docstring)."""
    if load < 1 or k < 1 or tokens_per_pass < 1 or new_tokens < 1:
        raise ValueError(f"load {load}, k {k}, tokens per pass {tokens_per_pass} and new tokens {new_tokens} are not "
                         "allowed: need load >= 1, k >= 1, tokens per pass >= 1, new tokens >= 1")
    measured = plain_step_s is not None and plain_step_s == plain_step_s and plain_step_s > 0
    plain = float(plain_step_s) if measured else target(load)
    scale = plain / target(load)
    drafting = k * draft(load) if draft is not None else 0.0
    spec = scale * (drafting + target(load * (k + 1))) / tokens_per_pass
    ttft = max(float(ttft_s), 0.0) if ttft_s == ttft_s else 0.0
    longest = min(max(target.tokens), max(draft.tokens)) if draft is not None else 0
    spec_ttft = ttft * (1 + draft(longest) / target(longest)) if draft is not None else ttft
    steps = new_tokens - 1
    plain_latency, spec_latency = ttft + steps * plain, spec_ttft + steps * spec
    gain = plain_latency / spec_latency
    return LoadPrediction(load, plain, spec, gain, gain, plain_latency, spec_latency)
