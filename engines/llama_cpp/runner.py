"""llama.cpp as the engine of a job: its servers started on the pair's GGUF files, the stages' requests answered by
them, its costs timed as its own passes (engines/llama_cpp/client.py). It answers the engine seam
(pipeline/engines/base.py ``Engine``): one row per request in acceptance (the server's counters), the top-2
probabilities of its own passes for divergence, and refusals of what only speclab's loop runs (``check``).

The pair's target must be a GGUF model (a packaged model name or a ``.gguf`` path): llama.cpp runs the file as
shipped (SmolLM2 Q4_1, the Qwen pair Q4_K_M). Its draft is ``engine.draft_model`` when set, else the pair's
draft when that names a GGUF model, else the target's own file (a copy: a torch variant such as ``int8`` has no
llama.cpp form). Prompts become token ids with the target's own tokenizer, so both engines answer the same ids.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import SPECLAB
from pipeline.engines.option_checks import (LOOP_ONLY, PLAN_PRESETS, check_request_entry, refuse_engine_keys,
                                            refuse_loop_groups)
from pipeline.engines.base import RequestResult
from pipeline.engines.server_engine import ServerEngine
from speclab.specs.arms import PLAIN, RECOMMENDED, Arm, ArmEntry
from engines.llama_cpp import arms as llama_arms
from engines.llama_cpp.client import (EngineRun, LlamaCppEngine, LlamaSettings, check_cached, gguf_type,
                                       sampling_payload, top_probs as position_probs)
from speclab.models.gguf_header import read_metadata
from store.layout import STAGES

log = logging.getLogger("speclab")
RUNS_ON_LLAMA = tuple(part for part in STAGES if part not in LOOP_ONLY)


ARMS_TEXT = "llama.cpp's drafter: model or an n-gram type, ks, settings, default"


def check_options(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse what llama.cpp cannot run (ConfigError, one line): speclab's own drafters, k policies, arms, trees,
    prefill timing and tie_ulps (its stage parts are ``LlamaRunner.stage_parts``, checked before)."""
    from pipeline.jobs.arms import stage_entries
    refuse_loop_groups(cfg, "llama_cpp", ARMS_TEXT)
    for e in stage_entries(cfg):
        check_entry(e)
    refuse_engine_keys(cfg, parts, SPECLAB, PLAN_PRESETS if "plan" in parts else ())


def check_entry(e: ArmEntry) -> None:
    """An arm entry llama.cpp runs: its speculative types and their settings, or the plan's choice (one line)."""
    check_request_entry(e, "llama_cpp", ARMS_TEXT, "llama.cpp drafts chains at ks or its own settings (e.g. "
                        "{drafter: model, ks: [4], settings: {p_min: 0.8}})", llama_arms.check_settings)


def find_binary(binary: str) -> str:
    """The llama-server to run: ``engine.binary``, else the cached build of ``make llama-cpp``."""
    if binary:
        return binary
    from engines.llama_cpp.build import installed
    found = installed()
    if found is None:
        raise ValueError("engine=llama_cpp needs a llama-server build: run `make llama-cpp` (builds it into the speclab "
                         "cache) or give your own with engine.binary=PATH")
    return str(found / "llama-server")


def gguf_of(name: str, what: str) -> Path:
    """The GGUF file of a packaged model name or a ``.gguf`` path (one-line ValueError otherwise)."""
    from speclab.models.loading import PACKAGED_GGUF, PARTED_GGUF, packaged_gguf_path
    if name in PACKAGED_GGUF or name in PARTED_GGUF:
        return packaged_gguf_path(name)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"{what}={name!r}: no such GGUF file")
        try:  # its header read here, so a file that is not GGUF fails before any server starts
            read_metadata(path)
        except (ValueError, OSError, OverflowError, MemoryError) as err:
            raise ValueError(f"{what}={name!r} is not a GGUF file llama.cpp can load: {err}") from None
        return path
    raise ValueError(f"{what}={name!r} is not a GGUF model llama.cpp can run: use one of "
                     f"{sorted([*PACKAGED_GGUF, *PARTED_GGUF])} or a path ending in .gguf")


def draft_source(cfg: DictConfig) -> tuple[Path, str]:
    """The draft GGUF and how the rows name it."""
    from speclab.models.loading import PACKAGED_GGUF, PARTED_GGUF
    chosen = str(OmegaConf.select(cfg, "engine.draft_model", default="") or "")
    if chosen:
        return gguf_of(chosen, "engine.draft_model"), Path(chosen).stem if chosen.endswith(".gguf") else chosen
    draft = str(cfg.pair.draft)
    if draft in PACKAGED_GGUF or draft in PARTED_GGUF or draft.endswith(".gguf"):
        return gguf_of(draft, "pair.draft"), draft
    return gguf_of(str(cfg.pair.target), "pair.target"), f"{cfg.pair.target} (copy)"


def expand_arms(entries: list[ArmEntry], ks: list[int]) -> list[Arm]:
    """Plain, then each entry's arms (one per k; ``default``: llama.cpp's own settings for the type; the plan's
    choice for the prompt's kind where an entry is {method: recommended})."""
    out = [PLAIN]
    for e in entries:
        if e.method == "recommended":
            out.append(RECOMMENDED)
            continue
        drafter = str(e.drafter or "model")
        if e.default or llama_arms.SPEC_TYPES[drafter].k_flag is None:
            out.append(llama_arms.arm(drafter, None, e.settings, default=True))
            continue
        out += [llama_arms.arm(drafter, int(k), e.settings) for k in (e.ks or ks)]
    return list(dict.fromkeys(out))


def result_of(run: EngineRun, probs: bool) -> RequestResult:
    """A server's answer as the seam's request result (no per-position counts: the server does not report them)."""
    return RequestResult(run.tokens, run.wall_s, run.prompt_s, run.decode_s, drafted=run.drafted,
                         accepted=run.accepted, top_probs=run.top_probs if probs else None)


class LlamaRunner(ServerEngine):
    payload = staticmethod(sampling_payload)
    name = "llama_cpp"
    stage_parts = RUNS_ON_LLAMA
    default_arms = ({}, {"drafter": "ngram-simple", "default": True})  # its draft model at stage.ks, n-gram lookup

    def __init__(self, name: str = "llama_cpp", binary: str = "", threads: int = 2, ctx_size: int = 2048,
                 cache_prompt: bool = False, port: int = 0, startup_timeout_s: float = 180.0, draft_model: str = "",
                 extra_args: list[str] | None = None) -> None:
        super().__init__()
        self.name = name
        self.settings = dict(binary=binary, threads=int(threads), ctx_size=int(ctx_size), cache_prompt=bool(cache_prompt),
                             port=int(port), startup_timeout_s=float(startup_timeout_s),
                             extra_args=tuple(str(a) for a in (extra_args or ())))

    # -- set-up -------------------------------------------------------------------------------------------------
    def context(self, cfg: DictConfig, prompts):
        from engines.llama_cpp.client import gguf_vocab
        from speclab.models.gguf_header import config_from_gguf
        from speclab.models.loading import ModelPair, load_tokenizer

        target = gguf_of(str(cfg.pair.target), "pair.target")
        draft, self.draft_label = draft_source(cfg)
        settings = LlamaSettings(**{**self.settings, "binary": find_binary(self.settings["binary"])})
        self._weights = f"gguf:{gguf_type(target)}"
        log_dir = Path(str(cfg.outputs_dir)) / ".llama-server"
        self.engine = LlamaCppEngine(settings, target, draft, log_dir)
        log.info(f"llama.cpp: {settings.binary}; target {target.name} ({gguf_type(target)}), draft {draft.name} "
                 f"({self.draft_label}); {settings.threads} threads, context {settings.ctx_size}")
        tok = load_tokenizer(str(cfg.pair.target))
        eos = tok.eos_token_id if tok is not None else None
        pair = ModelPair(None, None, tok, str(cfg.pair.target), self.draft_label, torch.device("cpu"), eos)
        limit = min(settings.ctx_size, int(config_from_gguf(target).get("max_position_embeddings") or settings.ctx_size))
        return self.request_context(cfg, prompts, pair, limit, gguf_vocab(target), {
            "binary": settings.binary, "target_gguf": str(target), "draft_gguf": str(draft), "threads": settings.threads,
            "ctx_size": settings.ctx_size, "cache_prompt": settings.cache_prompt, "extra_args": list(settings.extra_args)})

    def compute_threads(self) -> int | None:
        return self.settings.get("threads") or None  # the servers' (-t)

    @classmethod
    def check(cls, cfg: DictConfig, parts: list[str]) -> None:
        check_options(cfg, parts)

    @classmethod
    def arm_text(cls, arm: Arm) -> str:
        """The flags a user adds to their llama-server command."""
        return llama_arms.pasted_flags(arm)

    @classmethod
    def expand(cls, entries: list[ArmEntry], ks: list[int]) -> list[Arm]:
        return expand_arms(entries, ks)

    # -- the speed stage's questions ------------------------------------------------------------------------------
    def warm_arms(self, arms: list[Arm]) -> list[Arm]:
        return list(arms)  # each configuration is a server of its own: every one starts and answers once

    def request(self, ctx, arm: Arm, ids: torch.Tensor, gen=None, n_probs: int = 0,
                greedy: bool = False) -> RequestResult:
        sampling = sampling_payload(False, 1.0, 0, 1.0, 0) if greedy else self.sampling(ctx.cfg, gen)
        r = self.engine.generate(arm, ids[0].tolist(), int(ctx.cfg.max_new_tokens), sampling, n_probs)
        return result_of(r, bool(n_probs))

    # -- a load: one server per configuration and slot count (--parallel) ----------------------------------------------
    def prepare_load(self, ctx, arm: Arm, concurrency: int) -> None:
        """The server of ``arm`` with ``concurrency`` slots, started here (the main thread) and answering once."""
        self.engine.generate(arm, ctx.inputs[ctx.prompts[0].id][0].tolist(), 4, sampling_payload(False, 1, 0, 1, 0),
                             slots=concurrency)

    def load_request(self, ctx, arm: Arm, ids: torch.Tensor, concurrency: int) -> RequestResult:
        r = self.engine.generate(arm, ids[0].tolist(), int(ctx.cfg.max_new_tokens), self.sampling(ctx.cfg, None),
                                 slots=concurrency)
        return result_of(r, False)

    @classmethod
    def load_switch(cls, arm: Arm, up_to: int) -> str:
        return llama_arms.load_switch(arm, up_to)

    def speculative_arm(self, ctx, k: int) -> Arm:
        """The draft model's configuration at k (divergence compares it with the plain server)."""
        return llama_arms.arm("model", k)

    def top_probs(self, ids: list[int], n_probs: int, batch: int = 0) -> list[tuple[int, float]]:
        """The target's own top-``n_probs`` probabilities (full softmax, best first) of the token after ``ids``,
        its logits from one pass over the last ``batch`` tokens after the rest cached (0: one pass over all of
        ``ids``): the same next token computed in another batch shape than plain decoding's one-token steps."""
        server = self.engine.server(PLAIN)
        base = [int(t) for t in ids]
        cached = len(base) - batch if 0 < batch < len(base) else 0
        if cached:
            server.post("/completion", {"prompt": base[:cached], "n_predict": 1, "cache_prompt": True,
                                        "temperature": 0.0})
        answer = server.post("/completion", {"prompt": base, "n_predict": 1, "cache_prompt": bool(cached),
                                             "temperature": 0.0, "n_probs": int(n_probs),
                                             "post_sampling_probs": False})
        if cached:
            check_cached(answer, len(base) - cached)
        return position_probs((answer.get("completion_probabilities") or [{}])[0])

    def model_sizes(self, ctx=None) -> dict[str, Any]:
        """The timing stage's size columns from the GGUF files: bytes on disk as llama.cpp maps them, decoder
        layers from the header (parameters are not in a GGUF header: left empty)."""
        from speclab.models.gguf_header import config_from_gguf
        out: dict[str, Any] = {}
        for role, path in (("target", self.engine.target), ("draft", self.engine.draft or self.engine.target)):
            layers = config_from_gguf(path).get("num_hidden_layers")
            out.update({f"{role}_params": None, f"{role}_bytes": Path(path).stat().st_size,
                        f"{role}_layers": int(layers) if layers is not None else None})
        return out

    def context_limit(self) -> tuple[int, str]:
        return int(self.settings["ctx_size"]), "llama.cpp's context, engine.ctx_size,"

    def timed_passes(self, ids: list[int], extension: list[int], lengths: list[int], repeats: int, warmup: int,
                     role: str) -> tuple[int, dict[int, list[float]]]:
        """The server's processing of the cached context extended by m tokens (client.py ``pass_times``)."""
        return len(ids), self.engine.pass_times(ids, extension, lengths, repeats, warmup, role)

    def block_step_times(self, ctx, ids: torch.Tensor) -> dict[str, float]:
        repeats = int(ctx.cfg.stage.block_timing_repeats)
        if not repeats:
            return {"block_target_step_s": math.nan, "block_draft_step_s": math.nan}
        t, d, _ = self.engine.step_costs(ids[0].tolist(), self.extension(ctx, ids, str(ids.shape[1])), [], repeats, 1)
        return {"block_target_step_s": t, "block_draft_step_s": d}

