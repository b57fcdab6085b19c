"""The acceptance stage's replay (``stage.replay``): every configuration but one per drafter comes from one
plain generation and one teacher-forced draft pass per prompt, and its rows hold exactly the counts the loop
gives when it runs every configuration (tiny fp32 pair: no near-ties); the time model's calibration reads
the runs measured for real only."""
import pandas as pd
import pytest

from pipeline.jobs.identity import output_path
from speclab.costs.planning import calibrate, measured, predict_runs
from pipeline.run import run_parts
from pipeline_helpers import make_cfg

COUNTS = ["proposed", "accepted", "bonus", "new_tokens", "length", "draft_fed", "draft_calls", "with_prompt"]
KEYS = ["prompt_id", "drafter", "k_policy", "k", "iteration"]
SETTINGS = ["stage=acceptance", "stage.ks=[1,2,5]", "k=2", "stage.arms=[{drafter:model},{drafter:prompt_lookup},"
            "{drafter:hybrid},{k_policy:heuristic}]", "max_new_tokens=16", "prompts.per_kind=1"]


def _rows(tmp_path, name, *extra):
    cfg = make_cfg(tmp_path / name, *SETTINGS, *extra)
    run_parts(cfg)
    return pd.read_parquet(output_path(cfg, "acceptance")).sort_values(KEYS).reset_index(drop=True)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    return _rows(tmp, "loop", "stage.replay=false"), _rows(tmp, "replay", "stage.replay=true")


def test_replayed_rows_equal_the_loops(both):
    loop, rep = both
    assert not loop.replayed.any() and loop.replay_agrees.isna().all()
    assert len(rep) == len(loop)
    pd.testing.assert_frame_equal(rep[KEYS + COUNTS], loop[KEYS + COUNTS])
    # One configuration per drafter ran for real (the job's k=2, fixed): timed, and checked against its replay.
    real = rep[~rep.replayed]
    assert set(map(tuple, real[["drafter", "k_policy", "k"]].drop_duplicates().to_numpy())) == {
        ("model", "fixed", 2), ("prompt_lookup", "fixed", 2), ("hybrid", "fixed", 2)}
    assert (real.replay_agrees == 1.0).all() and real.verify_s.notna().all()
    assert rep[rep.replayed].verify_s.isna().all() and rep[rep.replayed].replay_agrees.isna().all()


def test_the_time_model_calibrates_on_measured_runs_and_predicts_every_run(both, tmp_path):
    _, rep = both
    assert len(measured(rep)) < len(rep)
    cfg = make_cfg(tmp_path, "stage=timing", "stage.prefill=true", "prompts.per_kind=1")
    run_parts(cfg)
    timing = pd.read_parquet(output_path(cfg, "timing"))
    model = calibrate(timing, rep)
    pred = predict_runs(model, rep)
    assert len(pred) == rep.groupby(["prompt_id", "drafter", "k_policy", "k"]).ngroups
    assert pred.predicted.notna().all() and model.loop.target_scale > 0


def test_sampling_runs_the_loop_every_time(tmp_path):
    rows = _rows(tmp_path, "t07", "stage.replay=true", "sampling=t07", "stage.arms=[{drafter:model}]")
    assert not rows.replayed.any() and rows.verify_s.notna().all()


def test_loop_facts_are_filled_in_their_own_tables_only():
    """A plan or timing table never gains the loop's columns; an older acceptance file gets their old value."""
    from store.compat import with_defaults

    plan = with_defaults(pd.DataFrame({"kind": ["code"], "drafter": ["model"], "k_policy": ["fixed"]}))
    assert not {"with_prompt", "merged_prefill", "replayed"} & set(plan.columns)
    old = with_defaults(pd.DataFrame({"replayed": [None, True], "with_prompt": [None, False]}))
    assert old.replayed.tolist() == [False, True] and old.with_prompt.tolist() == [False, False]
