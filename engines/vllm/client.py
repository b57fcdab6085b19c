"""vLLM's servers for one pair, one per configuration, asked for token ids, their counters and their timings.

A request is sent as token ids and answered with token ids (``return_token_ids``), so both engines see the same
ids. vLLM's per-request metrics give the rest: the time from scheduling to the first token (the prompt's pass,
``prompt_s``), from the first token to the last (``decode_s``), and, under speculation, the proposals drafted, the
accepted ones and the histogram of accepted proposals per verify step, from which the accepted per draft position
follow (``accepted_per_pos[i]`` = steps that accepted more than i).

vLLM's passes are timed as vLLM runs them (``pass_times``): a plain decoding step is the mean inter-token time of a
plain request (every step one pass over one new token after a cached context); a pass over m new tokens is a
request that adds m tokens to a context the server has cached (``prompt_tokens_details.cached_tokens`` checked),
less what a request costs beyond its pass (the one-token request's time less the decoding step).
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.vllm.arms import speculative_config
from engines.vllm.server import VllmServer, VllmSpec, spec_json
from pipeline.engines.base import RequestResult
from pipeline.engines.local_server import ServerError
from speclab.specs.arms import PLAIN, Arm

log = logging.getLogger("speclab")
WARM_TOKENS = 8  # a new server's first request pays one-time set-up (about 20 s on this CPU): done before timing
# What a CPU server holds beyond its weights and its KV cache (the API server, the engine core and the worker, each
# with torch loaded), measured here: about 2 GB for the Qwen pair's server (7-8 GB resident: 4.1 GB of bf16 weights, 1
# GiB KV) and for SmolLM2's draft-model server (4 GB: 1.1 GB of fp32 weights, 1 GiB KV).
RUNTIME_BYTES = 2 * 2**30
GPU_SHARE = 0.95  # the most of the GPU's memory the servers' gpu_memory_utilization may add up to


@dataclass
class VllmSettings:
    python: str
    dtype: str = "auto"
    device: str = "cpu"
    eager: bool = True
    max_model_len: int = 2048
    threads_bind: str = "auto"
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 8
    port: int = 0
    startup_timeout_s: float = 300.0
    cpu_expand_fix: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)


def weight_bytes(folder: str | Path) -> int:
    """The bytes of a Hugging Face-format folder's safetensors files: the weights a server loads from it."""
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


def sampling_payload(do_sample: bool, temperature: float, top_k: int, top_p: float, seed: int) -> dict[str, Any]:
    """vLLM's sampler settings for speclab's sampling config; its other samplers off (their neutral values)."""
    if not do_sample:
        return {"temperature": 0.0}
    return {"temperature": float(temperature), "top_k": int(top_k) if top_k > 0 else -1, "top_p": float(top_p),
            "min_p": 0.0, "repetition_penalty": 1.0, "seed": int(seed) % 2**31}


def per_position(histogram: list[int] | None) -> list[int] | None:
    """Accepted proposals per draft position from the histogram of accepted proposals per verify step (entry j: the
    steps that accepted j): position i is accepted in every step that accepted more than i."""
    if not histogram:
        return None
    return [int(sum(histogram[i + 1:])) for i in range(len(histogram) - 1)]


def top_probs(entry: dict[str, float] | None) -> list[tuple[int, float]]:
    """One position's top log-probabilities (``token_id:N`` keys) as (id, p), best first."""
    import math
    out = [(int(str(key).rpartition(":")[2]), math.exp(float(lp))) for key, lp in (entry or {}).items()]
    return sorted(out, key=lambda item: -item[1])


def result_of(answer: dict[str, Any], wall_s: float, probs: bool) -> RequestResult:
    """A completion as the seam's request result."""
    choice = answer["choices"][0]
    metrics = answer.get("metrics") or {}
    spec = metrics.get("speculative_decoding") or {}
    nan = float("nan")
    ttft, gen = metrics.get("time_to_first_token_ms"), metrics.get("generation_time_ms")
    tops = None
    if probs:
        tops = [top_probs(e) for e in ((choice.get("logprobs") or {}).get("top_logprobs") or [])]
    tokens = [int(t) for t in choice.get("token_ids") or []]
    accepted, steps = int(spec.get("num_accepted_draft_tokens") or 0), int(spec.get("num_spec_steps") or 0)
    # target passes after the prompt's: the verify steps, and a plain step per token neither they nor the prompt's pass
    # made (none where the last step's accepted tokens ran past max_tokens)
    passes = steps + max(0, len(tokens) - 1 - accepted - steps) if spec else None
    return RequestResult(tokens, wall_s,
                         float(ttft) / 1e3 if ttft is not None else nan, float(gen) / 1e3 if gen is not None else nan,
                         drafted=int(spec.get("num_draft_tokens") or 0),
                         accepted=accepted, passes=passes,
                         accepted_per_pos=per_position(spec.get("acceptance_histogram")), top_probs=tops)


class VllmEngine:
    """Servers for a target folder (and a draft folder), one per configuration, stopped by ``close``."""

    name = "vllm"

    def __init__(self, settings: VllmSettings, target: str | Path, draft: str | Path | None,
                 log_dir: str | Path | None = None) -> None:
        self.settings, self.target, self.draft = settings, str(target), str(draft) if draft else None
        self.log_dir = Path(log_dir) if log_dir else None
        self._servers: dict[tuple, VllmServer] = {}  # in order of last use: the first is closed first for room

    def _spec(self, model: str, config: dict[str, Any] | None, port_offset: int) -> VllmSpec:
        s = self.settings
        return VllmSpec(python=s.python, model=model, dtype=s.dtype, device=s.device,
                        speculative_config=spec_json(config), eager=s.eager, max_model_len=s.max_model_len,
                        threads_bind=s.threads_bind, kv_cache_gib=s.kv_cache_gib,
                        gpu_memory_utilization=s.gpu_memory_utilization, max_num_seqs=s.max_num_seqs,
                        extra_args=tuple(s.extra_args), port=s.port + port_offset if s.port else 0,
                        startup_timeout_s=s.startup_timeout_s, cpu_expand_fix=s.cpu_expand_fix)

    def server(self, arm: Arm = PLAIN, role: str = "target") -> VllmServer:
        """The server of a configuration (``role`` draft: the draft model alone), started and warmed on first use."""
        model = self.draft if role == "draft" else self.target
        if model is None:
            raise ValueError("this vLLM engine has no draft model folder")
        config = None if role == "draft" else speculative_config(arm, self.draft)
        key = (model, spec_json(config))
        if key in self._servers:
            self._servers[key] = self._servers.pop(key)  # the most recently used last
        else:
            self.make_room(model, config)
            name = "vllm-server (" + (f"speculative_config {spec_json(config)}" if config else f"{role} alone") + ")"
            server = VllmServer(self._spec(model, config, len(self._servers)), name, self.log_dir).start()
            self._servers[key] = server
            server.completion({"prompt": [0, 1, 2, 3], "max_tokens": WARM_TOKENS, "temperature": 0.0})
        return self._servers[key]

    def needs_bytes(self, model: str, config: dict[str, Any] | None) -> int:
        """A CPU server's estimated resident memory: its weights (the target's, the draft model's where it runs one),
        its KV cache and the runtime (``RUNTIME_BYTES``)."""
        folders = [model] + ([str(config["model"])] if config and config.get("model") else [])
        return sum(weight_bytes(f) for f in folders) + int(self.settings.kv_cache_gib * 2**30) + RUNTIME_BYTES

    def make_room(self, model: str, config: dict[str, Any] | None) -> None:
        """Close the least recently used servers until a new one fits: in the host's available memory on CPU, in
        ``GPU_SHARE`` of the GPU's by their gpu_memory_utilization. A job comparing more configurations than fit at
        once (the Qwen pair's servers take 7-8 GB each here) restarts servers as it moves between them."""
        import psutil
        need = self.needs_bytes(model, config) if self.settings.device != "cuda" else 0
        while self._servers:
            if self.settings.device == "cuda":
                short = (len(self._servers) + 1) * self.settings.gpu_memory_utilization > GPU_SHARE
                what = f"{len(self._servers) + 1} x gpu_memory_utilization {self.settings.gpu_memory_utilization:g}"
            else:
                free = psutil.virtual_memory().available
                short, what = need > free, f"{need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB available"
            if not short:
                return
            key, server = next(iter(self._servers.items()))
            del self._servers[key]
            log.info(f"vLLM: closing {server.name} to make room for another ({what})")
            server.close()
            time.sleep(1.0)  # the closed processes' memory returns to the host

    def generate(self, arm: Arm, ids: list[int], n_new: int, sampling: dict[str, Any] | None = None,
                 n_probs: int = 0) -> RequestResult:
        """One request for up to ``n_new`` tokens after ``ids``, by the server of ``arm``."""
        server = self.server(arm)
        payload: dict[str, Any] = {"prompt": [int(t) for t in ids], "max_tokens": int(n_new), "return_token_ids": True,
                                   **(sampling or sampling_payload(False, 1, 0, 1, 0))}
        if n_probs:
            payload.update(logprobs=int(n_probs), return_tokens_as_token_ids=True)
        start = time.perf_counter()
        answer = server.completion(payload)
        return result_of(answer, time.perf_counter() - start, bool(n_probs))

    def next_token_probs(self, ids: list[int], n_probs: int) -> list[tuple[int, float]]:
        """The plain server's top-``n_probs`` probabilities of the token after ``ids``."""
        r = self.generate(PLAIN, ids, 1, n_probs=n_probs)
        return (r.top_probs or [[]])[0]

    def draws_after(self, arm: Arm, prefix: list[int], last: int, runs: int, sampling: dict[str, Any],
                    seed: int, workers: int = 8) -> tuple[dict[int, int], set[int], int]:
        """The token after ``prefix + [last]`` sampled through ``arm``'s speculative server: requests of three tokens
        after ``prefix`` with seeds ``seed``, ``seed + 1``, ... (the second token is the draw; the third keeps the
        verify step that made it whole: vLLM counts no proposal accepted in a step cut by max_tokens), kept where the
        first token came out as ``last`` and the first verify step checked a proposal there, until ``runs`` are kept
        or ``5 * runs`` sent (a context whose last token the target rarely samples gives few: the stage's max_tv
        contexts, along the greedy text, give many). Returns the kept second tokens' counts, the proposals seen
        accepted there, and the requests sent."""
        from concurrent.futures import ThreadPoolExecutor
        server = self.server(arm)
        counts: dict[int, int] = {}
        proposals: set[int] = set()
        sent = kept = 0

        def one(i: int) -> dict[str, Any]:
            return server.completion({"prompt": prefix, "max_tokens": 3, "return_token_ids": True, **sampling,
                                      "seed": (seed + i) % 2**31})

        with ThreadPoolExecutor(workers) as pool:
            # a context where the configuration rarely proposes (n-gram lookup without a match) gives up early
            while kept < runs and sent < 5 * runs and not (sent >= runs // 2 and kept == 0):
                batch = list(pool.map(one, range(sent, sent + 4 * workers)))
                sent += len(batch)
                for answer in batch:
                    tokens = [int(t) for t in answer["choices"][0].get("token_ids") or []]
                    spec = (answer.get("metrics") or {}).get("speculative_decoding") or {}
                    drafted, accepted = spec.get("per_step_drafted") or [], spec.get("per_step_accepted") or []
                    if len(tokens) < 2 or tokens[0] != last or not drafted or drafted[0] < 1 or kept >= runs:
                        continue
                    counts[tokens[1]] = counts.get(tokens[1], 0) + 1
                    kept += 1
                    if accepted and accepted[0] >= 1:
                        proposals.add(tokens[1])
        return counts, proposals, sent

    def _first_token_s(self, server: VllmServer, prompt: list[int], computed: int | None) -> float:
        answer = server.completion({"prompt": prompt, "max_tokens": 1, "temperature": 0.0})
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
        if computed is not None and len(prompt) - cached != computed:
            raise ServerError(f"{server.name} computed {len(prompt) - cached} prompt tokens where {computed} were "
                              "new (its prefix cache did not hold the context): cannot time a pass of that length")
        return float((answer.get("metrics") or {})["time_to_first_token_ms"]) / 1e3

    def block_size(self, server: VllmServer) -> int:
        """The KV cache's block size: the prefix cache holds whole blocks only."""
        for line in server.metrics_text().splitlines():
            if line.startswith("vllm:cache_config_info"):
                for part in line[line.find("{") + 1:line.rfind("}")].split(","):
                    key, _, value = part.partition("=")
                    if key == "block_size":
                        return int(value.strip('"'))
        return 16

    def decode_step_s(self, ids: list[int], n_new: int, repeats: int, role: str = "target") -> list[float]:
        """Plain decoding steps: each request's mean time between its tokens (greedy, ``n_new`` tokens)."""
        server = self.server(PLAIN, role)
        out = []
        for _ in range(repeats):
            answer = server.completion({"prompt": [int(t) for t in ids], "max_tokens": int(n_new), "temperature": 0.0,
                                        "ignore_eos": True})
            out.append(float(answer["metrics"]["mean_itl_ms"]) / 1e3)
        return out

    def pass_times(self, ids: list[int], extension: list[int], lengths: list[int], repeats: int, warmup: int,
                   role: str = "target") -> tuple[int, dict[int, list[float]]]:
        """Seconds of the ``role`` model's pass over m new tokens after a cached context (``ids`` padded with its own
        tokens to whole cache blocks: the prefix cache holds whole blocks only), per m in ``lengths``, and that
        context's length: the m-token request's time to its first token,
        less what a request costs beyond its pass (the 1-token request's median less the median decoding step)."""
        server = self.server(PLAIN, role)
        block = self.block_size(server)
        ids, extension = [int(t) for t in ids], [int(t) for t in extension]
        whole = -(-len(ids) // block) * block  # the context padded with its own tokens to whole blocks
        base = (ids * (whole // max(len(ids), 1) + 1))[:whole]
        first: dict[int, list[float]] = {m: [] for m in sorted({1, *lengths})}
        for i in range(warmup + repeats):
            for j, m in enumerate(first):
                self._first_token_s(server, base, None)  # the context cached
                # a pass of a whole block or more would be cached by the last repeat: each repeat's first new token
                # differs (ids 100, 101, ...: in every vocabulary), so no block after the context matches
                new = extension[:m] if m < block else [100 + i * len(first) + j] + extension[1:m]
                t = self._first_token_s(server, base + new, m)
                if i >= warmup:
                    first[m].append(t)
        step = statistics.median(self.decode_step_s(base, 16, max(repeats, 3), role))
        overhead = statistics.median(first[1]) - step
        return len(base), {m: [max(t - overhead, 0.0) for t in first[m]] for m in lengths}

    def step_costs(self, ids: list[int], extension: list[int], ks: list[int], repeats: int,
                   warmup: int) -> tuple[float, float, dict[int, float]]:
        """Median target step, draft step (NaN without a draft) and check over k proposals (a pass over k + 1)."""
        target = statistics.median(self.decode_step_s(ids, 16, max(repeats, 1)))
        draft = (statistics.median(self.decode_step_s(ids, 16, max(repeats, 1), "draft")) if self.draft
                 else float("nan"))
        verify = {}
        if ks:
            _, times = self.pass_times(ids, extension, [k + 1 for k in ks], repeats, warmup)
            verify = {k: statistics.median(times[k + 1]) for k in ks}
        return target, draft, verify

    def server_pids(self) -> list[int]:
        """Every process of every server (the API server, its engine core and worker)."""
        import psutil
        out = []
        for s in self._servers.values():
            if s.proc is None:
                continue
            try:
                p = psutil.Process(s.proc.pid)
                out += [p.pid, *(c.pid for c in p.children(recursive=True))]
            except psutil.Error:
                pass
        return out

    def close(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            s.close()

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
