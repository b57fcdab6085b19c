"""Building the drafter and the k policy a stage asks for, from config."""
from __future__ import annotations

from dataclasses import replace

from omegaconf import DictConfig, OmegaConf

from pipeline.context import StageContext
from speclab.drafters import Drafter, HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.k_policy import ConditionedK, CostModelK, FixedK, HeuristicK, KPolicy
from speclab.step_costs import pass_times
from speclab.time_model import CostTable

DRAFTERS = ("model", "prompt_lookup", "hybrid")
K_POLICIES = ("fixed", "cost_model", "heuristic")


def make_drafter(ctx: StageContext, name: str | None = None) -> Drafter:
    d = ctx.cfg.drafter
    name = name or d.name
    if name == "model":
        return ModelDrafter(ctx.pair.draft)
    if name == "prompt_lookup":
        return PromptLookupDrafter(int(d.get("max_ngram", 3)), int(d.get("min_ngram", 1)))
    if name == "hybrid":
        return HybridDrafter(ctx.pair.draft, int(d.get("max_ngram", 3)), int(d.get("min_ngram", 1)),
                             int(d.get("min_match", 1)))
    raise ValueError(f"unknown drafter {name!r}: allowed are {list(DRAFTERS)}")


def measured_costs(ctx: StageContext, k_max: int, repeats: int = 5) -> CostTable:
    """The time model's iteration price, measured now on the first prompt: the draft model's 1- and
    2-token calls (a step, and the catch-up after an all-accepted iteration) and the target's pass
    over k + 1 tokens for each k, all in target steps. ``for_drafter`` prices a drafter without a model."""
    ids = ctx.inputs[ctx.prompts[0].id]
    target = {t.pass_len: t.median_s for t in pass_times(ctx.pair.target, ids, list(range(1, k_max + 2)), repeats, 1)}
    draft = {t.pass_len: t.median_s / target[1] for t in pass_times(ctx.pair.draft, ids, [1, 2], repeats, 1)}
    return CostTable(draft, {k: target[k + 1] / target[1] for k in range(1, k_max + 1)})


def free_draft(table: CostTable) -> CostTable:
    """The same verification prices with proposals that cost nothing (an n-gram lookup)."""
    return replace(table, draft={n: 0.0 for n in table.draft})


def drafts_free(drafter: str, label: object = None) -> bool:
    """Prompt lookup, and a hybrid's iterations labelled with a matched n-gram's length (an int), make
    their proposals for free; the draft model pays its measured calls."""
    return drafter == "prompt_lookup" or isinstance(label, int)


def for_drafter(table: CostTable, drafter: str, label: object = None) -> CostTable:
    """The price table for iterations of this drafter (``drafts_free``: no draft cost)."""
    return free_draft(table) if drafts_free(drafter, label) else table


def make_policy(ctx: StageContext, name: str, k: int, costs: CostTable | None = None,
                drafter: str | None = None) -> KPolicy:
    """``costs`` (the time model's price table) are used by the cost-model policy when the config leaves
    c_draft / c_verify null; set both to use the chapter's formula with those numbers instead.
    ``drafter`` (default: the job's) prices the proposals: prompt lookup's cost nothing. With
    ``condition_on: match`` the cost-model policy keeps one estimate per label the drafter gives
    before proposing (prompt lookup: the matched n-gram's length; see ``ConditionedK``). Where proposals
    are free (``drafts_free``) its smallest k is ``free_k_min`` (null: ``k_min``)."""
    p: DictConfig = ctx.cfg.k_policy
    drafter = drafter or str(ctx.cfg.drafter.name)
    if name != p.name and name in ("cost_model", "heuristic"):
        # An extra arm (stage.k_policies): the policy's own defaults, from its schema.
        from pipeline.config_schema import CostModelKConf, HeuristicKConf

        p = OmegaConf.structured(CostModelKConf if name == "cost_model" else HeuristicKConf)
    if name == "fixed":
        return FixedK(k)
    if name == "heuristic":
        return HeuristicK(k_start=min(max(k, int(p.get("k_min", 1))), int(p.get("k_max", 10))),
                          k_min=int(p.get("k_min", 1)), k_max=int(p.get("k_max", 10)))
    if name == "cost_model":
        k_max = int(p.get("k_max", 10))
        if p.get("c_draft") is not None and p.get("c_verify") is not None:  # the chapter's formula
            c_draft, c_verify = float(p.c_draft), float(p.c_verify)
            return CostModelK(c_draft, c_verify, k_min=int(p.k_min), k_max=k_max, decay=float(p.decay),
                              alpha0=float(p.alpha0), prior_weight=float(p.prior_weight),
                              probe_every=int(p.get("probe_every", 8)))
        measured = costs if costs is not None else measured_costs(ctx, k_max)

        def priced(label: object = None) -> CostModelK:
            table = for_drafter(measured, drafter, label)
            # A free proposal risks only the wider check. The estimate that would stop checking a match
            # rests on a few decayed checks, and a plain step cannot correct it, so free_k_min is 1.
            free_k_min = p.get("free_k_min")
            k_min = int(free_k_min) if free_k_min is not None and drafts_free(drafter, label) else int(p.k_min)
            return CostModelK(table.draft[1], table.verify, k_min=k_min, k_max=k_max, decay=float(p.decay),
                              alpha0=float(p.alpha0), prior_weight=float(p.prior_weight), table=table,
                              estimator=str(p.estimator), probe_every=int(p.get("probe_every", 8)))

        return ConditionedK(priced) if str(p.get("condition_on", "none")) == "match" else priced()
    raise ValueError(f"unknown k_policy {name!r}: allowed are {list(K_POLICIES)}")
