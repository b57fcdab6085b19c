"""Building the drafter and the k policy a stage asks for, from config."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from pipeline.context import StageContext
from speclab.drafters import Drafter, HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.k_policy import CostModelK, FixedK, HeuristicK, KPolicy
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
    """The time model's iteration price, measured now on the first prompt: the draft's 1- and 2-token
    calls (a step, and the catch-up after an all-accepted iteration) and the target's pass over k + 1
    tokens for each k, all in target steps."""
    ids = ctx.inputs[ctx.prompts[0].id]
    target = {t.pass_len: t.median_s for t in pass_times(ctx.pair.target, ids, list(range(1, k_max + 2)), repeats, 1)}
    if ctx.cfg.drafter.name == "prompt_lookup":  # a lookup costs ~nothing
        draft = {1: 0.0, 2: 0.0}
    else:
        draft = {t.pass_len: t.median_s / target[1] for t in pass_times(ctx.pair.draft, ids, [1, 2], repeats, 1)}
    return CostTable(draft, {k: target[k + 1] / target[1] for k in range(1, k_max + 1)})


def make_policy(ctx: StageContext, name: str, k: int, costs: CostTable | None = None) -> KPolicy:
    """``costs`` (the time model's price table) are used by the cost-model policy when the config leaves
    c_draft / c_verify null; set both to use the chapter's formula with those numbers instead."""
    p: DictConfig = ctx.cfg.k_policy
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
        table = None
        if p.get("c_draft") is not None and p.get("c_verify") is not None:
            c_draft, c_verify = float(p.c_draft), float(p.c_verify)
        else:
            table = costs if costs is not None else measured_costs(ctx, k_max)
            c_draft, c_verify = table.draft[1], table.verify
        return CostModelK(c_draft, c_verify, k_min=int(p.k_min), k_max=k_max, decay=float(p.decay),
                          alpha0=float(p.alpha0), prior_weight=float(p.prior_weight), table=table,
                          estimator=str(p.estimator) if table is not None else "iid",
                          probe_every=int(p.get("probe_every", 8)))
    raise ValueError(f"unknown k_policy {name!r}: allowed are {list(K_POLICIES)}")
