"""Multi-candidate acceptance rules: several draft candidates for one position, checked in order.

Shared convention: ``candidates`` [m] token ids, ``p`` [V] the target's distribution at the position,
``q`` [m, V] where row i is the distribution candidate i was drawn from *given the candidates before
it*. Each rule returns ``(i, token)``: the index of the accepted candidate and its token, or ``(-1,
token)`` with a token drawn from what is left of p.

The exact rule (SpecInfer's multi-step speculative sampling; recursive rejection sampling) keeps the
target's distribution for any such sequence of proposal distributions: candidate i is accepted with
probability min(1, r_i(x_i) / q_i(x_i)) where r_1 = p and, after a rejection, r_{i+1} =
norm(max(r_i - q_i, 0)); after the last rejection the token comes from r_{m+1}. The three ways a tree
drafter picks children map onto q:
- drawn i.i.d. from the draft's q (with replacement): every row is q;
- drawn without replacement: row i is q with the earlier candidates removed and renormalised (what
  ``torch.multinomial(q, m, replacement=False)`` draws from);
- chosen deterministically (the draft's top-b, prompt lookup): row i is a point mass at x_i, so x_i is
  accepted with probability r_i(x_i) and a rejection removes it from r.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import residual


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_candidates(candidates: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                      generator: torch.Generator | None = None) -> tuple[int, int]:
    """The exact multi-candidate rule (see the module docstring)."""
    r = p
    xs = candidates.tolist()
    u = torch.rand(len(xs), generator=generator, device=p.device).tolist()
    for i, x in enumerate(xs):
        r_x, q_x = float(r[x]), float(q[i, x])
        if u[i] * q_x < r_x:  # u < r/q without the division (q(x) = 0 never divides)
            return i, x
        r = residual(r, q[i])
    return -1, _draw(r, generator)


def accept_candidates_fixed_p(candidates: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                              generator: torch.Generator | None = None) -> tuple[int, int]:
    """WRONG on purpose: tests every candidate against the original p (no residual between them), and
    draws from the first candidate's residual after the last rejection. Equal to the exact rule for one
    candidate; with two or more it over-weights tokens the draft proposes often."""
    xs = candidates.tolist()
    u = torch.rand(len(xs), generator=generator, device=p.device).tolist()
    for i, x in enumerate(xs):
        if u[i] * float(q[i, x]) < float(p[x]):
            return i, x
    return -1, _draw(residual(p, q[0]), generator)


def without_replacement_rows(q: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
    """Rows [m, V]: the distribution each of ``drawn`` [m] came from when drawn in order from ``q`` [V]
    without replacement (q with the earlier draws removed, renormalised)."""
    rows = q.expand(drawn.shape[0], -1).clone()
    for i in range(1, drawn.shape[0]):
        rows[i:, drawn[i - 1]] = 0.0
    return rows / rows.sum(dim=1, keepdim=True).clamp_min(torch.finfo(rows.dtype).tiny)

