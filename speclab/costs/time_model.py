"""A time model of speculative and plain decoding, calibrated on pass timings and acceptance traces.

The chapter's i.i.d. formula prices an iteration at k draft steps plus one verification pass, all
at one context length, and counts tokens with a geometric series. What it leaves out, and this
model puts back:

- pass times depend on the pass length n *and* on the context: ``PassModel`` holds a table over n
  (jagged on CPUs: a 3-token pass can cost more than a 5-token one) and a per-n context slope;
- both models prefill the prompt (the draft's prefill is work plain decoding never does); with a
  merged prefill (the loop's default) the target's is its first verification pass, over the prompt
  and the first proposals, and the draft's is its first call, over the prompt;
- the draft's first call of an iteration is a catch-up pass of 1 token after a rejection, 2 after an
  all-accepted iteration (more after a hybrid's lookup iterations), not a one-token step;
- tokens per iteration come from the *observed* iterations (``Trace``), so bursts, EOS and the
  token budget's short last iteration are what they were, not an i.i.d. average;
- the loop's own per-iteration work (the acceptance check, rollback, bookkeeping) and the in-loop
  cost of a pass relative to the same pass timed alone (``LoopCosts``).

Pure numpy: usable from a notebook; the pipeline's plan stage and the analysis call it with numbers
read from the timing and acceptance stages.
Same concept, other floor: ``analysis/time_model.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from speclab.costs.cost_model import expected_tokens_per_iteration


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of y on x; a flat line through the mean when x does not vary."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0:
        return float(np.mean(y)), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


@dataclass(frozen=True)
class PassModel:
    """Seconds for one forward pass of n new tokens on top of ctx cached tokens, and for a prefill.

    ``at_ref[n]``: the pass time at context ``ctx_ref``; ``slope[n]``: seconds per extra context
    token (0 when only one context was timed); ``prefill`` = (intercept, seconds per token) of a
    pass into an empty cache. Lengths beyond the table extrapolate from its last two entries.
    """

    at_ref: dict[int, float]
    slope: dict[int, float]
    ctx_ref: float
    prefill: tuple[float, float]

    def _at(self, table: dict[int, float], n: np.ndarray) -> np.ndarray:
        lens = np.array(sorted(table))
        vals = np.array([table[m] for m in lens])
        out = np.interp(n, lens, vals)
        if len(lens) > 1:  # straight line beyond the last timed length
            step = (vals[-1] - vals[-2]) / (lens[-1] - lens[-2])
            out = np.where(n > lens[-1], vals[-1] + step * (n - lens[-1]), out)
        return out

    def time(self, n: np.ndarray | int, ctx: np.ndarray | float) -> np.ndarray:
        n = np.asarray(n, float)
        return self._at(self.at_ref, n) + self._at(self.slope, n) * (np.asarray(ctx, float) - self.ctx_ref)

    def prefill_time(self, n: np.ndarray | int) -> np.ndarray:
        a, b = self.prefill
        return np.maximum(a + b * np.asarray(n, float), 0.0)

    def scaled(self, factor: float) -> "PassModel":
        """Every time multiplied by ``factor``: the same model on a machine that runs this model
        ``factor`` times slower (a drift of the machine's state moves all pass lengths together)."""
        return PassModel({n: factor * v for n, v in self.at_ref.items()}, {n: factor * v for n, v in self.slope.items()},
                         self.ctx_ref, (factor * self.prefill[0], factor * self.prefill[1]))

    @classmethod
    def fit(cls, pass_len: np.ndarray, context_len: np.ndarray, seconds: np.ndarray) -> "PassModel":
        """From timing rows of one model: rows with context_len 0 are prefills, the others passes."""
        pass_len, context_len, seconds = (np.asarray(a, float) for a in (pass_len, context_len, seconds))
        is_pass = context_len > 0
        if not is_pass.any():
            raise ValueError("no pass timings (rows with context_len > 0): the time model needs them")
        ctx_ref = float(np.mean(context_len[is_pass]))
        at_ref, slope = {}, {}
        for n in np.unique(pass_len[is_pass]):
            sel = is_pass & (pass_len == n)
            a, b = _ols(context_len[sel] - ctx_ref, seconds[sel])
            at_ref[int(n)], slope[int(n)] = a, max(b, 0.0)  # a longer context never makes a pass cheaper
        pre = ~is_pass
        if pre.any() and np.ptp(pass_len[pre]) >= 8:
            prefill = _ols(pass_len[pre], seconds[pre])
        elif pre.any():  # lengths too close to fit a slope: proportional to the tokens
            prefill = (0.0, float(np.mean(seconds[pre] / pass_len[pre])))
        else:  # no prefill timed: a prefill of n tokens priced as a pass of n tokens at the reference context
            prefill = (0.0, at_ref[max(at_ref)] / max(at_ref))
        return cls(at_ref, slope, ctx_ref, prefill)


@dataclass(frozen=True)
class LoopCosts:
    """What the loop adds to the isolated passes, measured from its own per-iteration timings.

    ``target_scale`` / ``draft_scale``: in-loop time over the same passes timed alone (the argmax,
    the acceptance check, the per-call Python of the drafter, a cache that grows instead of being
    cut back to one length). Measured on verification passes, ``target_scale`` prices plain
    decoding's steps too: they are target passes in a generation loop as well; ``lookup_s``: one n-gram lookup;
    ``rollback_s`` and ``bookkeeping_s``: per iteration.
    """

    target_scale: float = 1.0
    draft_scale: float = 1.0
    lookup_s: float = 0.0
    rollback_s: float = 0.0
    bookkeeping_s: float = 0.0


@dataclass(frozen=True)
class Trace:
    """The iterations of one speculative run, as the acceptance stage records them."""

    prompt_len: int
    proposed: np.ndarray
    new_tokens: np.ndarray
    length: np.ndarray  # tokens before each iteration (prompt included)
    draft_fed: np.ndarray  # tokens in the draft model's first call (0: the model did not run)
    draft_calls: np.ndarray
    uses_model: bool  # the drafter holds a draft model (it prefills the prompt)
    uses_lookup: bool  # the drafter tries an n-gram lookup every iteration
    merged: bool = False  # the prompt rode in the first iteration's passes (no prefill apart)
    # A tree draft (speclab.trees.tree_loop): its calls after the first feed a level of nodes (``call_width``
    # tokens each, on average; None: one, as a chain's steps), and its check runs every node (``nodes``;
    # None: the proposals) through the tree mask's pass (``TimeModel.tree`` when timed).
    call_width: np.ndarray | None = None
    nodes: np.ndarray | None = None
    tree: bool = False

    @property
    def checked_width(self) -> np.ndarray:
        """Proposals in each iteration's verification pass (besides the pending token)."""
        return self.proposed if self.nodes is None else self.nodes

    @property
    def tokens(self) -> int:
        return int(np.sum(self.new_tokens))

    @classmethod
    def from_counts(cls, prompt_len: int, proposed: np.ndarray, accepted: np.ndarray, new_tokens: np.ndarray,
                    merged: bool = False) -> "Trace":
        """The trace of a draft-model run from its per-iteration counts alone (acceptance rows written
        before the trace columns): the draft runs every proposal, and its first call catches up 2
        tokens after an all-accepted iteration, 1 otherwise (merged: the whole prompt, the first time)."""
        proposed, accepted, new_tokens = (np.asarray(a, int) for a in (proposed, accepted, new_tokens))
        all_in = (accepted == proposed) & (proposed > 0)
        fed = np.where(proposed > 0, np.r_[prompt_len if merged else 1, np.where(all_in[:-1], 2, 1)], 0)
        length = prompt_len + np.r_[0, np.cumsum(new_tokens)[:-1]]
        return cls(prompt_len, proposed, new_tokens, length, fed, proposed.copy(), True, False, merged)

    def cold_draft(self) -> np.ndarray:
        """Iterations whose draft call starts from an empty cache (merged: its first model call runs the
        prompt): a prefill, priced as one."""
        return (self.draft_calls > 0) & (self.length == self.draft_fed) & self.merged

    def prompt_verify(self) -> np.ndarray:
        """Iterations whose verification pass also runs the prompt (merged: the first)."""
        return (np.arange(len(self.proposed)) == 0) & self.merged


PARTS = ("prefill_target", "prefill_draft", "draft_steps", "catch_up", "lookup", "verify", "rollback", "bookkeeping")


@dataclass(frozen=True)
class Decomposition:
    """Where a run's time goes, in seconds."""

    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))


@dataclass(frozen=True)
class TimeModel:
    target: PassModel
    draft: PassModel | None
    loop: LoopCosts = LoopCosts()
    tree: PassModel | None = None  # the target's pass over a tree (its 4D mask) by nodes + 1; None: as a chain's

    def at_steps(self, target_step_s: float, draft_step_s: float | None, ctx: float) -> "TimeModel":
        """This model re-priced at a machine state where a one-token step after ``ctx`` tokens takes
        ``target_step_s`` (target) and ``draft_step_s`` (draft): each pass model is scaled by the
        ratio of that step to its own. The loop's costs are kept (they are ratios, or microseconds)."""
        scale = (lambda m, s: m.scaled(s / float(m.time(1, ctx))) if m is not None and s is not None else m)
        factor = target_step_s / float(self.target.time(1, ctx)) if target_step_s is not None else 1.0
        return TimeModel(scale(self.target, target_step_s), scale(self.draft, draft_step_s), self.loop,
                         None if self.tree is None else self.tree.scaled(factor))

    def speculative(self, tr: Trace) -> Decomposition:
        """Predicted wall time of the run the trace describes, by part."""
        t, d = (self.tree if tr.tree and self.tree is not None else self.target), self.draft
        return price_speculative(tr, np.ones(len(tr.proposed)), lambda n, ctx, rows: t.time(n, ctx),
                                 None if d is None else (lambda n, ctx, rows: d.time(n, ctx)), self.target.prefill_time,
                                 None if d is None else d.prefill_time, self.loop)

    def plain(self, prompt_len: int, new_tokens: int) -> Decomposition:
        """Predicted wall time of plain decoding: a prefill of the prompt, then one step per further token."""
        return price_plain(prompt_len, np.ones(max(new_tokens - 1, 0)), lambda n, ctx, rows: self.target.time(n, ctx),
                           self.target.prefill_time, self.loop.target_scale)

    def speedup(self, tr: Trace) -> float:
        """Predicted tokens/s of the speculative run over plain decoding of the same tokens."""
        return self.plain(tr.prompt_len, tr.tokens).total / self.speculative(tr).total

    def iid(self, alpha: float, k: int, uses_model: bool = True) -> float:
        """The chapter's formula with this model's costs at its reference context: c_draft = draft step /
        target step (0 without a draft model), c_verify = target pass over k + 1 tokens / target step."""
        t, ref = self.target, self.target.ctx_ref
        t1 = float(t.time(1, ref))
        c_draft = float(self.draft.time(1, ref)) / t1 if uses_model and self.draft is not None else 0.0
        return iid_speedup(alpha, k, c_draft, float(t.time(k + 1, ref)) / t1)


PassTime = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (pass length, context, rows) -> seconds


def price_speculative(tr: Trace, rows: np.ndarray, target: PassTime, draft: PassTime | None,
                      target_prefill: Callable, draft_prefill: Callable | None, lp: LoopCosts) -> Decomposition:
    """The parts of a speculative run's time: ``tr``'s iterations, ``rows[i]`` rows in iteration i (all
    ones for batch 1: ``TimeModel``; a batch in lockstep: ``speclab.costs.batch_time_model``), passes priced
    by ``target`` / ``draft``, prefills (``*_prefill(n)``, the batch's rows bound in) by the others."""
    prefill_n = 0 if tr.merged else max(tr.prompt_len - 1, 0)  # the prefill apart, of all but the last token
    calls, fed = tr.draft_calls.astype(float), tr.draft_fed.astype(float)
    cold = tr.cold_draft()
    ran, with_prompt = (calls > 0) & ~cold, tr.prompt_verify()
    parts = dict.fromkeys(PARTS, 0.0)
    if prefill_n:
        parts["prefill_target"] = float(target_prefill(prefill_n))
    width = tr.checked_width
    if with_prompt.any():  # the first check runs the prompt and the proposals: a prefill of both
        parts["prefill_target"] = float(np.sum(target_prefill(tr.prompt_len + width[with_prompt])))
    if (tr.uses_model and prefill_n) or cold.any():
        if draft_prefill is None:
            raise ValueError("a trace with a draft model needs a draft PassModel")
        parts["prefill_draft"] = (float(draft_prefill(prefill_n)) if prefill_n else
                                  float(np.sum([draft_prefill(int(n)) for n in fed[cold]])))
    if (calls > 0).any():
        if draft is None:
            raise ValueError("a trace with draft calls needs a draft PassModel")
        # The draft cache holds length - fed tokens when its first call starts; a cold start's first
        # call is its prefill, priced above, and only its further calls are steps.
        steps = np.where(cold, calls - 1, calls)
        # A chain's calls after the first are one-token steps; a tree's feed a level of nodes each.
        one = draft(1 if tr.call_width is None else np.maximum(tr.call_width, 1), tr.length + (calls - 1) / 2, rows)
        ctx0, r = tr.length[ran] - fed[ran], rows[ran]
        parts["draft_steps"] = lp.draft_scale * float(np.sum((steps * one)[calls > 0]))
        parts["catch_up"] = lp.draft_scale * float(np.sum(draft(fed[ran], ctx0, r) - draft(1, ctx0, r)))
    if tr.uses_lookup:  # one lookup per row and iteration
        parts["lookup"] = lp.lookup_s * float(np.sum(rows))
    checks = ~with_prompt
    parts["verify"] = lp.target_scale * float(np.sum(target(width[checks] + 1, tr.length[checks] - 1, rows[checks])))
    parts["rollback"] = lp.rollback_s * len(tr.proposed)
    parts["bookkeeping"] = lp.bookkeeping_s * len(tr.proposed)
    return Decomposition(parts)


def price_plain(prompt_len: int, rows: np.ndarray, target: PassTime, target_prefill: Callable,
                target_scale: float) -> Decomposition:
    """Plain decoding: a prefill of the prompt, then one target step per further token, ``rows[s]`` rows in step s."""
    steps = np.arange(1, len(rows) + 1)
    return Decomposition({"prefill_target": float(target_prefill(prompt_len)),
                          "verify": target_scale * float(np.sum(target(1, prompt_len + steps - 1, rows)))})


def iid_speedup(alpha: float, k: int, c_draft: float, c_verify: float) -> float:
    """The chapter's reference: E[tokens] under i.i.d. acceptance over k draft steps plus one check."""
    return float(expected_tokens_per_iteration(alpha, k)) / (k * c_draft + c_verify)


@dataclass(frozen=True)
class CostTable:
    """An iteration's price in target steps, for a k policy choosing k while it runs.

    ``draft[n]``: the draft's call over n tokens (1: a step; 2: the catch-up after an all-accepted
    iteration), ``verify[k]``: the pass over k + 1 tokens, ``overhead``: the loop's own work; all
    divided by one target step.
    """

    draft: dict[int, float]
    verify: dict[int, float]
    overhead: float = 0.0

    def iteration_cost(self, k: int, alpha: float, p_all: float | None = None) -> float:
        """``p_all``: the chance the previous iteration accepted everything (so this one catches up 2
        tokens); by default alpha^k, the i.i.d. value with k steady."""
        p_all = alpha ** k if p_all is None else p_all
        first = (1 - p_all) * self.draft[1] + p_all * self.draft.get(2, self.draft[1])
        return first + (k - 1) * self.draft[1] + self.verify[k] + self.overhead

    def _ks(self, k_min: int, k_max: int) -> list[int]:
        ks = [k for k in range(k_min, k_max + 1) if k in self.verify]
        if not ks:
            raise ValueError(f"no verification cost for k in {k_min}..{k_max}: the table has {sorted(self.verify)}")
        return ks

    def speedup(self, alpha: float, k: int) -> float:
        """Tokens per target step at k under i.i.d. acceptance: over 1, speculating beats plain steps."""
        return float(expected_tokens_per_iteration(alpha, k)) / self.iteration_cost(k, alpha)

    def speedup_for_survival(self, survival: np.ndarray, k: int) -> float:
        """Tokens per target step at k when ``survival[j]`` = P(the first j + 1 proposals are all
        accepted), j = 0..: the empirical counterpart of alpha^(j+1), so runs of agreement (bursts)
        are priced as observed. Tokens per iteration at k: 1 + sum of survival[:k]."""
        return (1.0 + float(np.sum(survival[:k]))) / self.iteration_cost(k, 0.0, float(survival[k - 1]))

    def best_k(self, alpha: float, k_min: int, k_max: int) -> int:
        return max(self._ks(k_min, k_max), key=lambda k: self.speedup(alpha, k))

    def best_k_for_survival(self, survival: np.ndarray, k_min: int, k_max: int) -> int:
        """The best k for per-position survival probabilities (``speedup_for_survival``)."""
        return max(self._ks(k_min, min(k_max, len(survival))), key=lambda k: self.speedup_for_survival(survival, k))


def calibrate_loop(model: TimeModel, traces: list[Trace], draft_s: list[np.ndarray], verify_s: list[np.ndarray],
                   rollback_s: list[np.ndarray], total_s: list[np.ndarray]) -> LoopCosts:
    """The loop's costs from its own per-iteration times (the acceptance stage's), given the pass models.

    Scales are ratios of summed in-loop time to summed isolated pass time (so long passes weigh
    more, as they do in a run); per-iteration costs are medians, robust to a stray slow iteration.
    """
    t, d = model.target, model.draft
    ver_meas = ver_pred = dr_meas = dr_pred = 0.0
    lookups, rollbacks, books = [], [], []
    for tr, ds, vs, rs, ts in zip(traces, draft_s, verify_s, rollback_s, total_s):
        if tr.tree:  # the scales are the chain loop's; a tree's wider calls and pass are priced by width
            continue
        # A merged prefill's first iteration is priced as the prefills: its passes are not loop passes.
        checks = ~tr.prompt_verify()
        ver_meas += float(np.sum(vs[checks]))
        ver_pred += float(np.sum(t.time(tr.proposed[checks] + 1, tr.length[checks] - 1)))
        ran = (tr.draft_calls > 0) & ~tr.cold_draft()
        if ran.any() and d is not None:
            calls, fed = tr.draft_calls[ran].astype(float), tr.draft_fed[ran].astype(float)
            dr_meas += float(np.sum(ds[ran]))
            dr_pred += float(np.sum((calls - 1) * d.time(1, tr.length[ran] + (calls - 1) / 2)
                                    + d.time(fed, tr.length[ran] - fed)))
        if tr.uses_lookup:
            lookups.append(ds[tr.draft_calls == 0])
        rollbacks.append(rs)
        books.append(ts - ds - vs - rs)
    med = (lambda xs: float(np.median(np.concatenate(xs))) if xs and sum(map(len, xs)) else 0.0)
    return LoopCosts(target_scale=ver_meas / ver_pred if ver_pred else 1.0,
                     draft_scale=dr_meas / dr_pred if dr_pred else 1.0,
                     lookup_s=med(lookups), rollback_s=med(rollbacks), bookkeeping_s=med(books))
