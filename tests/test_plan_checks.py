"""The plan's two checks on synthetic speed rows: which fixed configuration the exploratory check
names as the best, and how the confirmatory check (that configuration named before its runs, next
to the recommendation) is reported beside it."""
import numpy as np
import pandas as pd

from analysis.recommend import check
from pipeline.best_fixed import best_fixed

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
