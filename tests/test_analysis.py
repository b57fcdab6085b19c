"""Analysis on synthetic Parquet-like tables with known answers."""
import numpy as np
import pandas as pd
import pytest

from analysis.breakeven import best_k_table, breakeven_table, cost_ratios
from analysis.common import bootstrap_ci, save_figure
from analysis.correctness import distribution_summary, divergence_summary
from analysis.drift import drift_table, drop_drifted
from analysis.fit import acceptance_table, alpha_hat, predictor_errors, speed_points
from speclab.costs.cost_model import break_even_alpha, expected_tokens_per_iteration

BOOT = {"samples": 300, "seed": 0, "level": 0.95}


def synthetic_acceptance(alpha: float, k: int, n: int, kind: str, seed: int = 0, prompts: int = 4) -> pd.DataFrame:
    """i.i.d. acceptances with a known alpha: accepted = number of successes before the first failure, capped at k."""
    rng = np.random.default_rng(seed)
    ok = rng.random((n, k)) < alpha
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    return pd.DataFrame({"pair": "p", "kind": kind, "k": k, "prompt_id": [f"{kind}{i % prompts}" for i in range(n)],
                         "proposed": k, "accepted": accepted, "new_tokens": accepted + 1, "do_sample": False})


def test_alpha_hat_recovers_known_alpha_at_every_k():
    for k in (1, 2, 4, 8):
        df = synthetic_acceptance(0.7, k, 20000, "prose", seed=k)
        assert alpha_hat(df) == pytest.approx(0.7, abs=0.01)


def test_acceptance_table_matches_formula_for_iid_data():
    acc = pd.concat([synthetic_acceptance(0.6, k, 20000, "prose", k) for k in (1, 4)]
                    + [synthetic_acceptance(0.9, k, 20000, "code", 10 + k) for k in (1, 4)])
    tab = acceptance_table(acc, BOOT)
    for row in tab[tab.kind != "all"].itertuples():
        assert row.tokens_per_pass == pytest.approx(row.formula_iid, rel=0.02)
        assert row.tokens_per_pass_lo <= row.tokens_per_pass <= row.tokens_per_pass_hi
    code4 = tab[(tab.kind == "code") & (tab.k == 4)].iloc[0]
    assert code4.alpha == pytest.approx(0.9, abs=0.01)
    assert set(tab.kind) == {"prose", "code", "all"}


def test_prompt_mixture_beats_iid_when_acceptance_is_heterogeneous():
    # Half the prompts are easy (0.95), half hard (0.2): the pooled-alpha formula misses the measured mean.
    acc = pd.concat([synthetic_acceptance(0.95, 4, 10000, "prose", 1, prompts=1).assign(prompt_id="easy"),
                     synthetic_acceptance(0.2, 4, 10000, "prose", 2, prompts=1).assign(prompt_id="hard")])
    row = acceptance_table(acc, BOOT).query("kind == 'prose'").iloc[0]
    assert abs(row.formula_prompt_mixture - row.tokens_per_pass) < 0.05
    assert abs(row.formula_iid - row.tokens_per_pass) > 0.15


def synthetic_speed(alpha: float, c_draft: float, c_verify: float, ks, kind: str, drift: float = 1.0,
                    config_hash: str = "h0") -> pd.DataFrame:
    """Speed rows whose measured ratio equals the i.i.d. prediction exactly."""
    rows = []
    target = 0.05
    for block, k in enumerate(ks):
        ratio = expected_tokens_per_iteration(alpha, k) / (k * c_draft + c_verify)
        base = {"pair": "p", "kind": kind, "config_hash": config_hash, "round": 0, "block": block, "k": k,
                "do_sample": False, "target_step_before_s": target, "target_step_after_s": target * drift,
                "draft_step_before_s": c_draft * target, "draft_step_after_s": c_draft * target * drift,
                "verify_before_s": c_verify * target, "verify_after_s": c_verify * target * drift,
                "rollback_s_per_iter": 0.0, "bookkeeping_s_per_iter": 0.0, "acceptance_rate": alpha}
        rows.append({**base, "arm": "plain", "ratio_to_adjacent_plain": 1.0})
        rows.append({**base, "arm": "speculative", "ratio_to_adjacent_plain": ratio})
    return pd.DataFrame(rows)


def test_speed_points_iid_predictor_exact_on_iid_world():
    acc = pd.concat([synthetic_acceptance(0.8, k, 40000, "code", k) for k in (1, 2, 4)])
    tab = acceptance_table(acc, BOOT)
    speed = synthetic_speed(0.8, 0.3, 1.2, [1, 2, 3, 4], "code")
    pts = speed_points(speed, tab, BOOT)
    code = pts[pts.kind == "code"]
    assert (code.predicted_iid - code.measured).abs().max() < 0.03
    assert code.loc[code.k == 3, "alpha_source"].iloc[0] == "acceptance pooled over k"
    assert code.c_draft.iloc[0] == pytest.approx(0.3) and code.c_verify.iloc[0] == pytest.approx(1.2)
    err = predictor_errors(pts)
    assert err.loc[err.kind == "code", "mae_iid"].iloc[0] < 0.03


def test_drift_flags_and_excludes_only_drifted_jobs():
    steady = synthetic_speed(0.8, 0.3, 1.2, [1, 2], "code", drift=1.1, config_hash="steady")
    drifted = synthetic_speed(0.8, 0.3, 1.2, [1, 2], "code", drift=1.6, config_hash="drifted")
    both = pd.concat([steady, drifted])
    d = drift_table(both, 1.25).set_index("config_hash")
    assert not d.loc["steady", "flagged"] and d.loc["drifted", "flagged"]
    assert d.loc["drifted", "drift_ratio"] == pytest.approx(1.6)
    assert set(drop_drifted(both, d.reset_index()).config_hash) == {"steady"}
    with pytest.raises(ValueError, match="max_ratio=0.9"):
        drift_table(both, 0.9)


def synthetic_timing(c_draft: float, c_verify: dict[int, float]) -> pd.DataFrame:
    rows = [{"pair": "p", "model": "target", "pass_len": n, "median_s": 0.05 * c} for n, c in c_verify.items()]
    rows.append({"pair": "p", "model": "draft", "pass_len": 1, "median_s": 0.05 * c_draft})
    return pd.DataFrame(rows)


def test_breakeven_table_uses_verification_of_k_plus_one_tokens():
    costs = cost_ratios(synthetic_timing(0.3, {1: 1.0, 2: 1.1, 3: 1.2, 5: 1.4}))
    tab = breakeven_table(costs, 6).set_index("k")
    assert tab.loc[1, "c_verify"] == pytest.approx(1.1)
    assert tab.loc[4, "c_verify"] == pytest.approx(1.4)  # k+1 = 5
    assert tab.loc[6, "c_verify"] == pytest.approx(1.4)  # beyond the longest measured pass
    assert tab.loc[2, "break_even_alpha"] == pytest.approx(break_even_alpha(2, 0.3, 1.2))


def test_best_k_prefers_longer_drafts_for_easier_text():
    costs = cost_ratios(synthetic_timing(0.1, {n: 1.0 for n in range(1, 10)}))
    points = pd.DataFrame({"pair": "p", "kind": ["prose", "prose", "code", "code"], "k": [1, 4, 1, 4],
                           "alpha": [0.4, 0.4, 0.95, 0.95], "measured": [1.1, 0.9, 1.3, 2.5]})
    best = best_k_table(points, costs, 8).set_index("kind")
    assert best.loc["code", "best_k_predicted"] > best.loc["prose", "best_k_predicted"]
    assert best.loc["code", "best_k_measured"] == 4 and best.loc["prose", "best_k_measured"] == 1


def test_distribution_summary_keeps_no_power_contexts_out_of_rates():
    rows = []
    for ctx, no_power in (("a", False), ("b", True)):
        for rule, p in (("correct", 0.4), ("keep_draft", 1e-9)):
            rows.append({"pair": "p", "prompt_id": ctx, "kind": "prose", "context_mode": "prompt", "draws": 1000,
                         "seed": 0, "rule": rule, "temperature": 1.0,
                         "top_p": 1.0, "pvalue": p if not no_power else 0.6, "total_variation": 0.3,
                         "expected_acceptance": 0.7, "no_power": no_power})
    rates, table = distribution_summary(pd.DataFrame(rows))
    r = rates.set_index("rule")
    assert r.loc["keep_draft", "rejection_rate"] == 1.0 and r.loc["correct", "rejection_rate"] == 0.0
    assert (r.tests == 1).all() and (r.no_power_tests == 1).all()
    assert set(table[table.no_power].verdict) == {"no power"}


def test_divergence_summary_counts():
    div = pd.DataFrame({"pair": "p", "prompt_id": ["x", "y", "z"], "kind": "prose", "k": [2, 2, 4], "round": 0,
                        "identical": [True, False, False], "position": [-1, 3, 5], "plain_text": ["", "a", "b"],
                        "spec_text": ["", "c", "d"], "gap_single_step": [np.nan, 1e-6, 2.0],
                        "gap_verify_pass": np.nan, "gap_full_prefill": np.nan, "top_logit": 10.0, "ulp": 1e-6,
                        "gap_ulps": [np.nan, 1.0, 2e6], "classification": ["identical", "near_tie", "bug"]})
    counts, table = divergence_summary(div)
    c = counts.set_index("k")
    assert c.loc[2, "identical"] == 1 and c.loc[2, "near_ties"] == 1 and c.loc[4, "bugs"] == 1
    assert list(table.prompt_id) == ["y", "z"]


def test_bootstrap_is_seeded_and_brackets_the_statistic():
    x = np.random.default_rng(0).normal(1.2, 0.1, 200)
    a, b = bootstrap_ci(x, np.median, 500, 3), bootstrap_ci(x, np.median, 500, 3)
    assert a == b and a[0] < np.median(x) < a[1]


def test_figures_are_byte_stable(tmp_path):
    import matplotlib.pyplot as plt

    paths = []
    for name in ("a.png", "b.png"):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [1, 4, 9])
        paths.append(save_figure(fig, tmp_path / name))
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_bootstrap_ci_is_scipy_percentile_for_a_mean_and_order_statistics_for_a_median():
    from scipy import stats

    from speclab.stats.intervals import median_ci

    x = np.random.default_rng(1).normal(1.0, 0.2, 40)
    res = stats.bootstrap((x,), np.mean, n_resamples=400, method="percentile", rng=np.random.default_rng(7))
    assert bootstrap_ci(x, np.mean, 400, 7) == (res.confidence_interval.low, res.confidence_interval.high)
    assert bootstrap_ci(np.array([1.5]), np.mean) == (1.5, 1.5)
    # the median's interval: distribution-free, none from fewer runs than it needs
    assert bootstrap_ci(x, np.median, 400, 7) == median_ci(x, 0.95)
    assert bootstrap_ci(x, np.median, 400, 7, level=0.9) == median_ci(x, 0.9)
    assert all(np.isnan(bootstrap_ci(np.array([1.5]), np.median)))
    assert all(np.isnan(bootstrap_ci(np.array([2.0, 2.0, np.nan]))))
    assert bootstrap_ci(np.array([2.0] * 6 + [np.nan])) == (2.0, 2.0)
    assert all(np.isnan(bootstrap_ci(np.array([np.nan]))))


def test_markdown_table_formats_numbers_and_keeps_text_as_written():
    from analysis.common import markdown_table

    df = pd.DataFrame({"config_hash": ["12345e67", "0000aaaa"], "k": [1, 2], "x": [0.12345, np.nan],
                       "flag": [True, False]})
    lines = markdown_table(df).splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["config_hash", "k", "x", "flag"]
    assert "12345e67" in lines[2] and "0.123" in lines[2] and "True" in lines[2]
    assert lines[3].split("|")[3].strip() == ""  # a missing value is blank, not "nan"
    assert markdown_table(df.iloc[:0]) == "_no rows_\n"


def test_strategy_comparison_picks_best_fixed_k_and_keeps_adaptive_policies():
    from analysis.strategies import strategy_comparison

    rows = []
    for kind, best in (("code", 3), ("prose", 2)):
        for k in (1, 2, 3):
            for i in range(6):
                rows.append({"pair": "p", "kind": kind, "arm": "speculative", "do_sample": False, "drafter": "model",
                             "k_policy": "fixed", "k": k, "mean_k": k,
                             "ratio_to_adjacent_plain": 1.0 + 0.1 * (k == best) + 0.01 * i})
        for policy, r in (("cost_model", 1.3), ("heuristic", 0.9)):
            rows += [{"pair": "p", "kind": kind, "arm": "speculative", "do_sample": False, "drafter": "model",
                      "k_policy": policy, "k": 4, "mean_k": 2.5, "ratio_to_adjacent_plain": r + 0.01 * i}
                     for i in range(6)]
        rows += [{"pair": "p", "kind": kind, "arm": "speculative", "do_sample": False, "drafter": "prompt_lookup",
                  "k_policy": "fixed", "k": 4, "mean_k": 3.0, "ratio_to_adjacent_plain": 1.5} for _ in range(3)]
    rows.append({**rows[0], "do_sample": True, "ratio_to_adjacent_plain": 9.0})  # sampled runs are left out
    table = strategy_comparison(pd.DataFrame(rows), BOOT).set_index(["kind", "strategy"])
    assert table.loc[("code", "draft model, best fixed k"), "k"] == 3
    assert table.loc[("prose", "draft model, best fixed k"), "k"] == 2
    assert table.loc[("code", "prompt lookup, best fixed k"), "speedup"] == 1.5
    cost = table.loc[("code", "draft model, adaptive k (cost model)")]
    assert cost.runs == 6 and cost.speedup_lo <= cost.speedup <= cost.speedup_hi and pd.isna(cost.k)
    assert (cost.speedup_lo, cost.speedup_hi) == pytest.approx((1.30, 1.35))  # six runs: their range at 95%
    lookup = table.loc[("code", "prompt lookup, best fixed k")]
    assert lookup.runs == 3 and pd.isna(lookup.speedup_lo)  # three runs: no interval
    assert table.speedup.max() < 9


def test_headline_metrics_keys_are_stable_and_finite():
    from analysis.headline import headline_metrics

    points = pd.DataFrame({"pair": "p", "kind": ["all", "all", "code", "code"], "k": [2, 4, 2, 4],
                           "measured": [1.1, 1.2, 1.3, 1.0], "predicted_iid": [1.0, 1.4, 1.3, 1.2],
                           "predicted_empirical": [1.1, 1.3, 1.2, np.nan]})
    acc = pd.DataFrame({"pair": "p", "kind": ["all", "code", "code"], "k": [4, 4, 2], "alpha": [0.8, 0.9, 0.7]})
    m = headline_metrics("ref", points, acc, 4)
    assert m["campaign"] == "ref"
    assert m["p"]["best_k"] == {"all": 4, "code": 2} and m["p"]["speedup_at_best_k"] == {"all": 1.2, "code": 1.3}
    assert m["p"]["alpha_at_k4"] == {"all": 0.8, "code": 0.9}
    assert m["p"]["mae_iid"] == {"pooled": 0.1, "all": 0.15, "code": 0.1}
    assert m["p"]["mae_empirical_overhead"]["code"] == 0.1  # the missing prediction is skipped
