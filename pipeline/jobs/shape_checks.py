"""Shapes that would take the machine down, refused before any model loads (one line each, with the estimate).

A job's trees (tree entries of ``stage.arms``), the largest k, the timing stage's tree nodes
and pass lengths and the batch sizes each make one forward pass and grow the caches. Their memory is
estimated (speclab/models/memory.py) from the pair's config, read without weights
(speclab/models/configs.py), and compared with what the machine has free now: a shape that does not fit is
refused with its estimate, before anything is allocated. A tree asking more candidates per node than the
draft's vocabulary has, and tree arms on a model that takes no 4-D tree mask (ALiBi: Bloom, MPT) or keeps
sliding-window layers, are refused here too.

Estimates are high on purpose; when the pair's config cannot be read before its first load, the sizes of a
large model stand in (said in the message) and the models' weights are not counted.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import ConfigError
from pipeline.jobs.context import job_k_max
from pipeline.jobs.arms import engine_type, stage_entries
from pipeline.prompts.prompt import Prompt
from speclab.models.memory import (CONSERVATIVE, PY_CANDIDATE, ModelDims, PassCost, available_memory,
                                     dims_from_config, pass_cost, size)
from speclab.models.configs import model_config
from speclab.specs.tree_shapes import TreeSpec, parse_tree, too_many_children
from speclab.trees.support import causal_lm_class, known_tree_ready, tree_mask_problem

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 4}  # int8: dynamic quantization computes in fp32
VARIANT_BYTES = {"bf16": 2, "fp16": 2}
TEMPLATE_TOKENS = 256  # a chat template's tokens around one turn, at most (a default system prompt included)
CHAIN_INSTEAD = "use a chain (drafter model, prompt_lookup or hybrid) with this pair"


@dataclass(frozen=True)
class Model:
    """One model of the pair as the check sizes it."""

    dims: ModelDims
    config: dict[str, Any] | None
    weights: float  # bytes; 0 when unknown


@dataclass(frozen=True)
class Need:
    """What one shape needs: the target's pass and the draft's side, on top of both models' weights."""

    verify: PassCost
    draft: float
    weights: float

    @property
    def total(self) -> float:
        return self.verify.total + self.draft + self.weights


def _variant(draft: str) -> bool:
    return draft in ("copy", "int8", "bf16", "fp16") or draft.startswith("layers:")


def _model(config: dict[str, Any] | None, dtype: str, int8: bool = False) -> Model:
    dims = dims_from_config(config, DTYPE_BYTES[dtype])
    if dims is None:
        return Model(CONSERVATIVE, config, 0.0)
    return Model(dims, config, dims.weight_bytes / 4 if int8 else dims.weight_bytes)


def pair_models(cfg: DictConfig) -> tuple[Model, Model]:
    """The pair's target and draft, sized from their configs (no weights read)."""
    p = cfg.pair
    t_config, _ = model_config(str(p.target))
    target = _model(t_config, str(p.dtype))
    draft = str(p.draft)
    if not _variant(draft):
        d_config, _ = model_config(draft)
        d_type = str(p.draft_dtype or p.dtype)
        return target, _model(d_config, d_type, int8=d_type == "int8")
    if target.config is None:
        return target, target
    if draft == "int8":
        return target, _model(t_config, "float32", int8=True)
    if draft in VARIANT_BYTES:
        dims = target.dims.with_bytes(VARIANT_BYTES[draft])
        return target, Model(dims, t_config, dims.weight_bytes)
    if draft.startswith("layers:") and draft[7:].isdigit():
        dims = replace(target.dims, layers=max(1, min(int(draft[7:]), target.dims.layers)))
        return target, Model(dims, t_config, dims.weight_bytes)
    return target, target


def prompt_tokens(prompts: list[Prompt], max_new_tokens: int) -> int:
    """The most tokens a prompt's context can have: a token is at least one byte of its text; every turn may
    bring a chat template's words, and every earlier turn the model's answer of up to ``max_new_tokens``."""
    return max((sum(len(t.encode()) + TEMPLATE_TOKENS for t in p.turns) + (len(p.turns) - 1) * max_new_tokens
                for p in prompts), default=TEMPLATE_TOKENS)


@dataclass(frozen=True)
class Shape:
    """One shape of the job: its config key and value as shown, what it is, its size ``n`` (nodes, k, rows,
    tokens) and what a size needs (``need(n)``)."""

    key: str
    what: Callable[[int], str]
    n: int
    need: Callable[[int], Need]
    unit: str  # how the advice names a smaller size


def _tree_arms(cfg: DictConfig) -> list[tuple[str, TreeSpec]]:
    out = []
    for e in stage_entries(cfg):
        if e.tree is not None:
            tree = parse_tree(e.tree)
            out.append((f"stage.arms entry {{tree: '{tree.label}'}}", tree))
    return out


def _ints(cfg: DictConfig, key: str) -> list[int]:
    value = OmegaConf.select(cfg, key)
    return [int(x) for x in value] if value else []


def job_shapes(cfg: DictConfig, prompts: list[Prompt], target: Model, draft: Model) -> list[Shape]:
    """Every shape the job runs, each with its estimate."""
    st, n_new = cfg.stage, int(cfg.max_new_tokens)
    t, d = target.dims, draft.dims
    limit = t.positions or 10**12
    prompt = min(prompt_tokens(prompts, n_new), limit)
    k_max = max(1, min(job_k_max(cfg), max(n_new - 1, 1)))
    ctx = min(prompt + n_new + k_max + 1, limit)  # the columns before a tree or a chain's proposals
    pending = prompt if bool(cfg.merge_prefill) else 1  # the first pass also feeds the prompt
    weights = target.weights + draft.weights
    draft_cache = ctx * d.kv_per_token
    shapes: list[Shape] = []

    for key, tree in _tree_arms(cfg):
        size_ = tree.size(d.vocab, max(n_new - 1, 0), ctx)
        side = draft_cache if tree.family != "lookup" else 0.0
        if tree.family != "lookup":
            w = size_.draft_widest
            side += size_.draft_fed * d.kv_per_token + pass_cost(d, 1, w, ctx + size_.draft_fed, w, tree=True).total
            side += size_.candidates * PY_CANDIDATE + w * min(tree.children_asked, d.vocab) * 12

        def need(n: int, side: float = side) -> Need:
            return Need(pass_cost(t, 1, pending + n, ctx + n, n + 1, tree=True), side, weights)

        shapes.append(Shape(key, lambda n, label=tree.label, cands=size_.candidates: (
            f"the verification pass of tree {label} ({n:,} nodes"
            + (f" kept of {cands:,} candidates" if cands > n else "") + f" after up to {ctx:,} context tokens)"),
            size_.nodes, need, "a smaller tree: at most about {n:,} nodes fit"))

    tree_nodes = _ints(cfg, "stage.tree_nodes")
    extra = max(_ints(cfg, "stage.context_extra") or [0])
    if tree_nodes:
        base = prompt + extra
        shapes.append(Shape(
            f"stage.tree_nodes={tree_nodes}", lambda n: f"the timed pass over {n:,} tree nodes after {base:,} tokens",
            max(tree_nodes), lambda n: Need(pass_cost(t, 1, 1 + n, base + 1 + n, n + 1, tree=True), 0.0, weights),
            "smaller node counts: at most about {n:,} fit"))

    shapes.append(Shape(
        f"k={k_max} (the largest k this job runs)", lambda n: f"a chain's verification pass over {n:,} proposals",
        k_max, lambda n: Need(pass_cost(t, 1, pending + n, ctx, n + 1), draft_cache, weights),
        "a smaller k: at most about {n:,} fits"))

    batch = _ints(cfg, "stage.batch_sizes") if "batch_sizes" in st else []
    rows = max(batch or [1])
    if batch:
        k_b = max(1, min(max(_ints(cfg, "stage.ks") or [int(cfg.k)]), max(n_new - 1, 1)))
        shapes.append(Shape(
            f"stage.batch_sizes={batch}", lambda n: f"a batch of {n:,} rows of up to {ctx:,} tokens",
            rows, lambda n: Need(pass_cost(t, n, pending + k_b, ctx, k_b + 1), n * draft_cache, weights),
            "smaller batches: at most about {n:,} rows fit"))
    lengths = _ints(cfg, "stage.pass_lengths")
    if lengths:
        shapes.append(Shape(
            f"stage.pass_lengths={lengths}" + (f" with stage.batch_sizes={batch}" if rows > 1 else ""),
            lambda n: f"a timed pass over {rows:,} x {n:,} new tokens after {prompt + extra:,}",
            max(lengths), lambda n: Need(pass_cost(t, rows, n, prompt + extra + n, 1), 0.0, weights),
            "shorter passes: at most about {n:,} tokens fit"))
    return shapes


def free_memory(device: str) -> tuple[int | None, str]:
    """Bytes the job may use now and what they are: free CUDA memory on a CUDA device (the job is about to
    open a context there anyway), else the machine's MemAvailable."""
    if device.startswith("cuda") or device == "auto":
        import torch

        if torch.cuda.is_available():
            index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
            return int(torch.cuda.mem_get_info(index)[0]), f"free on cuda:{index}"
    return available_memory(), "available (MemAvailable)"


def _largest(need: Callable[[int], Need], n: int, free: float) -> int:
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid).total <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_memory(shapes: list[Shape], free: int, what_free: str, note: str) -> None:
    for s in shapes:
        need = s.need(s.n)
        if need.total <= free:
            continue
        parts = need.verify.parts()
        for name, bytes_ in (("the draft's caches and lists", need.draft), ("the models' weights", need.weights)):
            if bytes_ >= 0.05 * 2**30:
                parts += f", {name} {size(bytes_)}"
        fits = _largest(s.need, s.n, free)
        advice = f"use {s.unit.format(n=fits)} here" if fits else "the pair alone does not fit here"
        raise ConfigError(f"{s.key}: about {size(need.total)} for {s.what(s.n)}: {parts}{note}; "
                          f"{size(free)} {what_free}: {advice}")


def check_vocabulary(trees: list[tuple[str, TreeSpec]], draft: Model) -> None:
    if not draft.dims.exact:
        return  # known once the draft loads: speclab.specs.tree_shapes.make_tree_drafter checks it there
    for key, tree in trees:
        if tree.family != "lookup" and (problem := too_many_children(tree, draft.dims.vocab)):
            raise ConfigError(f"{key}: {problem}")


def _sliding(config: dict[str, Any]) -> bool:
    text = config.get("text_config")
    c = {**config, **text} if isinstance(text, dict) else config
    types = c.get("layer_types")
    if isinstance(types, list):
        return "sliding_attention" in types
    return bool(c.get("sliding_window")) and c.get("use_sliding_window") is not False


def check_tree_support(cfg: DictConfig, trees: list[tuple[str, TreeSpec]], target: Model, draft: Model) -> None:
    """Tree arms (and timed tree passes) need models that take a 4-D tree mask; tree arms also plain
    full-attention caches. Models whose config is unknown before the load are checked when they load
    (speclab.trees.tree.check_tree_model)."""
    timed = _ints(cfg, "stage.tree_nodes")
    if not trees and not timed:
        return
    key = trees[0][0] if trees else f"stage.tree_nodes={timed}"
    roles = [("target", cfg.pair.target, target)]
    if any(tree.family != "lookup" for _, tree in trees):
        roles.append(("draft", cfg.pair.draft, draft))
    for role, name, model in roles:
        if model.config is None:
            continue
        cls = None if known_tree_ready(model.config) else causal_lm_class(model.config)
        problem = tree_mask_problem(cls, model.config) if cls is not None else None
        if problem:
            raise ConfigError(f"{key}: the {role} {name!r} cannot verify a tree: {problem}; {CHAIN_INSTEAD}")
        if trees and _sliding(model.config):
            arch = cls.__name__ if cls is not None else model.config.get("model_type")
            raise ConfigError(f"{key}: the {role} {name!r} ({arch}) has sliding-window layers: a tree draft needs "
                              f"plain full-attention layers; {CHAIN_INSTEAD}")


def check_shapes(cfg: DictConfig, prompts: list[Prompt], free: int | None = None) -> None:
    """Refuse, in one line and before any model loads, a shape the pair cannot run here (see the module doc).
    ``free``: the bytes to compare with (default: what the job's device has free now). An engine that does not load
    the pair in torch runs its own files (llama.cpp: GGUF as shipped, checked by its runner before a server starts)."""
    if not engine_type(cfg).recomputes_logits:
        return
    target, draft = pair_models(cfg)
    trees = _tree_arms(cfg)
    check_tree_support(cfg, trees, target, draft)
    what_free = "given"
    if free is None:
        free, what_free = free_memory(str(cfg.device))
    note = "" if target.dims.exact and draft.dims.exact else \
        "; the pair's sizes are unknown before its first load: those of a large model stand in"
    if free is not None:
        check_memory(job_shapes(cfg, prompts, target, draft), free, what_free, note)
    check_vocabulary(trees, draft)
