"""analysis/load.py on rows made here: the gains per load with intervals, the break-even load where they cross 1, the
prediction beside them, the recommendation with the engine's own switch, and the first screen's line."""
import numpy as np
import pandas as pd
import pytest

from analysis import load as load_analysis

GAIN = {1: 1.6, 2: 1.3, 4: 0.95, 8: 0.7}  # the true throughput gain at each load: crosses 1 between 2 and 4


def rows(engine="vllm", blocks=6, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    base = {"pair": "qwen", "engine": engine, "config_hash": "abc", "measure": "request", "ttft_s": 0.2}
    for c, gain in GAIN.items():
        for b in range(blocks):
            block = c * 100 + b
            noise = float(np.exp(rng.normal(0, 0.02)))
            for arm, lat in (("plain", 4.0), ("speculative", 4.0 / (gain * noise))):
                spec = arm != "plain"
                n_req = max(4, c)
                tps = 32 * n_req / (lat * max(n_req / c, 1))
                for i in range(n_req):
                    out.append({**base, "arm": arm, "label": "draft model k=4" if spec else "plain",
                                "k": 4 if spec else 0, "k_policy": "fixed" if spec else "", "drafter": "model" if spec else "",
                                "load": c, "block": block, "request": i, "kind": ("code", "prose")[i % 2],
                                "latency_s": lat,
                                "new_tokens": 32, "block_tokens_per_s": tps, "tpot_s": lat / 32,
                                "passes": 16 if spec else 32, "drafted": 64 if spec else 0, "accepted": 16 if spec else 0})
    passes = [{**base, "measure": "pass", "model": m, "pass_len": n, "median_s": s * (1 + 0.1 * (n - 1)),
               "arm": "plain", "label": "plain", "k": 0, "drafter": "", "k_policy": "", "load": 1, "block": -1}
              for m, s in (("target", 0.1), ("draft", 0.03)) for n in (1, 2, 4, 5, 8, 10, 20, 40)]
    return pd.DataFrame(out + passes)


def test_gains_intervals_break_even_and_prediction():
    t = load_analysis.compute(rows(), samples=300)
    g = t["gains"].set_index(["kind", "load"])
    assert g.loc[("all", 1), "throughput_gain"] == pytest.approx(1.6, rel=0.05)
    assert g.loc[("all", 1), "throughput_lo"] <= 1.6 * 1.001 and g.loc[("all", 8), "throughput_hi"] < 1
    assert (t["gains"].blocks == 6).all() and t["gains"].predicted.notna().all()
    assert t["gains"].latency_error.to_numpy() == pytest.approx((t["gains"].predicted - t["gains"].latency_gain).to_numpy())
    assert t["gains"].throughput_error.to_numpy() == pytest.approx(
        (t["gains"].predicted_throughput - t["gains"].throughput_gain).to_numpy())
    be = t["break_even"].set_index(["kind", "gain"])
    assert 2 < be.loc[("all", "throughput"), "load"] < 4 and not be.loc[("all", "throughput"), "hi_open"]
    assert "breaks even at" in be.loc[("all", "latency"), "text"]


def test_the_recommendation_says_up_to_which_load_and_pastes_the_engine_switch():
    for engine, word in (("vllm", "--max-num-seqs 2"), ("llama_cpp", "N <= 2")):
        rec = load_analysis.compute(rows(engine), samples=200)["recommendation"].set_index("kind")
        assert rec.loc["all", "up_to"] == 2
        assert rec.loc["all", "text"] == "speculate with draft model k=4 up to 2 concurrent requests, plain above"
        assert word in rec.loc["all", "switch"]


def test_the_first_screen_has_a_line_per_pair_and_engine_and_an_empty_campaign_says_not_measured():
    t = load_analysis.compute(pd.concat([rows("vllm"), rows("llama_cpp").assign(config_hash="def")]), samples=200)
    text = load_analysis.first_screen(t, "load50", "analysis/load/section.md")
    lines = [line for line in text.splitlines() if line.startswith("- qwen")]
    assert len(lines) == 2 and all("breaks even at" in line and "up to 2" in line for line in lines)
    empty = load_analysis.compute(pd.DataFrame())
    assert "Not measured" in load_analysis.first_screen(empty, "load50", "x")


def test_requests_timed_as_the_model_says_have_no_prediction_error():
    """Speculative requests whose latency is the time model's own prediction from their plain twin: the analysis
    predicts each gain exactly (it fails if it priced the wrong load, k, tokens per pass or twin)."""
    from speclab.costs.load_model import PassCurve, predict_load
    d = rows()
    passes = d[d.measure == "pass"]
    curve = {m: PassCurve(tuple(g.pass_len), tuple(g.median_s)) for m, g in passes.groupby("model")}
    req = d[d.measure == "request"].copy()
    req["ttft_s"] = 0.3 + 0.1 * req.request  # twins differ: each spec request must be priced from its own
    req["tpot_s"] = req.latency_s / 32 * (1 + 0.05 * req.request)
    spec = req.arm != "plain"
    req.loc[spec, "passes"] = 8 + 4 * (req.loc[spec, "request"] % 4)
    twins = req[~spec].set_index(["block", "request"])
    req.loc[spec, "latency_s"] = [
        predict_load(curve["target"], curve["draft"], r.load, 4, 32 / r.passes, 32,
                     twins.loc[(r.block, r.request)].ttft_s, twins.loc[(r.block, r.request)].tpot_s).spec_latency_s
        for r in req[spec].itertuples()]
    # a closed loop's wall: its requests' latencies over the load (exact at load 1, where they run one after another)
    walls = req.groupby(["block", "arm"]).latency_s.transform("sum") / req.load
    req["block_tokens_per_s"] = req.groupby(["block", "arm"]).new_tokens.transform("sum") / walls
    g = load_analysis.compute(pd.concat([req, passes]), samples=100)["gains"]
    assert g.latency_error.abs().max() < 1e-9 and g.throughput_error.abs().max() < 1e-9
