"""The Markdown report: the answer first, then one short section per campaign, the full tables in the appendix.

    python -m analysis.report     (reads outputs/analysis/, writes outputs/report.md and outputs/report_appendix.md)

The layout is in analysis/templates/ (Jinja2); this module gathers the tables and sentences they show.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jinja2
import pandas as pd

from analysis import report_sentences as say
from analysis.answer import read_answer, render
from analysis.common import load_params, markdown_table, published_campaign, read_table, run_script, save_csv
from analysis.engines import FOLDER as ENGINES, first_screen, read_tables as engine_tables
from analysis.load import FOLDER as LOAD, first_screen as load_first_screen, read_tables as load_tables
from analysis.figure_captions import CAPTIONS
from analysis.inputs import AnalysisError, campaign_dir
from analysis.recommend import record_text
from store.plan_check import track_record
from store.files import atomic_write_text

TEMPLATES = Path(__file__).parent / "templates"
# Full tables of the report's cut ones (outputs/analysis/report_tables/<name>.csv) and the appendix file.
FULL_TABLES = "report_tables"
APPENDIX = "report_appendix.md"
TABLES = ("acceptance_table", "speed_points", "predictor_errors", "drift", "breakeven", "best_k", "divergence_counts",
          "divergences", "distribution_rates", "distribution_tests", "drafter_comparison", "adaptive_vs_fixed",
          "sampled_alpha", "strategy_comparison", "batch_costs", "batch_speedups", "batch_model_error",
          "time_model_points", "time_model_errors", "time_model_decomposition", "time_model_exercise4",
          "time_model_calibration", "recommendation", "recommendation_check", "recommendation_ranking",
          "recommendation_unseen", "recommendation_summary", "recommendation_history")


def read_jobs(params: dict) -> pd.DataFrame:
    """The jobs table of the published campaign (analysis.jobs); required, and of that campaign only."""
    campaign, path = published_campaign(params), Path(params["analysis_dir"]) / "jobs.parquet"
    jobs = read_table(params["analysis_dir"], "jobs")
    # Without it the report could not say which runs it stands on; a stale one would say the wrong thing.
    if jobs.empty:
        raise AnalysisError(f"{path} is missing or empty; run `python -m analysis.jobs` (or `dvc repro`)")
    if set(jobs.campaign) != {campaign}:
        raise AnalysisError(f"{path} lists campaign(s) {sorted(set(jobs.campaign))}, not the published "
                            f"{campaign!r}; run `python -m analysis.jobs` (or `dvc repro`)")
    return jobs


def anchor(heading: str) -> str:
    """The fragment a Markdown viewer (GitHub's rule) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(campaign: str, tm_campaign: str | None, plan_campaign: str | None = None) -> dict[str, str]:
    """Every appendix section's heading, so the report can link to it."""
    c, tm = f"(campaign {campaign})", f"(campaign {tm_campaign})" if tm_campaign else ""
    planned = f"(campaign {plan_campaign})" if plan_campaign else tm
    return {"verdict": f"Verdict: the draft model's best k per kind {c}",
            "steps": f"Step and pass times {c}",
            "acceptance": f"Acceptance {c}",
            "speed": f"Speed: predicted vs measured {c}",
            "time_model": f"Predicting the speed-up: the time model {tm}".rstrip(),
            "planner": f"The planner's recommendation, checked {planned}".rstrip(),
            "strategies": f"Drafters and k policies {c}",
            "sampling": f"Sampling: acceptance against greedy {c}",
            "drift": f"Drift {c}",
            "divergences": f"Greedy correctness: divergences {c}",
            "distribution": f"Sampling correctness: distribution tests {c}",
            "batch": f"Batches: where the check stops being free, where speculation stops paying "
                     f"(campaign {campaign}, batch stage)",
            "behind": "Behind the answer: the best configurations per campaign, pair and kind",
            "jobs": f"Jobs pooled {c}",
            "every_test": f"Every distribution test {c}"}


def linked_section(params: dict, key: str, folder: str, module: str, title: str) -> dict | None:
    """A campaign whose full section another stage wrote (outputs/analysis/``folder``/section.md): its title and
    the link to that file; None without the campaign (params.yaml ``key``)."""
    campaign = params.get(key)
    if not campaign:
        return None
    section = Path(params["analysis_dir"]) / folder / "section.md"
    return {"title": title.format(campaign=campaign), "campaign": campaign, "module": module,
            "link": os.path.relpath(section, params["outputs_dir"]), "ready": section.is_file(), "table": "",
            "intro": ""}


def pair_campaign(params: dict) -> dict | None:
    """The second campaign (analysis.pair_section): its best k per kind, measured against predicted."""
    campaign = params.get("pair_campaign")
    if not campaign:
        return None
    campaign_dir(params["outputs_dir"], campaign)  # a name, never a path
    found = linked_section(params, "pair_campaign", campaign, "analysis.pair_section", "Pair campaign {campaign}")
    out = Path(params["analysis_dir"]) / campaign
    if (out / "summary.json").is_file():
        found["title"] = json.loads((out / "summary.json").read_text()).get("title", found["title"])
    # an absent campaign's best_k.csv holds no columns at all
    best = pd.read_csv(out / "best_k.csv") if (out / "best_k.csv").is_file() and (out / "best_k.csv").stat().st_size > 1 \
        else pd.DataFrame()
    if not best.empty:
        found["table"] = markdown_table(best)
        found["intro"] = ("The draft model's best k per pair and kind: measured speed-up over the adjacent plain run "
                          "(95% distribution-free interval) against the i.i.d. formula (`predicted_iid`) and measured tokens "
                          "per pass plus per-iteration overhead (`predicted_empirical`), both with the speed jobs' own "
                          "step times:")
    return found


def spec_bench(params: dict) -> dict | None:
    """The Spec-Bench campaign (analysis.spec_bench): the plan's choice on each category's held-out prompts."""
    found = linked_section(params, "spec_bench_campaign", "spec_bench", "analysis.spec_bench",
                           "Spec-Bench workloads (campaign {campaign})")
    if found:
        check = read_table(Path(params["analysis_dir"]) / "spec_bench", "recommendation_check")
        found["table"] = markdown_table(check, ".2f") if not check.empty else ""
        found["intro"] = ("The plan's recommendation on each category's other prompts (speclab's speed-up with its "
                          "95% interval; held-out share: checked prompts the plan did not calibrate on), beside the "
                          "best other arm; every arm by Spec-Bench's speed-up and speclab's is in the section file:")
    return found


def trees(params: dict) -> dict | None:
    """The tree campaign (analysis.trees): the best tree against the best chain per pair and kind."""
    found = linked_section(params, "trees_campaign", "trees", "analysis.trees",
                           "Tree-shaped drafts vs chains (campaign {campaign})")
    if found:
        vs = read_table(Path(params["analysis_dir"]) / "trees", "tree_vs_chain")
        best = vs[vs.compared == "best"] if not vs.empty else vs
        if len(best):
            best = best.assign(interval=[f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(best.lo, best.hi)])
            found["table"] = markdown_table(best[["pair", "kind", "tree", "tree_speedup", "chain", "chain_speedup",
                                                  "tree_over_chain", "interval", "blocks"]], ".2f")
            found["intro"] = ("The best tree against the best chain per pair and kind, run in the same blocks "
                              "(`tree_over_chain`: median of within-block ratios, 95% distribution-free interval):")
    return found


def first_screen_block(params: dict, key: str, folder: str, title: str, script: str, render) -> str:
    """A block under the answer read from an analysis stage's tables: ``render(tables, campaign, link)``, its
    "no section yet" line where the stage has not run, "" where params.yaml names no campaign for ``key``."""
    campaign = params.get(key)
    if not campaign:
        return ""
    campaign_dir(params["outputs_dir"], campaign)  # a name, never a path
    section = Path(params["analysis_dir"]) / folder / "section.md"
    if not section.is_file():
        return f"### {title} (campaign {campaign})\n\n_no section yet: run `python -m {script}` (or `dvc repro`)_\n"
    return render(campaign, os.path.relpath(section, params["outputs_dir"]))


def engines(params: dict) -> str:
    """The cross-engine block under the answer (analysis.engines): each engine's plain tokens/s and best
    configuration per pair and kind, the transfer's error, the link to the section; "" without the campaign."""
    return first_screen_block(params, "engines_campaign", ENGINES, "Across engines", "analysis.engines",
                              lambda c, link: first_screen(engine_tables(params["analysis_dir"]), c, link))


def under_load(params: dict) -> str:
    """The under-load block under the engines' (analysis.load): a line per pair and engine; "" without the campaign."""
    return first_screen_block(params, "load_campaign", LOAD, "Under load", "analysis.load",
                              lambda c, link: load_first_screen(load_tables(params["analysis_dir"]), c, link))


def correctness(t: dict[str, pd.DataFrame]) -> dict[str, int]:
    """Counts for one line on each correctness check: greedy runs equal to plain, and the correct rule's
    rejections among the distribution tests."""
    div, rates = t["divergence_counts"], t["distribution_rates"]
    correct = rates[rates.rule == "correct"] if not rates.empty else rates
    return {"runs": int(div.runs.sum()) if not div.empty else 0,
            "identical": int(div.identical.sum()) if not div.empty else 0,
            "near_ties": int(div.near_ties.sum()) if not div.empty else 0,
            "bugs": int(div.bugs.sum()) if not div.empty else 0,
            "tests": int(correct.tests.sum()) if len(correct) else 0,
            "rejected": int(correct.rejected.sum()) if len(correct) else 0}


def context(params: dict) -> dict:
    """Everything the templates show."""
    out, figs, outputs = Path(params["analysis_dir"]), Path(params["figures_dir"]), Path(params["outputs_dir"])
    campaign, jobs = published_campaign(params), read_jobs(params)
    t = {name: read_table(out, name) for name in TABLES}
    ans = read_answer(out)
    cal = t["time_model_calibration"]
    tm_campaign = str(cal.campaign.iloc[0]) if not cal.empty else None
    ex4 = t["time_model_exercise4"]

    def fig(name: str, alt: str) -> str:
        path = figs / name
        if not path.exists():
            return f"_{alt}: figure not produced (its stage has no results yet)_\n"
        text = f"![{alt}]({os.path.relpath(path, outputs)})\n"
        return text + (f"\n*{CAPTIONS[name]}*\n" if name in CAPTIONS else "")

    return {"params": params, "campaign": campaign, "t": t, "jobs": jobs, "fig": fig,
            "h": headings(campaign, tm_campaign, params.get("plan_campaign")), "appendix": APPENDIX,
            "plan_campaign": params.get("plan_campaign") or tm_campaign, "full": f"analysis/{FULL_TABLES}",
            "answer": "\n".join(render(ans)) if ans is not None else
            "## The answer\n\n_not computed yet: run `python -m analysis.answer` (or `dvc repro`)_\n",
            "engines": engines(params), "under_load": under_load(params),
            "why": say.why_numbers_differ(ans, t, read_table(out / "trees", "arms"), campaign,
                                          params.get("trees_campaign")),
            "cal": cal.iloc[0] if not cal.empty else None,
            "goals": say.time_model_goals(t["time_model_errors"]) if not cal.empty else pd.DataFrame(),
            "exercise4": ex4[ex4.kind != "all"] if not ex4.empty else ex4,
            "exercise4_words": say.exercise4_paragraph(ex4, t["time_model_decomposition"]) if not ex4.empty else "",
            "recommended": t["recommendation"][t["recommendation"].recommended] if not t["recommendation"].empty
            else pd.DataFrame(),
            "unseen": t["recommendation_unseen"],
            "plan_summary": t["recommendation_summary"],
            "track_record": record_text(track_record(t["recommendation_history"]))
            if not t["recommendation_history"].empty else "",
            "check": say.shown_check(t["recommendation_check"]) if not t["recommendation_check"].empty
            else pd.DataFrame(),
            "check_verdict": say.best_fixed_verdict(t["recommendation_check"]) if not t["recommendation_check"].empty
            else [],
            "drift_words": say.drift_sentence(t["drift"], params["drift"]["max_ratio"], params["drift"]["exclude"])
            if not t["drift"].empty else "",
            "exercise7": say.batch_exercise7(t["batch_costs"], t["batch_speedups"])
            if not t["batch_speedups"].empty else "",
            "batch_model_verdict": say.batch_model_verdict(t["batch_model_error"]),
            "correct": correctness(t), "candidates": say.candidates(ans), "jobs_table": say.jobs_table(jobs),
            "jobs_notes": say.jobs_notes(jobs),
            "linked": [s for s in (pair_campaign(params), spec_bench(params), trees(params)) if s]}


def table(df: pd.DataFrame, columns: list[str] | None = None, fmt: str = ".3f") -> str:
    """A Markdown table of ``columns`` (those present; all without), "_no rows_" when empty."""
    return markdown_table(df[[c for c in columns if c in df]] if columns and not df.empty else df, fmt)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters.update(table=table, anchor=anchor)
    return env


def render_report(params: dict) -> tuple[str, str]:
    """(report.md, report_appendix.md)."""
    env, ctx = environment(), context(params)
    return env.get_template("report.md.j2").render(ctx), env.get_template("report_appendix.md.j2").render(ctx)


def full_tables(params: dict) -> dict[str, pd.DataFrame]:
    """The report's cut tables in full, for CSV (outputs/analysis/report_tables/)."""
    out = Path(params["analysis_dir"])
    return {"time_model_points": read_table(out, "time_model_points"),
            "planner_check": read_table(out, "recommendation_check"), "batch_speedups": read_table(out, "batch_speedups"),
            "batch_model_error": read_table(out, "batch_model_error")}


def main() -> None:
    params = load_params()
    path = Path(params["outputs_dir"]) / "report.md"
    text, extra = render_report(params)
    for name, df in full_tables(params).items():
        if not df.empty:
            save_csv(df, Path(params["analysis_dir"]) / FULL_TABLES / f"{name}.csv")
    atomic_write_text(Path(params["outputs_dir"]) / APPENDIX, extra)
    atomic_write_text(path, text)
    print(f"analysis.report: wrote {path}")


if __name__ == "__main__":
    run_script("analysis.report", main)
