"""llama.cpp as an engine: one ``llama-server`` per configuration, asked for token ids and its own timings.

The draft settings of llama.cpp are server options, so each speculative configuration (``llama_arms``) gets a
server of its own, started on first use and kept for the job; plain decoding is a server with the target
alone, and the draft model's step is timed on a server of the draft alone. Requests carry token ids (the
same ids speclab's loop reads), so both engines answer the same contexts.

What a request returns (``EngineRun``): the tokens, the wall time the client saw (the user's latency), the
server's own split into prompt and decode (``timings.prompt_ms`` / ``predicted_ms``), and its counters
(``draft_n`` drafted, ``draft_n_accepted`` accepted). A verification pass over m new tokens is timed as the
server's prompt processing of a cached prompt extended by m tokens (``timings.prompt_ms`` with
``prompt_n`` = m): that is the target's batch of m tokens at the prompt's context, the pass a check of
m - 1 proposals makes.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclab.specs.arms import PLAIN, Arm
from engines.llama_cpp.arms import flags
from engines.llama_cpp.server import LlamaServer, ServerSpec
from speclab.models.gguf_header import read_metadata

# GGUF general.file_type -> llama.cpp's name for the weights' type (the dtype column of llama.cpp rows)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 32: "BF16"}


@dataclass(frozen=True)
class LlamaSettings:
    """How the servers run (all recorded in provenance through the job's config)."""

    binary: str
    threads: int = 2
    ctx_size: int = 2048
    cache_prompt: bool = False     # false: every request prefills its prompt, as speclab's loop does
    port: int = 0
    startup_timeout_s: float = 180.0
    extra_args: tuple[str, ...] = ()


@dataclass
class EngineRun:
    """One request: what came back and how long it took, as the engine itself counts."""

    tokens: list[int]
    wall_s: float             # client-side, request sent to answer read
    prompt_s: float           # the server's prompt processing
    decode_s: float           # the server's generation
    prompt_n: int
    drafted: int = 0
    accepted: int = 0
    top_probs: list[list[tuple[int, float]]] = field(default_factory=list)  # per new token: (id, p), best first

    @property
    def iterations(self) -> int:
        """Target passes after the prompt's: every pass yields one token of its own beside the accepted ones."""
        return max(len(self.tokens) - self.accepted, 0)


def top_probs(item: dict[str, Any]) -> list[tuple[int, float]]:
    """One position of an answer's ``completion_probabilities``: (token id, probability), best first."""
    return [(int(p["id"]), math.exp(float(p["logprob"]))) for p in item.get("top_logprobs") or []]


def check_cached(answer: dict[str, Any], new: int) -> dict[str, Any]:
    """The answer's timings, once they say the server processed exactly the ``new`` tokens sent after a cached
    prompt (RuntimeError otherwise: a pass timed over the whole prompt would not be the pass meant)."""
    t = answer.get("timings") or {}
    if int(t.get("prompt_n") or -1) != new:
        raise RuntimeError(f"llama-server processed {t.get('prompt_n')} prompt tokens where {new} new ones were sent "
                           "after a cached prompt: its prompt cache did not hold")
    return t


def gguf_type(path: str | Path) -> str:
    """The weights' type of a GGUF file (``Q4_K_M``), from its header."""
    code = read_metadata(path).get("general.file_type")
    return FILE_TYPES.get(code, f"type{code}")


def gguf_vocab(path: str | Path) -> int | None:
    meta = read_metadata(path)
    tokens = meta.get("tokenizer.ggml.tokens")
    return tokens[1] if isinstance(tokens, tuple) else None


def check_pair(target: str | Path, draft: str | Path) -> None:
    """A draft llama.cpp can pair with the target: the same vocabulary (one-line ValueError otherwise)."""
    vt, vd = gguf_vocab(target), gguf_vocab(draft)
    if vt is not None and vd is not None and vt != vd:
        raise ValueError(f"draft GGUF {str(draft)!r} has a vocabulary of {vd} tokens, the target {str(target)!r} "
                         f"{vt}: a llama.cpp draft must share the target's vocabulary")


def sampling_payload(do_sample: bool, temperature: float, top_k: int, top_p: float, seed: int) -> dict[str, Any]:
    """llama.cpp's sampler settings for speclab's sampling config; its other samplers switched off."""
    if not do_sample:
        return {"temperature": 0.0, "top_k": 1}
    return {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p), "min_p": 0.0,
            "typical_p": 1.0, "repeat_penalty": 1.0, "seed": int(seed) % 2**32,
            "samplers": ["top_k", "top_p", "temperature"]}


class LlamaCppEngine:
    """Servers for a target GGUF (and a draft GGUF), one per configuration, stopped by ``close``."""

    name = "llama_cpp"

    def __init__(self, settings: LlamaSettings, target_gguf: str | Path, draft_gguf: str | Path | None,
                 log_dir: str | Path | None = None) -> None:
        self.settings, self.target, self.draft = settings, str(target_gguf), str(draft_gguf) if draft_gguf else None
        if self.draft:
            check_pair(self.target, self.draft)
        self.log_dir = Path(log_dir) if log_dir else None
        self._servers: dict[tuple, LlamaServer] = {}

    def _spec(self, model: str, args: list[str], port_offset: int, slots: int = 1) -> ServerSpec:
        s = self.settings
        return ServerSpec(binary=s.binary, model=model, args=(*args, *s.extra_args), threads=s.threads,
                          ctx_size=s.ctx_size, port=s.port + port_offset if s.port else 0,
                          startup_timeout_s=s.startup_timeout_s, slots=slots)

    def server(self, arm: Arm = PLAIN, role: str = "target", slots: int = 1) -> LlamaServer:
        """The server of a configuration with ``slots`` slots (``role`` draft: the draft model alone), started on
        first use."""
        model = self.draft if role == "draft" else self.target
        if model is None:
            raise ValueError("this llama.cpp engine has no draft GGUF file")
        args = [] if role == "draft" else flags(arm, self.draft)
        key = (model, tuple(args)) + ((slots,) if slots != 1 else ())
        if key not in self._servers:
            name = "llama-server (" + (" ".join(args) if args else f"{role} alone") + (
                f", --parallel {slots}" if slots != 1 else "") + ")"
            spec = self._spec(model, args, len(self._servers), slots)
            self._servers[key] = LlamaServer(spec, name, self.log_dir).start()
        return self._servers[key]

    def generate(self, arm: Arm, ids: list[int], n_new: int, sampling: dict[str, Any] | None = None,
                 n_probs: int = 0, slots: int = 1) -> EngineRun:
        """One request for up to ``n_new`` tokens after ``ids``, by the server of ``arm`` with ``slots`` slots."""
        server = self.server(arm, slots=slots)
        payload = {"prompt": [int(t) for t in ids], "n_predict": int(n_new), "cache_prompt": self.settings.cache_prompt,
                   "return_tokens": True, "stream": False, **(sampling or sampling_payload(False, 1, 0, 1, 0))}
        if n_probs:
            payload.update(n_probs=int(n_probs), post_sampling_probs=False)
        start = time.perf_counter()
        answer = server.post("/completion", payload)
        wall = time.perf_counter() - start
        t = answer.get("timings", {})
        probs = [top_probs(item) for item in answer.get("completion_probabilities", [])] if n_probs else []
        return EngineRun(tokens=[int(x) for x in answer.get("tokens", [])], wall_s=wall,
                         prompt_s=float(t.get("prompt_ms", float("nan"))) / 1e3,
                         decode_s=float(t.get("predicted_ms", float("nan"))) / 1e3, prompt_n=int(t.get("prompt_n", 0)),
                         drafted=int(t.get("draft_n", 0) or 0), accepted=int(t.get("draft_n_accepted", 0) or 0),
                         top_probs=probs)

    def pass_times(self, ids: list[int], extension: list[int], lengths: list[int], repeats: int, warmup: int,
                   role: str = "target") -> dict[int, list[float]]:
        """Seconds of the ``role`` model's pass over m new tokens after ``ids``, per m in ``lengths``: the prompt
        cached, then extended by the first m tokens of ``extension`` (timings.prompt_ms, prompt_n checked)."""
        server = self.server(PLAIN, role)
        out: dict[int, list[float]] = {m: [] for m in lengths}
        base = [int(t) for t in ids]
        for i in range(warmup + repeats):
            for m in lengths:
                server.post("/completion", {"prompt": base, "n_predict": 1, "cache_prompt": True, "temperature": 0.0})
                answer = server.post("/completion", {"prompt": base + [int(t) for t in extension[:m]], "n_predict": 1,
                                                     "cache_prompt": True, "temperature": 0.0})
                t = check_cached(answer, m)
                if i >= warmup:
                    out[m].append(float(t["prompt_ms"]) / 1e3)
        return out

    def step_costs(self, ids: list[int], extension: list[int], ks: list[int], repeats: int,
                   warmup: int) -> tuple[float, float, dict[int, float]]:
        """Median target step, draft step (NaN without a draft) and check over k proposals (a pass over k + 1)."""
        lengths = sorted({1, *(k + 1 for k in ks)})
        target = self.pass_times(ids, extension, lengths, repeats, warmup)
        draft = (statistics.median(self.pass_times(ids, extension, [1], repeats, warmup, "draft")[1])
                 if self.draft else float("nan"))
        return statistics.median(target[1]), draft, {k: statistics.median(target[k + 1]) for k in ks}

    def server_pids(self) -> list[int]:
        return [s.proc.pid for s in self._servers.values() if s.proc is not None]

    def close(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            s.close()

    def __enter__(self) -> LlamaCppEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
