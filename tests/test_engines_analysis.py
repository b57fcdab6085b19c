"""The cross-engine analysis (analysis.engines) on hand-made speed rows of two engines: each run priced at its own
job's timed costs, the best configuration per engine with llama.cpp's flags, acceptance of one engine priced with
the other's costs; the answer (analysis.answer) keeps engines apart; an absent campaign is "not measured"."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.answer import best_table, candidates, speculative_runs
from analysis.engines import compute, costs_of, first_screen, timing_curve

REPO = Path(__file__).resolve().parents[1]
BOOT = {"samples": 200, "seed": 0, "level": 0.95}
# Timed costs of each engine's job: target step, draft step, the target's pass over k + 1 = 3 tokens
SPECLAB_COSTS = {"target_step": 0.010, "draft_step": 0.002, "verify": 0.012}
LLAMA_COSTS = {"target_step": 0.004, "draft_step": 0.003, "verify": 0.006}
PROMPT = {"speclab": 0.10, "llama_cpp": 0.04, "vllm": 0.05}  # each engine's plain run reading the prompt


def prompt_time(engine: str, arm: str, drafter: str) -> float:
    """A run's prompt time: speclab prices with its plain run's (a speculative run's own is never read); llama.cpp
    with the request's own, a draft model's reading of the prompt included (the plain side pays the target's share)."""
    if arm == "plain":
        return PROMPT[engine]
    if engine == "speclab":
        return 9.0
    return PROMPT[engine] * (1 + LLAMA_COSTS["draft_step"] / LLAMA_COSTS["target_step"] if drafter == "model" else 1)


def row(engine: str, arm: str, ratio: float, prompt: str, *, k: int = 0, drafter: str = "none", policy: str = "none",
        n: int = 48, drafted: int = 0, accepted: int = 0, checked: int = 0, tps: float = 100.0,
        kind: str = "code") -> dict:
    """One speed row. speclab's rows count by depth and report accepted / checked (``checked``); llama.cpp's report
    accepted / drafted and no depths."""
    costs = SPECLAB_COSTS if engine == "speclab" else LLAMA_COSTS
    passes = n - accepted
    depths = engine == "speclab" and arm != "plain"
    return {"pair": "p", "engine": engine, "config_hash": f"job-{engine}", "draft": "d.gguf" if engine != "speclab"
            else "int8", "prompt_id": prompt, "kind": kind, "arm": arm, "k": k, "drafter": drafter, "k_policy": policy,
            "do_sample": False, "temperature": 1.0, "top_p": 1.0, "new_tokens": n,
            "tokens_per_s": tps * ratio, "ratio_to_adjacent_plain": ratio,
            "prefill_s": prompt_time(engine, arm, drafter),
            "acceptance_rate": (accepted / checked if depths else accepted / drafted) if drafted else np.nan,
            "accepted_by_depth": f"{accepted - accepted // 2},{accepted // 2}" if depths else "",
            "checked_by_depth": f"{checked - checked // 2},{checked // 2}" if depths else "",
            "iterations": passes,
            "mean_k": drafted / passes if arm != "plain" else np.nan,
            **{f"{name}_{when}_s": (value if name != "verify" or k == 2 else np.nan)
               for name, value in costs.items() for when in ("before", "after")}}


def hand_made() -> pd.DataFrame:
    rows = []
    for i, prompt in enumerate(["a", "b", "c"]):
        rows.append(row("speclab", "plain", 1.0, prompt, tps=50.0))
        rows.append(row("speclab", "speculative", [1.30, 1.25, 1.35][i], prompt, k=2, drafter="model",
                        policy="fixed", drafted=30, accepted=20, checked=25))
        rows.append(row("llama_cpp", "plain", 1.0, prompt, tps=120.0))
        rows.append(row("llama_cpp", "speculative", [0.80, 0.85, 0.82][i], prompt, k=2, drafter="model",
                        policy="fixed", drafted=40, accepted=30))
        rows.append(row("llama_cpp", "speculative", [1.05, 1.02, 1.10][i], prompt, drafter="ngram-simple",
                        policy="library_default", drafted=6, accepted=3))
    return pd.DataFrame(rows)


def spec_time(n, drafted, accepted, t_target, t_draft, t_verify3, prompt):
    """The engine time model written out: passes * (d * t_D + t_V(d + 1)) over n * t_T, t_V a line through
    (1, t_T) and (3, t_V3) (and beyond 3 the same line), the prompt read first on both sides and by the draft
    at t_D / t_T of the target's time."""
    passes = n - accepted
    d = drafted / passes
    t_v = t_target + d * (t_verify3 - t_target) / 2
    return (n * t_target + prompt) / (passes * (d * t_draft + t_v) + prompt * (1 + t_draft / t_target))


@pytest.fixture(scope="module")
def tables():
    return compute(hand_made(), pd.DataFrame(), BOOT)


def test_each_run_priced_at_its_own_engines_costs(tables):
    p = tables["predictions"].set_index(["engine", "kind", "config"])
    s = p.loc[("speclab", "code", "draft model k=2")]
    assert s.predicted == pytest.approx(spec_time(48, 30, 20, 0.010, 0.002, 0.012, 0.10))
    assert s.alpha == pytest.approx(20 / 30) and s.drafted_per_pass == pytest.approx(30 / 28)
    assert s.measured == pytest.approx(1.30) and s.error == pytest.approx(s.predicted - 1.30)
    ll = p.loc[("llama_cpp", "code", "draft model k=2")]
    assert ll.predicted == pytest.approx(spec_time(48, 40, 30, 0.004, 0.003, 0.006, 0.04))
    # llama.cpp's n-gram type drafts for free: only the wider passes cost
    ng = p.loc[("llama_cpp", "code", "ngram-simple (llama.cpp defaults)")]
    assert ng.predicted == pytest.approx(spec_time(48, 6, 3, 0.004, 0.0, 0.006, 0.04))
    # the chapter's i.i.d. form at the same costs: k = 2, alpha-hat = accepted / checked = 0.8
    a = 0.8
    assert s.predicted_iid == pytest.approx((1 + a + a * a) / (2 * 0.2 + 1.2))


def test_llama_runs_are_priced_with_the_overheads_its_plans_requests_calibrate():
    """What the timed passes leave out, fitted on the campaign's llama.cpp acceptance requests (a plan's): 1 ms per
    pass and 0.5 ms per drafted token with the draft model, 0.2 ms per pass (and per plain token) with n-gram lookup."""
    from speclab.costs.engine_time import Counters, EngineCosts, predict

    t_t, t_d, t_v3 = LLAMA_COSTS["target_step"], LLAMA_COSTS["draft_step"], LLAMA_COSTS["verify"]
    timing = pd.DataFrame([{"pair": "p", "engine": "llama_cpp", "model": model, "prompt_id": "a", "context_len": 50,
                            "pass_len": m, "median_s": s} for model, m, s in
                           [("target", 1, t_t), ("target", 3, t_v3), ("draft", 1, t_d)]])
    costs = EngineCosts.from_timings(t_t, t_d, {1.0: t_t, 3.0: t_v3})
    requests = []
    for drafter, drafted, accepted in [("model", 40, 30), ("model", 60, 20), ("model", 20, 18), ("model", 90, 35),
                                       ("ngram-simple", 6, 3), ("ngram-simple", 12, 10), ("ngram-simple", 30, 8)]:
        c = Counters(48.0, float(drafted), float(accepted))
        timed = predict(costs if drafter == "model" else costs.without_draft(), c).speculative_s
        extra = 0.001 * c.passes + 0.0005 * drafted if drafter == "model" else 0.0002 * c.passes
        requests.append({"pair": "p", "engine": "llama_cpp", "prompt_id": "a", "kind": "code", "drafter": drafter,
                         "k": 0, "k_policy": "fixed", "new_tokens": 48, "proposed": drafted, "accepted": accepted,
                         "prefill_s": 0.07, "total_s": timed + extra})
    p = compute(hand_made(), timing, BOOT, pd.DataFrame(requests))["predictions"].set_index(["engine", "kind", "config"])
    prompt = PROMPT["llama_cpp"]  # the target's share of the speculative request's prompt time
    passes, d = 48 - 30, 40 / 18
    spec = passes * (d * t_d + t_t + d * (t_v3 - t_t) / 2) + 0.001 * passes + 0.0005 * 40 + prompt * (1 + t_d / t_t)
    assert p.loc[("llama_cpp", "code", "draft model k=2")].predicted == pytest.approx((48 * (t_t + 0.0002) + prompt) / spec)
    # speclab's loop is priced as before: no calibration of its own
    assert p.loc[("speclab", "code", "draft model k=2")].predicted == pytest.approx(
        spec_time(48, 30, 20, 0.010, 0.002, 0.012, 0.10))


def test_pass_lengths_a_speed_job_did_not_time_come_from_the_timing_stage():
    # the timing stage: passes of 1..5 tokens at 20, 22, 24, 30, 40 ms (at the prompt's context; a longer
    # context's rows are not read); the speed job timed its step at 10 ms and a 3-token pass at 12 ms
    timing = pd.DataFrame([{"pair": "p", "engine": "llama_cpp", "model": "target", "prompt_id": "a",
                            "context_len": ctx, "pass_len": m, "median_s": s * (1 if ctx == 50 else 3)}
                           for ctx in (50, 80) for m, s in zip(range(1, 6), [0.020, 0.022, 0.024, 0.030, 0.040])])
    curve = timing_curve(timing, "p", "llama_cpp")
    assert curve == pytest.approx({1: 0.020, 2: 0.022, 3: 0.024, 4: 0.030, 5: 0.040})
    job = pd.DataFrame([row("llama_cpp", "speculative", 1.0, "a", k=2, drafter="model", policy="fixed",
                            drafted=4, accepted=2)]).assign(target_step_before_s=0.010, target_step_after_s=0.010,
                                                            verify_before_s=0.012, verify_after_s=0.012)
    c = costs_of(job, curve)
    assert c.verify.time(3) == pytest.approx(0.012)  # the job's own timing wins
    assert c.verify.time(5) == pytest.approx(0.020)  # the timing stage's, at the job's speed (half)
    assert c.verify.time(2) == pytest.approx(0.011)
    assert costs_of(job).verify.time(5) == pytest.approx(0.014)  # without: the line through 1 and 3


def test_best_configuration_per_engine_with_llama_flags(tables):
    sm = tables["summary"].set_index(["engine", "kind"])
    assert sm.loc[("speclab", "code")].best == "draft model k=2" and sm.loc[("speclab", "code")].pasted_flags == ""
    assert sm.loc[("speclab", "code")].plain_tokens_per_s == pytest.approx(50.0)
    best = sm.loc[("llama_cpp", "code")]
    assert best.best == "ngram-simple (llama.cpp defaults)" and best.speedup == pytest.approx(1.05)
    assert best.pasted_flags == "--spec-type ngram-simple" and best.plain_tokens_per_s == pytest.approx(120.0)
    assert best.alpha == pytest.approx(0.5)


def test_dvc_metrics_count_the_engines_lines_cells_without_a_verdict(tables):
    """The first screen's engines line has its row in `dvc metrics show`: three runs a cell give no interval."""
    from analysis.engines import verdict_counts

    row = verdict_counts(tables["summary"], "eng")
    assert (row["campaign"], row["answers"], row["too_few"], row["speculate"]) == ("eng", 2, 2, 0)
    more = tables["summary"].assign(verdict="speculate")
    assert verdict_counts(more, "eng")["too_few"] == 0 and verdict_counts(more, "eng")["speculate"] == 2


def test_transfer_prices_one_engines_acceptance_with_the_others_costs(tables):
    tr = tables["transfer"]
    code = tr[tr.kind == "code"].set_index(["acceptance_of", "costs_of"])
    to_llama = code.loc[("speclab", "llama_cpp")]
    assert to_llama.k == 2
    # speclab's counters at llama.cpp's costs and llama.cpp's prompt time
    assert to_llama.predicted == pytest.approx(spec_time(48, 30, 20, 0.004, 0.003, 0.006, 0.04))
    assert to_llama.measured == pytest.approx(0.82)
    assert to_llama.error == pytest.approx(to_llama.predicted - 0.82)
    assert to_llama.predicted_own == pytest.approx(spec_time(48, 40, 30, 0.004, 0.003, 0.006, 0.04))
    to_speclab = code.loc[("llama_cpp", "speclab")]
    assert to_speclab.predicted == pytest.approx(spec_time(48, 40, 30, 0.010, 0.002, 0.012, 0.10))
    text = first_screen(tables, "eng", "analysis/engines/section.md")
    line = next(ln for ln in text.splitlines() if ln.startswith("- p: "))  # one line per pair, engines side by side
    assert "**llama.cpp**" in line and "**speclab**" in line and "`--spec-type ngram-simple`" in line
    assert "code " in line
    assert "speclab's acceptance priced with llama.cpp's timed costs" in text


def three_engines() -> pd.DataFrame:
    """hand_made's two engines and vLLM: its draft model and n-gram lookup at k = 2, counted per request."""
    rows = []
    for i, prompt in enumerate(["a", "b", "c"]):
        rows.append(row("vllm", "plain", 1.0, prompt, tps=80.0))
        rows.append(row("vllm", "speculative", [1.60, 1.70, 1.65][i], prompt, k=2, drafter="model", policy="fixed",
                        drafted=40, accepted=36))
        rows.append(row("vllm", "speculative", [1.10, 1.20, 1.15][i], prompt, k=2, drafter="ngram", policy="fixed",
                        drafted=10, accepted=6))
    return pd.concat([hand_made(), pd.DataFrame(rows).assign(draft="qwen2.5-coder-0.5b")], ignore_index=True)


def test_a_third_engine_sits_beside_the_others_with_the_config_a_user_pastes():
    tables = compute(three_engines(), pd.DataFrame(), BOOT)
    best = tables["summary"].set_index(["engine", "kind"]).loc[("vllm", "code")]
    assert best.best == "draft model k=2" and best.speedup == pytest.approx(1.65)
    assert best.pasted_flags == ("--speculative-config '{\"method\": \"draft_model\", \"num_speculative_tokens\": 2, "
                                 "\"model\": \"qwen2.5-coder-0.5b\"}'")
    assert best.plain_tokens_per_s == pytest.approx(80.0) and best.alpha == pytest.approx(0.9)
    tr = tables["transfer"]
    directions = set(zip(tr[tr.kind == "code"].acceptance_of, tr[tr.kind == "code"].costs_of))
    assert directions == {(a, b) for a in ("speclab", "llama_cpp", "vllm") for b in ("speclab", "llama_cpp", "vllm")
                          if a != b}
    line = next(ln for ln in first_screen(tables, "eng", "x").splitlines() if ln.startswith("- p: "))
    assert "**vLLM**" in line and "**llama.cpp**" in line and "**speclab**" in line and "--speculative-config" in line


def test_the_first_screen_names_the_configuration_both_engines_ran_pooled_over_kinds():
    from analysis.engines import _common_arm

    preds = pd.DataFrame([{"pair": "p", "engine": "llama_cpp", "config": "draft model k=4", "kind": "code",
                           "measured": 0.9, "measured_lo": 0.8, "measured_hi": 1.0},
                          {"pair": "p", "engine": "llama_cpp", "config": "draft model k=4", "kind": "all",
                           "measured": 0.54, "measured_lo": 0.52, "measured_hi": 0.57}])
    assert _common_arm(preds, "p", "llama_cpp") == "; draft model k=4 over all kinds x0.54 (0.52-0.57)"
    assert _common_arm(preds, "p", "speclab") == ""  # not measured in that engine: nothing said


def test_answer_keeps_engines_apart_and_speclab_only_campaigns_as_before():
    speed = hand_made()
    runs = speculative_runs(speed, "eng")
    best = best_table(runs, candidates(runs, BOOT), BOOT).set_index("pair")
    # the llama.cpp draft model (0.82) never competes with speclab's (1.30): one best per engine
    assert best.loc["p · speclab"].best == "draft model k=2"
    assert best.loc["p · llama.cpp"].best == "ngram-simple (llama.cpp defaults)"
    only = speculative_runs(speed[speed.engine == "speclab"], "c")
    assert set(only.pair) == {"p"} and set(only.config) == {"draft model k=2"}
    older = speculative_runs(speed[speed.engine == "speclab"].drop(columns="engine"), "c")  # files before engines
    assert set(older.pair) == {"p"} and set(older.config) == {"draft model k=2"}


@pytest.mark.slow
def test_absent_campaign_is_not_measured_and_the_stage_succeeds(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(outputs_dir=str(tmp_path / "outputs"), analysis_dir=str(tmp_path / "outputs/analysis"),
                  metrics_dir=str(tmp_path / "outputs/metrics"), engines_campaign="nothing_here")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    done = subprocess.run([sys.executable, "-m", "analysis.engines"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    section = (tmp_path / "outputs/analysis/engines/section.md").read_text()
    assert "Not measured: campaign **nothing_here**" in section
    assert json.loads((tmp_path / "outputs/metrics/detail/engines.json").read_text()) == {}
    assert pd.read_parquet(tmp_path / "outputs/analysis/engines/summary.parquet").empty


def test_answer_with_an_unmeasured_engines_campaign_is_the_answer_without_it(tmp_path):
    from analysis.answer import compute as answer
    from test_campaigns import SPEED, refile
    out = tmp_path / "outputs"
    refile(SPEED[0], out, "c", "speed")
    (out / "campaigns" / "eng").mkdir()
    (out / "campaigns" / "eng" / ".gitkeep").touch()  # kept in git before its first run
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(outputs_dir=str(out), analysis_dir=str(out / "analysis"), campaign="c", pair_campaign=None,
                  spec_bench_campaign=None, trees_campaign=None, time_model={"campaign": None})
    without = answer({**params, "engines_campaign": None})
    for name in ("eng", "absent"):
        got = answer({**params, "engines_campaign": name})
        for a, b in zip((got.best, got.candidates, got.not_to_use, got.provenance),
                        (without.best, without.candidates, without.not_to_use, without.provenance)):
            pd.testing.assert_frame_equal(a, b)


def test_an_engines_counters_come_from_its_own_ratio_not_its_position_histogram():
    import pandas as pd
    from analysis.engines import with_counters
    rows = pd.DataFrame({
        "mean_k": [4.0, 0.0, 2.0], "iterations": [5, 3, 4], "acceptance_rate": [0.5, float("nan"), 0.75],
        # vLLM: by position from its histogram (may disagree with its counts); speclab: with checked-by-depth
        "accepted_by_depth": ["6,3,1,0", "1,0", "3,2"], "checked_by_depth": ["", "", "4,3"]})
    out = with_counters(rows)
    assert out.drafted.tolist() == [20, 0, 8]
    assert out.accepted.tolist() == [10, 0, 5] and (out.accepted <= out.drafted).all()
    assert out.checked.tolist() == [20, 0, 7]
