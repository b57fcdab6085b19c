"""How many tokens to draft next: fixed, the transformers heuristic, or the cost model's choice."""
from __future__ import annotations

import copy
import operator
from typing import Callable, Hashable, Protocol

from speclab.decoding.acceptance import checked_proposals
import numpy as np

from speclab.costs.cost_model import best_k, predicted_speedup
from speclab.costs.time_model import CostTable


class KPolicy(Protocol):
    """Optionally also ``condition(label)``: called before ``k`` is read, with the drafter's label for
    the coming proposal when the drafter has one (``ConditionedK``)."""

    def start(self) -> None:
        """A new generation begins."""

    @property
    def k(self) -> int:
        """Proposals for the next iteration (>= 1; 0, a plain target step, only where a policy allows it)."""

    def update(self, proposed: int, accepted: int) -> None:
        """Result of the iteration just verified."""


def as_count(value: object, name: str = "k", minimum: int = 1) -> int:
    """``value`` as a plain int >= ``minimum``; any integral type counts (numpy, 0-d tensors), bool does not.

    A numpy integer stored as k would leak into slicing and statistics, so it is converted here.
    """
    n: int | None = None
    if not isinstance(value, bool):
        try:
            n = operator.index(value)
        except TypeError:
            pass
    if n is None or n < minimum:
        shown = " ".join(repr(value if n is None else n).split())  # a tensor's repr spans lines
        raise ValueError(f"{name}={shown} is not allowed: the number of proposals must be an integer >= {minimum}")
    return n


class FixedK:
    def __init__(self, k: int) -> None:
        self._k = as_count(k, "k")

    def start(self) -> None:
        pass

    @property
    def k(self) -> int:
        return self._k

    def update(self, proposed: int, accepted: int) -> None:
        pass


class HeuristicK:
    """transformers' assisted-generation schedule: +2 after an all-accepted iteration, -1 otherwise."""

    def __init__(self, k_start: int = 4, k_min: int = 1, k_max: int = 10) -> None:
        k_start, k_min, k_max = as_count(k_start, "k_start"), as_count(k_min, "k_min"), as_count(k_max, "k_max")
        if not 1 <= k_min <= k_start <= k_max:
            raise ValueError(f"k bounds start={k_start}, min={k_min}, max={k_max} are not allowed: need 1 <= min <= start <= max")
        self.k_start, self.k_min, self.k_max = k_start, k_min, k_max
        self._k = k_start

    def start(self) -> None:
        self._k = self.k_start

    @property
    def k(self) -> int:
        return self._k

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        step = 2 if accepted == proposed else -1
        self._k = max(self.k_min, min(self.k_max, self._k + step))


class CostModelK:
    """Chooses the k that maximises the predicted speed-up for a running estimate of alpha.

    Estimator: exponentially weighted counts of accepted and checked proposals,
    alpha = A / C with A <- decay*A + accepted and C <- decay*C + checked, started from a prior
    worth ``prior_weight`` checks at ``alpha0``. A decay of 0.7 forgets an iteration's evidence
    with a half-life of about two iterations, so the estimate follows the text (a stretch of
    boilerplate vs free prose) rather than the whole request.

    With a ``table`` (``speclab.costs.time_model.CostTable``: the draft's 1- and 2-token calls and each
    verification pass, in target steps) k is chosen with the time model's iteration price, which
    includes the catch-up after an all-accepted iteration and a jagged c_verify(k); without one,
    with the chapter's k * c_draft + c_verify.

    ``estimator="positions"`` (with a table) replaces the single alpha by one acceptance rate per
    draft position (the same decayed counts, kept per position, each shrunk towards the pooled
    alpha by ``prior_weight`` checks): acceptance comes in runs, so after the first proposal is
    accepted the next ones are more likely to be, and a single alpha would under-price long k after
    every rejection. Tokens per iteration at k are then 1 + the sum of the survival probabilities.

    ``k_min=0`` lets the policy stop speculating: k = 0 is a plain target step (one token for one
    step), chosen when no k >= 1 is priced above it, so a draft that does not pay on this machine
    or this text costs little more than plain decoding. A plain step teaches the estimate nothing,
    so after ``probe_every`` plain steps in a row one iteration drafts at the best k >= 1 (the draft
    model catches up on the skipped tokens in its first call) and the choice is made again.
    """

    def __init__(self, c_draft: float, c_verify: float | dict[int, float] = 1.0, k_min: int = 0, k_max: int = 10,
                 decay: float = 0.9, alpha0: float = 0.6, prior_weight: float = 2.0,
                 table: CostTable | None = None, estimator: str = "positions", probe_every: int = 8) -> None:
        if estimator not in ("iid", "positions"):
            raise ValueError(f"estimator={estimator!r} is not allowed: use 'iid' or 'positions'")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay={decay} is not allowed: use a value in [0, 1)")
        k_min, k_max = as_count(k_min, "k_min", minimum=0), as_count(k_max, "k_max")
        if not 0 <= k_min <= k_max:
            raise ValueError(f"k bounds min={k_min}, max={k_max} are not allowed: need 0 <= min <= max")
        if c_draft < 0:
            raise ValueError(f"c_draft={c_draft} is not allowed: a cost ratio is >= 0")
        self.probe_every = as_count(probe_every, "probe_every")
        self.c_draft, self.c_verify, self.k_min, self.k_max = c_draft, c_verify, k_min, k_max
        self.decay, self.alpha0, self.prior_weight = decay, alpha0, prior_weight
        self.table = table
        self.estimator = estimator if table is not None else "iid"
        self.start()

    def start(self) -> None:
        self.acc, self.chk = self.alpha0 * self.prior_weight, self.prior_weight
        # Per draft position: decayed counts of proposals accepted there and of checks that reached it.
        self.pos_acc, self.pos_chk = np.zeros(self.k_max), np.zeros(self.k_max)
        self.plain_run = 0  # plain steps (k = 0) in a row since the last drafted iteration
        self._choose()

    def survival(self) -> np.ndarray:
        """P(the first j + 1 proposals are all accepted), j = 0..k_max-1, from the per-position rates."""
        w, a = self.prior_weight, min(self.alpha, 0.999)
        rate = (self.pos_acc + w * a) / (self.pos_chk + w)
        return np.cumprod(np.minimum(rate, 0.999))

    @property
    def alpha(self) -> float:
        return self.acc / self.chk

    @property
    def k(self) -> int:
        return self._k

    def _best_drafting(self) -> tuple[int, float]:
        """The best k >= 1 and its predicted speed-up over plain steps (tokens per target step)."""
        # alpha = 1 exactly would make every k look equally unbounded; cap it just below.
        a, lo = min(self.alpha, 0.999), max(self.k_min, 1)
        if self.estimator == "positions":
            surv = self.survival()
            k = self.table.best_k_for_survival(surv, lo, self.k_max)
            return k, self.table.speedup_for_survival(surv, k)
        if self.table is not None:
            k = self.table.best_k(a, lo, self.k_max)
            return k, self.table.speedup(a, k)
        k = max(lo, best_k(a, self.c_draft, self.c_verify, self.k_max))
        cv = self.c_verify[k] if isinstance(self.c_verify, dict) else self.c_verify
        return k, float(predicted_speedup(a, k, self.c_draft, cv))

    def _choose(self) -> None:
        k, speedup = self._best_drafting()
        self._k = 0 if self.k_min == 0 and speedup < 1.0 and self.plain_run < self.probe_every else k

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            if self.k_min == 0:  # a plain step of ours (the loop also makes one at the token budget's end)
                self.plain_run += 1
                self._choose()
            return
        self.plain_run = 0
        self.acc = self.decay * self.acc + accepted
        self.chk = self.decay * self.chk + checked_proposals(accepted, proposed)
        reached = min(int(checked_proposals(accepted, proposed)), self.k_max)
        self.pos_acc *= self.decay
        self.pos_chk *= self.decay
        self.pos_acc[:min(accepted, self.k_max)] += 1
        self.pos_chk[:reached] += 1
        self._choose()


class ConditionedK:
    """One policy per kind of evidence the drafter shows before it proposes (its ``label``).

    Prompt lookup knows, before proposing, how long an n-gram it matched; the first proposal after a
    3-token match is accepted far more often than after a 1-token one (a copied span against a common
    token), so one acceptance estimate for both prices long k wrongly for each. Here every label gets
    its own policy, made by ``make(label)`` when the label first appears in a generation (a hybrid's
    lookup and model iterations also differ in price). The loop calls ``condition(label)`` before it
    reads ``k``; ``update`` goes to the policy that chose that k.
    """

    def __init__(self, make: Callable[[Hashable], KPolicy]) -> None:
        self.make = make
        self.start()

    def start(self) -> None:
        self.policies: dict[Hashable, KPolicy] = {}
        self.condition(None)

    def condition(self, label: Hashable) -> None:
        if label not in self.policies:
            self.policies[label] = policy = self.make(label)
            policy.start()
        self.active = self.policies[label]

    @property
    def k(self) -> int:
        return self.active.k

    def update(self, proposed: int, accepted: int) -> None:
        self.active.update(proposed, accepted)


def as_policy(k: int | KPolicy) -> KPolicy:
    """A policy as given, or a fixed k (``FixedK`` accepts any integral type and rejects the rest)."""
    return k if hasattr(k, "start") and hasattr(k, "update") else FixedK(k)


class RowPolicies:
    """One k policy per row of a batch (per-row k, per-row labels): the given policy for the first row,
    independent copies of it for the others, each started afresh. Finished rows' policies leave with them."""

    def __init__(self, k: int | KPolicy, rows: int) -> None:
        first = as_policy(k)
        self.policies = [first] + [copy.deepcopy(first) for _ in range(rows - 1)]
        for p in self.policies:
            p.start()
        self.conditioned = hasattr(first, "condition")

    def ks(self, labels: list[Hashable] | None) -> list[int]:
        """Each row's k; with ``labels`` (the drafter's, one per row) each policy is conditioned first."""
        if labels is not None:
            for p, label in zip(self.policies, labels):
                p.condition(label)
        return [p.k for p in self.policies]

    def update(self, proposed: list[int], accepted: list[int]) -> None:
        for p, n, a in zip(self.policies, proposed, accepted):
            p.update(n, a)

    def select(self, rows: list[int]) -> None:
        self.policies = [self.policies[b] for b in rows]
