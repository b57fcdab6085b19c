"""A load's gains block by block (speclab/stats/load_gains.py): latency and throughput against the plain block beside
it, per kind as each kind's own stream, and no interval from fewer blocks than the median's needs."""
import numpy as np
import pandas as pd
import pytest

from speclab.stats.load_gains import block_gains, gain_interval


def _rows(block, arm, latencies, kinds, tps, tokens=32):
    return [{"label": "plain" if arm == "plain" else "draft model k=4", "arm": arm, "k": 0 if arm == "plain" else 4,
             "drafter": "" if arm == "plain" else "model", "load": 2, "block": block, "kind": kind,
             "latency_s": lat, "new_tokens": tokens, "block_tokens_per_s": tps, "tpot_s": lat / tokens,
             "ttft_s": 0.1, "passes": tokens if arm == "plain" else tokens // 2, "drafted": 0 if arm == "plain" else 40,
             "accepted": 0 if arm == "plain" else 16} for lat, kind in zip(latencies, kinds)]


def test_gains_are_against_the_plain_block_beside_and_per_kind_streams():
    kinds = ["code", "prose", "code", "prose"]
    df = pd.DataFrame(_rows(0, "plain", [4, 4, 4, 4], kinds, 16.0) + _rows(0, "speculative", [1, 4, 1, 4], kinds, 20.0)
                      + _rows(1, "plain", [4, 4, 4, 4], kinds, 16.0) + _rows(1, "speculative", [2, 8, 2, 8], kinds, 12.0))
    g = block_gains(df, kinds=True).set_index(["block", "kind"])
    assert g.loc[(0, "all"), "throughput_gain"] == pytest.approx(20 / 16)
    assert g.loc[(0, "all"), "latency_gain"] == pytest.approx(4 / 2.5)
    assert g.loc[(0, "code"), "latency_gain"] == pytest.approx(4.0) and g.loc[(0, "prose"), "latency_gain"] == 1
    # a kind's throughput: its tokens over its requests' summed latency, against plain's
    assert g.loc[(1, "code"), "throughput_gain"] == pytest.approx((64 / 4) / (64 / 8))
    assert g.loc[(1, "prose"), "throughput_gain"] == pytest.approx(0.5)
    assert list(block_gains(df).kind.unique()) == ["all"]


def test_no_interval_from_fewer_blocks_than_the_median_needs():
    point, lo, hi = gain_interval(np.array([1.1, 1.2, 1.3, 1.0, 1.2]))
    assert point == pytest.approx(1.2) and np.isnan(lo) and np.isnan(hi)
    point, lo, hi = gain_interval(np.array([1.1, 1.2, 1.3, 1.0, 1.2, 1.25]))
    assert lo == 1.0 and hi == 1.3


def test_the_speed_check_sets_each_load_one_block_beside_the_speed_runs_after_it():
    from speclab.stats.load_gains import speed_check
    rows = pd.DataFrame(
        [{"measure": "request", "load": 1, "arm": "plain", "block": b, "block_tokens_per_s": tps, "new_tokens": 8,
          "latency_s": 1.0} for b, tps in ((0, 10.0), (1, 12.0))]
        + [{"measure": "speed_run", "load": 1, "arm": "plain", "block": b, "block_tokens_per_s": np.nan,
            "new_tokens": 8, "latency_s": lat} for b, lat in ((0, 0.8), (0, 0.8), (1, 0.5), (1, 0.5))])
    c = speed_check(rows)
    assert c["speed_check_blocks"] == 2 and c["speed_tokens_per_s"] == pytest.approx(13.0)  # median of 10 and 16
    assert c["speed_check_ratio"] == pytest.approx(np.median([10 / 10, 12 / 16]))
    assert speed_check(rows[rows.measure == "request"]) is None
