"""Building the drafter and the k policy a stage asks for, from config."""
from __future__ import annotations

from omegaconf import DictConfig

from pipeline.context import StageContext
from speclab.drafters import Drafter, HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.k_policy import CostModelK, FixedK, HeuristicK, KPolicy
from speclab.step_costs import step_costs

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


def measured_costs(ctx: StageContext, k_max: int, repeats: int = 5) -> tuple[float, dict[int, float]]:
    """c_draft and c_verify(k) = pass over k+1 tokens / one step, measured now on the first prompt."""
    draft = None if ctx.cfg.drafter.name == "prompt_lookup" else ctx.pair.draft  # a lookup costs ~nothing
    c = step_costs(ctx.pair.target, draft, ctx.inputs[ctx.prompts[0].id], list(range(1, k_max + 1)), repeats, 1)
    return c.c_draft, c.c_verify


def make_policy(ctx: StageContext, name: str, k: int, costs: tuple[float, dict[int, float]] | None = None) -> KPolicy:
    """``costs`` (c_draft, c_verify by k) are used by the cost-model policy when the config leaves them null."""
    p: DictConfig = ctx.cfg.k_policy
    if name == "fixed":
        return FixedK(k)
    if name == "heuristic":
        return HeuristicK(k_start=min(max(k, int(p.get("k_min", 1))), int(p.get("k_max", 10))),
                          k_min=int(p.get("k_min", 1)), k_max=int(p.get("k_max", 10)))
    if name == "cost_model":
        k_max = int(p.get("k_max", 10))
        if p.get("c_draft") is not None and p.get("c_verify") is not None:
            c_draft, c_verify = float(p.c_draft), float(p.c_verify)
        else:
            c_draft, c_verify = costs if costs is not None else measured_costs(ctx, k_max)
        return CostModelK(c_draft, c_verify, k_min=int(p.get("k_min", 1)), k_max=k_max,
                          decay=float(p.get("decay", 0.7)), alpha0=float(p.get("alpha0", 0.6)),
                          prior_weight=float(p.get("prior_weight", 2.0)))
    raise ValueError(f"unknown k_policy {name!r}: allowed are {list(K_POLICIES)}")
