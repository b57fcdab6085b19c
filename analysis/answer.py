"""The answer on one screen: per campaign, pair and prompt kind, which configuration to run, how much faster,
how sure, and when not to speculate.

    python -m analysis.answer     (reads the speed results of the campaigns the report shows: params.yaml's
                                   campaign, pair_campaign, spec_bench_campaign and trees_campaign (the
                                   engines campaign has its own block: analysis.engines); writes
                                   outputs/analysis/answer/*.parquet and the CSVs beside them, one row per
                                   campaign for `dvc metrics show` (outputs/metrics/<params key>.json:
                                   campaign.json, pair_campaign.json, ...) and every answer's numbers in
                                   outputs/metrics/detail/answer.json)

The same summary opens outputs/report.md (analysis.report), is the first thing `python -m analysis.recommend`
prints, and is the description of the `analysis-<campaign>` MLflow run (analysis.publish): all three call
``render`` on the tables this script wrote.

Definitions (the report's, everywhere): a run's speed-up is its tokens/s over the adjacent plain run's
(``ratio_to_adjacent_plain``); a configuration's speed-up is the median over its runs, with a 95% distribution-free
interval (order statistics, speclab.stats.intervals.median_ci; none from fewer than 6 runs); jobs whose step times drifted by more than drift.max_ratio are left
out, as in every section. The best configuration is the highest median over every drafter, k, k policy and tree
shape measured greedy in the campaign by one engine (a campaign of several engines names each pair with its
engine, ``smollm2 · llama.cpp``, and that engine's configurations by its own settings); best - runner-up is the
median of their differences in the blocks both ran (the block is the unit: each block's two runs share its plain
run and the machine's state), with that median's distribution-free interval (none from fewer than 6 shared blocks);
where they share too few blocks, the difference of the two medians, each median's 97.5% interval combined (none
from fewer than 7 runs each). Sampled runs and batched runs are not candidates (sampling changes what is generated,
batching what is served); they enter the "when not to speculate" lines where their interval lies below 1.

Everything below ``main`` is pure functions over DataFrames.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, read_stage_if_any, read_table,
                             run_script, save_csv, save_json, save_table)
from analysis.drift import drift_table, drop_drifted
from analysis.inputs import AnalysisError, campaign_dir, read_stage_files
from speclab.specs.arms import ENGINE_NAMES, Arm
from speclab.stats.intervals import median_ci, runs_needed
from speclab.stats.verdict import SPECULATE, UNCLEAR, USE_PLAIN, shows, verdict
from store import layout

# params.yaml keys of the campaigns the report shows, in the report's order.
CAMPAIGN_KEYS = ("campaign", "pair_campaign", "spec_bench_campaign", "trees_campaign")
TABLES = ("answer_best", "answer_candidates", "answer_not_to_use", "answer_provenance")
FOLDER = "answer"
UNRECORDED = "the CPU model is recorded only by jobs written since results name their machine"
SPECLAB = "speclab"  # the engine of every row written before there were others (store.compat)


# --------------------------------------------------------------------------------------------- candidates
def sampling_label(rows: pd.DataFrame) -> pd.Series:
    """``greedy``, ``T=0.7``, ``T=1, top-p 0.9``: the sampling setting of each row."""
    t = rows.temperature.map(lambda v: f"T={v:g}")
    top_p = rows.top_p.map(lambda v: f", top-p {v:g}" if v < 1 else "")
    return pd.Series(np.where(rows.do_sample, t + top_p, "greedy"), index=rows.index)


def config_label(rows: pd.DataFrame) -> pd.Series:
    """A reader's name of each speculative row's configuration (``speclab.specs.arms.Arm.label``, for every engine)."""
    return pd.Series([Arm.from_row(r).label for r in rows.itertuples()], index=rows.index, dtype=object)


def pair_label(rows: pd.DataFrame) -> pd.Series:
    """Each row's pair, named with its engine where the rows hold several engines (``smollm2 · llama.cpp``), so that
    a best configuration is one engine's: the same pair in two engines is two answers."""
    if "engine" not in rows or rows.engine.nunique() <= 1:
        return rows.pair
    return rows.pair + " · " + rows.engine.map(lambda e: ENGINE_NAMES.get(e, e))


def speculative_runs(speed: pd.DataFrame, campaign: str) -> pd.DataFrame:
    """Every non-plain run with its campaign, pair (per engine: ``pair_label``), configuration and sampling
    labels (the input of ``candidates``)."""
    speed = speed.assign(pair=pair_label(speed))
    rows = speed[(speed.arm != "plain") & speed.ratio_to_adjacent_plain.notna()]
    return rows.assign(campaign=campaign, config=config_label(rows), sampling=sampling_label(rows))


def candidates(runs: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per campaign, pair, kind, sampling setting and configuration: runs, median speed-up and its interval
    (none from fewer runs than it needs) and the minutes its runs took. Sorted best first within each group: the
    highest median among those with an interval, then those without."""
    rows = []
    for (campaign, pair, kind, sampling, config), g in runs.groupby(
            ["campaign", "pair", "kind", "sampling", "config"], sort=True):
        r = g.ratio_to_adjacent_plain.to_numpy(dtype=float)
        lo, hi = bootstrap_ci(r, np.median, **boot)
        rows.append({"campaign": campaign, "pair": pair, "kind": kind, "sampling": sampling, "config": config,
                     "runs": len(r), "speedup": float(np.median(r)), "speedup_lo": lo, "speedup_hi": hi,
                     "minutes": float(g.wall_s.sum() / 60) if "wall_s" in g else np.nan})
    out = pd.DataFrame(rows, columns=["campaign", "pair", "kind", "sampling", "config", "runs", "speedup",
                                      "speedup_lo", "speedup_hi", "minutes"])
    # A configuration with an interval ranks above one without: a median from too few runs for an interval (a raced
    # arm that left early, a job of two runs) is not shown to be anything, least of all the best.
    return out.assign(_interval=out.speedup_lo.notna()).sort_values(
        ["campaign", "pair", "kind", "sampling", "_interval", "speedup", "runs", "config"],
        ascending=[True, True, True, True, False, False, False, True], kind="mergesort",
        ignore_index=True).drop(columns="_interval")


def difference_ci(a: np.ndarray, b: np.ndarray, samples: int = 2000, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float, float]:
    """median(a) - median(b) and a distribution-free interval for it: each median's interval at
    1 - (1 - level) / 2 (``speclab.stats.intervals.median_ci``), combined as [lo_a - hi_b, hi_a - lo_b], which covers the
    difference whenever both cover their medians, so at least ``level`` (the union bound). NaN interval where either
    arm has fewer runs than that needs (``runs_needed``). For runs in different blocks; ``paired_difference`` for
    runs of the same blocks. ``samples`` and ``seed`` are not used."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(np.median(a) - np.median(b))
    each = 1 - (1 - level) / 2
    (lo_a, hi_a), (lo_b, hi_b) = median_ci(a, each), median_ci(b, each)
    return diff, float(lo_a - hi_b), float(hi_a - lo_b)


# A block of adjacent runs: one job's (config_hash) round, rotation and block, on one prompt.
BLOCK_KEYS = ["config_hash", "round", "rotation", "block", "prompt_id"]
RATIO = "ratio_to_adjacent_plain"


def paired_difference(a: pd.DataFrame, b: pd.DataFrame, level: float = 0.95) -> tuple[float, float, float, int] | None:
    """Two configurations' runs of the same blocks: the median of their per-block differences (each block's a - b,
    both over that block's plain run) and its distribution-free interval at ``level`` (``median_ci``: needs
    ``runs_needed(level)`` shared blocks, one fewer than the unpaired interval), and the number of shared blocks.
    The block is the unit: the machine's drift between blocks cancels. None where the rows carry no blocks or share
    too few (then ``difference_ci``)."""
    if any(k not in a or k not in b for k in BLOCK_KEYS):
        return None
    # a configuration run twice in a block (the plan's choice beside the same fixed arm) counts once, at its mean
    pa, pb = (x.groupby(BLOCK_KEYS, dropna=False)[RATIO].mean() for x in (a, b))
    both = pd.concat([pa.rename("a"), pb.rename("b")], axis=1, join="inner").dropna()
    if len(both) < runs_needed(level):
        return None
    d = (both.a - both.b).to_numpy()
    lo, hi = median_ci(d, level)
    return float(np.median(d)), lo, hi, len(both)


def best_table(runs: pd.DataFrame, cands: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per campaign, pair and kind (greedy candidates only): the best configuration, its speed-up, interval
    and runs, the runner-up, best - runner-up with its interval, and the verdict."""
    greedy = cands[cands.sampling == "greedy"]
    out = []
    for (campaign, pair, kind), g in greedy.groupby(["campaign", "pair", "kind"], sort=True):
        g = g.reset_index(drop=True)  # best first (candidates' order)
        best = g.iloc[0]
        level = float(boot.get("level", 0.95))
        row = {"campaign": campaign, "pair": pair, "kind": kind, "best": best.config, "speedup": best.speedup,
               "speedup_lo": best.speedup_lo, "speedup_hi": best.speedup_hi, "runs": int(best.runs),
               "precision": (best.speedup_hi - best.speedup_lo) / 2, "minutes": best.minutes, "level": level,
               "runner_up": None, "runner_up_speedup": np.nan, "difference": np.nan, "difference_lo": np.nan,
               "difference_hi": np.nan, "difference_blocks": 0,
               "verdict": verdict(best.speedup, best.speedup_lo, best.speedup_hi, best.runs, level)}
        if len(g) > 1:
            second = g.iloc[1]
            sel = (runs.campaign == campaign) & (runs.pair == pair) & (runs.kind == kind) & \
                  (runs.sampling == "greedy")
            a, b = runs[sel & (runs.config == best.config)], runs[sel & (runs.config == second.config)]
            paired = paired_difference(a, b, float(boot.get("level", 0.95)))
            if paired is not None:
                diff, lo, hi, blocks = paired
            else:
                diff, lo, hi = difference_ci(a[RATIO].to_numpy(dtype=float), b[RATIO].to_numpy(dtype=float), **boot)
                blocks = 0
            row.update(runner_up=second.config, runner_up_speedup=second.speedup, difference=diff,
                       difference_lo=lo, difference_hi=hi, difference_blocks=blocks)
        out.append(row)
    return pd.DataFrame(out, columns=["campaign", "pair", "kind", "best", "speedup", "speedup_lo", "speedup_hi",
                                      "runs", "precision", "minutes", "level", "runner_up", "runner_up_speedup",
                                      "difference", "difference_lo",
                                      "difference_hi", "difference_blocks", "verdict"])


def not_to_use(cands: pd.DataFrame, best: pd.DataFrame, batch: pd.DataFrame | None = None,
               batch_campaign: str | None = None) -> pd.DataFrame:
    """Where speculation loses: every candidate (greedy or sampled) whose whole interval is below 1, every
    batch size and k of the batch table (``batch``: analysis.batch's speed-ups, of ``batch_campaign``) whose
    interval is below 1, and every pair and kind whose best is shown below 1 (``use plain``: its interval below 1)."""
    cols = ["campaign", "pair", "kind", "setting", "config", "speedup", "speedup_hi", "reason"]
    lose = cands[cands.speedup_hi < 1]
    rows = [lose.assign(setting=lose.sampling, reason="interval below 1")]
    if batch is not None and not batch.empty:
        b = batch[batch.measured_hi < 1]
        rows.append(pd.DataFrame({"campaign": batch_campaign, "pair": b.pair, "kind": "all",
                                  "setting": "batch B=" + b.batch_size.astype(str),
                                  "config": "draft model k=" + b.k.astype(str), "speedup": b.measured,
                                  "speedup_hi": b.measured_hi, "reason": "interval below 1"}))
    plain = best[best.verdict == "use plain"]
    rows.append(pd.DataFrame({"campaign": plain.campaign, "pair": plain.pair, "kind": plain.kind,
                              "setting": "greedy", "config": "every configuration", "speedup": plain.speedup,
                              "speedup_hi": plain.speedup_hi, "reason": "best below 1"}))
    out = pd.concat([r.reindex(columns=cols) for r in rows if len(r)], ignore_index=True) if any(
        len(r) for r in rows) else pd.DataFrame(columns=cols)
    return out[cols].reset_index(drop=True)


NOT_RECORDED = "not recorded"  # results written before their provenance named the machine


def provenance(campaign: str, stage: str, meta: list[dict], devices: list[str]) -> dict:
    """One stage of a campaign: its dates (first and last day a job finished), machine (the results' ``device``
    column and the machine their provenance records; jobs written before it was recorded count as "not
    recorded") and commits (short, oldest first)."""
    days = sorted({str(m.get("finished_at") or "")[:10] for m in meta} - {""})
    commits = []
    for m in sorted(meta, key=lambda m: str(m.get("finished_at") or "")):
        c = str(m.get("git_commit") or "")[:7]
        if c and c not in commits:
            commits.append(c)
    return {"campaign": campaign, "stage": stage, "first_day": days[0] if days else "",
            "last_day": days[-1] if days else "", "device": ",".join(sorted(set(devices))) or "unknown",
            "machines": "; ".join(sorted({str(m.get("machine") or NOT_RECORDED) for m in meta})),
            "commits": ",".join(commits), "jobs": len(meta)}


def per_campaign(prov: pd.DataFrame, shown: list[str] | None = None) -> pd.DataFrame:
    """The stages' provenance merged per campaign (``shown``: only these campaigns, in this order)."""
    rows = []
    for campaign, g in prov.groupby("campaign", sort=False):
        if shown is not None and campaign not in shown:
            continue
        commits = []
        for c in ",".join(g.commits).split(","):
            if c and c not in commits:
                commits.append(c)
        rows.append({"campaign": campaign, "first_day": min(d for d in g.first_day if d),
                     "last_day": max(d for d in g.last_day if d), "device": ",".join(sorted(set(g.device))),
                     "machines": "; ".join(sorted(set("; ".join(g.machines).split("; ")))),
                     "commits": ",".join(commits)})
    return pd.DataFrame(rows, columns=["campaign", "first_day", "last_day", "device", "machines", "commits"])


# ------------------------------------------------------------------------------------------------- render
@dataclass(frozen=True)
class Answer:
    best: pd.DataFrame
    candidates: pd.DataFrame
    not_to_use: pd.DataFrame
    provenance: pd.DataFrame

    def only(self, campaign: str) -> "Answer":
        """The rows of one campaign (empty tables where the answer does not hold it)."""
        return Answer(*(t[t.campaign == campaign] if "campaign" in t else t.iloc[:0]
                        for t in (self.best, self.candidates, self.not_to_use, self.provenance)))


def _x(v: float) -> str:
    return "" if v != v else f"{v:.2f}"


def _interval(lo: float, hi: float) -> str:
    return "" if lo != lo or hi != hi else f"{lo:.2f}-{hi:.2f}"


def _signed(v: float) -> str:
    return "" if v != v else f"{v:+.2f}"


def days(p: pd.Series) -> str:
    return p.first_day if p.first_day == p.last_day else f"{p.first_day} to {p.last_day}"


def machine(p: pd.Series) -> str:
    """``measured on <CPU model, cores>`` as the results record it; a campaign whose jobs predate the record says so."""
    recorded = [m for m in str(getattr(p, "machines", NOT_RECORDED)).split("; ") if m and m != NOT_RECORDED]
    some_unrecorded = NOT_RECORDED in str(getattr(p, "machines", NOT_RECORDED)).split("; ")
    named = " and ".join(recorded) if recorded else ""
    if not named:
        return f"on a {p.device} machine whose model is not recorded"
    return f"on {named}" + (" (some jobs' machine not recorded)" if some_unrecorded else "")


def _kinds(kinds) -> str:
    return ", ".join(sorted(set(kinds)))


def _configs(configs: list[str]) -> str:
    """``draft model k=1``, ``draft model k=2``, ``draft model k=4``, ``hybrid k=4`` -> ``draft model k=1-2, 4; hybrid k=4``."""
    families: dict[str, list] = {}
    for c in configs:
        m = re.fullmatch(r"(.*) k=(\d+)", c)
        family, item = (m.group(1), int(m.group(2))) if m else (c, None)
        families.setdefault(family, []).append(item)
    out = []
    for family, items in families.items():
        ks = sorted(i for i in items if i is not None)
        ranges, start = [], None
        for i, k in enumerate(ks):
            start = k if start is None else start
            if i + 1 == len(ks) or ks[i + 1] != k + 1:
                ranges.append(f"{start}" if start == k else f"{start}-{k}")
                start = None
        text = [f"{family} k={', '.join(ranges)}"] if ks else []
        out += text + ([family] if None in items else [])
    return ", ".join(out)


def _setting_order(setting: str) -> tuple:
    return (0 if setting == "greedy" else 1 if setting.startswith("batch") else 2, setting)


def not_to_use_lines(lose: pd.DataFrame, limit: int = 8) -> list[str]:
    """One line per campaign and pair: configurations (grouped by the kinds where they lose), batch sizes and
    sampling settings whose interval is below 1, and kinds where even the best is shown below 1 (its interval)."""
    lines = []
    for (campaign, pair), g in lose.groupby(["campaign", "pair"], sort=False):
        plain = g[g.reason == "best below 1"]
        parts = [f"**use plain** for {_kinds(plain.kind)}"] if len(plain) else []
        loss = g[g.reason != "best below 1"]
        groups: dict[tuple, list[str]] = {}
        for (setting, config), h in loss.groupby(["setting", "config"], sort=True):
            groups.setdefault((setting, _kinds(h.kind)), []).append(config)
        items = [f"{_configs(configs)} ({kinds}{'' if setting == 'greedy' else ', ' + setting})"
                 for (setting, kinds), configs in sorted(groups.items(), key=lambda kv: (_setting_order(kv[0][0]),
                                                                                        kv[0][1]))]
        shown = items[:limit] + ([f"and {len(items) - limit} more"] if len(items) > limit else [])
        if shown:
            parts.append("loses with " + "; ".join(shown))
        lines.append(f"- {campaign}, {pair}: " + "; ".join(parts) + ".")
    return lines


def render(ans: Answer, heading: str = "##") -> list[str]:
    """The first screen: one table and a few lines (Markdown; the report's, recommend's and MLflow's)."""
    b = ans.best
    if b.empty:
        return [f"{heading} The answer\n", "_no speed results in the campaigns shown (run `python -m analysis.answer` "
                "or `dvc repro`)_\n"]
    table = pd.DataFrame({"campaign": b.campaign, "pair": b.pair, "kind": b.kind, "best configuration": b.best,
                          "speed-up": b.speedup.map(_x), "95% interval": [_interval(lo, hi) for lo, hi in
                                                                         zip(b.speedup_lo, b.speedup_hi)],
                          "runs": b.runs, "minutes": [f"{m:.1f}" if m == m else "" for m in b.minutes],
                          "runner-up": b.runner_up.fillna(""),
                          "best - runner-up": [f"{_signed(d)} ({lo:.2f} to {hi:.2f})" if d == d and lo == lo else _signed(d) if d == d else ""
                                               for d, lo, hi in zip(b.difference, b.difference_lo, b.difference_hi)],
                          "verdict": b.verdict})
    s = [f"{heading} The answer: speculate or not, with what, how much faster\n",
         "Fastest configuration per campaign, pair and prompt kind, over every drafter, k, k policy and tree shape "
         "measured greedy: speed-up = median of its runs' tokens/s over the adjacent plain run's (95% distribution-"
         "free interval, none from fewer than 6 runs; `runs` = adjacent pairs, `minutes` = their time); best - runner-up: median of the "
         "two runs' differences in the blocks both ran (95% interval, none from fewer than 6 shared blocks), else "
         "the difference of medians (each median's 97.5% interval combined, none from fewer than 7 runs each). "
         "The best is the fastest configuration with an interval (one without ranks below: too few runs to show anything). "
         f"`speculate`: interval above 1, {shows(SPECULATE)}; `unclear`: interval around 1, {shows(UNCLEAR)} (nor "
         f"slower; a median below 1 included); `use plain`: interval below 1, {shows(USE_PLAIN)}; "
         "`too few runs (n of N)`: no interval, so no verdict, until it has N runs.\n",
         table.to_markdown(index=False, disable_numparse=True), ""]
    if len(ans.not_to_use):
        s += ["**When not to speculate** (measured 95% interval below 1; full list in "
              "`outputs/analysis/answer/not_to_use.csv`):\n", *not_to_use_lines(ans.not_to_use), ""]
    if len(ans.provenance):
        prov = per_campaign(ans.provenance, list(dict.fromkeys(b.campaign)))
        s.append("**Measured**: " + "; ".join(f"{p.campaign} {days(p)}, {machine(p)}, commit{'s' if ',' in p.commits else ''} "
                                              f"{p.commits.replace(',', ', ')}" for p in prov.itertuples())
                 + (f" ({UNRECORDED})" if prov.machines.str.contains(NOT_RECORDED).any() else "") + ". Speed-ups hold for the machine that measured them: `python -m pipeline.recheck pair=<pair>` reruns a "
                 "pair's best configurations on yours and says, per kind, whether each holds. Every later section names "
                 "its campaign; *Why numbers differ between sections* says why the same configuration measures "
                 "differently in two of them.\n")
    return s


def render_text(ans: Answer) -> str:
    return "\n".join(render(ans, heading="#"))


# ---------------------------------------------------------------------------------------------- reading
def campaigns(params: dict) -> list[str]:
    """The campaigns the report shows, once each, in the report's order."""
    out = []
    for key in CAMPAIGN_KEYS:
        name = params.get(key)
        if name and name not in out:
            campaign_dir(params["outputs_dir"], name)  # a name, never a path
            out.append(name)
    return out


def read_answer(analysis_dir: str | Path) -> Answer | None:
    """The tables ``main`` wrote, or None when the answer has not been computed yet."""
    t = {name: read_table(Path(analysis_dir) / FOLDER, name.removeprefix("answer_")) for name in TABLES}
    if t["answer_best"].empty:
        return None
    return Answer(t["answer_best"], t["answer_candidates"], t["answer_not_to_use"], t["answer_provenance"])


def compute(params: dict) -> Answer:
    boot = bootstrap_settings(params)
    max_ratio = float(params["drift"]["max_ratio"])
    runs, prov = [], []
    for campaign in campaigns(params):
        speed = read_stage_if_any(params["outputs_dir"], "speed", campaign)
        if speed.empty:
            continue
        if params["drift"].get("exclude", True):
            speed = drop_drifted(speed, drift_table(speed, max_ratio))
        runs.append(speculative_runs(speed, campaign))
    # Dates, machine and commits of every stage a section's speed-ups come from (the time model's campaign too:
    # the planner's check is a section of the report).
    for campaign in dict.fromkeys([*campaigns(params), (params.get("time_model") or {}).get("campaign")]):
        if not campaign:
            continue
        for stage in ("speed", "batch"):
            # a campaign not measured yet (the engines campaign before its runs) has nothing to date
            files = read_stage_files(params["outputs_dir"], campaign, stage) \
                if layout.stage_paths(params["outputs_dir"], campaign, stage) else []
            if files:
                devices = {str(d) for f in files for d in f.data.get("device", pd.Series(dtype=str)).unique()}
                prov.append(provenance(campaign, stage, [f.meta for f in files], sorted(devices)))
    if not runs:
        raise AnalysisError(f"no speed results in the campaigns {campaigns(params)}: nothing to answer")
    runs = pd.concat(runs, ignore_index=True)
    order = {c: i for i, c in enumerate(campaigns(params))}
    cands = candidates(runs, boot)
    best = best_table(runs, cands, boot)
    cands = cands.sort_values("campaign", key=lambda c: c.map(order), kind="mergesort", ignore_index=True)
    best = best.sort_values("campaign", key=lambda c: c.map(order), kind="mergesort", ignore_index=True)
    batch = read_table(params["analysis_dir"], "batch_speedups")
    lose = not_to_use(cands, best, batch, params.get("campaign"))
    return Answer(best, cands, lose, pd.DataFrame(prov))


VERDICT_METRICS = ("speedup", "speedup_lo", "speedup_hi", "precision", "runs", "minutes", "level")


def verdict_metrics(best: pd.DataFrame) -> dict:
    """outputs/metrics/detail/answer.json (``dvc metrics show outputs/metrics/detail/answer.json``): per campaign,
    pair and kind, the verdict and how sure it is (the speed-up, its interval and half its width, the runs and
    minutes it took, the level; null where none)."""
    out: dict = {}
    for r in best.itertuples():
        cell = {m: (None if getattr(r, m) != getattr(r, m) else round(float(getattr(r, m)), 4)) for m in VERDICT_METRICS}
        out.setdefault(r.campaign, {}).setdefault(r.pair, {})[r.kind] = {"best": r.best, **cell, "verdict": r.verdict}
    return out


def _r4(value: float) -> float | None:
    return None if value != value else round(float(value), 4)


def headline_row(best: pd.DataFrame, campaign: str) -> dict:
    """One campaign's row of ``dvc metrics show`` (outputs/metrics/<params key>.json): how many pair x kind answers,
    how many say speculate, unclear, use plain or too few runs, and over them the highest speed-up, the highest
    lower bound of a 95% interval (what one can be sure of) and the median speed-up; a value with no answer behind
    it is left out (`-` in the table)."""
    rows = best[best.campaign == campaign]
    said = rows.verdict.astype(str)
    row = {"campaign": campaign, "pairs": int(rows.pair.nunique()), "answers": len(rows),
           "speculate": int((said == SPECULATE).sum()), "unclear": int((said == UNCLEAR).sum()),
           "use_plain": int((said == USE_PLAIN).sum()), "too_few": int(said.str.startswith("too few runs").sum()),
           "speedup_max": _r4(rows.speedup.max()), "speedup_lo_max": _r4(rows.speedup_lo.max()),
           "speedup_median": _r4(rows.speedup.median())}
    return {k: v for k, v in row.items() if v is not None}


def headline_rows(best: pd.DataFrame, params: dict) -> dict[str, dict]:
    """Per params.yaml key of a campaign the report shows (CAMPAIGN_KEYS), its ``headline_row``: one small file
    each, so that ``dvc metrics show`` is one short table, a row per campaign, and ``dvc metrics diff`` lines the
    rows up from commit to commit."""
    return {key: headline_row(best, params[key]) for key in CAMPAIGN_KEYS if params.get(key)}


def main() -> None:
    params = load_params()
    ans = compute(params)
    out = Path(params["analysis_dir"]) / FOLDER
    for name, df in zip(TABLES, (ans.best, ans.candidates, ans.not_to_use, ans.provenance)):
        save_table(df, out / f"{name.removeprefix('answer_')}.parquet")
    save_csv(ans.candidates, out / "candidates.csv")
    save_csv(ans.not_to_use, out / "not_to_use.csv")
    save_json(verdict_metrics(ans.best), Path(params["metrics_dir"]) / "detail" / "answer.json")
    for key, row in headline_rows(ans.best, params).items():
        save_json(row, Path(params["metrics_dir"]) / f"{key}.json")
    print(render_text(ans))


if __name__ == "__main__":
    run_script("analysis.answer", main)
