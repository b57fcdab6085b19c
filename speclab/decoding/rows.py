"""The rows of a batch in flight (tokens, lengths, outputs of finished rows) and the checks on their inputs."""
from __future__ import annotations

import operator

import torch


def check_budget(max_new_tokens: int) -> int:
    """The token budget as a plain int; any integral type counts, bool and non-integers do not."""
    try:
        n = None if isinstance(max_new_tokens, bool) else operator.index(max_new_tokens)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an integer >= 1")
    return n


def eos_tensor(ids: list[int], device: torch.device) -> torch.Tensor:
    """The EOS ids (``speclab.decoding.checks.eos_ids``) on the device, for ``torch.isin``."""
    return torch.tensor(ids, dtype=torch.long, device=device)


class Rows:
    """Per-row state of a batch in flight; finished rows are moved out into ``outputs``.

    ``seq`` [B, L] holds each row's tokens left-aligned (column = logical position); ``length`` is
    each row's length on the device and ``length_h`` its host copy.
    """

    def __init__(self, rows: list[torch.Tensor], extra: int) -> None:
        lens = [p.shape[0] for p in rows]
        self.seq = torch.zeros((len(rows), max(lens) + extra), dtype=torch.long, device=rows[0].device)
        for b, p in enumerate(rows):
            self.seq[b, : lens[b]] = p
        self.plen = torch.tensor(lens, device=self.seq.device)
        self.length = self.plen.clone()
        self.plen_h, self.length_h = lens, list(lens)
        self.row_ids = list(range(len(rows)))  # each active row's index in the prompt list
        self.outputs: list[list[int] | None] = [None] * len(rows)

    @property
    def active(self) -> int:
        return len(self.row_ids)

    def finish(self, done: list[bool], final_len: list[int]) -> tuple[torch.Tensor, list[int]] | None:
        """Store finished rows' outputs; the batch positions that stay (None when none finished)."""
        if not any(done):
            return None
        for b, (d, n) in enumerate(zip(done, final_len)):
            if d:
                self.outputs[self.row_ids[b]] = self.seq[b, self.plen_h[b]: n].tolist()
        keep_h = [b for b, d in enumerate(done) if not d]
        keep = torch.tensor(keep_h, dtype=torch.long, device=self.seq.device)
        self.seq, self.plen, self.length = self.seq[keep], self.plen[keep], self.length[keep]
        self.row_ids, self.plen_h, self.length_h = ([xs[b] for b in keep_h]
                                                    for xs in (self.row_ids, self.plen_h, self.length_h))
        return keep, keep_h
