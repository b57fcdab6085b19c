"""An engine's speed-up over its own plain decoding, predicted from its own timed costs and its own counters.

Any engine that reports, per request, the tokens it generated and the proposals it drafted and accepted (speclab's
loop, llama.cpp's server) and whose costs were timed on the same machine is priced the same way:

- ``t_T``: the target's one-token step (plain decoding's pass);
- ``t_D``: the draft's one-token step (0 for drafters that run no model: n-gram lookups);
- ``t_V(m)``: the target's pass over m new tokens at the prompt's context (the check of m - 1 proposals is a pass
  over m tokens: the pending token and the proposals), timed at whole m and interpolated linearly between them
  (a straight line from the last two timed lengths beyond them).

A request that produced ``n`` new tokens with ``drafted`` proposals of which ``accepted`` were kept made
``passes = n - accepted`` target passes (each pass yields one token of its own besides the accepted ones), with
``d = drafted / passes`` proposals per pass on average. Then

    predicted time = passes * (d * t_D + t_V(d + 1))
    plain time     = n * t_T
    speed-up       = plain time / predicted time

A request's prompt is read before either: ``with_prompt`` adds the target's prompt time to both sides and, with a
draft model, the draft's reading of the prompt to the speculative side (on short answers the prompt is a large
share of the wall time, so it pulls a measured speed-up towards 1).
The chapter's i.i.d. form, for comparison, prices an iteration of exactly k proposals each accepted with
probability alpha independently: speed-up = (1 - alpha^(k+1)) / (1 - alpha) / (k * t_D / t_T + t_V(k + 1) / t_T).

Pure numpy: the analysis and a notebook call it with numbers read from the speed and timing stages.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from speclab.costs.cost_model import expected_tokens_per_iteration


@dataclass(frozen=True)
class PassCurve:
    """Seconds of the target's pass over m new tokens, from timed whole lengths (``lengths`` ascending, ``seconds``
    beside them): linear between them, a straight line from the last two beyond the longest, the shortest's time
    below it."""

    lengths: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Mapping[float, float]) -> PassCurve:
        """From {pass length: seconds}; lengths whose time is NaN are left out. ValueError when none is left."""
        kept = sorted((float(m), float(s)) for m, s in points.items() if s == s and m == m)
        if not kept:
            raise ValueError("a pass curve needs at least one timed pass length")
        if kept[0][0] < 1:
            raise ValueError(f"pass length {kept[0][0]:g} is not allowed: a pass has at least one new token")
        return cls(tuple(m for m, _ in kept), tuple(s for _, s in kept))

    def time(self, m: float | np.ndarray) -> float | np.ndarray:
        lens, vals = np.array(self.lengths), np.array(self.seconds)
        m = np.asarray(m, dtype=float)
        out = np.interp(m, lens, vals)
        if len(lens) > 1:
            step = (vals[-1] - vals[-2]) / (lens[-1] - lens[-2])
            out = np.where(m > lens[-1], vals[-1] + step * (m - lens[-1]), out)
        return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class EngineCosts:
    """One engine's timed costs on one machine: target step ``t_T``, draft step ``t_D`` and the pass curve ``t_V``
    (whose length 1 is the target step itself, added when the curve lacks it)."""

    target_step_s: float
    draft_step_s: float
    verify: PassCurve

    @classmethod
    def from_timings(cls, target_step_s: float, draft_step_s: float, passes: Mapping[float, float]) -> EngineCosts:
        """From the target step, the draft step and {pass length m: seconds} (m = k + 1 for a check of k)."""
        return cls(float(target_step_s), float(draft_step_s),
                   PassCurve.from_points({1.0: float(target_step_s), **{float(m): s for m, s in passes.items()}}))

    def without_draft(self) -> EngineCosts:
        """The same costs for a drafter that runs no model (n-gram lookups draft for free)."""
        return EngineCosts(self.target_step_s, 0.0, self.verify)


@dataclass(frozen=True)
class Counters:
    """What one request counted: new tokens ``n``, proposals ``drafted`` and ``accepted``."""

    new_tokens: float
    drafted: float
    accepted: float

    @property
    def passes(self) -> float:
        """Target passes: each yields one token of its own besides the accepted proposals."""
        return self.new_tokens - self.accepted

    @property
    def drafted_per_pass(self) -> float:
        return self.drafted / self.passes if self.passes > 0 else float("nan")


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds with speculation and without, and their ratio (the speed-up over plain decoding)."""

    speculative_s: float
    plain_s: float
    passes: float
    drafted_per_pass: float

    @property
    def speedup(self) -> float:
        return self.plain_s / self.speculative_s if self.speculative_s > 0 else float("nan")


def predict(costs: EngineCosts, c: Counters) -> Prediction:
    """``passes * (d * t_D + t_V(d + 1))`` against ``n * t_T`` (module docstring)."""
    if c.new_tokens < 0 or c.drafted < 0 or c.accepted < 0 or c.accepted > c.drafted:
        raise ValueError(f"counters {c} are not allowed: need 0 <= accepted <= drafted and new_tokens >= 0")
    passes, d = c.passes, c.drafted_per_pass
    if passes <= 0:
        return Prediction(float("nan"), c.new_tokens * costs.target_step_s, passes, d)
    spec = passes * (d * costs.draft_step_s + costs.verify.time(d + 1.0))
    return Prediction(float(spec), c.new_tokens * costs.target_step_s, passes, d)


def with_prompt(p: Prediction, prompt_s: float, draft_prompt_s: float = 0.0) -> Prediction:
    """``p`` with the prompt read first: ``prompt_s`` (the target's) on both sides, ``draft_prompt_s`` (the draft
    model's; 0 for n-gram drafters) on the speculative side only."""
    return Prediction(p.speculative_s + prompt_s + draft_prompt_s, p.plain_s + prompt_s, p.passes, p.drafted_per_pass)


def predicted_speedups(costs: EngineCosts, new_tokens: np.ndarray, drafted: np.ndarray, accepted: np.ndarray,
                       prompt_s: np.ndarray | None = None, draft_prompt_s: np.ndarray | None = None) -> np.ndarray:
    """``predict(...).speedup`` per request over arrays of counters, each request's prompt times added
    (``with_prompt``; none when not given); NaN where a request has no pass or a counter is missing."""
    n_ = np.asarray(new_tokens, float)
    prompt = np.zeros(len(n_)) if prompt_s is None else np.nan_to_num(np.asarray(prompt_s, float))
    draft = np.zeros(len(n_)) if draft_prompt_s is None else np.nan_to_num(np.asarray(draft_prompt_s, float))
    out = []
    for n, d, a, p, q in zip(n_, np.asarray(drafted, float), np.asarray(accepted, float), prompt, draft):
        ok = n == n and d == d and a == a
        out.append(with_prompt(predict(costs, Counters(n, d, a)), p, q).speedup if ok else float("nan"))
    return np.array(out, dtype=float)


def iid_speedup(costs: EngineCosts, alpha: float, k: int) -> float:
    """The chapter's i.i.d. form at the same costs: E[tokens per pass] / (k * c_draft + c_verify(k))."""
    if not alpha == alpha or k < 1:
        return float("nan")
    t = costs.target_step_s
    return float(expected_tokens_per_iteration(alpha, k)) / (k * costs.draft_step_s / t + costs.verify.time(k + 1.0) / t)
