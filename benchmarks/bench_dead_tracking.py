"""What an unreachable tracking server costs a sweep: the same 2-job sweep with tracking off, against
a port that refuses connections, and against a server that accepts connections and never answers.

    python -m benchmarks.bench_dead_tracking [--rounds 3] [--pair tiny_random]

Writes outputs/benchmarks/dead_tracking.parquet (one row per sweep) and prints the median wall time
per case and its ratio to tracking off, rounds interleaved so drift hits every case alike.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from store.records import make_schema, write_parquet

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = make_schema([("case", "string"), ("round", "int64"), ("pair", "string"), ("jobs", "int64"),
                      ("wall_s", "float64"), ("returncode", "int64"), ("parquet_files", "int64")])


def _sweep(tracking: list[str], pair: str, out: Path) -> tuple[float, int, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_HTTP", "SPECLAB_TRACKING"))}
    env["HF_HUB_OFFLINE"] = "1"
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "pipeline.run", "-m", "k=2,4", f"pair={pair}", "prompts=smoke",
                          "stage=acceptance", "max_new_tokens=16", f"outputs_dir={out}", "force=true",
                          f"hydra.sweep.dir={out}/sweep", *tracking], cwd=ROOT, env=env, capture_output=True, text=True)
    return time.monotonic() - start, res.returncode, len(list(out.rglob("*.parquet")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pair", default="tiny_random")
    args = ap.parse_args()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # never accepts or answers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    cases = {"off": ["mlflow.enabled=false"],
             "refused": [f"mlflow.tracking_uri=http://127.0.0.1:{refused}"],
             "silent": [f"mlflow.tracking_uri=http://127.0.0.1:{silent.getsockname()[1]}"]}
    rows = []
    for r in range(args.rounds):
        order = list(cases)[r % 3:] + list(cases)[:r % 3]
        for case in order:
            with tempfile.TemporaryDirectory() as tmp:
                wall, rc, files = _sweep(cases[case], args.pair, Path(tmp))
            rows.append({"case": case, "round": r, "pair": args.pair, "jobs": 2, "wall_s": wall, "returncode": rc,
                         "parquet_files": files})
            print(f"round {r} {case:8s} {wall:6.1f} s rc={rc} files={files}")
    silent.close()
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, ROOT / "outputs" / "benchmarks" / "dead_tracking.parquet")
    med = df.groupby("case").wall_s.median()
    for case in cases:
        print(f"{case:8s} median {med[case]:6.1f} s  x{med[case] / med['off']:.2f} of tracking off")


if __name__ == "__main__":
    main()
