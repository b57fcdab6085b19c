"""Is the speed stage's plain tokens/s in vLLM vLLM's own? The stage against vLLM's offline ``LLM.generate``.

Per round, two whole arms in alternating order: ``stage`` runs `python -m pipeline.run engine=vllm stage=speed` with
plain decoding only (``stage.arms=[]``) and reads its rows; ``offline`` runs the same requests (the same token ids,
max_tokens, greedy) through ``vllm.LLM.generate`` in vLLM's own environment (a worker process started here, not by
speclab, with the stage's settings: eager, dtype, max_model_len, KV cache, threads), timing each ``generate`` call.
Then, drift-robust, per prompt back to back in alternating order, the stage's own request path (speclab's
``VllmEngine.generate``, which times the speed stage's rows) against the offline call. All count the new tokens over
the request's wall time (prompt included). Writes one row per request to outputs/benchmarks/vllm_plain.parquet and
prints each arm's median and the median of the per-prompt ratios stage / offline with a bootstrap interval.

    make vllm && python -m benchmarks.bench_vllm_plain --pair smollm2_int8 --rounds 3 --per-kind 3
"""
from __future__ import annotations

import argparse
import json
import os
import signal
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

OUT = Path("outputs/benchmarks/vllm_plain.parquet")
PAIRS = {"qwen25_coder_bf16": ("qwen2.5-coder-1.5b", "bfloat16"), "smollm2_int8": ("smollm2-135m", "float32")}
SCHEMA = pa.schema([("round", pa.int32()), ("arm", pa.string()), ("position", pa.int32()),
                    ("prompt_id", pa.string()), ("kind", pa.string()), ("new_tokens", pa.int32()),
                    ("wall_s", pa.float64()), ("tokens_per_s", pa.float64())])
KV_GIB = 1.0
# The offline worker, run by vLLM's own python: one LLM, then one generate call per request line on stdin.
WORKER = r'''
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
if __name__ == "__main__":
    model, dtype, kv = sys.argv[1], sys.argv[2], float(sys.argv[3])
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=2048, seed=0,
              kv_cache_memory_bytes=int(kv * 2**30), max_num_seqs=8)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"])
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=req["ids"])], params, use_tqdm=False)
        wall = time.perf_counter() - start
        print(json.dumps({"tokens": list(out[0].outputs[0].token_ids), "wall_s": wall}), flush=True)
'''


class Offline:
    """vLLM's offline engine in its own environment, asked one request at a time."""

    def __init__(self, args) -> None:
        from engines.vllm.install import installed
        from speclab.models.loading import packaged_folder

        name, dtype = PAIRS[args.pair]
        self.script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
        self.script.write(WORKER)
        self.script.close()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_CPU_KVCACHE_SPACE")}
        env.update(VLLM_CPU_OMP_THREADS_BIND="auto", VLLM_NO_USAGE_STATS="1")
        # in a session of its own: close() ends its engine-core and worker processes with it
        self.proc = subprocess.Popen([str(installed()), self.script.name, str(packaged_folder(name)), dtype,
                                      str(KV_GIB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit("vLLM's offline worker did not start")
            if line.startswith("{"):
                break

    def request(self, ids: list[int], n: int) -> tuple[int, float]:
        self.proc.stdin.write(json.dumps({"ids": ids, "max_tokens": n}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return len(answer["tokens"]), answer["wall_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(wait_s if self.proc.poll() is None else 1)
        self.proc.wait()
        os.unlink(self.script.name)


def stage_rows(args, outputs: str, r: int) -> pd.DataFrame:
    cmd = [sys.executable, "-m", "pipeline.run", "engine=vllm", "stage=speed", "stage.arms=[]", f"pair={args.pair}",
           f"prompts.per_kind={args.per_kind}", f"max_new_tokens={args.max_new_tokens}", f"engine.kv_cache_gib={KV_GIB}",
           "stage.timing_repeats=1", "stage.timing_warmup=0", "mlflow.enabled=false", f"outputs_dir={outputs}",
           "campaign=bench", f"round={r}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    files = sorted(Path(outputs, "campaigns", "bench", "speed").glob("*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files])
    return df[(df.arm == "plain") & (df["round"] == r)]


def offline_rows(args, requests) -> list[dict]:
    offline = Offline(args)
    try:
        offline.request(requests[0][2], args.max_new_tokens)  # warm-up
        rows = []
        for pid, kind, ids in requests:
            n, wall = offline.request(ids, args.max_new_tokens)
            rows.append({"prompt_id": pid, "kind": kind, "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall})
        return rows
    finally:
        offline.close()


def interleaved_rows(args, requests, r: int) -> list[dict]:
    """Per prompt, back to back in alternating order: the stage's request path (VllmEngine.generate, which times the
    speed stage's plain rows) and the offline call, each engine idle while the other runs."""
    from engines.vllm.client import VllmEngine, VllmSettings
    from engines.vllm.install import installed
    from speclab.models.loading import packaged_folder
    from speclab.specs.arms import PLAIN

    name, dtype = PAIRS[args.pair]
    engine = VllmEngine(VllmSettings(python=str(installed()), dtype=dtype, kv_cache_gib=KV_GIB),
                        packaged_folder(name), None)
    offline = Offline(args)
    rows = []
    try:
        engine.generate(PLAIN, requests[0][2], args.max_new_tokens)
        offline.request(requests[0][2], args.max_new_tokens)
        for i, (pid, kind, ids) in enumerate(requests):
            order = ("engine", "offline") if (i + r) % 2 == 0 else ("offline", "engine")
            for position, arm in enumerate(order):
                if arm == "engine":
                    run = engine.generate(PLAIN, ids, args.max_new_tokens)
                    n, wall = len(run.tokens), run.wall_s
                else:
                    n, wall = offline.request(ids, args.max_new_tokens)
                rows.append({"round": r, "arm": f"interleaved_{arm}", "position": position, "prompt_id": pid,
                             "kind": kind, "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall})
    finally:
        engine.close()
        offline.close()
    return rows


_REQUESTS: list | None = None


def prompt_requests(args) -> list[tuple[str, str, list[int]]]:
    """The stage's prompts as token ids, made once (benchmarks.common.stage_prompt_requests)."""
    global _REQUESTS
    if _REQUESTS is None:
        _REQUESTS = stage_prompt_requests(PAIRS[args.pair][0], args.per_kind)
    return _REQUESTS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="smollm2_int8", choices=list(PAIRS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-kind", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as outputs:
        rows = alternating_rounds(args.rounds, "offline", lambda r: stage_rows(args, outputs, r),
                                  lambda: offline_rows(args, prompt_requests(args)),
                                  lambda r: interleaved_rows(args, prompt_requests(args), r))
    df = pd.DataFrame(rows)
    write_parquet(df, SCHEMA, OUT)
    print_adjacent_ratios(df, [("stage", "offline", "whole stage job vs offline LLM.generate, adjacent within a round"),
                                ("interleaved_engine", "interleaved_offline", "the stage's request path vs offline, per prompt")])
    print(f"rows: {OUT}")


if __name__ == "__main__":
    main()
