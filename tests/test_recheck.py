"""Does the published answer hold here? A speed job's medians beside the published figures of the same pair, kind
and configuration (pipeline/jobs/published.py), and the recheck that reruns a pair's published best configurations
(pipeline/recheck.py)."""
import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.answer import Answer
from pipeline.jobs.published import comparison_lines, published_best
from pipeline.config.overrides import hydra_value
from pipeline.recheck import RecheckError, command, entry_of, pair_of, published_arms
from pipeline.jobs.stage_output import ArmResult
from speclab.specs.arms import Arm
from speclab.stats.verdict import agreement

NAN = math.nan
ROOT = Path(__file__).resolve().parents[1]


def test_a_published_median_holds_inside_the_new_interval_only():
    assert agreement(1.26, 1.10, 1.40, 8) == "holds"
    assert agreement(1.26, 0.73, 0.98, 8) == "differs (slower here)"
    assert agreement(0.90, 1.02, 1.30, 8) == "differs (faster here)"
    assert agreement(1.26, NAN, NAN, 4) == "too few runs here (4 of 6)"
    assert agreement(1.26, 1.26, 1.40, 8) == "holds"  # on the interval's edge: not told apart


def _answer():
    best = pd.DataFrame([
        {"campaign": "ref", "pair": "p", "kind": "code", "best": "draft model cost-model k", "speedup": 1.32,
         "speedup_lo": NAN, "speedup_hi": NAN, "runs": 4},
        {"campaign": "ref", "pair": "p", "kind": "prose", "best": "prompt lookup k=4 (plan)", "speedup": 1.37,
         "speedup_lo": 1.2, "speedup_hi": 1.5, "runs": 8},
        {"campaign": "other", "pair": "p", "kind": "code", "best": "hybrid k=4", "speedup": 2.0,
         "speedup_lo": NAN, "speedup_hi": NAN, "runs": 2}])
    cands = pd.DataFrame([
        {"campaign": "ref", "pair": "p", "kind": "code", "sampling": "greedy", "config": "draft model k=4",
         "runs": 4, "speedup": 1.26, "speedup_lo": NAN, "speedup_hi": NAN},
        {"campaign": "ref", "pair": "p", "kind": "code", "sampling": "T=0.7", "config": "draft model k=4",
         "runs": 4, "speedup": 0.5, "speedup_lo": NAN, "speedup_hi": NAN},
        {"campaign": "ref", "pair": "p", "kind": "prose", "sampling": "greedy", "config": "draft model k=4",
         "runs": 8, "speedup": 1.05, "speedup_lo": 0.9, "speedup_hi": 1.2},
        {"campaign": "ref", "pair": "p", "kind": "code", "sampling": "greedy", "config": "draft model cost-model k",
         "runs": 4, "speedup": 1.32, "speedup_lo": NAN, "speedup_hi": NAN},
        {"campaign": "ref", "pair": "p", "kind": "prose", "sampling": "greedy", "config": "prompt lookup k=4 (plan)",
         "runs": 8, "speedup": 1.37, "speedup_lo": 1.2, "speedup_hi": 1.5},
        {"campaign": "other", "pair": "p", "kind": "structured", "sampling": "greedy", "config": "draft model k=4",
         "runs": 8, "speedup": 3.0, "speedup_lo": 2.0, "speedup_hi": 4.0}])
    prov = pd.DataFrame([{"campaign": "ref", "stage": "speed", "machines": "not recorded"},
                         {"campaign": "other", "stage": "speed", "machines": "Some CPU, 2 cores"}])
    return Answer(best, cands, pd.DataFrame(), prov)


def _arm(label, kind, speedup, lo, hi, runs=8):
    return ArmResult(f"run {label} {kind}", {"kind": kind},
                     {"speedup": speedup, "speedup_lo": lo, "speedup_hi": hi, "runs": runs, "level": 0.95}, label)


def test_a_job_that_did_not_run_the_published_best_sets_its_own_configurations_beside_their_figures():
    arms = [_arm("draft model k=4", "code", 0.84, 0.73, 0.98), _arm("draft model k=4", "prose", 1.0, 0.95, 1.1),
            _arm("draft model k=4", "structured", 1.0, 0.9, 1.1),  # published only in a later campaign: not the pair's
            _arm("draft model k=4", "all", 0.9, 0.8, 1.0)]
    lines = comparison_lines(_answer(), "p", arms)
    assert lines[0] == "published answer for p: campaign ref, measured on a machine whose CPU model is not recorded"
    assert lines[1] == ("published figure for code: draft model k=4 x1.26 (no interval, 4 runs); "
                        "here x0.84 (0.73-0.98, 8 runs): differs (slower here)")
    assert lines[2] == ("published figure for prose: draft model k=4 x1.05 (0.90-1.20, 8 runs); "
                        "here x1.00 (0.95-1.10, 8 runs): holds")
    assert not any("structured" in ln or " all:" in ln for ln in lines)
    # then the published best of each kind this job did not run, and the command that runs them here
    assert lines[3] == "published best for code: draft model cost-model k x1.32 (no interval, 4 runs): not run by this job"
    assert lines[4].startswith("published best for prose: prompt lookup k=4 x1.37 (1.20-1.50, 8 runs): not run")
    assert lines[-1] == "to measure the published answer here: python -m pipeline.recheck pair=p"


def test_a_job_that_ran_the_published_best_says_only_how_that_fared():
    arms = [_arm("draft model cost-model k", "code", 1.3, 1.1, 1.5), _arm("prompt lookup k=4", "prose", 1.0, 0.9, 1.1),
            _arm("draft model k=4", "code", 1.0, 0.9, 1.1)]
    lines = comparison_lines(_answer(), "p", arms)
    assert [ln.split(":")[0] for ln in lines[1:]] == ["published best for code", "published best for prose"]
    assert [ln.rsplit(": ", 1)[1] for ln in lines[1:]] == ["holds", "differs (slower here)"]
    assert comparison_lines(_answer(), "unpublished pair", arms) == []
    assert comparison_lines(None, "p", arms) == []


def test_a_published_best_that_left_the_race_is_said_slower_here_not_too_few_runs():
    dropped = ArmResult("run prompt lookup k=4 prose", {"kind": "prose", "stopped_by": "dropped: slower than prompt "
                        "lookup cost-model k after 4 blocks (speed-up ratio at most 0.969, one-sided at 0.99583)"},
                        {"speedup": 1.29, "speedup_lo": NAN, "speedup_hi": NAN, "runs": 4, "level": 0.95},
                        "prompt lookup k=4")
    lines = comparison_lines(_answer(), "p", [dropped])
    assert lines[1].endswith("here x1.29 (no interval, 4 runs): differs (slower here: it left this job's race, "
                             "slower than prompt lookup cost-model k after 4 blocks (speed-up ratio at most 0.969, "
                             "one-sided at 0.99583))")


def test_the_published_best_of_a_pair_comes_from_its_first_campaign():
    best = published_best(_answer(), "p")
    assert [(b.campaign, b.kind, b.config) for b in best] == [("ref", "code", "draft model cost-model k"),
                                                             ("ref", "prose", "prompt lookup k=4")]


def test_a_published_configuration_becomes_the_arm_entry_that_runs_it():
    assert entry_of(Arm("speculative", 4, "fixed", "prompt_lookup")) == {"drafter": "prompt_lookup",
                                                                        "k_policy": "fixed", "ks": [4]}
    assert entry_of(Arm("speculative", None, "cost_model", "model")) == {"drafter": "model", "k_policy": "cost_model"}
    assert entry_of(Arm("speculative", 2, "fixed", "tree:lookup:4-6")) == {"tree": "lookup:4-6"}
    assert entry_of(Arm("hf_default", None, "library_default", "model")) == {"method": "hf_default"}
    assert hydra_value([{"tree": "lookup:4-6"}, {"drafter": "model", "ks": [2, 4]}]) == \
        "[{tree:'lookup:4-6'},{drafter:'model',ks:[2,4]}]"


def test_the_recheck_runs_the_published_answer_of_the_committed_outputs():
    campaign, arms = published_arms(ROOT / "outputs", "smollm2_int8")
    answer_best = pd.read_parquet(ROOT / "outputs/analysis/answer/best.parquet")
    mine = answer_best[(answer_best.pair == "smollm2_int8") & (answer_best.campaign == campaign)]
    assert [(k, a.label) for k, a in arms] == [(r.kind, r.best.removesuffix(" (plan)")) for r in mine.itertuples()]
    assert all(a.method == "speculative" for _, a in arms)


def test_the_recheck_job_keeps_the_users_overrides_over_its_defaults():
    cmd = command(["stage.rounds=3", "pair=x"], [{"drafter": "model", "ks": [4]}])
    assert "stage.rounds=2" not in cmd and cmd[-2:] == ["stage.rounds=3", "pair=x"]
    assert "campaign=recheck" in cmd and "stage=speed" in cmd
    assert pair_of([]) == "smollm2_int8" and pair_of(["pair=qwen25_coder_bf16"]) == "qwen25_coder_bf16"


def test_a_pair_without_a_published_answer_is_one_line_naming_the_published_pairs():
    with pytest.raises(RecheckError, match=r"pair=nope has no published answer: use one of \[.*'smollm2_int8'"):
        published_arms(ROOT / "outputs", "nope")
