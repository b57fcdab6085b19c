"""A server engine's plan (llama.cpp's or vLLM's), checked on prompts it did not see: the time model's error and the
recommendation's speed-up.

Reads a campaign holding the engine's plan (`+sweep=plan_llama` / `+sweep=plan_vllm`: timing and one request per
candidate on the sample prompts) and its check (`+sweep=check_plan_llama` / `+sweep=check_plan_vllm`: every candidate
and the plan's choice in adjacent rotated runs on the other prompts). No model runs here.

- Predictor: each check run of a candidate is priced with the costs the plan job timed (its timing rows), the
  overheads fitted on the plan's own requests (the calibration) and the run's own counters (new tokens, drafted,
  accepted, the server's prompt time), all in speclab/costs/engine_plan.py. Per configuration and kind, ``error`` is the
  median over its runs of (predicted - measured ratio to the adjacent plain run): each prediction against the run
  it predicts. ``difference_of_medians`` (median predicted - median measured) is shown beside it; it is not the
  error of any prediction where a configuration's runs mix prompts on which it does very different things (n-gram
  lookup drafting nothing on one prompt, 40 tokens on the next): the median of such a mixture jumps between them.
- Recommendation: per kind and pooled, the plan's choice (the recommended arm) against the best fixed configuration
  in hindsight (the highest median on these prompts; no speculation counts, at exactly 1): the difference of
  medians with a 95% bootstrap interval that chooses the best again in every resample. ``holds``: the interval
  reaches 0, i.e. the plan is not shown slower than the best configuration one could have fixed knowing the answer.

Writes outputs/benchmarks/<llama|vllm>_plan_predictor.parquet and <llama|vllm>_plan_check.parquet and prints both.

    python -m benchmarks.bench_engine_plan --campaign engines --pair qwen25_coder_bf16
    python -m benchmarks.bench_engine_plan --campaign engines --engine vllm --pair smollm2_int8
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from speclab.costs.engine_plan import engine_costs, fit_overheads, predict_requests, speed_requests
from store.records import read_meta

OUT = Path("outputs/benchmarks")
PREFIX = {"llama_cpp": "llama", "vllm": "vllm"}  # the output files' names per engine


def read(campaign: Path, stage: str, pair: str, engine: str) -> pd.DataFrame:
    files = sorted((campaign / stage).glob(f"{pair}-*.parquet"))
    if not files:
        raise SystemExit(f"no {stage} results of pair {pair} in {campaign}")
    frames = [pd.read_parquet(f).assign(finished_at=str(read_meta(f).get("finished_at", ""))) for f in files]
    df = pd.concat(frames, ignore_index=True)
    return df[df.engine == engine] if "engine" in df else df.iloc[0:0]


def predictor_table(timing: pd.DataFrame, acc: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    costs = engine_costs(timing)
    overheads = fit_overheads(costs, acc)  # calibrated on the plan's own requests, as the plan is
    print(f"costs: target step {costs.target_step_s * 1e3:.1f} ms, draft step {costs.draft_step_s * 1e3:.1f} ms; "
          f"calibrated overheads {overheads}")
    spec = speed[(speed.arm != "plain") & (speed.iterations > 0)].copy()
    spec["predicted"] = predict_requests(costs, speed_requests(spec), overheads).predicted.values
    spec["run_error"] = spec.predicted - spec.ratio_to_adjacent_plain
    rows = []
    for (arm, drafter, k, policy, kind), g in spec.groupby(["arm", "drafter", "k", "k_policy", "kind"]):
        rows.append({"arm": arm, "drafter": drafter, "k": int(k), "k_policy": policy, "kind": kind, "runs": len(g),
                     "measured": g.ratio_to_adjacent_plain.median(), "predicted": g.predicted.median(),
                     "error": g.run_error.median()})
    out = pd.DataFrame(rows)
    out["difference_of_medians"] = out.predicted - out.measured
    return out


NONE = ("none", 0, "no speculation")  # plain decoding: a fixed configuration at exactly 1 (the reference)


def _medians(groups: dict, rng: np.random.Generator | None = None) -> dict:
    """Each configuration's median ratio, of its runs or (``rng``) of a resample of them."""
    return {key: float(np.median(rng.choice(runs, len(runs)) if rng is not None else runs))
            for key, runs in groups.items()}


def check_table(speed: pd.DataFrame, samples: int = 2000, level: float = 0.95) -> pd.DataFrame:
    """Per kind (and all kinds pooled): the plan's choice against the best fixed configuration in hindsight, no
    speculation included (exactly 1). The best is chosen again in every bootstrap resample, so the interval
    carries the choice's own luck: the highest of a dozen noisy medians is above its configuration's true speed-up,
    and a fixed best chosen once would count that against the plan."""
    rows = []
    spec = speed[speed.arm != "plain"]
    for kind, g in [*spec.groupby("kind"), ("all", spec)]:
        rec = g[g.arm == "recommended"].ratio_to_adjacent_plain.to_numpy(dtype=float)
        fixed = {key: runs.to_numpy(dtype=float) for key, runs in
                 g[g.arm != "recommended"].groupby(["drafter", "k", "k_policy"]).ratio_to_adjacent_plain}
        medians = {**_medians(fixed), NONE: 1.0}
        best = max(medians, key=medians.get)
        rng = np.random.default_rng(0)
        diffs = [np.median(rng.choice(rec, len(rec))) - max(1.0, *_medians(fixed, rng).values())
                 for _ in range(samples)]
        lo, hi = np.percentile(diffs, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
        chosen = g[g.arm == "recommended"].drop_duplicates(["drafter", "k", "k_policy"])
        difference = float(np.median(rec) - medians[best])
        rows.append({"kind": kind, "recommended": "; ".join(f"{c.drafter} k={c.k} {c.k_policy}"
                                                            for c in chosen.itertuples()),
                     "recommended_speedup": float(np.median(rec)), "best_fixed": " ".join(map(str, best)),
                     "best_fixed_speedup": medians[best], "difference": difference, "difference_lo": float(lo),
                     "difference_hi": float(hi), "runs": len(rec),
                     "holds": bool(hi >= 0)})  # not shown slower than the best fixed configuration
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign", default="engines")
    ap.add_argument("--pair", default="qwen25_coder_bf16")
    ap.add_argument("--engine", default="llama_cpp", choices=sorted(PREFIX))
    ap.add_argument("--outputs", default="outputs")
    args = ap.parse_args()
    campaign = Path(args.outputs) / "campaigns" / args.campaign
    plan = read(campaign, "plan", args.pair, args.engine)
    plan_hash = plan.sort_values("finished_at").config_hash.iloc[-1]
    timing = read(campaign, "timing", args.pair, args.engine)
    timing = timing[timing.config_hash == plan_hash]
    acc = read(campaign, "acceptance", args.pair, args.engine)
    acc = acc[acc.config_hash == plan_hash]
    plan_prompts = set(plan[plan.config_hash == plan_hash].prompt_ids.iloc[0].split(","))
    speed = read(campaign, "speed", args.pair, args.engine)
    plan_done = plan[plan.config_hash == plan_hash].finished_at.iloc[0]
    speed = speed[(speed.arm == "recommended").groupby(speed.config_hash).transform("any")  # the check's jobs
                  & (speed.finished_at > plan_done)]  # ... that followed this plan (older checks followed older plans)
    unseen = speed[~speed.prompt_id.isin(plan_prompts)]
    if unseen.empty:
        raise SystemExit("the check ran no prompt the plan did not see")
    for job, g in unseen.groupby("config_hash"):  # the job-time checks' verdict (pipeline/jobs/trust.py), said, not hidden
        if "trust" in g and str(g.trust.iloc[0]) not in ("", "trusted", "nan"):
            print(f"check job {job}: flagged {g.trust.iloc[0]}: {g.trust_detail.iloc[0]}")
    pred, check = predictor_table(timing, acc, unseen), check_table(unseen)
    OUT.mkdir(parents=True, exist_ok=True)
    pred.to_parquet(OUT / f"{PREFIX[args.engine]}_plan_predictor.parquet", index=False)
    check.to_parquet(OUT / f"{PREFIX[args.engine]}_plan_check.parquet", index=False)
    pd.set_option("display.width", 200)
    print(f"predictor on {unseen.prompt_id.nunique()} prompts the plan did not see (costs timed on "
          f"{len(plan_prompts)} plan prompts):")
    print(pred.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"error (median over runs of predicted - measured): median |error| {pred.error.abs().median():.3f}, "
          f"max {pred.error.abs().max():.3f}; difference of medians: max {pred.difference_of_medians.abs().max():.3f}")
    for drafter, g in pred[pred.arm != "recommended"].groupby("drafter"):
        print(f"  {drafter}: max |error| {g.error.abs().max():.3f}, mean error {g.error.mean():+.3f}")
    print("recommendation vs the best fixed configuration in hindsight, per kind:")
    print(check.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
