"""A plan's sample sized by what it shows: a kind is settled when its recommendation is told apart from every
rival, or within the precision of it, at the plan's level corrected for the rivals and the looks; the plan job adds prompts of the kinds that are not,
within its budgets, and says per kind why its sample stopped."""
import numpy as np
import pandas as pd
import pytest

from speclab.costs.planning import settled

MODEL4, LOOKUP4 = ("model", "fixed", 4), ("prompt_lookup", "fixed", 4)


def _pred(model: list[float], lookup: list[float]) -> pd.DataFrame:
    rows = []
    for i, (m, lk) in enumerate(zip(model, lookup)):
        for (drafter, policy, k), v in ((MODEL4, m), (LOOKUP4, lk)):
            rows.append({"prompt_id": f"p{i}", "kind": "code", "drafter": drafter, "k_policy": policy, "k": k,
                         "predicted": v})
    return pd.DataFrame(rows)


def test_two_prompts_that_agree_settle_the_kind_and_two_that_disagree_do_not():
    agree = settled(_pred([1.50, 1.60], [1.20, 1.25]), MODEL4, 0.05, 0.9)
    assert agree.runner_up == LOOKUP4 and agree.settled and agree.margin > 1.15
    # The same mean advantage, but the prompts disagree on the sign: two prompts cannot tell them apart.
    disagree = settled(_pred([1.80, 1.10], [1.20, 1.30]), MODEL4, 0.05, 0.9)
    assert not disagree.settled and disagree.margin < 0.95
    # More prompts that keep the same advantage with the same spread do settle it.
    many = settled(_pred([1.80, 1.10] * 8, [1.20, 1.30] * 8), MODEL4, 0.05, 0.9)
    assert many.settled


def test_a_tie_within_the_precision_settles_and_one_prompt_never_does():
    tie = settled(_pred([1.30, 1.31, 1.29], [1.31, 1.30, 1.30]), MODEL4, 0.05, 0.9)
    assert tie.settled and 0.95 < tie.margin < 1.0  # not told apart, but either will do
    assert not settled(_pred([1.30, 1.31, 1.29], [1.31, 1.30, 1.30]), MODEL4, 0.001, 0.9).settled
    one = settled(_pred([1.5], [1.2]), MODEL4, 0.05, 0.9)
    assert not one.settled and np.isnan(one.margin)


def test_the_bound_is_the_closest_rivals_not_the_sample_runner_ups():
    pred = pd.concat([_pred([1.5, 1.6], [1.45, 1.62]),
                      pd.DataFrame([{"prompt_id": f"p{i}", "kind": "code", "drafter": "hybrid", "k_policy": "fixed",
                                     "k": 2, "predicted": 0.5} for i in range(2)])])
    assert settled(pred, MODEL4, 0.05, 0.9).runner_up == LOOKUP4
    # A rival ranked third by median whose prompts disagree is the one the sample cannot rule out: the old rule,
    # against the runner-up (lookup, agreeing closely) alone, called this settled.
    third = pd.concat([_pred([1.50, 1.52, 1.51], [1.45, 1.47, 1.46]),
                       pd.DataFrame([{"prompt_id": f"p{i}", "kind": "code", "drafter": "hybrid", "k_policy": "fixed",
                                      "k": 2, "predicted": v} for i, v in enumerate([1.0, 1.9, 1.0])])])
    s = settled(third, MODEL4, 0.05, 0.9)
    assert s.runner_up == ("hybrid", "fixed", 2) and not s.settled and s.rivals == 3
    # The correction: more looks ask for more.
    assert settled(third, MODEL4, 0.05, 0.9, looks=7).margin < s.margin


def _plan(tmp_path, *overrides):
    from pipeline.jobs.identity import output_path
    from pipeline.run import run_parts
    from tests.pipeline_helpers import make_cfg

    cfg = make_cfg(tmp_path, "stage=plan", "stage.repeats=2", "stage.warmup=0", "stage.pass_lengths=[1,2]",
                   "stage.acceptance_ks=[1,2]", "prompts=default", "prompts.kinds=[prose,code]",
                   "prompts.per_kind=1", *overrides)
    run_parts(cfg)
    timing = pd.read_parquet(output_path(cfg, "timing"))
    # Passes timed once, on the first prompt of each kind (stage.time_per_kind), however the sample grows.
    assert dict(timing.groupby("kind").prompt_id.unique().map(list)) == {"code": ["code-fibonacci"],
                                                                         "prose": ["prose-harbour"]}
    return pd.read_parquet(output_path(cfg, "acceptance")), pd.read_parquet(output_path(cfg, "plan"))


@pytest.mark.slow
def test_the_plan_grows_unsettled_kinds_within_its_budgets_and_says_why_it_stopped(tmp_path):
    acc, plan = _plan(tmp_path / "grown", "stage.sample_max_prompts=3")
    sizes = acc.groupby("kind").prompt_id.nunique()
    assert (sizes >= 2).all() and (sizes <= 3).all()  # one prompt never settles a kind; none passes the cap
    rec = plan[plan.recommended & (plan.kind != "all")].set_index("kind")
    for kind, r in rec.iterrows():
        assert r.prompts == sizes[kind]
        if r.sample_stop.startswith("settled"):
            assert r.runner_up_margin >= 0.95
        else:
            assert sizes[kind] == 3 and "stage.sample_max_prompts=3" in r.sample_stop
    assert set(plan.prompt_ids.iloc[0].split(",")) == set(acc.prompt_id)
    # The added prompts are the kind's next ones in the file, after the sample per_kind chose.
    from pipeline.prompts.sets import load_prompts
    for kind, n in sizes.items():
        assert set(acc[acc.kind == kind].prompt_id) == {p.id for p in load_prompts("default.yaml", [kind], n)}

    _, fixed = _plan(tmp_path / "fixed", "stage.sample_precision=null")
    assert (fixed[fixed.kind != "all"].prompts == 1).all()
    assert (fixed[fixed.kind != "all"].sample_stop == "sample as chosen (stage.sample_precision=null)").all()

    acc, timed_out = _plan(tmp_path / "budget", "stage.sample_budget_minutes=0.0001")
    assert acc.groupby("kind").prompt_id.nunique().eq(1).all()
    rec = timed_out[timed_out.recommended & (timed_out.kind != "all")]
    assert rec.sample_stop.str.endswith("stopped by stage.sample_budget_minutes=0.0001").all()
