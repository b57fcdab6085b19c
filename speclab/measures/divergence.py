"""Why did speculative greedy output differ from plain greedy? Recompute the logits and look at the gap.
Same concept, other floor: ``pipeline/stages/divergence.py``."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from speclab.decoding.cache import forward_logits, new_cache


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or where one output stops early), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def ulp(x: float, dtype: torch.dtype) -> float:
    """Spacing of representable numbers of ``dtype`` at magnitude |x|."""
    finfo = torch.finfo(dtype)
    mag = max(abs(x), finfo.tiny)
    return 2.0 ** math.floor(math.log2(mag)) * finfo.eps


@dataclass(frozen=True)
class Recomputation:
    way: str  # single_step | verify_pass | full_prefill
    logit_plain: float  # logit of the token plain decoding chose
    logit_spec: float  # logit of the token speculative decoding chose
    top_logit: float

    @property
    def gap(self) -> float:
        return self.logit_plain - self.logit_spec


@torch.inference_mode()
def recompute_logits(model: torch.nn.Module, context: torch.Tensor, plain_token: int, spec_token: int,
                     verify_len: int) -> list[Recomputation]:
    """Next-token logits after ``context`` ([1, n]) computed three ways.

    single_step: prefill all but the last token, then one single-token step (plain decoding's path);
    verify_pass: prefill all but the last ``verify_len`` tokens, then one pass over them (verification's path);
    full_prefill: one pass over the whole context.
    """
    n = context.shape[1]
    out = []
    for way, split in (("single_step", n - 1), ("verify_pass", max(n - verify_len, 1)), ("full_prefill", 0)):
        cache = new_cache(model)
        if split > 0:
            forward_logits(model, context[:, :split], cache, 1)
        row = forward_logits(model, context[:, split:], cache, 1)[-1].float()
        out.append(Recomputation(way, float(row[plain_token]), float(row[spec_token]), float(row.max())))
    return out


@dataclass(frozen=True)
class Verdict:
    max_gap: float
    ulp: float
    gap_ulps: float
    near_tie: bool


def classify(recomputations: list[Recomputation], dtype: torch.dtype, tol_ulps: float = 4.0) -> Verdict:
    """A near-tie when every recomputed gap is within ``tol_ulps`` units in the last place at the top logit.

    Then the two tokens are tied to within rounding and either output is a valid rounding of
    an undecided choice; a larger gap means the loop computed something else (a bug).
    """
    top = max(abs(r.top_logit) for r in recomputations)
    spacing = ulp(top, dtype)
    max_gap = max(abs(r.gap) for r in recomputations)
    return Verdict(max_gap, spacing, max_gap / spacing, max_gap <= tol_ulps * spacing)
