"""The answer on one screen (analysis.answer): the best configuration, its interval, the runner-up and the difference on
hand-made runs; the report's first screen against the full tables it links to; the same summary as the first lines of
`python -m analysis.recommend` and as the description of the MLflow analysis run."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.answer import (Answer, best_table, candidates, difference_ci, headline_row, headline_rows, not_to_use,
                             paired_difference, read_answer, render, render_text)

REPO = Path(__file__).resolve().parents[1]
BOOT = {"samples": 500, "seed": 0, "level": 0.95}


def runs(campaign: str, pair: str, kind: str, config: str, ratios, sampling: str = "greedy") -> pd.DataFrame:
    return pd.DataFrame({"campaign": campaign, "pair": pair, "kind": kind, "config": config, "sampling": sampling,
                         "ratio_to_adjacent_plain": np.asarray(ratios, dtype=float)})


K4 = [1.50, 1.62, 1.41, 1.55, 1.58, 1.52, 1.60]
K2 = [1.20, 1.31, 1.25, 1.10, 1.22, 1.18, 1.27]


@pytest.fixture
def hand_made() -> pd.DataFrame:
    return pd.concat([
        runs("c", "p", "code", "draft model k=4", K4),
        runs("c", "p", "code", "draft model k=2", K2),
        runs("c", "p", "code", "prompt lookup k=4", [0.80, 0.85, 0.90, 0.82, 0.84, 0.88]),
        runs("c", "p", "code", "tree static:2-1-1", [3.0]),           # one run: highest, but no interval
        runs("c", "p", "code", "draft model k=4", [2.5, 2.6, 2.7], sampling="T=1"),   # sampled: never the best
        runs("c", "p", "prose", "draft model k=4", [0.95, 0.97, 0.90, 0.99, 0.93, 0.96]),
        runs("c", "p", "prose", "draft model k=2", [0.70, 0.75, 0.72]),
        runs("c", "p", "prose", "draft model k=2", [0.60, 0.62, 0.61, 0.63, 0.59, 0.64], sampling="T=0.7"),
        runs("c", "p", "structured", "draft model k=4", [1.4, 1.5, 1.3, 1.6]),  # four runs: too few for 95%
    ], ignore_index=True)


def test_best_runner_up_difference_and_verdict_on_hand_made_runs(hand_made):
    cands = candidates(hand_made, BOOT)
    best = best_table(hand_made, cands, BOOT).set_index("kind")
    code, prose = best.loc["code"], best.loc["prose"]
    # the one-run tree has the highest median, but no interval: a configuration with one ranks above it, so the best
    # is the draft model k=4, with an interval from its seven runs, and the runner-up k=2
    assert code.best == "draft model k=4" and code.runs == 7 and code.speedup == pytest.approx(1.55)
    assert (code.speedup_lo, code.speedup_hi) == (1.41, 1.62)  # seven runs at 95%: the smallest and the largest
    assert code.runner_up == "draft model k=2" and code.runner_up_speedup == pytest.approx(1.22)
    assert code.difference == pytest.approx(1.55 - 1.22)
    # each median's 97.5% interval is its runs' range (seven runs): k=4's lowest minus k=2's highest, and back
    assert (code.difference_lo, code.difference_hi) == pytest.approx((1.41 - 1.31, 1.62 - 1.10))
    assert code.verdict == "speculate"
    tree = cands[(cands.kind == "code") & (cands.config == "tree static:2-1-1")].iloc[0]
    assert tree.speedup == 3.0 and np.isnan(tree.speedup_lo)  # still a candidate, ranked below those with intervals
    # four runs of every configuration: a median but no 95% interval, and no verdict however far above 1 they all are
    assert best.loc["structured"].verdict == "too few runs (4 of 6)" and np.isnan(best.loc["structured"].speedup_hi)
    # only the tree's run: the best is the one-run tree, with no interval and no verdict (1 of 6 runs)
    only_tree = hand_made[(hand_made.config == "tree static:2-1-1") | (hand_made.kind != "code")]
    t = best_table(only_tree, candidates(only_tree, BOOT), BOOT).set_index("kind").loc["code"]
    assert t.best == "tree static:2-1-1" and t.verdict == "too few runs (1 of 6)" and np.isnan(t.difference_lo)
    # prose: the best is below 1 -> use plain, and the losers are listed
    assert prose.verdict == "use plain" and prose.best == "draft model k=4"
    lose = not_to_use(cands, best.reset_index(), None)
    assert {("prose", "every configuration", "best below 1")} <= set(zip(lose.kind, lose.config, lose.reason))
    assert ("code", "prompt lookup k=4", "greedy") in set(zip(lose.kind, lose.config, lose.setting))
    assert ("prose", "draft model k=2", "T=0.7") in set(zip(lose.kind, lose.config, lose.setting))  # sampling too
    assert ("code", "draft model k=4", "T=1") not in set(zip(lose.kind, lose.config, lose.setting))



def test_headline_row_counts_the_verdicts_of_one_campaign(hand_made):
    """`dvc metrics show`'s row of a campaign (outputs/metrics/<params key>.json): counts and three speed-ups."""
    other = runs("d", "q", "code", "draft model k=4", [2.0] * 7)
    data = pd.concat([hand_made, other], ignore_index=True)
    best = best_table(data, candidates(data, BOOT), BOOT)
    row = headline_row(best, "c")
    # code: the draft model k=4 (speculate; the one-run tree ranks below it), prose: use plain, structured: four
    # runs (too few)
    assert row == {"campaign": "c", "pairs": 1, "answers": 3, "speculate": 1, "unclear": 0, "use_plain": 1,
                   "too_few": 1, "speedup_max": 1.55, "speedup_lo_max": pytest.approx(1.41),
                   "speedup_median": pytest.approx(1.45)}
    assert headline_row(best, "nothing") == {"campaign": "nothing", "pairs": 0, "answers": 0, "speculate": 0,
                                             "unclear": 0, "use_plain": 0, "too_few": 0}  # no speed-up: left out
    rows = headline_rows(best, {"campaign": "c", "pair_campaign": "d", "trees_campaign": ""})
    assert list(rows) == ["campaign", "pair_campaign"] and rows["pair_campaign"]["speculate"] == 1

def test_difference_interval_by_hand():
    # seven runs each: each median's 97.5% interval is the range of its runs
    d, lo, hi = difference_ci([2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6], [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], 200, 0, 0.95)
    assert (d, lo, hi) == pytest.approx((1.0, 2.0 - 1.6, 2.6 - 1.0))
    # fewer runs than a 97.5% interval needs: the difference, no interval
    d, lo, hi = difference_ci([1.0, 3.0], [1.0, 1.0], 2000, 0, 0.95)
    assert d == 1.0 and np.isnan(lo) and np.isnan(hi)
    # order: best minus runner-up, not the reverse
    assert difference_ci([1.0, 1.1, 1.2], [2.0, 2.1, 2.2], 200, 0, 0.95)[0] == pytest.approx(-1.0)


def blocks(config: str, ratios, job: str = "j") -> pd.DataFrame:
    n = len(ratios)
    return runs("c", "p", "code", config, ratios).assign(config_hash=job, round=0, rotation=0, block=range(n),
                                                         prompt_id=[f"q{i % 2}" for i in range(n)])


def test_arms_of_the_same_blocks_are_compared_block_by_block():
    # the machine drifts from block to block (1.2 .. 1.9), k=4 is 0.05 ahead of k=2 in every block: the unpaired
    # interval cannot tell them apart, the paired one can
    drift = np.array([1.2, 1.9, 1.4, 1.7, 1.3, 1.8, 1.5, 1.6])
    k4, k2 = blocks("draft model k=4", drift + 0.05 + [0, .01, 0, .02, 0, .01, 0, .01]), blocks("draft model k=2", drift)
    d, lo, hi, n = paired_difference(k4, k2, 0.95)
    assert n == 8 and d == pytest.approx(0.055) and (lo, hi) == pytest.approx((0.05, 0.07))  # 8 blocks: the range
    unpaired = difference_ci(k4.ratio_to_adjacent_plain, k2.ratio_to_adjacent_plain, level=0.95)
    assert unpaired[1] < 0 < unpaired[2]
    both = pd.concat([k4, k2], ignore_index=True)
    row = best_table(both, candidates(both, BOOT), BOOT).iloc[0]
    assert row.best == "draft model k=4" and row.difference_blocks == 8 and row.difference_lo == pytest.approx(0.05)
    # runs of different jobs share no block: the two medians' intervals, combined
    apart = pd.concat([k4, blocks("draft model k=2", drift, job="other")], ignore_index=True)
    row = best_table(apart, candidates(apart, BOOT), BOOT).iloc[0]
    assert row.difference_blocks == 0 and row.difference_lo < 0
    # too few shared blocks for a 95% interval (5 < 6): no paired interval
    assert paired_difference(k4.iloc[:5], k2.iloc[:5], 0.95) is None


def test_batch_sizes_below_one_are_listed():
    cands = pd.DataFrame(columns=["campaign", "pair", "kind", "sampling", "config", "runs", "speedup", "speedup_lo",
                                  "speedup_hi"])
    batch = pd.DataFrame({"pair": ["p", "p", "p"], "batch_size": [1, 2, 4], "k": [4, 4, 4],
                          "measured": [0.87, 1.15, 0.98], "measured_hi": [0.94, 1.29, 1.05]})  # B=4: a tie, kept
    lose = not_to_use(cands, best_table(cands.assign(ratio_to_adjacent_plain=[]), cands, BOOT), batch, "ref")
    assert list(zip(lose.setting, lose.config)) == [("batch B=1", "draft model k=4")]


# ---------------------------------------------------------------------------------- the committed report
def _tables(text: str) -> list[tuple[int, pd.DataFrame]]:
    """Every Markdown pipe table of ``text``: (line of its header, its rows as strings)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[:\- |]+\|$", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip("|").split("|")])
                j += 1
            out.append((i, pd.DataFrame(rows, columns=header)))
            i = j
        else:
            i += 1
    return out


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else len(text)]


def test_first_screen_matches_the_tables_below_it():
    text = (REPO / "outputs" / "report.md").read_text()
    tables = _tables(text)
    first_line, screen = tables[0]
    assert text.splitlines()[2].startswith("## The answer") and first_line < 40  # the answer opens the report
    end = text.index("## Why numbers differ")
    # the answer, then one line per pair across engines (analysis.engines): about one screen
    assert text[:end].count("\n") <= 60, "the first screen is about 50 lines"
    # the full tables live in the appendix and in the sections' own files, linked from the report
    appendix = (REPO / "outputs" / "report_appendix.md").read_text()
    assert "(report_appendix.md#behind-the-answer" in text
    behind = _tables(_section(appendix, "## Behind the answer"))[0][1]
    number = lambda col: col.replace("", "nan").astype(float)  # noqa: E731 - an empty cell: no interval
    behind = behind.assign(speedup=number(behind.speedup), speedup_lo=number(behind.speedup_lo),
                           speedup_hi=number(behind.speedup_hi))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    shown = [params[k] for k in ("campaign", "pair_campaign", "spec_bench_campaign", "trees_campaign")]
    assert list(dict.fromkeys(screen.campaign)) == shown
    best = pd.read_parquet(REPO / "outputs" / "analysis" / "answer" / "best.parquet")
    for r in screen.itertuples():
        g = behind[(behind.campaign == r.campaign) & (behind.pair == r.pair) & (behind.kind == r.kind)]
        assert len(g), r
        top = g.iloc[0]
        # the best is the table's fastest configuration of its pair and kind, with the same numbers
        # (the appendix's table has 3 decimals, the screen 2)
        assert top.config == r._4 and abs(top.speedup - float(r._5)) <= 0.0051 and str(top.runs) == r.runs
        assert top.speedup == g.speedup.max()
        if r._6:
            lo, hi = (float(v) for v in r._6.split("-"))
            assert abs(top.speedup_lo - lo) <= 0.0051 and abs(top.speedup_hi - hi) <= 0.0051
        assert r.minutes == "" or float(r.minutes) > 0
        if r._9:
            second = g.iloc[1]
            assert second.config == r._9
            diff = float(r._10.split()[0])
            row = best[(best.campaign == r.campaign) & (best.pair == r.pair) & (best.kind == r.kind)].iloc[0]
            if row.difference_blocks == 0:  # unpaired: the difference of the two medians
                assert diff == pytest.approx(top.speedup - second.speedup, abs=0.006)
            else:  # the median of the per-block differences over the blocks both ran
                assert diff == pytest.approx(row.difference, abs=0.006)
            if (found := re.search(r"\((\S+) to (\S+)\)", r._10)) is not None:  # none from too few runs
                lo, hi = (float(v) for v in found.groups())
                assert lo <= diff <= hi
        verdict = (f"too few runs ({top.runs} of 6)" if top.speedup_lo != top.speedup_lo else "use plain"
                   if top.speedup_hi < 1 else "speculate" if top.speedup_lo > 1 else "unclear")
        assert r.verdict == verdict
    # and the answer's numbers are the sections' own where they measure the same thing (computed apart)
    ref = _section(appendix, "## Drafters and k policies")
    strategies = _tables(ref)[0][1]
    for r in screen[screen.campaign == params["campaign"]].itertuples():
        name = {"draft model cost-model k": "draft model, adaptive k (cost model)",
                "prompt lookup k=4": "prompt lookup, best fixed k"}.get(r._4)
        if name:
            row = strategies[(strategies.kind == r.kind) & (strategies.strategy == name)].iloc[0]
            assert abs(float(row.speedup) - float(r._5)) <= 0.0051
            if r._6:
                assert all(abs(float(a) - float(b)) <= 0.0051
                           for a, b in zip((row.speedup_lo, row.speedup_hi), r._6.split("-")))
            else:
                assert row.speedup_lo == ""  # no interval on the screen: none in the section either
    assert "(analysis/spec_bench/section.md)" in text
    bench = (REPO / "outputs" / "analysis" / "spec_bench" / "section.md").read_text()
    for r in screen[screen.campaign == params["spec_bench_campaign"]].itertuples():
        block = bench[bench.index(f"**{r.pair}, {r.kind}**"):]
        t = _tables(block)[0][1]
        label = r._4.replace("draft model", "model").replace("prompt lookup", "prompt_lookup").replace(
            "cost-model k", "cost_model")
        label = ("recommended " + label.removesuffix(" (plan)")) if label.endswith("(plan)") else "speculative " + label
        row = t[t.config == label].iloc[0]
        assert (row.speedup_speclab, row.interval) == (r._5, r._6)


@pytest.mark.parametrize("name", ["report.md", "report_appendix.md"])
def test_numbers_carry_their_campaign_and_no_internal_words(name):
    text = (REPO / "outputs" / name).read_text()
    for heading in re.findall(r"^## .*$", text, flags=re.M):
        if heading.startswith(("## The answer", "## Why numbers differ", "## The sections below", "## Behind")):
            continue
        assert "campaign" in heading, heading
    for word in ("same_config_", "other_plan_blocks", "none of the latest plan's", "issue "):
        assert word not in text, word
    shown = text.split("\n## Every distribution test")[0]  # the appendix's raw test rows: every column, by design
    widest = max(len(t.columns) for _, t in _tables(shown))
    assert widest <= 14
    assert name != "report.md" or "## Why numbers differ between sections" in text


def test_recommend_prints_only_the_asked_campaign():
    """--campaign X prints X's rows of the answer (none when the answer does not hold X), then X's plan: never
    another campaign's answer."""
    ans = read_answer(REPO / "outputs" / "analysis")
    for campaign in ("timemodel2", "qwen25"):
        out = subprocess.run([sys.executable, "-m", "analysis.recommend", "--campaign", campaign], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        mine = ans.only(campaign)
        assert out.stdout.startswith(f"campaign {campaign}\n" if mine.best.empty else render_text(mine))
        assert f"\ncampaign {campaign}\n" in "\n" + out.stdout
        others = set(ans.best.campaign) - {campaign}
        assert not [c for c in others if f"| {c} " in out.stdout or f"campaign {c}" in out.stdout]


def test_answer_of_one_campaign_keeps_only_its_rows():
    ans = read_answer(REPO / "outputs" / "analysis")
    mine = ans.only("trees")
    assert set(mine.best.campaign) == {"trees"} and set(mine.provenance.campaign) == {"trees"}
    assert ans.only("no such campaign").best.empty


def test_render_without_rows_says_how_to_make_it():
    empty = Answer(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    assert "python -m analysis.answer" in "\n".join(render(empty))
