"""The time model of ``speclab.costs.time_model`` for B rows decoded together (``speclab.decoding.batch``).

A batched run is its rows' traces run in lockstep: iteration i holds the rows whose trace is longer
than i (finished rows leave the batch), proposes the largest k any of them proposes (the batched loop
shares one k, cut only when the least advanced row nears the budget), feeds the draft the widest
catch-up (pending tokens are right-aligned in one shared width) and sees the longest row's context
(rows are padded to it). Every pass is then priced by the pass time over (rows in the batch) x (new
tokens per row), and the prompts' prefills over B rows x the longest prompt. With one row this is
exactly ``TimeModel`` (both price with ``price_speculative`` / ``price_plain``).

Pass times are measured at a few batch sizes (the batch stage's pass rows); a batch that has shrunk
to a size between two of them is priced on the straight line between the two.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from speclab.costs.time_model import (Decomposition, LoopCosts, PassModel, TimeModel, Trace, _ols, price_plain,
                                price_speculative)


@dataclass(frozen=True)
class BatchPassModel:
    """Seconds for one pass over ``rows`` rows x n new tokens on top of ctx cached tokens, and for a prefill.

    ``by_rows[b]``: the pass model timed at batch size b. ``prefill``: (intercept, seconds per token
    of the whole batch, rows x n), when prefills were priced apart from the passes (see
    ``with_prefill``); otherwise each batch size's own ``PassModel.prefill``.
    """

    by_rows: dict[int, PassModel]
    prefill: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not self.by_rows or min(self.by_rows) < 1:
            raise ValueError(f"by_rows={sorted(self.by_rows)} is not allowed: give a PassModel for batch sizes >= 1")

    def _over_rows(self, rows: np.ndarray | int, per_size) -> np.ndarray:
        """``per_size(model)`` at each measured batch size, on the straight line between the two nearest to ``rows``."""
        sizes = np.array(sorted(self.by_rows))
        vals = [np.asarray(per_size(self.by_rows[b]), float) for b in sizes]
        if len(sizes) == 1:
            return vals[0] + np.zeros(np.shape(rows))
        rows = np.asarray(rows, float)
        vals = np.stack(np.broadcast_arrays(*vals, rows)[:-1])
        hi = np.clip(np.searchsorted(sizes, rows, side="right"), 1, len(sizes) - 1)
        w = (rows - sizes[hi - 1]) / (sizes[hi] - sizes[hi - 1])
        lower = np.take_along_axis(vals, (hi - 1)[None], 0)[0]
        upper = np.take_along_axis(vals, hi[None], 0)[0]
        return np.where(w == 1, upper, lower + w * (upper - lower))

    def time(self, rows: np.ndarray | int, n: np.ndarray | int, ctx: np.ndarray | float) -> np.ndarray:
        return self._over_rows(rows, lambda m: m.time(n, ctx))

    def prefill_time(self, rows: int, n: np.ndarray | int) -> np.ndarray:
        if self.prefill is not None:
            a, b = self.prefill
            return np.maximum(a + b * rows * np.asarray(n, float), 0.0)
        return self._over_rows(rows, lambda m: m.prefill_time(n))

    def with_prefill(self, intercept: float, per_token: float) -> "BatchPassModel":
        return replace(self, prefill=(float(intercept), float(per_token)))

    @classmethod
    def fit(cls, batch_size: np.ndarray, pass_len: np.ndarray, context_len: np.ndarray,
            seconds: np.ndarray) -> "BatchPassModel":
        """``PassModel.fit`` at every batch size of the timing rows of one model."""
        batch_size = np.asarray(batch_size)
        return cls({int(b): PassModel.fit(np.asarray(pass_len)[batch_size == b], np.asarray(context_len)[batch_size == b],
                                          np.asarray(seconds)[batch_size == b]) for b in np.unique(batch_size)})


@dataclass(frozen=True)
class BatchTrace(Trace):
    """The iterations of a batched run: ``Trace``'s columns for the batch as a whole (``proposed``,
    ``draft_fed``, ``draft_calls``: the largest over its rows; ``length``: the longest row's;
    ``new_tokens``: summed over rows; ``prompt_len``: the longest prompt), and ``rows`` in each iteration."""

    rows: np.ndarray = field(default_factory=lambda: np.ones(0, int))  # always given: lockstep builds it

    @property
    def batch_size(self) -> int:
        return int(self.rows[0]) if len(self.rows) else 1

    @classmethod
    def lockstep(cls, traces: list[Trace]) -> "BatchTrace":
        """The batch that runs ``traces`` (one per row, each as that row ran alone) together."""
        if not traces:
            raise ValueError("traces is empty: a batch needs at least one row")
        n = max(len(t.proposed) for t in traces)
        active = np.array([[i < len(t.proposed) for i in range(n)] for t in traces])

        def widest(col: str, reduce=np.max, empty=0) -> np.ndarray:
            padded = np.array([np.r_[getattr(t, col), np.full(n - len(t.proposed), empty)] for t in traces], float)
            return reduce(np.where(active, padded, empty), axis=0)

        return cls(prompt_len=max(t.prompt_len for t in traces), proposed=widest("proposed").astype(int),
                   new_tokens=widest("new_tokens", np.sum).astype(int), length=widest("length").astype(int),
                   draft_fed=widest("draft_fed").astype(int), draft_calls=widest("draft_calls").astype(int),
                   uses_model=any(t.uses_model for t in traces), uses_lookup=any(t.uses_lookup for t in traces),
                   merged=any(t.merged for t in traces), rows=active.sum(axis=0))


@dataclass(frozen=True)
class BatchTimeModel:
    """``TimeModel`` over a batch: pass models over rows x new tokens; loop costs of one batch size."""

    target: BatchPassModel
    draft: BatchPassModel | None
    loop: LoopCosts = LoopCosts()

    @classmethod
    def of(cls, model: TimeModel) -> "BatchTimeModel":
        """A batch-1 time model as a batch model (timed at batch size 1 only)."""
        return cls(BatchPassModel({1: model.target}), None if model.draft is None else BatchPassModel({1: model.draft}),
                   model.loop)

    def speculative(self, bt: BatchTrace) -> Decomposition:
        """Predicted wall time of the batched run, by part (``speclab.costs.time_model.PARTS``)."""
        t, d, b = self.target, self.draft, bt.batch_size
        return price_speculative(bt, bt.rows, lambda n, ctx, rows: t.time(rows, n, ctx),
                                 None if d is None else (lambda n, ctx, rows: d.time(rows, n, ctx)),
                                 lambda n: t.prefill_time(b, n), None if d is None else (lambda n: d.prefill_time(b, n)),
                                 self.loop)

    def plain(self, prompt_len: int, new_tokens: list[int] | np.ndarray) -> Decomposition:
        """Batched plain decoding of rows that generate ``new_tokens[r]`` tokens each: one prefill over
        the rows padded to ``prompt_len`` (the longest), then one step for every row still going."""
        tokens = np.asarray(new_tokens, int)
        rows = (tokens[:, None] > np.arange(1, max(int(tokens.max()), 1))[None]).sum(axis=0)
        t = self.target
        return price_plain(prompt_len, rows, lambda n, ctx, r: t.time(r, n, ctx),
                           lambda n: t.prefill_time(len(tokens), n), self.loop.target_scale)

    def speedup(self, bt: BatchTrace, plain_tokens: list[int] | np.ndarray) -> float:
        """Predicted tokens/s of the batched speculative run over batched plain decoding of the same prompts."""
        plain = self.plain(bt.prompt_len, plain_tokens)
        return plain.total / self.speculative(bt).total


def fit_prefill(tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(intercept, seconds per token) of prefills over ``tokens`` (rows x padded prompt) in all."""
    a, b = _ols(tokens, seconds)
    return a, max(b, 0.0)


def calibrate_batch_loop(model: BatchTimeModel, traces: list[BatchTrace], iterations: np.ndarray,
                         draft_s: np.ndarray, verify_s: np.ndarray, rollback_s: np.ndarray,
                         iter_s: np.ndarray) -> LoopCosts:
    """The batched loop's costs from runs that record per-iteration means (the batch stage's run rows),
    given the pass models: like ``calibrate_loop``, scales are ratios of summed in-loop to summed
    predicted pass time (each run's predicted per-iteration time counted over its measured
    iterations), and the per-iteration costs are medians over runs. ``iter_s`` less draft, verify and
    rollback is the bookkeeping (outputs, row drops and re-packing, stopwatches)."""
    bare = replace(model, loop=LoopCosts())
    its = np.asarray(iterations, float)
    pred_d, pred_v = [], []
    for bt in traces:
        parts = bare.speculative(bt).parts
        # Merged, the prompt's passes run inside the first iteration, and its measured times hold them.
        inside = bt.merged
        pred_d.append((parts["draft_steps"] + parts["catch_up"] + inside * parts["prefill_draft"]) / len(bt.proposed))
        pred_v.append((parts["verify"] + inside * parts["prefill_target"]) / len(bt.proposed))
    ratio = (lambda meas, pred: float(np.sum(meas * its) / np.sum(np.asarray(pred) * its)) if np.sum(pred) > 0 else 1.0)
    return LoopCosts(target_scale=ratio(np.asarray(verify_s, float), pred_v),
                     draft_scale=ratio(np.asarray(draft_s, float), pred_d),
                     rollback_s=float(np.median(rollback_s)),
                     bookkeeping_s=float(np.median(np.asarray(iter_s) - draft_s - verify_s - rollback_s)))
