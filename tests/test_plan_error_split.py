"""A plan's error on unseen prompts, split into sample (their own acceptance, priced by the plan's model) and model
(the measurement against that price): speclab/costs/error_split.py on rows whose answer is known."""
import numpy as np
import pandas as pd
import pytest

from speclab.costs.error_split import split

CONFIG = {"drafter": "prompt_lookup", "k_policy": "fixed", "k": 4}


def _prompts(kind: str, values: list[float], column: str) -> pd.DataFrame:
    return pd.DataFrame([{"prompt_id": f"{kind}-{i}", "kind": kind, **CONFIG, column: v} for i, v in enumerate(values)])


def test_a_miss_from_the_sample_is_told_from_a_miss_of_the_pricing():
    plan = pd.DataFrame([{"kind": kind, **CONFIG, "predicted": 1.30} for kind in ("docs", "chat")])
    # docs: the unseen prompts copy more than the sample did (priced 1.75), and the pricing is right (measured 1.78)
    # chat: the unseen prompts accept as the sample did (priced 1.30), and the pricing misses (measured 1.60)
    priced = pd.concat([_prompts("docs", [1.70, 1.75, 1.80], "predicted"), _prompts("chat", [1.28, 1.30, 1.32], "predicted")])
    measured = pd.concat([_prompts("docs", [1.74, 1.78, 1.83], "measured"), _prompts("chat", [1.55, 1.60, 1.66], "measured")])
    got = split(plan, priced, measured).set_index("kind")
    assert got.sample_error["docs"] == pytest.approx(0.45) and got.model_error["docs"] == pytest.approx(0.03)
    assert got.sample_error["chat"] == pytest.approx(0.0) and got.model_error["chat"] == pytest.approx(0.30)
    assert (got.sample_error + got.model_error).to_numpy() == pytest.approx((got.measured - got.predicted).to_numpy())
    # the paired per-prompt range: each prompt's measurement less its own price
    assert (got.model_error_lo["chat"], got.model_error_hi["chat"]) == pytest.approx((0.27, 0.34))
    assert (got.prompts == 3).all()


def test_a_configuration_the_check_did_not_run_is_not_split():
    plan = pd.DataFrame([{"kind": "docs", **CONFIG, "predicted": 1.3}, {"kind": "docs", **{**CONFIG, "k": 8},
                                                                        "predicted": 1.2}])
    got = split(plan, _prompts("docs", [1.7], "predicted"), _prompts("docs", [1.8], "measured"))
    assert got.prompts.tolist() == [1, 0] and np.isnan(got.model_error.iloc[1])
