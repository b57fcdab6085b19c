"""The same 4-job sweep (tiny pair, speed stage) through the basic launcher, submitit_local and SLURM, adjacent,
on the cluster of cluster/up.sh (source its env.sh first); writes outputs/benchmarks/launchers.parquet.

    python cluster/bench.py [--rounds 2]

Per launcher: the sweep's wall time (start of the command to its exit) and, for the submitit launchers, each
job's delay from submission (its pickle written) to its start (submitit's first log line).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

LAUNCHERS = {"basic": [], "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.cpus_per_task=1",
                                             "threads=1"],
             "slurm": ["+launcher=slurm_cpu"]}
START = re.compile(r"submitit INFO \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\) - Starting with JobEnvironment")


def delays(sweep_dir: Path) -> list[float]:
    """Seconds from each job's submission to its start."""
    out = []
    for submitted in sweep_dir.glob(".submitit/*/*_submitted.pkl"):
        text = "".join(log.read_text() for log in submitted.parent.glob("*_log.*"))
        found = START.search(text)
        if found:
            start = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(start - submitted.stat().st_mtime)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    shared, uri = os.environ.get("SPECLAB_SHARED"), os.environ.get("SPECLAB_TRACKING_URI")
    if not shared or not uri:
        sys.exit("cluster/bench.py: source the env.sh that cluster/up.sh wrote first")
    rows = []
    for rnd in range(args.rounds):
        for name, extra in LAUNCHERS.items():
            sweep_dir = Path(shared) / "bench-sweeps" / f"{name}-{rnd}"
            cmd = [sys.executable, "-m", "pipeline.run", "-m", *extra, "pair=tiny_random", "prompts=smoke",
                   "stage=speed", "stage.ks=[1,2]", "k=1,2", "round=0,1", "max_new_tokens=8", "device=cpu",
                   f"campaign=bench-{name}-{rnd}", f"outputs_dir={shared}", f"mlflow.tracking_uri={uri}",
                   f"hydra.sweep.dir={sweep_dir}"]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if done.returncode:
                sys.exit(f"cluster/bench.py: the {name} sweep failed:\n{done.stderr[-2000:]}")
            d = delays(sweep_dir)
            rows.append({"launcher": name, "round": rnd, "jobs": 4, "wall_s": wall,
                         "median_start_delay_s": float(pd.Series(d).median()) if d else float("nan")})
            delay = f", start delay {rows[-1]['median_start_delay_s']:.1f} s" if d else ""
            print(f"{name} round {rnd}: {wall:.1f} s{delay}")
    df = pd.DataFrame(rows)
    out = Path("outputs/benchmarks/launchers.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out, index=False)
    print(df.groupby("launcher")[["wall_s", "median_start_delay_s"]].median().to_string())


if __name__ == "__main__":
    main()
