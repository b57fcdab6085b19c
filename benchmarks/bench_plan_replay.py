"""What the acceptance replay saves a plan: the plan job (timing, acceptance, plan) with and without
``stage.replay``, on the same prompts, alternating the two in adjacent rounds.

Each job writes to its own temporary outputs folder, so nothing is reused between them; the wall time of
each part comes from its stage file's provenance record (started_at / finished_at). Writes one row per
(round, arm, part) to outputs/benchmarks/plan_replay.parquet and prints the medians of the within-round
ratios (replay / loop), and whether the two plans recommend the same configuration per kind.

    python -m benchmarks.bench_plan_replay --rounds 2 --per-kind 1
"""
from __future__ import annotations

import argparse
import os
import tempfile
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from pipeline.config.schema import register  # noqa: E402
from pipeline.jobs.identity import output_path  # noqa: E402
from pipeline.run import run_parts  # noqa: E402
from store.records import read_meta, write_parquet  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"loop": "stage.replay=false", "replay": "stage.replay=true"}
PARTS = ("timing", "acceptance", "plan")
SCHEMA = pa.schema([
    ("round", pa.int32()), ("arm", pa.string()), ("position", pa.int32()), ("part", pa.string()),
    ("wall_s", pa.float64()), ("prompts", pa.int32()), ("configurations", pa.int32()),
    ("replayed_share", pa.float64()), ("replay_mismatches", pa.int32()), ("recommended", pa.string()),
])


def _seconds(meta: dict) -> float:
    return (datetime.fromisoformat(meta["finished_at"]) - datetime.fromisoformat(meta["started_at"])).total_seconds()


def plan_job(arm: str, rnd: int, position: int, overrides: list[str], folder: Path) -> list[dict]:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "stage=plan", ARMS[arm], *overrides, f"outputs_dir={folder}", "mlflow.enabled=false",
            f"campaign=bench_{arm}_{rnd}"])
    run_parts(cfg)
    acc = pd.read_parquet(output_path(cfg, "acceptance"))
    plan = pd.read_parquet(output_path(cfg, "plan"))
    rec = plan[plan.recommended].sort_values("kind")
    chosen = "; ".join(f"{r.kind}: {r.drafter} {r.k_policy} k={r.k}" for r in rec.itertuples())
    replayed = acc.replayed.astype(bool) if "replayed" in acc else pd.Series(False, index=acc.index)
    rows = []
    for part in PARTS:
        rows.append({"round": rnd, "arm": arm, "position": position, "part": part,
                     "wall_s": _seconds(read_meta(output_path(cfg, part))), "prompts": acc.prompt_id.nunique(),
                     "configurations": acc.groupby(["drafter", "k_policy", "k"]).ngroups,
                     "replayed_share": float(replayed.mean()),
                     "replay_mismatches": int((acc.replay_agrees == 0).sum()) if "replay_agrees" in acc else 0,
                     "recommended": chosen})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--per-kind", type=int, default=1, help="prompts of each kind in the plan")
    ap.add_argument("--pair", default="smollm2_int8")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="outputs/benchmarks/plan_replay.parquet")
    args = ap.parse_args()
    register()
    overrides = [f"pair={args.pair}", f"prompts.per_kind={args.per_kind}", f"max_new_tokens={args.max_new_tokens}"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_plan_replay_") as tmp:
        for rnd in range(args.rounds):
            order = list(ARMS) if rnd % 2 == 0 else list(ARMS)[::-1]
            for position, arm in enumerate(order):
                rows += plan_job(arm, rnd, position, overrides, Path(tmp) / f"{arm}{rnd}")
                done = [r for r in rows if r["round"] == rnd and r["arm"] == arm]
                print(f"round {rnd} {arm:6s} " + ", ".join(f"{r['part']} {r['wall_s']:.0f} s" for r in done), flush=True)
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, args.out)
    wide = df.pivot_table(index=["round", "part"], columns="arm", values="wall_s").reset_index()
    job = wide.groupby("round")[["loop", "replay"]].sum()
    print(f"\nplan job on {args.pair}, {int(df.prompts.iloc[0])} prompts, {int(df.configurations.iloc[0])} "
          f"configurations, {args.rounds} rounds (medians of within-round ratios):")
    for part in PARTS:
        w = wide[wide.part == part]
        print(f"  {part:10s} loop {w.loop.median():7.1f} s  replay {w.replay.median():7.1f} s  "
              f"replay / loop {np.median(w.replay / w.loop):.3f}")
    print(f"  {'whole job':10s} loop {job.loop.median():7.1f} s  replay {job.replay.median():7.1f} s  "
          f"replay / loop {np.median(job.replay / job.loop):.3f}")
    rep = df[df.arm == "replay"]
    print(f"replayed share of acceptance iterations {rep.replayed_share.median():.2f}; replay mismatches on the "
          f"configurations run for real: {int(rep[rep.part == 'acceptance'].replay_mismatches.sum())}")
    for arm in ARMS:
        print(f"recommended ({arm}): " + " | ".join(sorted(set(df[df.arm == arm].recommended))))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
