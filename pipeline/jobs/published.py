"""Does the published answer hold here? A speed job's own medians set beside the published figures of the same
pair, kind and configuration, one line each: ``holds`` where the published median lies in this job's interval,
``differs`` where it does not (the line says which way), no verdict where this job has too few runs.

The published answer is what ``dvc repro`` wrote (outputs/analysis/answer/, analysis.answer): per campaign, pair and
kind its best configuration, and every greedy configuration's median and interval. A pair's published answer is that
of the first campaign of the report's order that measured it (params.yaml: ``campaign`` first). The published
configurations of a pair are also what ``python -m pipeline.recheck`` runs (pipeline/recheck.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from speclab.stats.verdict import DIFFERS, agreement
from store.published_answer import PLAN_SUFFIX

GREEDY = "greedy"


@dataclass(frozen=True)
class PublishedFigure:
    campaign: str
    kind: str
    config: str
    speedup: float
    lo: float
    hi: float
    runs: int

    def text(self) -> str:
        interval = f"{self.lo:.2f}-{self.hi:.2f}" if self.lo == self.lo else "no interval"
        return f"x{self.speedup:.2f} ({interval}, {self.runs} runs)"


def read_published(outputs_dir: str | Path):
    """The published answer's tables (analysis.answer.Answer), or None before the first ``dvc repro``."""
    from analysis.answer import read_answer

    return read_answer(Path(outputs_dir) / "analysis")


def pair_campaign(answer, pair: str) -> str | None:
    """The campaign whose answer is the pair's published one: the first, in the report's order, that holds it."""
    rows = answer.best[answer.best.pair == pair]
    return str(rows.campaign.iloc[0]) if len(rows) else None


def campaign_machine(answer, campaign: str) -> str:
    """Where the campaign was measured, as its results' provenance records it."""
    from analysis.answer import NOT_RECORDED

    prov = answer.provenance[(answer.provenance.campaign == campaign)]
    machines = prov.machines if "machines" in prov else pd.Series(dtype=str)
    recorded = sorted({m for ms in machines for m in str(ms).split("; ") if m and m != NOT_RECORDED})
    return f"on {'; '.join(recorded)}" if recorded else "on a machine whose CPU model is not recorded"


def published_best(answer, pair: str) -> list[PublishedFigure]:
    """Per kind, the pair's published best configuration (the planner's arm as the configuration it chose)."""
    campaign = pair_campaign(answer, pair)
    if campaign is None:
        return []
    rows = answer.best[(answer.best.pair == pair) & (answer.best.campaign == campaign)]
    return [PublishedFigure(campaign, str(r.kind), str(r.best).removesuffix(PLAN_SUFFIX), float(r.speedup),
                            float(r.speedup_lo), float(r.speedup_hi), int(r.runs)) for r in rows.itertuples()]


def published_figure(answer, pair: str, kind: str, config: str) -> PublishedFigure | None:
    """The published median of one greedy configuration of the pair on one kind, in the pair's campaign."""
    campaign = pair_campaign(answer, pair)
    c = answer.candidates
    rows = c[(c.campaign == campaign) & (c.pair == pair) & (c.kind == kind) & (c.sampling == GREEDY)
             & (c.config.str.removesuffix(PLAN_SUFFIX) == config.removesuffix(PLAN_SUFFIX))]
    if rows.empty:
        return None
    r = rows.sort_values("runs", ascending=False).iloc[0]
    return PublishedFigure(str(campaign), kind, config, float(r.speedup), float(r.speedup_lo), float(r.speedup_hi),
                           int(r.runs))


def comparison_lines(answer, pair: str, arms: list, level: float = 0.95) -> list[str]:
    """Per kind: the published best configuration beside this job's runs of it; where this job did not run it, this
    job's configurations the published answer measured, then the best as "not run by this job" and the command
    that runs it. ``arms``: the job's per-kind ArmResults (speed stage)."""
    if answer is None or pair_campaign(answer, pair) is None:
        return []
    measured: dict[str, list[tuple[str, PublishedFigure, dict, str]]] = {}
    for a in arms:
        kind, m = str(a.params.get("kind")), a.metrics
        if kind == "all" or "speedup" not in m or m["speedup"] != m["speedup"]:
            continue
        pub = published_figure(answer, pair, kind, a.label or a.name)
        if pub is not None:
            stopped = str(a.params["stopped_by"]) if "stopped_by" in a.params else ""
            measured.setdefault(kind, []).append((pub.config, pub, m, stopped))
    best = {b.kind: b for b in published_best(answer, pair)}
    lines, missing = [], []
    for kind in dict.fromkeys([*measured, *best]):
        ran = measured[kind] if kind in measured else []
        of_best = [r for r in ran if kind in best and r[0] == best[kind].config]
        for config, pub, m, stopped in of_best or ran:
            what = "best" if of_best else "figure"
            said = agreement(pub.speedup, m["speedup_lo"], m["speedup_hi"], int(m["runs"]), float(m.get("level", level)))
            if m["speedup_lo"] != m["speedup_lo"] and stopped.startswith("dropped"):
                said = f"{DIFFERS} (slower here: it left this job's race, {stopped.removeprefix('dropped: ')})"
            lines.append(f"published {what} for {kind}: {config} {pub.text()}; here {_here(m)}: {said}")
        if not of_best and kind in best:
            missing.append(best[kind])
    lines += [f"published best for {b.kind}: {b.config} {b.text()}: not run by this job" for b in missing]
    if not lines:
        return []
    campaign = pair_campaign(answer, pair)
    head = f"published answer for {pair}: campaign {campaign}, measured {campaign_machine(answer, campaign)}"
    tail = [f"to measure the published answer here: python -m pipeline.recheck pair={pair}"] if missing else []
    return [head, *lines, *tail]


def _here(m: dict) -> str:
    interval = f"{m['speedup_lo']:.2f}-{m['speedup_hi']:.2f}" if m["speedup_lo"] == m["speedup_lo"] else "no interval"
    return f"x{m['speedup']:.2f} ({interval}, {int(m['runs'])} runs)"
