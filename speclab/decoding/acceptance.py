"""Acceptance rules as pure functions of proposals and target/draft outputs.

Conventions, shared by every rule:
- ``proposals``: LongTensor [k], the draft's guesses, k >= 0.
- target rows: [k + 1, V]; row i predicts proposal i, row k predicts the bonus token.
- draft rows ``q``: [k, V]; row i is the distribution proposal i was drawn from.
Each rule returns ``(n_accepted, next_token)``: the first ``n_accepted`` proposals
are kept and ``next_token`` is the target's own token (correction or bonus).

All comparisons are vectorised over the k proposals; the only Python-level work
is reading back two scalars.
Same concept, other floor: ``pipeline/stages/acceptance.py``.
"""
from __future__ import annotations

from typing import Callable

import torch

from speclab.stats.estimators import alpha_hat, checked_proposals  # noqa: F401 - re-exported (numpy-only home)

AcceptRule = Callable[..., tuple[int, int]]


def _accepted_prefix(ok: torch.Tensor) -> int:
    """Length of the leading run of True values in a 1-D bool tensor."""
    return int(torch.cumprod(ok.to(torch.int64), dim=0).sum())


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_greedy(proposals: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Keep proposals while each equals the target's arg-max; the target supplies the next token."""
    best = torch.argmax(target_logits, dim=-1)
    k = proposals.shape[0]
    n = _accepted_prefix(best[:k] == proposals)
    return n, int(best[n])


def batch_accept_greedy(proposals: torch.Tensor, target_logits: torch.Tensor,
                        counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``accept_greedy`` for every row: proposals [B, k], logits [B, k + 1, V] -> (n accepted [B], next token [B]).

    ``counts`` [B]: row b made only counts[b] proposals (the first ones) and its logits are the last
    counts[b] + 1 rows (right-aligned, as a ragged pass feeds them).
    """
    best = target_logits.argmax(dim=-1)
    k = proposals.shape[1]
    match = best[:, :k] == proposals
    if counts is not None:
        steps = torch.arange(k + 1, device=best.device)
        best = best.gather(1, (steps + (k - counts)[:, None]).clamp(max=k))
        match = (best[:, :k] == proposals) & (steps[:k] < counts[:, None])
    n = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)
    return n, best.gather(1, n[:, None]).squeeze(1)


def _coin_flips(proposals: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                generator: torch.Generator | None) -> int:
    """Accept proposal i with probability min(1, p_i(x_i) / q_i(x_i)); return the accepted prefix."""
    k = proposals.shape[0]
    if k == 0:
        return 0
    idx = torch.arange(k, device=proposals.device)
    p_x = p[idx, proposals]
    q_x = q[idx, proposals]
    u = torch.rand(k, generator=generator, device=p.device)
    # u < p/q written without the division so q(x) = 0 cannot produce inf/nan.
    return _accepted_prefix(u * q_x < p_x)


def residual(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); falls back to p when p == q (no mass left over)."""
    r = torch.clamp(p_row - q_row, min=0.0)
    total = r.sum()
    return r / total if total > 0 else p_row


def accept_sample(proposals: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                  generator: torch.Generator | None = None) -> tuple[int, int]:
    """The exact rule (Leviathan et al.; Chen et al.): accept with min(1, p/q), else draw from the residual."""
    k = proposals.shape[0]
    n = _coin_flips(proposals, p, q, generator)
    if n < k:
        return n, _draw(residual(p[n], q[n]), generator)
    return n, _draw(p[k], generator)


def accept_sample_resample_target(proposals: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                                  generator: torch.Generator | None = None) -> tuple[int, int]:
    """WRONG on purpose: after a rejection draws from p instead of the residual (over-weights q's favourites)."""
    k = proposals.shape[0]
    n = _coin_flips(proposals, p, q, generator)
    return n, _draw(p[n], generator)


def accept_keep_draft(proposals: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                      generator: torch.Generator | None = None) -> tuple[int, int]:
    """WRONG on purpose: keeps every draft token, ignoring p (samples the draft's distribution)."""
    k = proposals.shape[0]
    return k, _draw(p[k], generator)


SAMPLING_RULES: dict[str, AcceptRule] = {
    "correct": accept_sample,
    "resample_target": accept_sample_resample_target,
    "keep_draft": accept_keep_draft,
}


def sampling_rule(name: str) -> AcceptRule:
    try:
        return SAMPLING_RULES[name]
    except KeyError:
        raise ValueError(f"unknown acceptance rule {name!r}: allowed are {sorted(SAMPLING_RULES)}") from None


def first_token_draws(p: torch.Tensor, q: torch.Tensor, n: int, rule: str,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` first tokens emitted with k = 1 under ``rule``, vectorised over draws.

    The same three rules as above, for one shared context (p and q are [V] rows), so that
    hundreds of thousands of draws over a real vocabulary take a fraction of a second.
    """
    sampling_rule(rule)  # validates the name
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    if rule == "keep_draft":
        return x
    u = torch.rand(n, generator=generator, device=p.device)
    rejected = ~(u * q[x] < p[x])
    fallback = residual(p, q) if rule == "correct" else p
    n_rej = int(rejected.sum())
    if n_rej:
        x[rejected] = torch.multinomial(fallback, n_rej, replacement=True, generator=generator)
    return x


def rule_output_distribution(p: torch.Tensor, q: torch.Tensor, rule: str) -> torch.Tensor:
    """Exact distribution of the first emitted token under each rule with k = 1 (rows p, q: [V]).

    correct: p. keep_draft: q. resample_target: the draft's token survives with min(p, q), and
    a rejection (probability 1 - sum min(p, q)) draws from p.
    """
    sampling_rule(rule)
    if rule == "correct":
        return p
    if rule == "keep_draft":
        return q
    overlap = torch.minimum(p, q)
    return overlap + (1 - overlap.sum()) * p
