"""A strategy: the drafter, the k policy that sizes its proposals, and the price table the policy reads.

Config builds one without a switch on names (the pipeline calls Hydra's ``instantiate`` on each option's
``_target_``): a drafter option names a drafter class (speclab.decoding.drafters), a k-policy option one of the
policy specs below, which turn the option's settings into a policy for one run. Adding a drafter is
two files, its class and its option file; a drafter whose constructor takes a ``model`` gets the pair's draft
model and pays for its proposals, one without makes them for free (prompt lookup). What else the pipeline asks of
a drafter, its class declares (speclab.decoding.drafters.Drafter: ``looks_up``, ``replay_as``).

The specs' defaults are the policies' constructor defaults, and the config schema reads its defaults
from the specs and the drafter classes (``default_of``): one source for both.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Hashable, Optional, Protocol

import torch

from speclab.decoding.drafters import Drafter
from speclab.decoding.k_policy import ConditionedK, CostModelK, FixedK, HeuristicK, KPolicy
from speclab.measures.step_costs import pass_times
from speclab.costs.time_model import CostTable


def default_of(cls: type, param: str) -> Any:
    """The default value of ``param`` in the constructor of ``cls``."""
    return inspect.signature(cls).parameters[param].default


def drafts_with_model(cls: type) -> bool:
    """A drafter class that runs a draft model (its constructor takes one)."""
    return "model" in inspect.signature(cls).parameters


def measure_prices(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, k_max: int,
                   repeats: int = 5) -> CostTable:
    """The time model's iteration price, measured now after ``ids``: the draft model's 1- and 2-token
    calls (a step, and the catch-up after an all-accepted iteration) and the target's pass over k + 1
    tokens for each k, all in target steps."""
    tgt = {t.pass_len: t.median_s for t in pass_times(target, ids, list(range(1, k_max + 2)), repeats, 1)}
    drf = {t.pass_len: t.median_s / tgt[1] for t in pass_times(draft, ids, [1, 2], repeats, 1)}
    return CostTable(drf, {k: tgt[k + 1] / tgt[1] for k in range(1, k_max + 1)})


@dataclass(frozen=True)
class Prices:
    """A price table as one drafter's iterations see it: proposals are free (no draft cost) from a
    drafter without a model, and on a hybrid's iterations labelled with a matched n-gram's length (an int)."""

    table: CostTable
    model_drafts: bool

    def free(self, label: Hashable = None) -> bool:
        return not self.model_drafts or isinstance(label, int)

    def table_for(self, label: Hashable = None) -> CostTable:
        return replace(self.table, draft={n: 0.0 for n in self.table.draft}) if self.free(label) else self.table


class PolicySpec(Protocol):
    """A k-policy option: its ``name`` and how it builds the policy of one run starting at ``k``."""

    name: str

    @property
    def needs_prices(self) -> bool:
        """Whether ``build`` reads a measured price table."""

    def build(self, k: int, prices: Prices | None) -> KPolicy:
        ...


@dataclass
class FixedPolicy:
    """k proposals every iteration."""

    name: str = "fixed"
    needs_prices = False

    def build(self, k: int, prices: Prices | None = None) -> KPolicy:
        return FixedK(k)


@dataclass
class HeuristicPolicy:
    """transformers' schedule, starting at the run's k (clipped into k_min..k_max)."""

    name: str = "heuristic"
    k_min: int = default_of(HeuristicK, "k_min")
    k_max: int = default_of(HeuristicK, "k_max")
    needs_prices = False

    def build(self, k: int, prices: Prices | None = None) -> KPolicy:
        return HeuristicK(k_start=min(max(k, self.k_min), self.k_max), k_min=self.k_min, k_max=self.k_max)


@dataclass
class CostModelPolicy:
    """``CostModelK`` priced by the measured table, or by the chapter's formula when c_draft and c_verify
    are both set. ``condition_on="match"``: one estimate per label the drafter gives before proposing
    (``ConditionedK``); where proposals are free the smallest k is ``free_k_min`` (None: ``k_min``)."""

    name: str = "cost_model"
    k_min: int = default_of(CostModelK, "k_min")
    k_max: int = default_of(CostModelK, "k_max")
    decay: float = default_of(CostModelK, "decay")
    alpha0: float = default_of(CostModelK, "alpha0")
    prior_weight: float = default_of(CostModelK, "prior_weight")
    c_draft: Optional[float] = None
    c_verify: Optional[float] = None
    estimator: str = default_of(CostModelK, "estimator")
    probe_every: int = default_of(CostModelK, "probe_every")
    condition_on: str = "match"
    # A free proposal risks only the wider check. The estimate that would stop checking a match
    # rests on a few decayed checks, and a plain step cannot correct it, so free_k_min is 1.
    free_k_min: Optional[int] = 1

    @property
    def needs_prices(self) -> bool:
        return self.c_draft is None or self.c_verify is None

    def build(self, k: int, prices: Prices | None) -> KPolicy:
        common = {"k_max": self.k_max, "decay": self.decay, "alpha0": self.alpha0, "prior_weight": self.prior_weight,
                  "probe_every": self.probe_every}
        if not self.needs_prices:  # the chapter's formula
            return CostModelK(self.c_draft, self.c_verify, k_min=self.k_min, estimator="iid", **common)
        if prices is None:
            raise ValueError(f"k_policy {self.name}: set c_draft and c_verify, or pass a measured price table")

        def priced(label: Hashable = None) -> CostModelK:
            table = prices.table_for(label)
            free = self.free_k_min is not None and prices.free(label)
            return CostModelK(table.draft[1], table.verify, k_min=self.free_k_min if free else self.k_min,
                              table=table, estimator=self.estimator, **common)

        return ConditionedK(priced) if self.condition_on == "match" else priced()


@dataclass
class Strategy:
    """What one speculative run uses: its drafter, its k policy and the price table the policy reads."""

    drafter: Drafter
    policy: KPolicy
    prices: Prices | None = None


def make_strategy(drafter: Drafter, policy: PolicySpec, k: int, table: CostTable | None = None) -> Strategy:
    """The strategy of one run starting at ``k``; ``table`` prices the proposals where the policy needs it."""
    prices = Prices(table, drafts_with_model(type(drafter))) if table is not None else None
    return Strategy(drafter, policy.build(k, prices), prices)
