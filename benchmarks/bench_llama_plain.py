"""Is the speed stage's plain tokens/s in llama.cpp the engine's own? The stage against a direct timing.

Per round: two whole arms, their order alternating: ``stage`` runs `python -m pipeline.run engine=llama_cpp stage=speed`
with plain decoding only (``stage.arms=[]``) and reads its rows; ``direct`` starts llama-server itself (the same
binary, model and options, launched here, not by speclab) and sends the same requests (the same token ids,
n_predict, greedy) through ``http.client``, timing each one around its HTTP exchange; then, drift-robust, per prompt
back to back in alternating order, the stage's own request path (speclab's ``LlamaCppEngine.generate``, which times
the speed stage's rows) against the direct request, each to its own idle server. All count the new tokens over the
request's wall time (prompt included). Writes one row per request to
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

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks.common import alternating_rounds, print_adjacent_ratios, stage_prompt_requests  # noqa: E402
from store.records import write_parquet  # noqa: E402

OUT = Path("outputs/benchmarks/llama_plain.parquet")
TARGETS = {"qwen25_coder_bf16": "qwen2.5-coder-1.5b", "smollm2_int8": "smollm2-135m"}  # --pair -> its target GGUF
SCHEMA = pa.schema([("round", pa.int32()), ("arm", pa.string()), ("position", pa.int32()),
                    ("prompt_id", pa.string()), ("kind", pa.string()), ("new_tokens", pa.int32()),
                    ("wall_s", pa.float64()), ("tokens_per_s", pa.float64())])


def stage_rows(args, outputs: str, r: int) -> pd.DataFrame:
    cmd = [sys.executable, "-m", "pipeline.run", "engine=llama_cpp", "stage=speed", "stage.arms=[]",
           f"pair={args.pair}", f"prompts.per_kind={args.per_kind}", f"max_new_tokens={args.max_new_tokens}",
           f"engine.threads={args.threads}", "stage.timing_repeats=1", "stage.timing_warmup=0",
           "mlflow.enabled=false", f"outputs_dir={outputs}", "campaign=bench", f"round={r}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    files = sorted(Path(outputs, "campaigns", "bench", "speed").glob("*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files])
    return df[(df.arm == "plain") & (df["round"] == r)]


def direct_rows(args, requests: list[tuple[str, str, list[int]]]) -> list[dict]:
    """The same requests to a llama-server started here, timed around each HTTP exchange (the first one twice: a
    warm-up)."""
    from speclab.models.loading import packaged_gguf_path

    direct = DirectServer(args, packaged_gguf_path(TARGETS[args.pair]))
    try:
        direct.request(requests[0][2])
        rows = []
        for pid, kind, ids in requests:
            n, wall = direct.request(ids)
            rows.append({"prompt_id": pid, "kind": kind, "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall})
        return rows
    finally:
        direct.close()


def interleaved_rows(args, requests: list[tuple[str, str, list[int]]], r: int) -> list[dict]:
    """Per prompt, back to back in alternating order: the stage's own request path (speclab's LlamaCppEngine, whose
    ``generate`` times the speed stage's plain rows) and the direct request, each to its own idle server."""
    from speclab.specs.arms import PLAIN
    from engines.llama_cpp.build import installed
    from engines.llama_cpp.client import LlamaCppEngine, LlamaSettings, sampling_payload
    from speclab.models.loading import packaged_gguf_path

    target = packaged_gguf_path(TARGETS[args.pair])
    engine = LlamaCppEngine(LlamaSettings(binary=str(installed() / "llama-server"), threads=args.threads), target, None)
    direct = DirectServer(args, target)
    rows = []
    try:
        engine.generate(PLAIN, requests[0][2], args.max_new_tokens)
        direct.request(requests[0][2])
        for i, (pid, kind, ids) in enumerate(requests):
            order = ("engine", "direct") if (i + r) % 2 == 0 else ("direct", "engine")
            for position, arm in enumerate(order):
                if arm == "engine":
                    run = engine.generate(PLAIN, ids, args.max_new_tokens, sampling_payload(False, 1, 0, 1, 0))
                    n, wall = len(run.tokens), run.wall_s
                else:
                    n, wall = direct.request(ids)
                rows.append({"round": r, "arm": f"interleaved_{arm}", "position": position, "prompt_id": pid,
                             "kind": kind, "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall})
    finally:
        engine.close()
        direct.close()
    return rows


class DirectServer:
    """llama-server started here with the stage's options, asked through http.client."""

    def __init__(self, args, target) -> None:
        from engines.llama_cpp.build import installed
        from engines.llama_cpp.server import free_port

        self.args, self.port = args, free_port()
        argv = [str(installed() / "llama-server"), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port),
                "-t", str(args.threads), "-tb", str(args.threads), "-c", "2048", "--parallel", "1", "--no-webui",
                "--cache-ram", "0"]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:  # /health answers 503 while the model loads
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the directly started llama-server did not come up")
            time.sleep(0.1)

    def request(self, ids: list[int]) -> tuple[int, float]:
        body = json.dumps({"prompt": ids, "n_predict": self.args.max_new_tokens, "cache_prompt": False,
                           "return_tokens": True, "temperature": 0.0, "top_k": 1})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        start = time.perf_counter()
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        wall = time.perf_counter() - start
        if "tokens" not in answer:
            raise SystemExit(f"llama-server answered without tokens: {str(answer)[:200]}")
        return len(answer["tokens"]), wall

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="qwen25_coder_bf16", choices=list(TARGETS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-kind", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as outputs:
        rows = alternating_rounds(args.rounds, "direct", lambda r: stage_rows(args, outputs, r),
                                  lambda: direct_rows(args, prompt_requests(args)),
                                  lambda r: interleaved_rows(args, prompt_requests(args), r))
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, OUT)
    print_adjacent_ratios(df, [("stage", "direct", "whole stage job vs direct, adjacent within a round"),
                                ("interleaved_engine", "interleaved_direct", "the stage's request path vs direct, per prompt")])
    print(f"rows: {OUT}")


_REQUESTS: list | None = None


def prompt_requests(args) -> list[tuple[str, str, list[int]]]:
    """The stage's prompts as token ids, made once (benchmarks.common.stage_prompt_requests)."""
    global _REQUESTS
    if _REQUESTS is None:
        _REQUESTS = stage_prompt_requests(TARGETS[args.pair], args.per_kind)
    return _REQUESTS


if __name__ == "__main__":
    main()
