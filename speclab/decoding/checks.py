"""The loops' checks on their inputs, done once per call before any pass: prompt ids (dtype, device,
vocabulary range), EOS ids, draft/target vocabularies and the positions a call needs.

Each failure is a one-line ValueError naming the bad value and what is allowed; a deep IndexError or
a silently wrong run is what they replace. The prompts' id range is the only device read (one per call).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from speclab.decoding.k_policy import FixedK
from speclab.decoding.rows import check_budget


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` on one line (a tensor's repr spans lines), cut to ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def context_limit(model: torch.nn.Module) -> int | None:
    """The longest sequence a model's positions cover (None when its config does not say).

    A sliding-window model (Gemma 3) still has ``max_position_embeddings`` positions: its window
    limits what a layer attends to, not how long a sequence may be.
    """
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if limit else None


def vocab_size(model: torch.nn.Module) -> int | None:
    """The number of token ids a model knows: its config's ``vocab_size``, else its input embedding's rows."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    size = getattr(config, "vocab_size", None)
    if size:
        return int(size)
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return int(embed.num_embeddings) if isinstance(embed, torch.nn.Embedding) else None


def check_vocabularies(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """A draft token must mean the same thing to both models."""
    vt, vd = vocab_size(target), vocab_size(draft)
    if vt != vd:
        raise ValueError(f"vocabulary mismatch: target has {vt} tokens, draft has {vd}; "
                         "a draft must share the target's tokenizer")


def input_device(model: torch.nn.Module) -> torch.device | None:
    """Where a model takes its token ids: its input embedding's device (the first parameter's without one)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embed, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.device
    return next((p.device for p in model.parameters()), None)


def draft_models(drafter: object) -> list[torch.nn.Module]:
    """The language models behind a drafter (a draft model, a ModelDrafter, a hybrid's; none for prompt lookup)."""
    found: list[torch.nn.Module] = []
    todo, seen = [drafter], set()
    while todo:
        d = todo.pop()
        if d is None or id(d) in seen:
            continue
        seen.add(id(d))
        if isinstance(d, torch.nn.Module):
            found.append(d)
        else:  # ModelDrafter.model, HybridDrafter.model (a ModelDrafter), OneRow.drafter
            todo += [getattr(d, "model", None), getattr(d, "drafter", None)]
    return found


def eos_ids(eos_token_id: object, vocab: int | None = None) -> list[int]:
    """EOS ids as plain ints: None, one id or a list/tuple of them (numpy and 0-d tensor integers count)."""
    items = [] if eos_token_id is None else list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) \
        else [eos_token_id]
    ids = []
    for x in items:
        n = None
        if not isinstance(x, bool) and not (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
            try:
                n = operator.index(x)
            except TypeError:
                pass
        if n is None or n < 0 or (vocab is not None and n >= vocab):
            upto = f"0..{vocab - 1}" if vocab is not None else ">= 0"
            raise ValueError(f"eos_token_id={shown(eos_token_id)} is not allowed: use None, a token id (an integer "
                             f"in {upto}) or a list of them")
        ids.append(n)
    return ids


def _check_devices(device: torch.device, models: dict[str, torch.nn.Module]) -> None:
    if device.type == "meta":
        raise ValueError("the prompt token ids are on the meta device (no data): put them on the model's device "
                         f"({input_device(next(iter(models.values())))})")
    for role, model in models.items():
        where = input_device(model)
        if where is not None and where != device:
            raise ValueError(f"the prompt token ids are on {device} but the {role} model is on {where}: "
                             "put the prompts and the models on one device")


def _check_id_range(rows: list[torch.Tensor], vocab: int, whose: str) -> None:
    """One device read for every row's smallest and largest id."""
    lo_hi = torch.stack([torch.stack(p.aminmax()) for p in rows]).tolist()
    for i, (lo, hi) in enumerate(lo_hi):
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            which = f"prompt {i}" if len(rows) > 1 else "the prompt"
            raise ValueError(f"{which} holds token id {bad}: ids must be in 0..{vocab - 1} ({whose} vocabulary "
                             f"of {vocab} tokens)")


def proposal_bound(k: object, max_new_tokens: int) -> int:
    """The most proposals one iteration can make: a fixed k, a policy's ``k_max`` (``FixedK``: its k;
    a policy without a bound: the budget's), never more than the budget allows."""
    if not hasattr(k, "start"):
        bound = k  # a plain count, already checked
    else:
        bound = k.k if isinstance(k, FixedK) else getattr(k, "k_max", None)
    return max_new_tokens - 1 if bound is None else min(operator.index(bound), max_new_tokens - 1)


def check_positions(longest: int, max_new_tokens: int, proposals: int, models: dict[str, torch.nn.Module]) -> None:
    """The longest prompt, the new tokens and one iteration's proposals must fit every model's positions."""
    need = longest + max_new_tokens + proposals
    for role, model in models.items():
        limit = context_limit(model)
        if limit is not None and need > limit:
            extra = f" and up to {proposals} proposals" if proposals else ""
            raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed here: a prompt of {longest} tokens, "
                             f"{max_new_tokens} new tokens{extra} need {need} positions, more than the {role}'s "
                             f"{limit} (max_position_embeddings); use max_new_tokens <= "
                             f"{max(0, limit - longest - proposals)} or a shorter prompt")


@dataclass(frozen=True)
class Checked:
    """A call's inputs once checked: the budget as an int and the EOS ids as ints."""

    max_new_tokens: int
    eos: list[int]


def check_call(target: torch.nn.Module, drafts: list[torch.nn.Module], rows: list[torch.Tensor],
               max_new_tokens: object, eos_token_id: object, proposals: object | None = None) -> Checked:
    """Every check of a decoding call, before any pass. ``rows``: the prompts' 1-D token ids (shapes
    already checked); ``drafts``: the draft models (none for plain decoding or prompt lookup);
    ``proposals``: the speculative loop's k or policy (None: plain decoding)."""
    budget = check_budget(max_new_tokens)
    for d in drafts:
        check_vocabularies(target, d)
    for i, p in enumerate(rows):
        if p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
            which = f"prompt {i}" if len(rows) > 1 else "the prompt"
            raise ValueError(f"{which} has dtype {p.dtype}: token ids must be an integer tensor (torch.long)")
    models = {"target": target, **{"draft" if len(drafts) == 1 else f"draft {j}": d for j, d in enumerate(drafts)}}
    _check_devices(rows[0].device, models)
    vocab = vocab_size(target)
    eos = eos_ids(eos_token_id, vocab)
    k = 0 if proposals is None else proposal_bound(proposals, budget)
    check_positions(max(p.shape[0] for p in rows), budget, k, models)
    if vocab is not None:
        _check_id_range(rows, vocab, "the target's")
    return Checked(budget, eos)
