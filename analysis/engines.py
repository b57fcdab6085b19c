"""Across engines: the same pair in speclab's loop, llama.cpp and vLLM, each engine priced by its own timed costs.

    python -m analysis.engines     (reads outputs/campaigns/<engines_campaign>/ speed and timing results; writes
                                    outputs/analysis/engines/{summary,predictions,transfer}.parquet and .csv,
                                    outputs/analysis/engines/section.md, outputs/metrics/detail/engines.json)

Per pair, engine and kind (``summary``): plain decoding's tokens/s (median of the plain runs), the best greedy
configuration (the highest median speed-up over the adjacent plain run, as in analysis.answer; for llama.cpp and
vLLM also the server option a user pastes: llama-server's flags, vLLM's --speculative-config), its 95% distribution-free interval and its acceptance (accepted / drafted,
pooled over its runs).

Per configuration (``predictions``): the speed-up each run's own counters predict at its own job's timed costs
(speclab.costs.engine_time: passes = n - accepted, each priced at drafted-per-pass draft steps and a target pass over
drafted-per-pass + 1 tokens, against n target steps; the prompt read first on both sides, at the engine's plain
run's prompt time for that prompt, and by a draft model too at the draft/target step ratio; for an engine such as
llama.cpp, as its plan prices it, speclab.costs.engine_plan: the request's own prompt time, plain decoding paying the
target's share, plus the per-pass and per-drafted-token overheads calibrated on the campaign's acceptance requests
of that pair and engine, a plan's), the median over runs against the measured median, with the chapter's i.i.d. form at the same costs beside it (decode only; its alpha is
accepted / checked, speclab's alpha-hat, where llama.cpp checks every proposal it drafted).

The transfer question (``transfer``): for a pair measured in two engines, the draft model at the same fixed k in
both: engine A's runs (its acceptance, its drafted-per-pass) priced with engine B's timed costs, against B's
measured speed-up. Where that error is as small as B's own prediction's, acceptance measured in one engine
predicts the other's speed-up; where it is larger, acceptance itself differs between the engines (another draft
file, llama.cpp's own stopping rule), not only the costs.

Costs come from each speed job's step times (before and after its runs: target step, draft step, and the target's
pass over k + 1 tokens for each k it ran); pass lengths a job did not time come from the campaign's timing
stage of the same engine and pair (pass_len 1..9, scaled to the job's target step). Drifted jobs are left out, as
everywhere. An absent or empty campaign gives "not measured" lines, never a failed stage.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.answer import ENGINE_NAMES, SPECLAB, config_label, headline_row, verdict
from analysis.common import (bootstrap_ci, bootstrap_settings, load_params, markdown_table, read_stage_if_any,
                             read_table, run_script, save_csv, save_json, save_table)
from analysis.drift import drift_table, drop_drifted
from analysis.inputs import named_campaign
from speclab.specs.arms import NONE, PLAN, Arm, drafter_runs_model
from speclab.costs.engine_plan import (Overheads, engine_costs, engine_counts, fit_overheads, predict_requests,
                                      speed_requests)
from speclab.costs.engine_time import EngineCosts, iid_speedup, predicted_speedups
from engines.llama_cpp.arms import ENGINE as LLAMA, pasted_flags
from engines.vllm.arms import ENGINE as VLLM, pasted_config
from speclab.specs.tree_shapes import is_tree
from store.files import atomic_write_text

FOLDER = "engines"
TABLES = ("summary", "predictions", "transfer")
ALL = "all"
METRICS_KEY = "engines_campaign"  # its `dvc metrics show` row: outputs/metrics/<params key>.json, as the answer's
SUMMARY = ["pair", "engine", "kind", "plain_tokens_per_s", "plain_runs", "best", "pasted_flags", "speedup",
           "speedup_lo", "speedup_hi", "runs", "alpha", "predicted", "verdict"]
PREDICTIONS = ["pair", "engine", "kind", "config", "draft", "runs", "alpha", "drafted_per_pass", "measured",
               "measured_lo", "measured_hi", "predicted", "error", "predicted_iid", "error_iid"]
TRANSFER = ["pair", "kind", "k", "acceptance_of", "costs_of", "alpha_from", "alpha_to", "drafted_per_pass_from",
            "drafted_per_pass_to", "predicted", "predicted_own", "measured", "measured_lo", "measured_hi", "error",
            "error_own"]


def engine_name(engine: str) -> str:
    return ENGINE_NAMES.get(engine, engine)


# ------------------------------------------------------------------------------------------ counters and costs
def _depth_sum(counts: pd.Series) -> pd.Series:
    """The total of comma-separated counts by depth (``3,2,1`` -> 6); NaN where a row has none."""
    def total(text) -> float:
        return float(sum(int(c) for c in str(text).split(","))) if isinstance(text, str) and text else np.nan
    return counts.map(total).astype(float)


def with_counters(spec: pd.DataFrame) -> pd.DataFrame:
    """Speculative speed rows with each request's counters: drafted = mean_k * iterations (proposals per pass
    times passes); accepted = the sum of speclab's accepted-by-depth counts where a row has its checked-by-depth
    counts too (its acceptance_rate is accepted / checked: proposals after a rejection are never judged), else
    acceptance_rate * drafted (the engines', accepted / drafted from their own counters; none drafted: none
    accepted; vLLM's accepted by position comes from its histogram of verify steps, which need not add up to its
    request's accepted count); checked = the sum of speclab's checked-by-depth counts, else drafted (an engine checks
    every proposal it drafted in one pass)."""
    drafted, accepted = engine_counts(spec)
    checked = drafted
    if "accepted_by_depth" in spec and "checked_by_depth" in spec:
        loop_checked = _depth_sum(spec.checked_by_depth)
        accepted = _depth_sum(spec.accepted_by_depth).where(loop_checked.notna()).fillna(accepted)
        checked = loop_checked.fillna(drafted)
    return spec.assign(drafted=drafted, accepted=accepted, checked=checked)


def priceable(spec: pd.DataFrame) -> pd.Series:
    """Rows the engine time model prices: a chain of proposals from the loop or the engine (not a tree, whose pass
    is wider than its depth; not transformers' generate, which counts nothing)."""
    return spec.arm.isin(["speculative", "recommended"]) & ~spec.drafter.isin([NONE, PLAN]) & \
        ~spec.drafter.map(is_tree)


def runs_model(engine: str, drafter: str) -> bool:
    """Whether the drafter pays a draft model's step per proposal (llama.cpp and vLLM: their ``model`` type;
    speclab: the draft model and hybrid); n-gram drafters draft for free."""
    return drafter_runs_model(drafter) if engine == SPECLAB else drafter == "model"


def _mean_of(rows: pd.DataFrame, name: str) -> float:
    cols = [c for c in (f"{name}_before_s", f"{name}_after_s") if c in rows]
    values = rows[cols].to_numpy(dtype=float).ravel() if cols else np.array([])
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")


def timing_curve(timing: pd.DataFrame, pair: str, engine: str) -> dict[int, float]:
    """The target's pass time per pass length at the prompt's context (median over prompts and jobs), from the
    campaign's timing stage of this engine and pair; empty when not timed."""
    if timing.empty:
        return {}
    t = timing[(timing.pair == pair) & (timing.engine == engine) & (timing.model == "target") &
               (timing.context_len > 0)]
    t = t[t.context_len == t.groupby("prompt_id").context_len.transform("min")]  # the prompt's own context
    return {int(m): float(s) for m, s in t.groupby("pass_len").median_s.median().items()}


def costs_of(rows: pd.DataFrame, curve: dict[int, float] | None = None) -> EngineCosts | None:
    """An engine's timed costs from speed rows (their jobs' step times before and after: the target step, the
    draft step, and the pass over k + 1 tokens per k run), lengths not timed there filled from ``curve`` (the
    timing stage's, scaled to these rows' target step). None without a target step."""
    target, draft = _mean_of(rows, "target_step"), _mean_of(rows, "draft_step")
    if target != target:
        return None
    passes = {int(k) + 1: _mean_of(g, "verify") for k, g in rows[rows.k > 0].groupby("k")}
    passes = {m: s for m, s in passes.items() if s == s}
    if curve and 1 in curve:
        scale = target / curve[1]
        passes = {**{m: scale * s for m, s in curve.items() if m > 1}, **passes}
    return EngineCosts.from_timings(target, draft if draft == draft else 0.0, passes)


def prompt_times(plain: pd.DataFrame, pair: str, engine: str) -> dict[str, float]:
    """Per prompt, the engine's plain run reading it (median of its plain rows' ``prefill_s``): the prompt time a
    request of either kind pays before its first token."""
    p = plain[(plain.pair == pair) & (plain.engine == engine)]
    return {str(k): float(v) for k, v in p.groupby("prompt_id").prefill_s.median().items() if v == v}


def predict_rows(spec: pd.DataFrame, costs: EngineCosts | None, prompts: dict[str, float] | None = None) -> np.ndarray:
    """Each row's predicted speed-up at ``costs`` (its drafter's: a free draft for n-gram types), its prompt read
    first at ``prompts``' time for it (a prompt not there: their median) by the target, and by a draft model at the
    draft/target step ratio."""
    if costs is None or spec.empty:
        return np.full(len(spec), np.nan)
    prompts = prompts or {}
    fallback = float(np.median(list(prompts.values()))) if prompts else 0.0
    prompt = spec.prompt_id.map(lambda p: prompts.get(str(p), fallback)).to_numpy(dtype=float)
    out = np.full(len(spec), np.nan)
    for uses_model in (True, False):
        sel = np.array([runs_model(e, d) == uses_model for e, d in zip(spec.engine, spec.drafter)], dtype=bool)
        if sel.any():
            c = costs if uses_model else costs.without_draft()
            draft_prompt = prompt[sel] * (c.draft_step_s / c.target_step_s)
            out[sel] = predicted_speedups(c, spec.new_tokens[sel], spec.drafted[sel], spec.accepted[sel],
                                          prompt[sel], draft_prompt)
    return out


def calibration(timing: pd.DataFrame, acceptance: pd.DataFrame, pair: str, engine: str) -> Overheads:
    """What an engine's timed passes leave out (speclab.costs.engine_plan.fit_overheads), fitted on the campaign's
    acceptance requests of this pair and engine (a plan's) at its timing stage's costs; none without them."""
    if engine == SPECLAB or timing.empty or acceptance.empty or "total_s" not in acceptance:
        return Overheads()
    t = timing[(timing.pair == pair) & (timing.engine == engine)]
    a = acceptance[(acceptance.pair == pair) & (acceptance.engine == engine)]
    if a.empty or not (t.model == "target").any():
        return Overheads()
    return fit_overheads(engine_costs(t), a)


def price(rows: pd.DataFrame, costs: EngineCosts | None, engine: str, pair: str, plain: pd.DataFrame,
          overheads: Overheads, spec_prompts: dict[str, float] | None = None) -> np.ndarray:
    """``rows``' predicted speed-ups at ``engine``'s costs: speclab's loop with that engine's plain runs' prompt
    times (``predict_rows``); an engine such as llama.cpp the way its plan prices it (speclab.costs.engine_plan: each
    request's prompt time, plain decoding paying the target's share, plus ``overheads``, the engine's
    ``calibration``). ``spec_prompts``: the engine's own speculative prompt times, for rows of another engine."""
    if engine == SPECLAB or costs is None:
        return predict_rows(rows, costs, prompt_times(plain, pair, engine))
    out = pd.Series(np.nan, index=rows.index)
    priced = rows[rows.iterations > 0]
    requests = speed_requests(priced)
    if spec_prompts:
        fallback = float(np.median(list(spec_prompts.values())))
        requests["prefill_s"] = requests.prompt_id.map(lambda p: spec_prompts.get(str(p), fallback)).astype(float)
    out[priced.index] = predict_requests(costs, requests, overheads).predicted.values
    return out.to_numpy()


def own_predictions(spec: pd.DataFrame, plain: pd.DataFrame, timing: pd.DataFrame,
                    overheads: dict[tuple[str, str], Overheads]) -> np.ndarray:
    """Every row priced at its own job's timed costs (``price``)."""
    out = pd.Series(np.nan, index=spec.index)
    for (pair, engine, _job), g in spec.groupby(["pair", "engine", "config_hash"], sort=False):
        out[g.index] = price(g, costs_of(g, timing_curve(timing, pair, engine)), engine, pair, plain,
                             overheads.get((pair, engine), Overheads()))
    return out.to_numpy()


# ------------------------------------------------------------------------------------------------- tables
def _pooled(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([rows, rows.assign(kind=ALL)], ignore_index=True)


def _alpha(g: pd.DataFrame) -> float:
    return float(g.accepted.sum() / g.drafted.sum()) if g.drafted.sum() > 0 else float("nan")


def _per_pass(g: pd.DataFrame) -> float:
    passes = (g.new_tokens - g.accepted).sum()
    return float(g.drafted.sum() / passes) if passes > 0 else float("nan")


def _iid_k(config: pd.DataFrame) -> int:
    """The i.i.d. form's k: the arm's fixed k, or (where the engine chose how many to draft) the mean drafted per
    pass, rounded (0, no form, when nothing was drafted)."""
    k, per_pass = int(config.k.iloc[0]), _per_pass(config)
    if k > 0:
        return k
    return max(1, int(round(per_pass))) if per_pass == per_pass and per_pass > 0 else 0


def predictions(spec: pd.DataFrame, costs: dict[tuple[str, str], EngineCosts | None], boot: dict) -> pd.DataFrame:
    """Per pair, engine, kind (and all kinds) and configuration: measured median speed-up (95% interval),
    the runs' own prediction (median) and the i.i.d. form at the pair and engine's costs, with their errors."""
    rows = []
    for (pair, engine, kind, config), g in _pooled(spec).groupby(["pair", "engine", "kind", "config"], sort=True):
        r = g.ratio_to_adjacent_plain.to_numpy(dtype=float)
        lo, hi = bootstrap_ci(r, np.median, **boot)
        measured, predicted = float(np.median(r)), float(np.nanmedian(g.predicted)) if g.predicted.notna().any() \
            else np.nan
        c = costs.get((pair, engine))
        iid = np.nan
        if c is not None and bool(g.priceable.all()):
            c = c if runs_model(engine, g.drafter.iloc[0]) else c.without_draft()
            alpha_hat = float(g.accepted.sum() / g.checked.sum()) if g.checked.sum() > 0 else np.nan
            iid = iid_speedup(c, alpha_hat, _iid_k(g)) if alpha_hat == alpha_hat else np.nan
        rows.append({"pair": pair, "engine": engine, "kind": kind, "config": config,
                     "draft": ", ".join(sorted(set(g.draft))), "runs": len(r), "alpha": _alpha(g),
                     "drafted_per_pass": _per_pass(g), "measured": measured, "measured_lo": lo, "measured_hi": hi,
                     "predicted": predicted, "error": predicted - measured, "predicted_iid": iid,
                     "error_iid": iid - measured})
    return pd.DataFrame(rows, columns=PREDICTIONS)


def flags_of(row: pd.Series) -> str:
    """What a user pastes into their server command for this configuration: llama-server's flags (its draft named
    by file when the rows name a .gguf), vLLM's --speculative-config (its draft named as the rows name it); speclab's
    loop: nothing."""
    arm = Arm("speculative", int(row.k) or None, str(row.k_policy), str(row.drafter), str(row.engine))
    draft = str(row.draft)
    if row.engine == LLAMA:
        return pasted_flags(arm, Path(draft).name if draft.endswith(".gguf") else "DRAFT.gguf")
    if row.engine == VLLM:
        return pasted_config(arm, draft.removesuffix(" (copy)"))
    return ""


def summary(speed: pd.DataFrame, spec: pd.DataFrame, preds: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per pair, engine and kind: plain tokens/s, the best greedy configuration (the fastest with an interval, else
    the fastest) with its interval, acceptance and
    prediction (``preds``' row of it), its flags and the verdict (analysis.answer's)."""
    plain = speed[(speed.arm == "plain") & ~speed.do_sample]
    out = []
    for (pair, engine, kind), g in preds[preds.kind != ALL].groupby(["pair", "engine", "kind"], sort=True):
        # the fastest configuration with an interval, as the answer's (analysis.answer.candidates)
        g = g.assign(_interval=g.measured_lo.notna()).sort_values(
            ["_interval", "measured", "runs", "config"], ascending=[False, False, False, True], kind="mergesort")
        best = g.iloc[0]
        p = plain[(plain.pair == pair) & (plain.engine == engine) & (plain.kind == kind)]
        example = spec[(spec.pair == pair) & (spec.engine == engine) & (spec.config == best.config)].iloc[0]
        out.append({"pair": pair, "engine": engine, "kind": kind,
                    "plain_tokens_per_s": float(p.tokens_per_s.median()) if len(p) else np.nan, "plain_runs": len(p),
                    "best": best.config, "pasted_flags": flags_of(example), "speedup": best.measured,
                    "speedup_lo": best.measured_lo, "speedup_hi": best.measured_hi, "runs": int(best.runs),
                    "alpha": best.alpha, "predicted": best.predicted,
                    "verdict": verdict(best.measured, best.measured_lo, best.measured_hi, best.runs, level)})
    return pd.DataFrame(out, columns=SUMMARY)


def matched(spec: pd.DataFrame) -> pd.DataFrame:
    """The rows the engines can be matched on: the draft model at a fixed k (``drafter=model``, k > 0)."""
    return spec[(spec.drafter == "model") & (spec.k > 0) & (spec.k_policy == "fixed") & spec.priceable]


def transfer(spec: pd.DataFrame, plain: pd.DataFrame, costs: dict[tuple[str, str], EngineCosts | None],
             boot: dict, overheads: dict[tuple[str, str], Overheads] | None = None) -> pd.DataFrame:
    """Per pair measured in two engines, kind (and all kinds) and k run by both: engine A's runs priced with engine
    B's costs and B's prompt times (median over A's runs) against B's measured speed-up, beside B's runs priced
    the same way."""
    m = _pooled(matched(spec))
    rows = []
    for (pair, kind, k), g in m.groupby(["pair", "kind", "k"], sort=True):
        engines = sorted(set(g.engine))
        for a in engines:
            for b in engines:
                c = costs.get((pair, b))
                if a == b or c is None:
                    continue
                ga, gb = g[g.engine == a], g[g.engine == b]
                own_prompts = gb.groupby("prompt_id").prefill_s.median()
                priced = price(ga, c, b, pair, plain, (overheads or {}).get((pair, b), Overheads()),
                               {str(p): float(v) for p, v in own_prompts.items() if v == v})
                r = gb.ratio_to_adjacent_plain.to_numpy(dtype=float)
                lo, hi = bootstrap_ci(r, np.median, **boot)
                measured = float(np.median(r))
                own = float(np.nanmedian(gb.predicted)) if gb.predicted.notna().any() else np.nan
                predicted = float(np.nanmedian(priced)) if np.isfinite(priced).any() else np.nan
                rows.append({"pair": pair, "kind": kind, "k": int(k), "acceptance_of": a, "costs_of": b,
                             "alpha_from": _alpha(ga), "alpha_to": _alpha(gb), "drafted_per_pass_from": _per_pass(ga),
                             "drafted_per_pass_to": _per_pass(gb), "predicted": predicted, "predicted_own": own,
                             "measured": measured, "measured_lo": lo, "measured_hi": hi,
                             "error": predicted - measured, "error_own": own - measured})
    return pd.DataFrame(rows, columns=TRANSFER)


def compute(speed: pd.DataFrame, timing: pd.DataFrame, boot: dict,
            acceptance: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The three tables from a campaign's (drift-filtered) speed rows, its timing rows and its acceptance rows
    (an engine's calibration)."""
    greedy = speed[~speed.do_sample.astype(bool) & speed.ratio_to_adjacent_plain.notna()] if len(speed) else speed
    spec = greedy[greedy.arm != "plain"] if len(greedy) else greedy
    if spec.empty:
        return {"summary": pd.DataFrame(columns=SUMMARY), "predictions": pd.DataFrame(columns=PREDICTIONS),
                "transfer": pd.DataFrame(columns=TRANSFER)}
    spec = with_counters(spec).assign(config=lambda d: config_label(d), priceable=lambda d: priceable(d))
    plain = greedy[greedy.arm == "plain"]
    acceptance = pd.DataFrame() if acceptance is None else acceptance
    overheads = {(pair, engine): calibration(timing, acceptance, pair, engine)
                 for pair, engine in spec[["pair", "engine"]].drop_duplicates().itertuples(index=False)}
    spec = spec.assign(predicted=np.where(spec.priceable, own_predictions(spec, plain, timing, overheads), np.nan))
    costs = {(pair, engine): costs_of(g, timing_curve(timing, pair, engine))
             for (pair, engine), g in speed.groupby(["pair", "engine"], sort=True)}
    preds = predictions(spec, costs, boot)
    return {"summary": summary(greedy, spec, preds, float(boot.get("level", 0.95))), "predictions": preds,
            "transfer": transfer(spec, plain, costs, boot, overheads)}


# ---------------------------------------------------------------------------------------------- rendering
def _x(v: float) -> str:
    return "" if v != v else f"{v:.2f}"


def _ci(lo: float, hi: float) -> str:
    return "" if lo != lo else f"{lo:.2f}-{hi:.2f}"


def _with_interval(lo: float, hi: float, verdict: str) -> str:
    """``1.02-1.16, speculate``; the verdict alone where there is no interval (``too few runs (4 of 6)``)."""
    return f"{_ci(lo, hi)}, {verdict}" if lo == lo else verdict


def not_measured(campaign: str) -> str:
    return (f"Not measured: campaign **{campaign}** holds no greedy speed runs. Run one pair in every engine: "
            f"`make qwen llama-cpp vllm && python -m pipeline.run +sweep=engines campaign={campaign}`, "
            "then `dvc repro`.")


def transfer_lines(tr: pd.DataFrame) -> list[str]:
    """One line per direction: the mean absolute error over kinds and k, against the other engine's own."""
    lines = []
    for (a, b), g in tr[tr.kind != ALL].groupby(["acceptance_of", "costs_of"], sort=True):
        err, own = g.error.abs().mean(), g.error_own.abs().mean()
        lines.append(f"{engine_name(a)}'s acceptance priced with {engine_name(b)}'s timed costs predicts "
                     f"{engine_name(b)}'s draft-model speed-up (k = {', '.join(map(str, sorted(set(g.k))))}) with a "
                     f"mean absolute error of {err:.2f} ({engine_name(b)}'s own runs priced the same way: {own:.2f})")
    return lines


COMMON_ARM = "draft model k=4"  # the configuration both engines run (conf/sweep/engines.yaml): named on every line


def _common_arm(preds: pd.DataFrame, pair: str, engine: str) -> str:
    """``; draft model k=4 over all kinds x0.54 (0.52-0.57)`` where the engine ran it on every kind pooled."""
    if preds is None or preds.empty:
        return ""
    row = preds[(preds.pair == pair) & (preds.engine == engine) & (preds.config == COMMON_ARM) & (preds.kind == ALL)]
    if row.empty:
        return ""
    r = row.iloc[0]
    interval = f" ({_ci(r.measured_lo, r.measured_hi)})" if r.measured_lo == r.measured_lo else f" (n={int(r.runs)})"
    return f"; {COMMON_ARM} over all kinds x{_x(r.measured)}{interval}"


def first_screen(tables: dict[str, pd.DataFrame], campaign: str, link: str) -> str:
    """The report's first-screen block: one row per pair, kind and engine, the transfer's errors, the link."""
    s = [f"### Across engines (campaign {campaign})\n"]
    sm = tables.get("summary", pd.DataFrame())
    if sm is None or sm.empty:
        return "\n".join(s + [not_measured(campaign), ""])
    sm = sm.sort_values(["pair", "engine", "kind"], kind="mergesort")
    s.append("Per pair, each engine's plain tokens/s (median over kinds) and, per prompt kind, its best greedy "
             "configuration's speed-up over its own adjacent plain run (95% distribution-free interval; the full table: the "
             "section linked below):\n")
    preds = tables.get("predictions", pd.DataFrame())
    for pair, g in sm.groupby("pair", sort=True):
        parts = []
        for engine, e in g.groupby("engine", sort=True):
            kinds = "; ".join(f"{r.kind} {r.best}" + (f" `{r.pasted_flags}`" if r.pasted_flags else "")
                              + f" x{_x(r.speedup)} ({_with_interval(r.speedup_lo, r.speedup_hi, r.verdict)})"
                              for r in e.itertuples())
            parts.append(f"**{engine_name(engine)}** {e.plain_tokens_per_s.median():.1f} tok/s: {kinds}"
                         + _common_arm(preds, pair, engine))
        s.append(f"- {pair}: " + " | ".join(parts))
    s.append("")
    tr = tables.get("transfer", pd.DataFrame())
    lines = transfer_lines(tr) if tr is not None and len(tr) else []
    s.append(("Transfer: " + "; ".join(lines) + ". " if lines else "") + f"Every configuration, predicted vs "
             f"measured, and the transfer table: [{link}]({link}).\n")
    return "\n".join(s)


def markdown(tables: dict[str, pd.DataFrame], campaign: str) -> str:
    s = [f"## Across engines: speclab's loop, llama.cpp and vLLM (campaign {campaign})\n"]
    sm, preds, tr = tables["summary"], tables["predictions"], tables["transfer"]
    if sm.empty:
        return "\n".join(s + [not_measured(campaign), ""])
    s += ["Speed-up: median over runs of tokens/s over the adjacent plain run of the same engine (95% distribution-free "
          "interval); alpha = accepted / drafted, pooled over runs. Predicted (speclab.costs.engine_time): each run's own "
          "counters at its job's timed costs, passes = n - accepted, each a target pass over drafted-per-pass + 1 "
          "tokens plus drafted-per-pass draft steps (none for n-gram types), against n target steps; median over "
          "runs; llama.cpp's and vLLM's runs as their plans price them (speclab.costs.engine_plan: plus the per-pass and "
          "per-drafted-token overheads calibrated on the campaign's acceptance requests of that engine). `predicted_iid`: the chapter's i.i.d. form at the same costs (alpha = accepted / checked). error = "
          "predicted - measured.\n",
          "**Per pair, kind and engine: the best configuration**\n",
          markdown_table(sm.assign(engine=sm.engine.map(engine_name)), ".2f"), ""]
    s += ["**Every configuration, predicted vs measured**\n",
          markdown_table(preds.assign(engine=preds.engine.map(engine_name)), ".2f"), ""]
    if preds.error.notna().any():
        s.append("Mean absolute error of the prediction per engine (kinds, not pooled): " + "; ".join(
            f"{engine_name(e)} {g.error.abs().mean():.2f} (i.i.d. form {g.error_iid.abs().mean():.2f}, "
            f"{g.error.notna().sum()} configurations)" for e, g in preds[preds.kind != ALL].groupby("engine")) + ".\n")
    s.append("**The transfer question**: engine A's runs of the draft model at k (their acceptance and drafted per "
             "pass) priced with engine B's timed costs, against B's measured speed-up; `predicted_own`: B's own runs "
             "priced the same way. A transfer error well above the own error says the acceptance itself differs "
             "between the engines (another draft file, another rule for when to stop drafting).\n")
    if tr.empty:
        s.append("Not measured: no pair ran the draft model at the same fixed k in two engines of this campaign.\n")
    else:
        s += [markdown_table(tr.assign(acceptance_of=tr.acceptance_of.map(engine_name),
                                       costs_of=tr.costs_of.map(engine_name)), ".2f"), "",
              *(f"- {line}." for line in transfer_lines(tr)), ""]
    return "\n".join(s)


def metrics(tables: dict[str, pd.DataFrame]) -> dict:
    """outputs/metrics/detail/engines.json: per pair, engine and kind the headline numbers; per engine the prediction's
    mean absolute error; per direction the transfer's."""
    out: dict = {}
    for r in tables["summary"].itertuples():
        out.setdefault(r.pair, {}).setdefault(r.engine, {})[r.kind] = {
            "plain_tokens_per_s": r.plain_tokens_per_s, "best": r.best, "speedup": r.speedup,
            "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi, "alpha": r.alpha}
    preds = tables["predictions"]
    for (pair, engine), g in preds[(preds.kind != ALL) & preds.error.notna()].groupby(["pair", "engine"]):
        out[pair][engine]["predictor_mae"] = float(g.error.abs().mean())
    tr = tables["transfer"]
    for (pair, a, b), g in tr[(tr.kind != ALL) & tr.error.notna()].groupby(["pair", "acceptance_of", "costs_of"]):
        out[pair].setdefault("transfer_mae", {})[f"{a}->{b}"] = float(g.error.abs().mean())
    return _finite(out)


def verdict_counts(summary: pd.DataFrame, campaign: str) -> dict:
    """The engines line's row of ``dvc metrics show`` (outputs/metrics/engines_campaign.json): its pair x engine x
    kind cells, how many say speculate, unclear, use plain or too few runs (analysis.answer.headline_row)."""
    return headline_row(summary.assign(campaign=campaign), campaign)


def _finite(data):
    """NaN (not measured) as null: JSON has no NaN."""
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    return None if isinstance(data, float) and data != data else data


# ---------------------------------------------------------------------------------------------- reading
def read_tables(analysis_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables ``main`` wrote (empty frames where not written yet)."""
    return {name: read_table(Path(analysis_dir) / FOLDER, name) for name in TABLES}


def read_campaign(params: dict, campaign: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The campaign's speed rows (drifted jobs left out when drift.exclude), its timing and acceptance rows."""
    outputs = params["outputs_dir"]
    speed, timing, acceptance = (read_stage_if_any(outputs, stage, campaign)
                                 for stage in ("speed", "timing", "acceptance"))
    if not speed.empty and params["drift"].get("exclude", True):
        speed = drop_drifted(speed, drift_table(speed, float(params["drift"]["max_ratio"])))
    for df in (speed, timing, acceptance):
        if not df.empty and "engine" not in df:
            df["engine"] = SPECLAB
    return speed, timing, acceptance


def main() -> None:
    params = load_params()
    campaign = named_campaign(params, "engines_campaign")
    speed, timing, acceptance = read_campaign(params, campaign)
    tables = compute(speed, timing, bootstrap_settings(params), acceptance)
    out = Path(params["analysis_dir"]) / FOLDER
    for name, df in tables.items():
        save_table(df, out / f"{name}.parquet")
        save_csv(df, out / f"{name}.csv")
    save_json(metrics(tables), Path(params["metrics_dir"]) / "detail" / "engines.json")
    save_json(verdict_counts(tables["summary"], campaign), Path(params["metrics_dir"]) / f"{METRICS_KEY}.json")
    text = markdown(tables, campaign)
    atomic_write_text(out / "section.md", text)
    print(text)


if __name__ == "__main__":
    run_script("analysis.engines", main)
