"""Is the speed stage's plain tokens/s in llama.cpp the engine's own? The stage against a direct timing.

Two arms per round, their order alternating: ``stage`` runs `python -m pipeline.run engine=llama_cpp stage=speed`
with plain decoding only (``engine.arms=[]``) and reads its rows; ``direct`` starts llama-server itself (the same
binary, model and options, launched here, not by speclab) and sends the same requests (the same token ids,
n_predict, greedy) through ``http.client``, timing each one around its HTTP exchange. Both count the new tokens
over the request's wall time (prompt included). Writes one row per request to
outputs/benchmarks/llama_plain.parquet and prints each arm's median and the median of the per-prompt ratios
stage / direct of adjacent rounds, with a bootstrap interval.

    python -m benchmarks.bench_llama_plain --pair qwen25_coder_bf16 --rounds 3 --per-kind 3
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from analysis.common import bootstrap_ci  # noqa: E402
from store.records import write_parquet  # noqa: E402

OUT = Path("outputs/benchmarks/llama_plain.parquet")
SCHEMA = pa.schema([("round", pa.int32()), ("arm", pa.string()), ("position", pa.int32()),
                    ("prompt_id", pa.string()), ("kind", pa.string()), ("new_tokens", pa.int32()),
                    ("wall_s", pa.float64()), ("tokens_per_s", pa.float64())])


def stage_rows(args, outputs: str, r: int) -> pd.DataFrame:
    cmd = [sys.executable, "-m", "pipeline.run", "engine=llama_cpp", "stage=speed", "engine.arms=[]",
           f"pair={args.pair}", f"prompts.per_kind={args.per_kind}", f"max_new_tokens={args.max_new_tokens}",
           f"engine.threads={args.threads}", "stage.timing_repeats=1", "stage.timing_warmup=0",
           "mlflow.enabled=false", f"outputs_dir={outputs}", "campaign=bench", f"round={r}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    files = sorted(Path(outputs, "campaigns", "bench", "speed").glob("*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files])
    return df[(df.arm == "plain") & (df["round"] == r)]


def direct_rows(args, requests: list[tuple[str, str, list[int]]]) -> list[dict]:
    """The same requests to a llama-server started here, timed around each HTTP exchange."""
    from speclab.engines.llama_build import installed
    from speclab.engines.llama_server import free_port
    from speclab.models import packaged_gguf_path

    cfg_target = {"qwen25_coder_bf16": "qwen2.5-coder-1.5b", "smollm2_int8": "smollm2-135m"}[args.pair]
    port = free_port()
    argv = [str(installed() / "llama-server"), "-m", str(packaged_gguf_path(cfg_target)), "--host", "127.0.0.1",
            "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads), "-c", "2048", "--parallel", "1",
            "--no-webui", "--cache-ram", "0"]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            rows = []
            for i, (pid, kind, ids) in enumerate([requests[0], *requests]):  # the first one twice: a warm-up
                body = json.dumps({"prompt": ids, "n_predict": args.max_new_tokens, "cache_prompt": False,
                                   "return_tokens": True, "temperature": 0.0, "top_k": 1})
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                start = time.perf_counter()
                conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
                answer = json.loads(conn.getresponse().read())
                wall = time.perf_counter() - start
                if i:
                    n = len(answer["tokens"])
                    rows.append({"prompt_id": pid, "kind": kind, "new_tokens": n, "wall_s": wall,
                                 "tokens_per_s": n / wall})
            return rows
        finally:
            server.terminate()
            server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="qwen25_coder_bf16", choices=["qwen25_coder_bf16", "smollm2_int8"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-kind", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as outputs:
        for r in range(args.rounds):
            order = ("stage", "direct") if r % 2 == 0 else ("direct", "stage")
            for position, arm in enumerate(order):
                if arm == "stage":
                    df = stage_rows(args, outputs, r)
                    got = [{"prompt_id": p.prompt_id, "kind": p.kind, "new_tokens": int(p.new_tokens),
                            "wall_s": float(p.wall_s), "tokens_per_s": float(p.tokens_per_s)} for p in df.itertuples()]
                else:
                    got = direct_rows(args, prompt_requests(args))
                rows += [{"round": r, "arm": arm, "position": position, **g} for g in got]
                print(f"round {r} {arm}: median {np.median([g['tokens_per_s'] for g in got]):.2f} tok/s", flush=True)
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, OUT)
    wide = df.pivot_table(index=["round", "prompt_id"], columns="arm", values="tokens_per_s")
    ratio = (wide.stage / wide.direct).dropna().to_numpy()
    lo, hi = bootstrap_ci(ratio, np.median)
    print(f"stage {df[df.arm == 'stage'].tokens_per_s.median():.2f} tok/s, direct "
          f"{df[df.arm == 'direct'].tokens_per_s.median():.2f} tok/s; stage/direct median {np.median(ratio):.3f} "
          f"(95% CI {lo:.3f}-{hi:.3f}, n={len(ratio)}); rows: {OUT}")


_REQUESTS: list | None = None


def prompt_requests(args) -> list[tuple[str, str, list[int]]]:
    """The stage's prompts as token ids, made as the stage makes them (the target's tokenizer, raw texts)."""
    global _REQUESTS
    if _REQUESTS is None:
        from pipeline.prompts import encode, load_prompts
        from speclab.models import load_tokenizer

        target = {"qwen25_coder_bf16": "qwen2.5-coder-1.5b", "smollm2_int8": "smollm2-135m"}[args.pair]
        tok = load_tokenizer(target)
        prompts = load_prompts("default.yaml", ["prose", "code", "structured"], args.per_kind)
        _REQUESTS = [(p.id, p.kind, encode(p, tok, len(tok), "cpu")[0].tolist()) for p in prompts]
    return _REQUESTS


if __name__ == "__main__":
    main()
