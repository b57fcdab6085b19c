"""Racing against the fixed design on the same arms: does the race reach the fixed run's best configuration per kind,
and with how many of its runs?

Reads one campaign's speed results of one pair holding a racing job (``stage.race``/``stage.precision``: its rows'
``stopped_by`` is not ``rounds``) and a fixed job of the same arms (every row ``rounds``), e.g. ``+sweep=race_qwen``
run twice (conf/sweep/race_qwen.yaml). Per kind: each job's best configuration (the highest median ratio to the
adjacent plain run; plain decoding counts, at exactly 1; the racing job's among the arms still in its race at the
end), whether they agree, the runs each job spent (every run, plain's included) and their share, the racing job's
blocks and why it stopped. A configuration is its arm's label (``speclab.specs.arms.Arm.label``) without the plan's mark:
the plan's choice runs as its own arm, ``prompt lookup k=4 (plan)``, and is the same configuration as the fixed arm
``prompt lookup k=4``. Where the two bests differ, the fixed run's own paired 95% interval of their difference says
whether even it can tell them apart (``tied_in_fixed``). The fixed reference is every fixed job of the campaign,
pooled: each block holds its own adjacent plain runs, so blocks of two jobs (renumbered apart, never paired across
jobs) add up to one longer fixed run, e.g. a 12-round job and a 6-round job give the 18 rounds that are 3x a racing
budget of 6. Every racing job is compared with that pool. No model runs here.

Writes outputs/benchmarks/race.parquet and prints it.

    python -m benchmarks.bench_race --campaign racing --pair qwen25_coder_bf16
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.answer import paired_difference
from pipeline.stages.speed_race import FIXED
from speclab.specs.arms import Arm
from store.records import read_meta

OUT = Path("outputs/benchmarks")
PLAIN = "plain"


def read(outputs: Path, campaign: str, pair: str) -> pd.DataFrame:
    files = sorted((outputs / "campaigns" / campaign / "speed").glob(f"{pair}-*.parquet"))
    if not files:
        raise SystemExit(f"no speed results of pair {pair} in campaign {campaign} under {outputs}")
    df = pd.concat([pd.read_parquet(f).assign(file=f.name, path=str(f)) for f in files], ignore_index=True)
    if "stopped_by" not in df:
        raise SystemExit(f"campaign {campaign}'s speed results predate racing (no stopped_by column)")
    return labelled(df)


def jobs(df: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """({racing job's overrides: its rows}, every fixed job's rows pooled): a fixed job has every row ``rounds``;
    its blocks are renumbered after the previous fixed job's, so that a pair of runs never spans two jobs."""
    racing, fixed = {}, []
    for name, rows in df.groupby("file", sort=False):
        meta = read_meta(rows.path.iloc[0])
        if (rows.stopped_by == FIXED).all():
            fixed.append((str(meta.get("finished_at", "")), rows))
        else:
            racing[" ".join(meta.get("overrides") or [name])] = rows
    if not racing or not fixed:
        raise SystemExit(f"need a racing job and a fixed job; found {len(racing)} racing, {len(fixed)} fixed")
    pooled, offset = [], 0
    for _, rows in sorted(fixed, key=lambda f: f[0]):
        pooled.append(rows.assign(block=rows.block + offset))
        offset += int(rows.block.max()) + 1
    return racing, pd.concat(pooled, ignore_index=True)


PLAN_MARK = " (plan)"


def labelled(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(label=[PLAIN if r.arm == "plain" else Arm.from_row(r).label.removesuffix(PLAN_MARK)
                              for r in rows.itertuples()])


def best(rows: pd.DataFrame, still_running: bool) -> tuple[str, float]:
    """The configuration with the highest median ratio (plain at 1), among the arms in the race at the end."""
    spec = rows[rows.label != PLAIN]
    if still_running:
        spec = spec[~spec.stopped_by.str.startswith("dropped")]
    medians = spec.ratio_to_adjacent_plain.groupby(spec.label).median()
    medians[PLAIN] = 1.0
    top = medians.sort_values(ascending=False, kind="mergesort")
    return str(top.index[0]), float(top.iloc[0])


def fixed_difference(fixed: pd.DataFrame, a: str, b: str) -> tuple[float, float, float]:
    """In the fixed run: the median of a's minus b's ratio over the blocks both ran, and its 95% interval (the
    report's paired difference); zero where a and b are one configuration."""
    if a == b:
        return 0.0, 0.0, 0.0
    side = {x: fixed[fixed.label == x] if x != PLAIN else fixed[fixed.label == PLAIN].assign(ratio_to_adjacent_plain=1.0)
            for x in (a, b)}
    found = paired_difference(side[a], side[b], 0.95)
    return found[:3] if found else (float("nan"),) * 3


def compare(racing: pd.DataFrame, fixed: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for kind in fixed.kind.unique():
        r, f = racing[racing.kind == kind], fixed[fixed.kind == kind]
        (rb, rs), (fb, fs) = best(r, True), best(f, False)
        diff, lo, hi = fixed_difference(f, fb, rb)
        dropped = sorted(set(r[r.stopped_by.str.startswith("dropped")].label))
        rows.append({"kind": kind, "fixed_best": fb, "fixed_speedup": fs, "racing_best": rb, "racing_speedup": rs,
                     "same_best": rb == fb,
                     # the fixed run's own paired interval of (its best - the race's pick) reaches 0: it cannot
                     # tell the two apart either
                     "tied_in_fixed": bool(lo <= 0) if lo == lo else False,
                     "fixed_best_minus_racing_best": diff, "difference_lo": lo, "difference_hi": hi,
                     "fixed_runs": len(f), "racing_runs": len(r), "runs_share": len(r) / len(f),
                     "fixed_blocks": f.block.nunique(), "racing_blocks": r.block.nunique(),
                     "racing_minutes": r.wall_s.sum() / 60, "fixed_minutes": f.wall_s.sum() / 60,
                     "stopped_by": str(r[r.label == PLAIN].stopped_by.iloc[-1]), "dropped": "; ".join(dropped)})
    out = pd.DataFrame(rows)
    total = {"kind": "all", "same_best": bool(out.same_best.all()),
             "tied_in_fixed": bool((out.same_best | out.tied_in_fixed).all()),
             "fixed_runs": int(out.fixed_runs.sum()), "racing_runs": int(out.racing_runs.sum()),
             "fixed_minutes": out.fixed_minutes.sum(), "racing_minutes": out.racing_minutes.sum()}
    total["runs_share"] = total["racing_runs"] / total["fixed_runs"]
    return pd.concat([out, pd.DataFrame([total])], ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign", default="racing")
    ap.add_argument("--pair", default="qwen25_coder_bf16")
    ap.add_argument("--outputs", type=Path, default=Path("outputs"))
    args = ap.parse_args()
    racing, fixed = jobs(read(args.outputs, args.campaign, args.pair))
    out = pd.concat([compare(rows, fixed).assign(racing_job=name) for name, rows in racing.items()],
                    ignore_index=True)
    OUT.mkdir(parents=True, exist_ok=True)
    out.to_parquet(OUT / "race.parquet", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", 40):
        for name, t in out.groupby("racing_job", sort=False):
            print(f"== racing job: {name}")
            print(t.drop(columns=["dropped", "stopped_by", "racing_job"]).round(3).to_string(index=False))
            for r in t[t.kind != "all"].itertuples():
                print(f"{r.kind}: racing stopped by {r.stopped_by} after {r.racing_blocks} blocks; "
                      f"dropped: {r.dropped or '-'}")
            total = t.iloc[-1]
            print(f"same best configuration in every kind: {total.same_best} (or one the fixed run cannot tell from "
                  f"its best: {total.tied_in_fixed}); runs {total.runs_share:.2f} of the fixed run's "
                  f"({'at most half' if total.runs_share <= 0.5 else 'more than half'})")


if __name__ == "__main__":
    main()
