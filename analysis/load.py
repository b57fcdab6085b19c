"""Speculation under load: the gains at each load, the load at which they reach 1, the time model's prediction of
them, and the recommendation per load.

    python -m analysis.load     (reads outputs/campaigns/<load_campaign>/load/; writes outputs/analysis/load/
                                 {gains,break_even,recommendation}.parquet and .csv, outputs/analysis/load/section.md,
                                 outputs/figures/load_speedup.png, outputs/metrics/load_campaign.json (its
                                 `dvc metrics show` row) and outputs/metrics/detail/load.json)

Per pair, engine, configuration, kind and load (``gains``): the latency gain (plain's median end-to-end latency over
the configuration's) and the throughput gain (output tokens/s over plain's) of each block against the plain block
beside it (speclab.stats.load_gains), their median over blocks with its 95% distribution-free interval, the
acceptance (accepted / drafted) and the gains the time model predicts (speclab.costs.load_model: the job's own
passes over n new tokens on one sequence, each request's tokens per target pass, its plain twin's times at that load),
with the error predicted - measured. The model predicts each speculative request from its plain twin in the block
beside it (its time to first token and per output token at that load), the job's passes and the request's own
counters; the predicted gains aggregate those requests as the measured gains do (latency: medians; throughput: sums).

Per pair, engine, configuration and kind (``break_even``): the load at which each gain reaches 1
(speclab.stats.break_even: interpolated in log-log between the loads measured, a bootstrap interval over each load's
blocks, open where it leaves the loads measured).

Per pair, engine and kind (``recommendation``): the configuration with the largest throughput gain at the smallest
load, "speculate with it up to N concurrent requests, plain above" with N the largest load up to which its
throughput gain stays above 1, and the engine's own switch to paste (its ``load_switch``).
Same concept, other floors: ``pipeline/stages/load.py``, ``engines/speclab/load.py``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.answer import headline_row
from analysis.common import (bootstrap_settings, load_params, markdown_table, read_stage_if_any, read_table, run_script, save_csv,
                             save_json, save_table)
from analysis.inputs import named_campaign
from engines.llama_cpp import arms as llama_arms
from engines.vllm import arms as vllm_arms
from speclab.costs.load_model import PassCurve, predict_load
from speclab.specs.arms import ENGINE_NAMES, Arm, drafter_runs_model
from speclab.stats.break_even import break_even
from speclab.stats.load_gains import ALL, block_gains, gain_interval, speed_check as check_speed
from speclab.stats.verdict import verdict
from store.files import atomic_write_text

FOLDER = "load"
TABLES = ("gains", "break_even", "recommendation")
METRICS_KEY = "load_campaign"  # its `dvc metrics show` row: outputs/metrics/<params key>.json
FIGURE = "load_speedup.png"
SWITCHES = {llama_arms.ENGINE: llama_arms.load_switch, vllm_arms.ENGINE: vllm_arms.load_switch}
GAINS = ["pair", "engine", "config", "kind", "load", "blocks", "latency_gain", "latency_lo", "latency_hi",
         "throughput_gain", "throughput_lo", "throughput_hi", "alpha", "tokens_per_pass", "plain_tokens_per_s",
         "tokens_per_s", "plain_tpot_ms", "tpot_ms", "predicted", "predicted_throughput", "latency_error",
         "throughput_error", "unpriced_ms_per_pass"]
BREAK_EVEN = ["pair", "engine", "config", "kind", "gain", "load", "lo", "hi", "lo_open", "hi_open", "loads", "text"]
RECOMMENDATION = ["pair", "engine", "kind", "config", "up_to", "largest_load", "text", "switch"]


def engine_name(engine: str) -> str:
    return ENGINE_NAMES.get(engine, engine)


def arm_of(row) -> Arm:
    return Arm(str(row.arm), int(row.k) or None, str(row.k_policy), str(row.drafter), str(row.engine))


def curves(passes: pd.DataFrame) -> dict[str, PassCurve]:
    """Each model's pass curve (median over the job's timings of each length)."""
    out = {}
    for model, g in passes.groupby("model"):
        m = g.groupby("pass_len").median_s.median()
        if len(m) >= 2:
            out[str(model)] = PassCurve(tuple(int(n) for n in m.index), tuple(float(s) for s in m.values))
    return out


def predicted_requests(req: pd.DataFrame, c: dict[str, PassCurve]) -> pd.DataFrame:
    """Each speculative request's latency as the time model predicts it (speclab.costs.load_model) from its plain
    twin (the same request in the plain block beside it: its time to first token and time per output token at
    that load), the job's pass curves and its own counters (tokens over target passes)."""
    out = []
    if "target" not in c:
        return pd.DataFrame(columns=["label", "load", "block", "kind", "request", "plain_s", "predicted_s",
                                     "unpriced_s"])
    for (load, block), blk in req.groupby(["load", "block"], sort=False):
        plain = blk[blk.arm == "plain"].set_index("request")
        for r in blk[blk.arm != "plain"].itertuples():
            if r.request not in plain.index or not 0 < r.passes <= r.new_tokens:
                continue
            twin = plain.loc[r.request]
            draft = c.get("draft") if drafter_runs_model(str(r.drafter)) else None
            p = predict_load(c["target"], draft, int(load), int(r.k), r.new_tokens / r.passes, float(r.new_tokens),
                             float(twin.ttft_s), float(twin.tpot_s))
            tau = r.new_tokens / r.passes
            out.append({"label": r.label, "load": int(load), "block": block, "kind": r.kind, "request": r.request,
                        "plain_s": float(twin.latency_s), "predicted_s": p.spec_latency_s,
                        # what a speculative pass took beyond its price: the engine's own cost of speculating
                        "unpriced_s": (float(r.tpot_s) - p.spec_token_s) * tau})
    return pd.DataFrame(out, columns=["label", "load", "block", "kind", "request", "plain_s", "predicted_s",
                                      "unpriced_s"])


def job_gains(rows: pd.DataFrame) -> pd.DataFrame:
    """Block gains of one job's rows, per kind and for all its kinds, with the gains the time model predicts for the
    same requests, aggregated as the measured ones are: latency over the medians, throughput over the sums (in a
    closed loop a block's wall time is its requests' latencies over the load)."""
    req = rows[rows.measure == "request"]
    g = block_gains(req, kinds=True)
    if g.empty:
        return g
    pred = predicted_requests(req, curves(rows[rows.measure == "pass"]))
    latency, throughput, unpriced = {}, {}, {}
    for (label, load, block), b in pred.groupby(["label", "load", "block"], sort=False):
        for kind, s in [(ALL, b), *b.groupby("kind")]:
            latency[(label, load, block, kind)] = s.plain_s.median() / s.predicted_s.median()
            throughput[(label, load, block, kind)] = s.plain_s.sum() / s.predicted_s.sum()
            unpriced[(label, load, block, kind)] = s.unpriced_s.median()
    keys = list(zip(g.label, g.load, g.block, g.kind))
    return g.assign(predicted=[latency.get(k, np.nan) for k in keys],
                    predicted_throughput=[throughput.get(k, np.nan) for k in keys],
                    unpriced_s=[unpriced.get(k, np.nan) for k in keys],
                    engine=str(req.engine.iloc[0]), pair=str(req.pair.iloc[0]))


def gains_table(blocks: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Per pair, engine, configuration, kind and load: the gains over blocks with intervals, and the prediction."""
    out = []
    for (pair, engine, label, kind, load), g in blocks.groupby(["pair", "engine", "label", "kind", "load"], sort=True):
        lat, lat_lo, lat_hi = gain_interval(g.latency_gain.to_numpy())
        thr, thr_lo, thr_hi = gain_interval(g.throughput_gain.to_numpy())
        pred = float(np.median(g.predicted)) if g.predicted.notna().any() else np.nan
        pred_thr = float(np.median(g.predicted_throughput)) if g.predicted_throughput.notna().any() else np.nan
        out.append({"pair": pair, "engine": engine, "config": label, "kind": kind, "load": int(load),
                    "blocks": len(g), "latency_gain": lat, "latency_lo": lat_lo, "latency_hi": lat_hi,
                    "throughput_gain": thr, "throughput_lo": thr_lo, "throughput_hi": thr_hi,
                    "alpha": g.accepted.sum() / g.drafted.sum() if g.drafted.sum() else np.nan,
                    "tokens_per_pass": g.new_tokens.sum() / g.passes.sum() if g.passes.sum() else np.nan,
                    "plain_tokens_per_s": float(g.plain_tokens_per_s.median()),
                    "tokens_per_s": float(g.tokens_per_s.median()), "plain_tpot_ms": 1e3 * float(g.plain_tpot_s.median()),
                    "tpot_ms": 1e3 * float(g.tpot_s.median()), "predicted": pred,
                    "predicted_throughput": pred_thr, "latency_error": pred - lat, "throughput_error": pred_thr - thr,
                    "unpriced_ms_per_pass": 1e3 * float(g.unpriced_s.median())})
    return pd.DataFrame(out, columns=GAINS)


def break_even_table(blocks: pd.DataFrame, level: float, samples: int, seed: int) -> pd.DataFrame:
    out = []
    for (pair, engine, label, kind), g in blocks.groupby(["pair", "engine", "label", "kind"], sort=True):
        if g.load.nunique() < 2:
            continue
        for gain in ("latency", "throughput"):
            ratios = {int(c): s[f"{gain}_gain"].dropna().to_numpy() for c, s in g.groupby("load")}
            b = break_even(ratios, level, samples, seed)
            out.append({"pair": pair, "engine": engine, "config": label, "kind": kind, "gain": gain, "load": b.load,
                        "lo": b.lo, "hi": b.hi, "lo_open": b.lo_open, "hi_open": b.hi_open,
                        "loads": ",".join(str(c) for c in sorted(ratios)), "text": b.text()})
    return pd.DataFrame(out, columns=BREAK_EVEN)


def recommendation(gains: pd.DataFrame, arms: dict[tuple[str, str, str], Arm]) -> pd.DataFrame:
    """Per pair, engine and kind: the configuration whose throughput gain at the smallest load is largest, and the
    largest load up to which its gain stays above 1 (0: plain at every load measured)."""
    out = []
    for (pair, engine, kind), g in gains.groupby(["pair", "engine", "kind"], sort=True):
        smallest = g[g.load == g.load.min()]
        best = smallest.sort_values("throughput_gain", ascending=False).iloc[0].config
        mine = g[g.config == best].sort_values("load")
        up_to = 0
        for r in mine.itertuples():
            if not r.throughput_gain > 1:
                break
            up_to = int(r.load)
        largest = int(mine.load.max())
        arm = arms[(pair, engine, best)]
        switch = SWITCHES[engine](arm, up_to) if engine in SWITCHES and 0 < up_to < largest else ""
        if up_to == 0:
            text = (f"plain at every load measured ({best}: throughput x{mine.throughput_gain.iloc[0]:.2f} at "
                    f"{int(mine.load.min())})")
        elif up_to >= largest:
            text = f"speculate with {best} at every load measured (up to {largest})"
        else:
            text = f"speculate with {best} up to {up_to} concurrent requests, plain above"
        out.append({"pair": pair, "engine": engine, "kind": kind, "config": best, "up_to": up_to,
                    "largest_load": largest, "text": text, "switch": switch})
    return pd.DataFrame(out, columns=RECOMMENDATION)


def compute(rows: pd.DataFrame, level: float = 0.95, samples: int = 2000, seed: int = 0) -> dict[str, pd.DataFrame]:
    if rows.empty:
        return {"gains": pd.DataFrame(columns=GAINS), "break_even": pd.DataFrame(columns=BREAK_EVEN),
                "recommendation": pd.DataFrame(columns=RECOMMENDATION), "blocks": pd.DataFrame()}
    rows = rows.assign(block=rows.config_hash.astype(str) + ":" + rows.block.astype(str))
    blocks = pd.concat([job_gains(job) for _, job in rows.groupby("config_hash", sort=True)], ignore_index=True)
    req = rows[rows.measure == "request"]
    arms = {(str(r.pair), str(r.engine), str(r.label)): arm_of(r) for r in req.drop_duplicates("label").itertuples()}
    arms.update({(str(r.pair), str(r.engine), str(r.label)): arm_of(r)
                 for r in req.drop_duplicates(["pair", "engine", "label"]).itertuples()})
    gains = gains_table(blocks, req)
    return {"gains": gains, "break_even": break_even_table(blocks, level, samples, seed),
            "recommendation": recommendation(gains, arms), "blocks": blocks}


CHECK = ["pair", "engine", "blocks", "load_tokens_per_s", "speed_tokens_per_s", "ratio"]


def speed_check(rows: pd.DataFrame) -> pd.DataFrame:
    """Per pair and engine: the load generator's plain tokens/s at load 1 over the speed stage's runs of the same
    requests right after (speclab.stats.load_gains.speed_check over its jobs' blocks)."""
    out = []
    if rows.empty:
        return pd.DataFrame(columns=CHECK)
    rows = rows.assign(block=rows.config_hash.astype(str) + ":" + rows.block.astype(str))
    for (pair, engine), g in rows.groupby(["pair", "engine"], sort=True):
        c = check_speed(g)
        if c is not None:
            out.append({"pair": pair, "engine": engine, "blocks": int(c["speed_check_blocks"]),
                        "load_tokens_per_s": c["load_tokens_per_s"], "speed_tokens_per_s": c["speed_tokens_per_s"],
                        "ratio": c["speed_check_ratio"]})
    return pd.DataFrame(out, columns=CHECK)


def figure(gains: pd.DataFrame, path: Path) -> None:
    """Speed-up against concurrency, per pair and engine (rows) and kind (columns): latency and throughput gains
    with their intervals, the predicted curve dashed, 1 (no gain) dotted."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    panels = gains.groupby(["pair", "engine"], sort=True)
    kinds = [k for k in sorted(gains.kind.unique()) if k != ALL] + [ALL]
    fig, axes = plt.subplots(len(panels), len(kinds), figsize=(3.2 * len(kinds), 2.8 * len(panels)), squeeze=False,
                             sharex=True)
    for i, ((pair, engine), g) in enumerate(panels):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for config, c in g[g.kind == kind].groupby("config", sort=True):
                c = c.sort_values("load")
                for what, marker, dx in (("latency", "o", 0.96), ("throughput", "s", 1.04)):
                    y = c[f"{what}_gain"]
                    err = np.vstack([y - c[f"{what}_lo"].fillna(y), c[f"{what}_hi"].fillna(y) - y])
                    ax.errorbar(c.load * dx, y, yerr=err, marker=marker, ms=4, capsize=2, lw=1,
                                label=f"{config}: {what}")
                ax.plot(c.load, c.predicted, "k--", lw=1, label=f"{config}: latency predicted")
                ax.plot(c.load, c.predicted_throughput, "k:", lw=1, label=f"{config}: throughput predicted")
            ax.axhline(1, color="grey", ls=":", lw=1)
            ax.set_xscale("log", base=2)
            loads = sorted(int(x) for x in g.load.unique())
            ax.set_xticks(loads, [str(x) for x in loads])
            ax.minorticks_off()
            ax.set_title(f"{pair} · {engine_name(engine)} · {kind}", fontsize=8)
            if j == 0:
                ax.set_ylabel("gain over plain")
            if i == len(panels) - 1:
                ax.set_xlabel("concurrent requests")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interval(lo: float, hi: float) -> str:
    return f"{lo:.2f}-{hi:.2f}" if lo == lo else "no interval"


def first_screen(tables: dict[str, pd.DataFrame], campaign: str, link: str) -> str:
    """The report's first-screen block: one line per pair and engine (the break-even loads of its recommended
    configuration on all kinds, and the recommendation)."""
    s = [f"### Under load (campaign {campaign})\n"]
    rec, be = tables.get("recommendation"), tables.get("break_even")
    if rec is None or rec.empty:
        return "\n".join(s + [not_measured(campaign), ""])
    s.append("Per pair and engine, speculation against plain decoding at 1, 2, 4, 8 concurrent requests (closed loop; "
             "the load at which the gain reaches 1, 95% bootstrap interval over blocks; per kind and load, predicted "
             f"and measured: [{link}]({link})):\n")
    for r in rec[rec.kind == ALL].itertuples():
        b = be[(be.pair == r.pair) & (be.engine == r.engine) & (be.config == r.config) & (be.kind == ALL)]
        said = "; ".join(f"{x.gain}: {x.text}" for x in b.itertuples())
        kinds = rec[(rec.pair == r.pair) & (rec.engine == r.engine) & (rec.kind != ALL)]
        per_kind = "; ".join(f"{k.kind}: {kind_words(k)}" for k in kinds.itertuples())
        s.append(f"- {r.pair} · **{engine_name(r.engine)}** {r.config}: {said}. All kinds: **{r.text}**"
                 + (f" ({r.switch})" if r.switch else "") + (f". Per kind: {per_kind}" if per_kind else ""))
    s.append("")
    return "\n".join(s)


def kind_words(r) -> str:
    """A kind's recommendation in a few words (the first screen's per-kind part)."""
    if r.up_to == 0:
        return "plain"
    if r.up_to >= r.largest_load:
        return f"{r.config} at every load (to {r.largest_load})"
    return f"{r.config} up to {r.up_to}, plain above"


def not_measured(campaign: str) -> str:
    return (f"Not measured: campaign **{campaign}** holds no load runs. Run `make qwen llama-cpp vllm && python -m "
            f"pipeline.run +sweep=load campaign={campaign}`, then `dvc repro`.")


def markdown(tables: dict[str, pd.DataFrame], campaign: str, checks: pd.DataFrame, figure_link: str) -> str:
    s = [f"## Speculation under load (campaign {campaign})\n"]
    gains = tables["gains"]
    if gains.empty:
        return "\n".join(s + [not_measured(campaign), ""])
    s.append(f"![speed-up against concurrency]({figure_link})\n")
    s.append("Break-even loads (the load at which the gain reaches 1; interpolated in log-log between loads, 95% "
             "bootstrap interval over each load's blocks, open where it leaves the loads measured):\n")
    s.append(markdown_table(tables["break_even"][["pair", "engine", "config", "kind", "gain", "text"]]))
    s.append("\nRecommendation per load:\n")
    s.append(markdown_table(tables["recommendation"][["pair", "engine", "kind", "text", "switch"]]))
    g = gains.assign(latency=[f"{x:.2f} ({_interval(lo, hi)})" for x, lo, hi in
                              zip(gains.latency_gain, gains.latency_lo, gains.latency_hi)],
                     throughput=[f"{x:.2f} ({_interval(lo, hi)})" for x, lo, hi in
                                 zip(gains.throughput_gain, gains.throughput_lo, gains.throughput_hi)])
    s.append("\nGains per load, measured (median over blocks, 95% distribution-free interval) and predicted by the time "
             "model (speclab/costs/load_model.py: the engine's passes over n tokens on one sequence, the counters' "
             "tokens per pass), with the error predicted - measured, and what a speculative pass took beyond its "
             "price (`unpriced_ms_per_pass`: the engine's own cost of speculating, which the passes do not show):\n")
    s.append(markdown_table(g[["pair", "engine", "config", "kind", "load", "blocks", "latency", "throughput",
                               "predicted", "predicted_throughput", "latency_error", "throughput_error", "alpha",
                               "tokens_per_pass", "unpriced_ms_per_pass",
                               "plain_tpot_ms", "tpot_ms"]], ".2f"))
    if not checks.empty:
        s.append("\nThe load generator at load 1 against the speed stage's runs of the same plain requests, right after "
                 "(tokens/s, median over blocks):\n")
        s.append(markdown_table(checks, ".3f"))
    return "\n".join(s) + "\n"


def headline(gains: pd.DataFrame, recommendation: pd.DataFrame, campaign: str) -> dict:
    """The `dvc metrics show` row (outputs/metrics/load_campaign.json), in the columns of every campaign's row
    (analysis.answer.headline_row): its cells are pair x engine x kind x load for the recommended configuration,
    each a verdict on its throughput gain's interval (speculate / unclear / use plain / too few)."""
    cells = gains.merge(recommendation[["pair", "engine", "kind", "config"]], on=["pair", "engine", "kind", "config"])
    cells = cells.assign(campaign=campaign, speedup=cells.throughput_gain, speedup_lo=cells.throughput_lo,
                         speedup_hi=cells.throughput_hi,
                         verdict=[verdict(g, lo, hi, b) for g, lo, hi, b in
                                  zip(cells.throughput_gain, cells.throughput_lo, cells.throughput_hi, cells.blocks)])
    return headline_row(cells, campaign)


def metrics(tables: dict[str, pd.DataFrame], checks: pd.DataFrame, campaign: str) -> dict:
    """The detail (outputs/metrics/detail/load.json): per pair and engine, the recommended configuration's
    break-even loads on all kinds, the load up to which it speculates, the largest prediction error and the load
    generator's check."""
    out: dict = {"campaign": campaign}
    be, gains = tables["break_even"], tables["gains"]
    for r in tables["recommendation"][tables["recommendation"].kind == ALL].itertuples():
        key = f"{r.pair}.{r.engine}"
        b = be[(be.pair == r.pair) & (be.engine == r.engine) & (be.config == r.config) & (be.kind == ALL)]
        for x in b.itertuples():
            out[f"{key}.{x.gain}_break_even"] = None if not np.isfinite(x.load) else float(x.load)
        g = gains[(gains.pair == r.pair) & (gains.engine == r.engine)]
        out[f"{key}.speculate_up_to"] = int(r.up_to)
        errors = np.abs(g[["latency_error", "throughput_error"]].to_numpy(dtype=float))
        out[f"{key}.max_abs_error"] = float(np.nanmax(errors)) if np.isfinite(errors).any() else None
    for r in checks.itertuples():
        out[f"{r.pair}.{r.engine}.load1_over_speed"] = float(r.ratio)
    return out


def read_tables(analysis_dir: str | Path) -> dict[str, pd.DataFrame]:
    return {name: read_table(Path(analysis_dir) / FOLDER, name) for name in TABLES}


def main() -> None:
    params = load_params()
    campaign = named_campaign(params, "load_campaign")
    rows = read_stage_if_any(params["outputs_dir"], "load", campaign)
    boot = bootstrap_settings(params)
    tables = compute(rows, boot["level"], boot["samples"], boot["seed"])
    tables.pop("blocks")
    checks = speed_check(rows)
    out = Path(params["analysis_dir"]) / FOLDER
    for name, df in tables.items():
        save_table(df, out / f"{name}.parquet")
        save_csv(df, out / f"{name}.csv")
    fig = Path(params["figures_dir"]) / FIGURE
    if not tables["gains"].empty:
        figure(tables["gains"], fig)
    save_json(metrics(tables, checks, campaign), Path(params["metrics_dir"]) / "detail" / "load.json")
    save_json(headline(tables["gains"], tables["recommendation"], campaign),
              Path(params["metrics_dir"]) / f"{METRICS_KEY}.json")
    text = markdown(tables, campaign, checks, os.path.relpath(fig, out))
    atomic_write_text(out / "section.md", text)
    print(text)


if __name__ == "__main__":
    run_script("analysis.load", main)
