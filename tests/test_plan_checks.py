"""The plan's two checks on synthetic speed rows: which fixed configuration the exploratory check
names as the best, and how the confirmatory check (that configuration named before its runs, next
to the recommendation) is reported beside it."""
import numpy as np
import pandas as pd
import pytest

from analysis.recommend import check
from store.best_fixed import best_fixed

BOOT = {"samples": 200, "seed": 0, "level": 0.95}


def _job(job: str, arms: list[tuple[str, str, int, float]], blocks: int, noise: float = 0.0, seed: int = 0):
    """Speed rows of one job: every arm (method, drafter, k, speed-up over plain) in every block,
    in this order (position = index), with plain at 10 tokens/s."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(blocks):
        for pos, (method, drafter, k, speedup) in enumerate([("plain", "none", 0, 1.0)] + arms):
            tps = 10.0 * speedup * (1 + noise * rng.standard_normal()) if method != "plain" else 10.0
            rows.append({"config_hash": job, "round": 0, "block": b, "arm": method, "drafter": drafter, "k": k,
                         "k_policy": "none" if method == "plain" else "fixed", "position": pos,
                         "kind": "code", "tokens_per_s": tps, "ratio_to_adjacent_plain": tps / 10.0})
    return pd.DataFrame(rows)


EXPLORATORY = [("speculative", "model", 4, 0.8), ("speculative", "prompt_lookup", 2, 1.30),
               ("speculative", "prompt_lookup", 3, 1.30), ("speculative", "prompt_lookup", 8, 1.10),
               ("recommended", "prompt_lookup", 2, 1.30)]


def test_best_fixed_is_the_exploratory_checks_fastest_with_ties_to_the_lower_k():
    speed = pd.concat([
        _job("explore", EXPLORATORY, blocks=6),
        # A job without the recommended arm is not a check, however fast its arm.
        _job("heldout", [("speculative", "prompt_lookup", 5, 2.0), ("speculative", "model", 1, 0.9)], blocks=6),
    ])
    best = best_fixed(speed)
    assert (best.drafter, best.k, best.configs, best.blocks) == ("prompt_lookup", 2, 4, 6)
    assert abs(best.speedup - 1.30) < 1e-12


def test_no_exploratory_check_means_no_best_fixed():
    one_fixed = _job("confirm", [("speculative", "prompt_lookup", 2, 1.3), ("recommended", "prompt_lookup", 2, 1.3)], 4)
    assert best_fixed(one_fixed) is None
    assert best_fixed(_job("heldout", [("speculative", "model", 1, 0.9), ("speculative", "model", 2, 0.9)], 4)) is None


def test_check_reports_the_confirmatory_design_beside_the_exploratory_one():
    confirm = _job("confirm", [("speculative", "prompt_lookup", 2, 1.0), ("recommended", "prompt_lookup", 3, 1.1)],
                   blocks=8)
    out = check(pd.concat([_job("explore", EXPLORATORY, blocks=6), confirm]), BOOT)
    assert set(out.kind) == {"all", "code"}  # the best-fixed comparison is also given per kind
    out = out[out.kind == "all"].set_index("check")
    ex, co = out.loc["exploratory"], out.loc["confirmatory"]
    assert ex.baseline == co.baseline == "speculative prompt_lookup k=2"
    assert ex.baseline_chosen.startswith("after the runs: the best of 4")
    assert co.baseline_chosen == "before the runs: the exploratory check's best"
    assert (ex.blocks, co.blocks, ex.arms_per_block, co.arms_per_block) == (6, 8, 6, 3)
    assert (ex.runs_apart, co.runs_apart) == (3, 1)
    assert abs(co.median_ratio - 1.1) < 1e-12 and co.met and co.config == "speculative prompt_lookup k=3"
    # The exploratory check's recommended arm ran the best fixed configuration: its noise floor.
    assert ex.same_config_blocks == 6 and abs(ex.same_config_median - 1.0) < 1e-12
    assert co.same_config_blocks == 0


def test_check_leaves_out_recommended_runs_of_an_earlier_plan():
    """A campaign whose plan was remade: recommended runs of the earlier plan's choice are left out of
    the comparisons with the recommendation (and counted), while the best fixed configuration and the
    other arms keep every block; the latest plan is the one that finished last, whatever its hash."""
    from analysis.recommend import latest_plan

    old = EXPLORATORY[:-1] + [("recommended", "prompt_lookup", 2, 1.30)]
    explo = _job("explo", old, 6, noise=0.01)
    confirm = _job("confirm", [("speculative", "prompt_lookup", 2, 1.30), ("recommended", "prompt_lookup", 0, 1.39)],
                   8, noise=0.01, seed=1)
    confirm.loc[confirm.arm == "recommended", "k_policy"] = "cost_model"
    speed = pd.concat([explo, confirm], ignore_index=True).assign(pair="p")
    plans = pd.DataFrame([
        {"pair": "p", "config_hash": "zz-old", "finished_at": "2026-01-01", "kind": "code", "drafter": "prompt_lookup",
         "k_policy": "fixed", "k": 2, "recommended": True},
        {"pair": "p", "config_hash": "aa-new", "finished_at": "2026-02-01", "kind": "code", "drafter": "prompt_lookup",
         "k_policy": "cost_model", "k": 0, "recommended": True}])
    plan = latest_plan(plans)
    assert list(plan.config_hash) == ["aa-new"]  # the last to finish, not the last by name
    out = check(speed, BOOT, plan)
    rec = out[(out.comparison == "recommended vs best fixed") & (out.kind == "all")].set_index("check")
    assert rec.loc["exploratory", "blocks"] == 0 and rec.loc["exploratory", "other_plan_blocks"] == 6
    assert rec.loc["confirmatory", "blocks"] == 8 and rec.loc["confirmatory", "other_plan_blocks"] == 0
    assert abs(rec.loc["confirmatory", "median_ratio"] - 1.39 / 1.30) < 0.03
    assert rec.loc["confirmatory", "config"] == "speculative prompt_lookup cost_model"
    # Without the plan every recommended run counts, the earlier plan's too.
    everything = check(speed, BOOT)
    assert everything[(everything.comparison == "recommended vs best fixed") & (everything.kind == "all")
                      & (everything.check == "exploratory")].blocks.iloc[0] == 6


def test_recommended_runs_count_only_under_the_plan_their_job_followed():
    """Two plans that chose the same configuration: a job's recorded plan decides, and a job that records
    none counts only if it started after the latest plan finished (it cannot have followed it before)."""
    from analysis.recommend import other_plans

    plan = pd.DataFrame([{"pair": "p", "config_hash": "new", "finished_at": "2026-02-01T10:00:00+00:00",
                          "kind": "code", "drafter": "prompt_lookup", "k_policy": "cost_model", "k": 4,
                          "recommended": True}])
    jobs = {"recorded-old": ("p-old", "2026-03-01T00:00:00+00:00"), "recorded-new": ("p-new", "2026-01-01"),
            "unrecorded-before": (None, "2026-02-01T09:00:00+00:00"),
            "unrecorded-after": (None, "2026-02-01T11:00:00+00:00")}
    speed = pd.concat([_job(name, [("recommended", "prompt_lookup", 4, 1.3)], 2).assign(
        pair="p", k_policy=lambda d: np.where(d.arm == "plain", "none", "cost_model"),
        job_plan=followed, job_started_at=started) for name, (followed, started) in jobs.items()], ignore_index=True)
    flagged = speed[other_plans(speed, plan)].config_hash.unique()
    assert sorted(flagged) == ["recorded-old", "unrecorded-before"]
    other_config = speed.assign(k=8, job_plan=None, job_started_at="")  # neither recorded: the configuration decides
    assert other_plans(other_config, plan).sum() == (other_config.arm == "recommended").sum()


def test_adaptive_policies_run_with_every_policy_drafter_and_lookup_is_priced_free(tmp_path):
    from hydra.utils import get_class

    from engines.speclab.runner import configurations
    from pipeline.config.strategy_config import drafter_conf
    from speclab.drafting.strategy import Prices, drafts_with_model
    from speclab.costs.time_model import CostTable
    from tests.pipeline_helpers import make_cfg

    cfg = make_cfg(tmp_path, "stage=plan", "stage.acceptance_ks=[1,2]", "k=3")
    runs = configurations(cfg)
    assert [r for r in runs if r[1] == "cost_model"] == [(d, "cost_model", 3) for d in ("model", "prompt_lookup", "hybrid")]
    default = configurations(make_cfg(tmp_path, "stage=acceptance", "stage.ks=[2]", "stage.arms=[{},{k_policy:cost_model}]"))
    assert default == [("model", "fixed", 2), ("model", "cost_model", 4)]  # no drafter: the job's own, at the top k
    table = CostTable({1: 0.7, 2: 0.8}, {1: 1.1, 2: 1.2})

    def for_drafter(table: CostTable, drafter: str, label: object = None) -> CostTable:
        return Prices(table, drafts_with_model(get_class(drafter_conf(cfg, drafter)._target_))).table_for(label)

    assert for_drafter(table, "prompt_lookup").draft == {1: 0.0, 2: 0.0}
    assert for_drafter(table, "hybrid", 3).draft == {1: 0.0, 2: 0.0}  # a lookup iteration of the hybrid
    assert for_drafter(table, "hybrid", "model") == table == for_drafter(table, "model")
    assert for_drafter(table, "prompt_lookup").verify == table.verify


def test_free_proposals_keep_being_checked_where_a_paid_draft_stops(tmp_path):
    """With free_k_min 1 the policy keeps checking lookup matches (and a hybrid's lookup iterations)
    after rejections that make it stop paying the draft model; null gives the older k_min 0 for both."""
    from omegaconf import OmegaConf

    from hydra.utils import get_class

    from pipeline.jobs.identity import config_hash
    from pipeline.config.strategy_config import drafter_conf, policy_conf, policy_spec
    from speclab.drafting.strategy import Prices, drafts_with_model
    from speclab.costs.time_model import CostTable
    from tests.pipeline_helpers import make_cfg

    # A dear check (1.3 target steps and more) and a dear draft step: few rejections stop every paid k.
    table = CostTable({1: 0.9, 2: 1.0}, {k: 1.3 + 0.05 * k for k in range(1, 11)})

    def ks_after_rejections(cfg, drafter: str, label: object) -> list[int]:
        prices = Prices(table, drafts_with_model(get_class(drafter_conf(cfg, drafter)._target_)))
        pol = policy_spec(policy_conf(cfg, "cost_model")).build(4, prices)
        pol.condition(label)
        ks = []
        for _ in range(6):
            ks.append(pol.k)
            pol.update(pol.k, 0)
        return ks

    cfg = make_cfg(tmp_path, "k_policy=cost_model")
    assert min(ks_after_rejections(cfg, "prompt_lookup", 3)) == 1
    assert min(ks_after_rejections(cfg, "hybrid", 2)) == 1
    assert ks_after_rejections(cfg, "hybrid", "model")[-1] == 0  # the draft model's iterations still stop
    older = make_cfg(tmp_path, "k_policy=cost_model", "k_policy.free_k_min=null")
    assert ks_after_rejections(older, "prompt_lookup", 3)[-1] == 0
    # null reproduces the older jobs, so it keeps their hash; the new default is a new job.
    plain = OmegaConf.to_container(older)
    del plain["k_policy"]["free_k_min"]
    before = OmegaConf.create(plain)  # a config from before the key existed
    assert config_hash(older) == config_hash(before) != config_hash(cfg)


def test_a_job_that_follows_a_plan_or_schema_defaults_is_a_new_job_when_they_change(tmp_path, monkeypatch):
    """A recommended arm's job is named by the latest plan it follows, and a cost-model arm from the
    schema by that schema's newer defaults; jobs that read neither keep their hash."""
    import pyarrow as pa

    from pipeline.config.schema import CostModelKConf
    from pipeline.jobs.inputs import freeze, latest_plan_file
    from pipeline.jobs.identity import campaign_dir, config_hash
    from store.records import write_parquet
    from tests.pipeline_helpers import make_cfg

    check = make_cfg(tmp_path, "stage=speed", "stage.arms=[{},{method:recommended}]")
    fixed_only = make_cfg(tmp_path, "stage=speed", "stage.ks=[2]")
    arms = make_cfg(tmp_path, "stage=speed", "stage.ks=[2]", "stage.arms=[{},{k_policy:cost_model}]")
    plans = campaign_dir(check) / "plan"
    before = config_hash(check), config_hash(fixed_only), config_hash(arms)

    def plan(name: str, finished_at: str) -> None:
        write_parquet(pd.DataFrame({"x": [1]}), pa.schema([("x", pa.int64())]),
                      plans / f"{check.pair.name}-{name}.parquet", {"finished_at": finished_at})

    plan("bbbb", "2026-02-01")
    first = config_hash(check)
    plan("aaaa", "2026-03-01")  # a later plan, earlier in name order
    second = config_hash(check)
    assert len({before[0], first, second}) == 3
    plan("cccc", "2026-01-01")  # an older plan changes nothing
    assert config_hash(check) == second
    freeze(check)  # as a job does at its start: the same hash, and the plan it follows stays its own
    assert config_hash(check) == second and latest_plan_file(check).stem == f"{check.pair.name}-aaaa"
    plan("dddd", "2026-04-01")
    assert config_hash(check) == second and latest_plan_file(check).stem.endswith("aaaa")
    assert config_hash(fixed_only) == before[1]
    monkeypatch.setattr(CostModelKConf, "free_k_min", None)  # the schema as it was
    assert config_hash(arms) != before[2] and config_hash(fixed_only) == before[1]


def _predictions(per_kind: int) -> pd.DataFrame:
    """Predicted speed-ups per prompt: lookup k=6 is best on every structured prompt and poor elsewhere,
    lookup k=2 is near the best everywhere."""
    rows = []
    for kind, k6, k2 in (("structured", 2.0, 1.8), ("code", 0.8, 1.05)):
        for i in range(per_kind):
            for k, v in ((6, k6), (2, k2)):
                rows.append({"prompt_id": f"{kind}-{i}", "kind": kind, "drafter": "prompt_lookup", "k_policy": "fixed",
                             "k": k, "predicted": v + 0.01 * i, "predicted_iid": v, "alpha": 0.5})
    return pd.DataFrame(rows)


def test_plan_takes_a_kinds_own_choice_and_says_how_it_fared_on_prompts_it_did_not_see():
    from speclab.costs.planning import recommend

    few = recommend(_predictions(2), level=0.9)
    rec = few[few.recommended].set_index("kind")
    # both structured prompts favour k=6 by 11%: chosen without one prompt, k=6 gains 11% on it, every time
    assert rec.k.to_dict() == {"all": 2, "code": 2, "structured": 6}
    assert rec.chosen_by["structured"].startswith("kind's best: the kind's own choice gains +11% (± 0%) over the "
                                                  "robust one on prompts neither saw (2 left out in turn)")
    assert rec.cv_gain["structured"] == pytest.approx(0.1108, abs=1e-3) and rec.chosen_by["all"].startswith("robust")
    from analysis.recommend import show_plan

    printed = show_plan(few.assign(pair="p", level=0.9, prompt_ids="x"), top=1).splitlines()
    assert any(line.split()[:4] == ["structured", "recommended", "prompt_lookup", "k=6"] for line in printed)
    assert abs(rec.worst_ratio["all"] - 1.8 / 2.0) < 0.01  # k=2's worst case: 0.9 of structured's best
    # the second structured prompt disagrees: the kind's best median is still k=6, and the held-out loss is shown
    split = _predictions(2)
    split.loc[(split.prompt_id == "structured-1") & (split.k == 6), "predicted"] = 1.7
    rec = recommend(split, level=0.9).query("recommended").set_index("kind")
    assert rec.k["structured"] == 6 and rec.cv_gain["structured"] < 0


def test_each_planned_configuration_says_where_an_unseen_prompt_of_its_kind_falls():
    """Not the sample median's interval: the order statistics that cover one more prompt of the kind, with how
    often (speclab.stats.intervals.prediction_interval); plain decoding is exactly 1."""
    from pipeline.stages.plan import unseen_text
    from speclab.costs.planning import recommend

    plan = recommend(_predictions(4), level=0.9)
    k6 = plan[(plan.kind == "structured") & (plan.k == 6)].iloc[0]
    assert (k6.unseen_lo, k6.unseen_hi) == pytest.approx((2.0, 2.03)) and k6.unseen_coverage == pytest.approx(3 / 5)
    both = plan[(plan.kind == "all") & (plan.k == 6)].iloc[0]  # eight prompts of two kinds: the range, 7/9
    assert (both.unseen_lo, both.unseen_hi, both.unseen_coverage) == pytest.approx((0.8, 2.03, 7 / 9))
    plain = plan[plan.drafter == "none"]
    assert (plain.unseen_lo == 1).all() and (plain.unseen_coverage == 1).all()
    assert unseen_text(k6.to_frame().T.assign(level=0.9).iloc[0]) == \
        "an unseen prompt 2.00-2.03 (60% of the time; 90% needs 19 prompts)"
    from analysis.recommend import show_plan

    printed = show_plan(plan.assign(pair="p", level=0.9, prompt_ids="x"), top=1)
    assert "unseen prompt [2.00, 2.03] 60%" in printed


def test_an_unseen_prompts_interval_holds_the_noise_of_the_adjacent_runs_that_measure_it():
    """A check measures a prompt's speed-up as a ratio of two timed runs: plain itself reads 1 only within their noise
    (measured 0.96-1.01 beside a plan's '1.00-1.00'), so every stated interval is widened by the noise the plan's own
    timing part saw (its passes' quartiles over their repeats)."""
    from scipy.stats import norm

    from speclab.costs.planning import recommend, run_noise

    timing = pd.DataFrame({"model": ["target", "target", "target", "draft", "target"],
                           "context_len": [40, 40, 88, 40, 0],  # a prefill (context 0) and the draft do not count
                           "median_s": [0.1, 0.2, 0.1, 0.01, 1.0], "q25_s": [0.098, 0.194, 0.097, 0.005, 0.5],
                           "q75_s": [0.102, 0.206, 0.103, 0.02, 2.0]})
    spreads = np.log([0.102 / 0.098, 0.206 / 0.194, 0.103 / 0.097]) / (2 * norm.ppf(0.75))
    noise = run_noise(timing)
    assert noise == pytest.approx(np.sqrt(2) * np.median(spreads))
    quiet, noisy = (recommend(_predictions(4), level=0.9, noise=n) for n in (0.0, noise))
    plain = noisy[noisy.drafter == "none"]
    width = np.exp(norm.ppf(0.95) * noise)
    assert plain.unseen_lo.to_numpy() == pytest.approx(1 / width) and plain.unseen_hi.to_numpy() == pytest.approx(width)
    assert (plain.unseen_lo < 0.96).all() and (plain.unseen_hi > 1.01).all() and (plain.unseen_coverage == 0.9).all()
    spec = noisy.drafter != "none"
    assert noisy.unseen_lo[spec].to_numpy() == pytest.approx(quiet.unseen_lo[spec].to_numpy() / width)
    assert noisy.unseen_hi[spec].to_numpy() == pytest.approx(quiet.unseen_hi[spec].to_numpy() * width)
    assert run_noise(timing.iloc[:0]) == 0.0


def test_the_check_says_how_many_unseen_prompts_fell_where_the_plan_said():
    from analysis.recommend import unseen_check

    plan = pd.DataFrame([
        {"pair": "p", "kind": "code", "drafter": "prompt_lookup", "k_policy": "fixed", "k": 4, "recommended": True,
         "predicted": 1.3, "unseen_lo": 1.1, "unseen_hi": 1.5, "unseen_coverage": 0.6, "config_hash": "h",
         "finished_at": "2026-01-01", "prompts": 2, "prompt_ids": "c0,p0"},
        {"pair": "p", "kind": "prose", "drafter": "model", "k_policy": "fixed", "k": 2, "recommended": True,
         "predicted": 1.1, "unseen_lo": np.nan, "unseen_hi": np.nan, "unseen_coverage": np.nan, "config_hash": "h",
         "finished_at": "2026-01-01", "prompts": 2, "prompt_ids": "c0,p0"}])
    runs = [("code", "c1", 1.2), ("code", "c1", 1.4), ("code", "c2", 1.6), ("code", "c2", 1.7), ("prose", "p1", 1.0)]
    speed = pd.DataFrame([{"pair": "p", "kind": k, "prompt_id": pid, "arm": "recommended", "drafter": "prompt_lookup",
                           "k_policy": "fixed", "k": 4, "ratio_to_adjacent_plain": r, "job_plan": "p-h",
                           "job_started_at": "2026-02-01", "config_hash": "s", "round": 0, "block": i,
                           "tokens_per_s": 10 * r} for i, (k, pid, r) in enumerate(runs)])
    got = unseen_check(speed, plan).set_index("kind")
    # c1's median 1.3 falls inside 1.1-1.5, c2's 1.65 above it
    assert got.loc["code", ["prompts_checked", "inside", "inside_share"]].tolist() == [2, 1, 0.5]
    assert got.loc["code", "choice"] == "prompt lookup k=4" and got.loc["code", "stated_coverage"] == 0.6
    assert got.loc["prose", "prompts_checked"] == 1 and np.isnan(got.loc["prose", "inside"])  # no interval stated
