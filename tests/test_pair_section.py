"""Issue 21: model sizes in the timing stage, and the report section of a second campaign (analysis.pair_section)
checked against hand computations on a small synthetic campaign, and against the published analysis."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
import yaml

from analysis import pair_section as ps
from analysis.report import pair_campaign
from pipeline.stages import acceptance, speed, timing
from speclab.models.size import model_size
from speclab.models.loading import int8_dynamic, tiny_random_model
from store import layout
from store.records import check_stage_file, open_stage_file, write_parquet

REPO = Path(__file__).resolve().parents[1]
BOOT = {"samples": 2000, "seed": 0, "level": 0.95}
PARAMS = {"drift": {"max_ratio": 1.25, "exclude": True}, "time_model": {"campaign": "timemodel2",
                                                                          "calibration_job": "14858f2fa28f96b4"}}
CAMPAIGN = "pairs"


# ---------------------------------------------------------------- model sizes

def test_model_size_counts_float_and_int8_packed_weights():
    model = tiny_random_model()
    params = sum(p.numel() for p in model.parameters())
    assert model_size(model) == ps_size(params, 4 * params, 2)
    # int8: every Linear's weight (no biases in Llama) at one byte, the rest (embeddings, norms) still fp32.
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    size = model_size(int8_dynamic(model))
    assert size.params == params                     # packed int8 weights are counted, not lost
    assert size.bytes == linear + 4 * (params - linear)
    assert size.layers == 2
    assert model_size(tiny_random_model(num_layers=3).to(torch.bfloat16)).layers == 3
    bf16 = tiny_random_model().to(torch.bfloat16)
    assert model_size(bf16).bytes == 2 * sum(p.numel() for p in bf16.parameters())


def ps_size(params, n_bytes, layers):
    from speclab.models.size import ModelSize
    return ModelSize(params, n_bytes, layers)


def test_timing_stage_records_both_models_sizes(tmp_path):
    from pipeline.jobs.identity import output_path
    from pipeline.run import run_parts
    from pipeline_helpers import make_cfg

    cfg = make_cfg(tmp_path, "stage=timing", "stage.repeats=2", "stage.warmup=0", "stage.pass_lengths=[1,2]")
    run_parts(cfg)
    df = pd.read_parquet(output_path(cfg, "timing"))
    assert set(ps.SIZE_COLUMNS) <= set(df.columns) and df[ps.SIZE_COLUMNS].notna().all().all()
    r = df.iloc[0]
    # the tiny pair is two fp32 tiny random models of one shape
    assert r.target_bytes == 4 * r.target_params and r.draft_bytes == 4 * r.draft_params
    assert r.target_params == r.draft_params > 0 and r.target_layers == r.draft_layers == 2


def test_old_timing_files_read_sizes_as_not_measured():
    paths = layout.stage_paths(REPO / "outputs", "timemodel2", "timing")
    assert paths
    for path in paths:
        assert check_stage_file(path, timing.SCHEMA) is None   # still complete for the pipeline
        data = open_stage_file(path, timing.SCHEMA).data
        assert data[ps.SIZE_COLUMNS].isna().all().all()


# ---------------------------------------------------------------- a synthetic campaign

def _row(schema: pa.Schema, **values) -> dict:
    """A row of ``schema`` with neutral values, ``values`` overriding them."""
    neutral = {pa.string(): "", pa.int32(): 0, pa.int64(): 0, pa.float64(): 0.0, pa.bool_(): False}
    return {f.name: neutral[f.type] for f in schema} | values


def _write(outputs: Path, stage: str, module, pair: str, rows: list[dict], config_hash: str) -> None:
    path = layout.stage_file(outputs, CAMPAIGN, stage, pair, config_hash)
    write_parquet(rows, module.SCHEMA, path, {"stage": stage, "campaign": CAMPAIGN, "pair": pair,
                                               "config_hash": config_hash})


IDENT = {"main": {"pair": "main", "target": "tgt-1.5b", "draft": "drf-0.5b", "memory_trusted": True},
         "side": {"pair": "side", "target": "tgt-1.5b", "draft": "int8", "memory_trusted": True}}
# Per prompt, one-token step times (s): medians are target 0.010, main draft 0.004 (c_draft 0.4), side draft 0.007.
TARGET_STEP = [0.009, 0.010, 0.013]
DRAFT_STEP = {"main": [0.004, 0.005, 0.0035], "side": [0.007, 0.006, 0.0075]}
# Target pass over n tokens = step x (1 + 0.05 (n - 1)): c_verify(k) = 1 + 0.05 k.
SIZES = {"main": {"target_params": 1_500_000_000, "target_bytes": 3_000_000_000, "target_layers": 28,
                  "draft_params": 500_000_000, "draft_bytes": 1_000_000_000, "draft_layers": 24},
         "side": {}}   # side: written before sizes were recorded (null)


def _timing_rows(pair: str) -> list[dict]:
    rows = []
    for i, (t, d) in enumerate(zip(TARGET_STEP, DRAFT_STEP[pair])):
        for model, step in (("target", t), ("draft", d)):
            for n in range(1, 10):
                rows.append(_row(timing.SCHEMA, **IDENT[pair], prompt_id=f"p{i}", kind="code", context_len=70 + i,
                                 model=model, pass_len=n, median_s=step * (1 + 0.05 * (n - 1)), samples=3,
                                 **{c: SIZES[pair].get(c) for c in ps.SIZE_COLUMNS}))
    return rows


# accepted counts per iteration, by kind, at k = 2 and 4: code accepts much more than prose.
ACCEPTED = {("code", 2): [2, 2, 1, 0], ("prose", 2): [0, 0, 1, 2], ("code", 4): [4, 3, 4, 1], ("prose", 4): [0, 1, 0, 2]}


def _acceptance_rows(pair: str) -> list[dict]:
    rows = []
    for (kind, k), accepted in ACCEPTED.items():
        for i, a in enumerate(accepted):
            rows.append(_row(acceptance.SCHEMA, **IDENT[pair], prompt_id=f"{kind}0", kind=kind, k=k, drafter="model",
                             k_policy="fixed", top_p=1.0, iteration=i, proposed=k, accepted=a, bonus=a == k,
                             new_tokens=a + 1))
    return rows


# adjacent-run ratios: code wins at k = 2 (every run above 1), prose loses at every k.
RATIOS = {("code", 2): [1.30, 1.25, 1.35, 1.28, 1.31, 1.27], ("code", 4): [1.10, 1.05, 1.12, 1.08, 1.09, 1.07],
          ("prose", 2): [0.90, 0.95, 0.92, 0.93, 0.91, 0.94], ("prose", 4): [0.85, 0.80, 0.82, 0.84, 0.83, 0.81]}
STEPS = {"target_step_before_s": 0.010, "target_step_after_s": 0.010, "draft_step_before_s": 0.004,
         "draft_step_after_s": 0.004, "verify_before_s": 0.0105, "verify_after_s": 0.0105}


def _speed_rows() -> list[dict]:
    rows = []
    for (kind, k), ratios in RATIOS.items():
        for r, ratio in enumerate(ratios):
            common = dict(**IDENT["main"], round=r, prompt_id=f"{kind}0", kind=kind, top_p=1.0, **STEPS)
            rows.append(_row(speed.SCHEMA, **common, arm="plain", drafter="none", k_policy="none", k=0,
                             block=k, tokens_per_s=10.0, ratio_to_adjacent_plain=1.0))
            rows.append(_row(speed.SCHEMA, **common, arm="speculative", drafter="model", k_policy="fixed", k=k,
                             block=k, position=1, tokens_per_s=10.0 * ratio, ratio_to_adjacent_plain=ratio,
                             iterations=10, new_tokens=30))
    return rows


@pytest.fixture
def campaign(tmp_path) -> Path:
    outputs = tmp_path / "outputs"
    for pair in ("main", "side"):
        _write(outputs, "timing", timing, pair, _timing_rows(pair), f"t{pair}")
        _write(outputs, "acceptance", acceptance, pair, _acceptance_rows(pair), f"a{pair}")
    _write(outputs, "speed", speed, "main", _speed_rows(), "smain")
    return outputs


def _section(outputs: Path, campaign: str = CAMPAIGN):
    data = ps.read_campaign(outputs, campaign, BOOT)
    sec = ps.build(data, PARAMS, BOOT)
    return sec, ps.markdown(sec, data)


def _alpha(accepted: list[int], k: int) -> float:
    """By hand: accepted / checked proposals, a rejection ending the check."""
    return sum(accepted) / sum(a + (a < k) for a in accepted)


def test_costs_and_size_ratios_by_hand(campaign):
    sec, text = _section(campaign)
    main, side = (sec.costs.set_index("pair").loc[p] for p in ("main", "side"))
    assert main.target_step_ms == pytest.approx(10.0) and main.draft_step_ms == pytest.approx(4.0)
    assert main.c_draft == pytest.approx(0.4)          # draft / target; inverted it would be 2.5
    assert side.c_draft == pytest.approx(0.7)
    for k in ps.VERIFY_KS:
        assert main[f"c_verify_k{k}"] == pytest.approx(1 + 0.05 * k)   # pass over k + 1 tokens / one step
    assert main.bytes_ratio == pytest.approx(1 / 3) and main.layer_ratio == pytest.approx(24 / 28)
    assert main.params_ratio == pytest.approx(1 / 3)
    assert np.isnan(side.bytes_ratio) and np.isnan(side.layer_ratio)
    line = next(s for s in sec.verdict if s.startswith("- main: c_draft"))
    assert "x1.20 the weight-bytes ratio 0.33: the draft step costs more" in line
    assert f"x{0.4 / (24 / 28):.2f} the layer ratio 0.86: the draft step costs less" in line
    assert "- side: c_draft = 0.70; the weight-bytes ratio is not measured; the layer ratio is not measured." in sec.verdict
    assert "| side   | not measured" in text
    assert title_line(text) == "## tgt-1.5b drafted by drf-0.5b (campaign pairs)"


def title_line(text: str) -> str:
    return text.splitlines()[0]


def test_alpha_per_kind_by_hand(campaign):
    sec, text = _section(campaign)
    got = sec.alpha.set_index(["pair", "kind", "k"]).alpha
    for (kind, k), accepted in ACCEPTED.items():
        assert got[("main", kind, k)] == pytest.approx(_alpha(accepted, k))
    assert got[("main", "code", 2)] == pytest.approx(5 / 7) and got[("main", "prose", 2)] == pytest.approx(0.5)
    pooled = ACCEPTED[("code", 2)] + ACCEPTED[("prose", 2)]
    assert got[("main", "all", 2)] == pytest.approx(_alpha(pooled, 2))
    # the Markdown row of each kind carries that kind's alpha at k = 2 then 4
    code_row = next(s for s in text.splitlines() if s.startswith("| main   | code"))
    assert f"{5 / 7:.3f}" in code_row and f"{_alpha(ACCEPTED[('code', 4)], 4):.3f}" in code_row
    assert "0.500" not in code_row


def test_best_k_interval_prediction_and_verdict_by_hand(campaign):
    sec, text = _section(campaign)
    best = sec.best.set_index(["pair", "kind"])
    code, prose = best.loc[("main", "code")], best.loc[("main", "prose")]
    assert code.k == 2 and code.measured == pytest.approx(np.median(RATIOS[("code", 2)]))
    assert prose.k == 2 and prose.measured == pytest.approx(np.median(RATIOS[("prose", 2)]))
    assert min(RATIOS[("code", 2)]) <= code.measured_lo <= code.measured <= code.measured_hi <= max(RATIOS[("code", 2)])
    assert code.measured_lo > 1 > prose.measured_hi
    # the i.i.d. formula at the kind's alpha, priced with the speed jobs' step times
    a = _alpha(ACCEPTED[("code", 2)], 2)
    assert code.predicted_iid == pytest.approx((1 - a ** 3) / (1 - a) / (2 * 0.4 + 1.05))
    assert any(s.startswith("- main, code: the draft pays at its best k = 2: x1.290") for s in sec.verdict)
    assert any(s.startswith("- main, prose: the draft does not pay (loses) at its best k = 2: x0.925") for s in sec.verdict)
    assert "side" not in set(sec.best.pair)   # timing and acceptance only: no speed verdict
    # no plan in this campaign, and too few columns for a time model: said, not crashed
    assert "Plan: not measured in this campaign." in text and "Time model: not available" in text
    # kinds pooled at k = 2: half the runs win, half lose, so the interval straddles 1
    pooled = best.loc[("main", "all")]
    assert pooled.measured == pytest.approx(np.median(RATIOS[("code", 2)] + RATIOS[("prose", 2)]))
    assert any(s.startswith("- main, all: the draft is not distinguishable from plain decoding") for s in sec.verdict)
    assert ps.summary(sec)["pairs"]["main"]["pays"] == {"all": False, "code": True, "prose": False}


def test_partial_and_absent_campaigns_say_not_measured(campaign, tmp_path, monkeypatch):
    for p in layout.stage_paths(campaign, CAMPAIGN, "acceptance"):
        p.unlink()
    sec, text = _section(campaign)   # speed without acceptance: measured speed-ups, no alpha to predict from
    assert "Acceptance: not measured in this campaign." in text and not sec.best.empty
    assert sec.best.predicted_iid.isna().all() and "Time model: not available" in text
    for p in layout.stage_paths(campaign, CAMPAIGN, "speed"):
        p.unlink()
    sec, text = _section(campaign)
    assert not sec.costs.empty and "Speed: not measured in this campaign." in text
    # an absent campaign through the script itself: every output written, the report links the section
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(yaml.safe_dump({
        "pair_campaign": "nothing_yet", "outputs_dir": "outputs", "analysis_dir": "outputs/analysis",
        "bootstrap": {"samples": 100, "seed": 0, "level": 0.95}, **PARAMS}))
    ps.main()
    out = Path("outputs/analysis/nothing_yet")
    assert {p.name for p in out.iterdir()} >= {"section.md", "summary.json", "costs.csv", "best_k.csv"}
    fragment = (out / "section.md").read_text()
    assert fragment.count("not measured in this campaign") == 5
    params = yaml.safe_load(Path("params.yaml").read_text())
    linked = pair_campaign(params)
    assert linked["ready"] and linked["link"] == "analysis/nothing_yet/section.md" and not linked["table"]
    assert linked["title"] == json.loads((out / "summary.json").read_text())["title"]
    assert not pair_campaign({**params, "pair_campaign": "other"})["ready"]  # the report: "no section yet"


# ---------------------------------------------------------------- against the published analysis

def test_time_model_and_plan_check_are_the_published_analysis_for_timemodel2():
    """On the time model's own campaign the section's numbers are analysis.time_model's and analysis.recommend's."""
    sec, text = _section(REPO / "outputs", "timemodel2")
    points = pd.read_parquet(REPO / "outputs/analysis/time_model_points.parquet").set_index(["kind", "k"])
    assert not sec.time_model.empty
    for r in sec.time_model.itertuples():
        p = points.loc[(r.kind, r.k)]
        assert (r.time_model, r.iid_formula, r.measured_held_out) == pytest.approx((p.tm_own, p.iid_own, p.measured),
                                                                                    rel=1e-9)
    from analysis.common import bootstrap_settings
    from analysis.recommend import recommendation

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    check = recommendation(str(REPO / "outputs"), "timemodel2", bootstrap_settings(params)).check
    check = check[check.kind == "all"].reset_index(drop=True)
    assert list(sec.plan_check.comparison) == list(check.comparison)
    assert sec.plan_check.median_ratio.to_numpy() == pytest.approx(check.median_ratio.to_numpy(), rel=1e-9,
                                                                   nan_ok=True)
    planner = text.split("### The planner's check")[1].split("### Verdict")[0]
    assert "not measured" not in planner and "| confirmatory | recommended vs best fixed" in planner


def test_drafts_compared_on_the_prompts_every_pair_has(campaign):
    """Main also ran a prompt the side pair did not (every proposal accepted): it must not lift main's alpha."""
    extra = [_row(acceptance.SCHEMA, **IDENT["main"], prompt_id="extra0", kind="code", k=4, drafter="model",
                  k_policy="fixed", top_p=1.0, iteration=i, proposed=4, accepted=4, bonus=True, new_tokens=5)
             for i in range(6)]
    _write(campaign, "acceptance", acceptance, "main", extra, "zextra")
    sec, text = _section(campaign)
    d = sec.drafts.set_index("pair")
    alpha = _alpha(ACCEPTED[("code", 4)] + ACCEPTED[("prose", 4)], 4)
    assert d.alpha_k4["main"] == pytest.approx(alpha) and d.alpha_k4["side"] == pytest.approx(alpha)
    assert list(sec.drafts.pair) == ["main", "side"]   # fastest first: main's draft is cheaper (0.4 vs 0.7)
    from speclab.costs.time_model import iid_speedup
    for pair, c_draft in (("main", 0.4), ("side", 0.7)):
        pred = {k: iid_speedup(alpha, k, c_draft, 1 + 0.05 * k) for k in ps.VERIFY_KS}
        assert d.iid_best_k[pair] == max(pred, key=pred.get)
        assert d.iid_best_speedup[pair] == pytest.approx(max(pred.values()))
    assert "Drafts compared on equal terms: alpha at k = 4 on the 2 prompts" in text
