"""The published answer's best configuration per kind of a pair, as arms: what a ``published`` arm entry runs (the
recheck folded into the main job) and what ``python -m pipeline.recheck`` runs.

Reads the files ``dvc repro`` wrote (outputs/analysis/answer/best.parquet: per campaign, pair and kind the best
configuration's label, in the report's order) and the pair's published campaign's speed rows, so an arm is exactly the
one published. A pair's published answer is that of the first campaign of the report's order that holds it. No torch,
no analysis code: a job's identity reads it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from speclab.specs.arms import NONE, PEER_METHODS, Arm
from speclab.specs.tree_shapes import PREFIX as TREE_PREFIX
from store.layout import stage_paths

BEST = Path("analysis") / "answer" / "best.parquet"
PLAN_SUFFIX = " (plan)"  # the planner's arm: the published configuration is the one it chose
ARM_COLUMNS = ["arm", "k", "k_policy", "drafter", "engine"]


class PublishedError(ValueError):
    """No published configuration to run: one line naming the value and what is allowed."""


def best_rows(outputs_dir: str | Path) -> pd.DataFrame:
    """The published answer's best table (empty before the first ``dvc repro``)."""
    path = Path(outputs_dir) / BEST
    return pd.read_parquet(path) if path.exists() else pd.DataFrame(columns=["campaign", "pair", "kind", "best"])


def pair_campaign(best: pd.DataFrame, pair: str) -> str | None:
    """The campaign whose answer is the pair's published one: the first, in the report's order, that holds it."""
    rows = best[best.pair == pair]
    return str(rows.campaign.iloc[0]) if len(rows) else None


def entry_of(arm: Arm) -> dict:
    """The ``stage.arms`` entry that runs ``arm`` (the planner's arm as the fixed configuration it chose)."""
    if arm.is_tree:
        return {"tree": arm.drafter.removeprefix(TREE_PREFIX)}
    if arm.method in PEER_METHODS.values():
        return {"method": arm.method, **({"ks": [arm.k]} if arm.k and arm.k_policy == "fixed" else {})}
    entry = {"drafter": arm.drafter, "k_policy": arm.k_policy}
    return {**entry, **({"ks": [arm.k]} if arm.k else {})}


def published_arms(outputs_dir: str | Path, pair: str) -> tuple[str, list[tuple[str, Arm]]]:
    """The pair's published campaign and, per kind, its best configuration as an arm."""
    best = best_rows(outputs_dir)
    if best.empty:
        raise PublishedError(f"no published answer under {Path(outputs_dir) / BEST.parent}: run `dvc repro` first")
    campaign = pair_campaign(best, pair)
    if campaign is None:
        raise PublishedError(f"pair={pair} has no published answer: use one of {sorted(set(best.pair))}")
    files = stage_paths(outputs_dir, campaign, "speed")
    speed = pd.concat([pd.read_parquet(f, columns=[c for c in ARM_COLUMNS if c in pd.read_parquet(f).columns])
                       for f in files], ignore_index=True) if files else pd.DataFrame(columns=ARM_COLUMNS)
    by_label: dict[str, Arm] = {}
    for row in speed.drop_duplicates().itertuples():
        arm = Arm.from_row(row)
        if arm.method != "plain" and arm.drafter != NONE:
            by_label.setdefault(arm.label.removesuffix(PLAN_SUFFIX),
                                Arm("speculative", arm.k, arm.k_policy, arm.drafter, arm.engine)
                                if arm.method == "recommended" else arm)
    out = []
    for r in best[(best.pair == pair) & (best.campaign == campaign)].itertuples():
        config = str(r.best).removesuffix(PLAN_SUFFIX)
        if config not in by_label:
            raise PublishedError(f"published configuration {config!r} ({pair}, {r.kind}) is not among campaign "
                                 f"{campaign}'s speed rows: rerun `dvc repro`")
        out.append((str(r.kind), by_label[config]))
    return campaign, out


def published_entries(outputs_dir: str | Path, pair: str) -> list[dict]:
    """The ``stage.arms`` entries of the pair's published best configurations, each once; none where the pair has no
    published answer (before the first ``dvc repro``, another pair)."""
    try:
        _, arms = published_arms(outputs_dir, pair)
    except PublishedError:
        return []
    return list({repr(e): e for e in (entry_of(a) for _, a in arms)}.values())
