"""One DynamicCache for B sequences of different lengths: physical columns, logical positions, a mask.

DynamicCache keeps one tensor per layer, ``[B, heads, P, head_dim]``: every row has the same
number P of *physical* columns. A row's sequence is ragged (prompts of different lengths,
different numbers of accepted proposals), so a column of row b is either

- *valid*: the key/value of one token of row b's own sequence, computed at position id
  ``pos[b, col]`` = that token's index in row b (its *logical* position), or
- *masked*: left padding, a dummy input slot, or a proposal that row rejected. No query of row b
  ever attends to it (``mask[b, col]`` is False), so its content does not matter.

Valid columns of a row appear in logical order, and the causal mask HF builds is physical (a new
query sees every earlier column), so with the padding mask a query of row b sees exactly the
tokens 0..pos-1 of row b, at the positions batch 1 would have used: the same attention as
batch 1, up to floating-point summation order.

``RaggedKV.feed`` appends ``m`` columns per row, right-aligned: row b contributes the tokens it
has not yet run (``seq[b, seen_b:upto_b]``) and fills the rest on the left with masked dummies.
``rollback`` masks out every column past a row's valid length and crops only the suffix that no
row needs; ``select`` drops finished rows (per-layer slicing of keys and values) and ``compact``
re-packs valid columns to the right, removing accumulated holes.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from speclab.decoding.cache import crop_to, new_cache
from speclab.decoding.timing import Stopwatch


def _sliding_window(model: torch.nn.Module, cache: DynamicCache) -> int | None:
    """The attention window of a model with sliding-window layers, else None."""
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        return int(getattr(model.config, "sliding_window", 0) or 0) or None
    return None


class RaggedKV:
    """A model, its KV cache over B rows, and the layout that makes the rows independent."""

    def __init__(self, model: torch.nn.Module, rows: int, device: torch.device) -> None:
        self.model = model
        self.cache = new_cache(model)
        self.seen = torch.zeros(rows, dtype=torch.long, device=device)  # tokens of each row in the cache
        # No masked column anywhere: the model runs without an attention mask (batch 1, equal prompts),
        # exactly as the batch-1 loop does. Tracked from host-side facts so it costs no device read.
        self.dense = True
        # mask / pos are built only once the layout stops being dense (None until then: every column is
        # valid and holds the token at its own position), so batch 1 pays for no layout bookkeeping.
        self._mask: torch.Tensor | None = None
        self._pos: torch.Tensor | None = None
        self._width, self._rows = 0, rows
        self.layout = Stopwatch(device)  # time spent building inputs, masks and position ids
        self._window = _sliding_window(model, self.cache)
        self._steps = torch.arange(64, device=device)

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._mask is None:  # dense so far: every column valid, at its own position
            self._mask = torch.ones((self._rows, self._width), dtype=torch.bool, device=self.seen.device)
            self._pos = torch.arange(self._width, device=self.seen.device).expand(self._rows, -1).clone()
        return self._mask, self._pos

    @property
    def mask(self) -> torch.Tensor:
        """[B, P] valid columns."""
        return self._layout()[0]

    @property
    def pos(self) -> torch.Tensor:
        """[B, P] logical positions."""
        return self._layout()[1]

    def _set(self, mask: torch.Tensor, pos: torch.Tensor) -> None:
        self._mask, self._pos = mask, pos
        self._rows, self._width = mask.shape

    @property
    def width(self) -> int:
        """P, the number of physical columns."""
        return self._width

    @property
    def rows(self) -> int:
        return self._rows

    def feed(self, seq: torch.Tensor, upto: torch.Tensor, m: int, uniform: bool, n_logits: int) -> torch.Tensor:
        """Run ``seq[b, seen_b:upto_b]`` of every row in ``m`` new columns; logits [B, n_logits, V].

        ``seq`` [B, L] holds each row's tokens left-aligned (column = logical position). Rows with
        fewer than ``m`` new tokens get masked dummy slots on the left. ``uniform``: the caller
        knows every row has exactly ``m`` new tokens (no dummies), so the layout stays dense.
        """
        if self._mask is None and uniform:
            # Dense, and staying so: every row's new tokens fill the next m columns at their own
            # positions, so the model takes a slice and derives the position ids from the cache.
            with self.layout:
                ids = seq[:, self._width: self._width + m]
                self._width += m
                self.seen = upto.clone()
            return self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=n_logits).logits
        with self.layout:
            if m > self._steps.shape[0]:
                self._steps = torch.arange(m, device=self._steps.device)
            idx = upto[:, None] + (self._steps[:m] - m)
            valid = idx >= self.seen[:, None]
            # A dummy slot reads some earlier token of its row; it is masked, so which one is irrelevant.
            idx = idx.clamp(min=0)
            ids = seq.gather(1, idx)
            self._set(torch.cat([self.mask, valid], dim=1), torch.cat([self.pos, idx], dim=1))
            self.seen = upto.clone()
            self.dense = self.dense and uniform
            if self._window is not None and not self.dense and self.width > self._window:
                # HF's sliding window counts physical columns; holes would shift it against batch 1.
                raise NotImplementedError(f"a batch wider than the model's sliding window ({self._window}) "
                                          "would not be exact; use a shorter generation or batch 1")
            attention_mask = None if self.dense else self.mask
        out = self.model(input_ids=ids, attention_mask=attention_mask, position_ids=idx, cache=self.cache,
                         use_cache=True, logits_to_keep=n_logits)
        return out.logits

    def rollback(self, valid_length: torch.Tensor, n_crop: int, ragged: bool) -> None:
        """Row b keeps only its tokens ``0..valid_length_b - 1``; the last ``n_crop`` columns go for all rows.

        ``n_crop`` is the suffix no row needs (the caller knows it from the acceptance counts);
        ``ragged``: rows lost different numbers of columns, so holes now exist.
        """
        if self._mask is not None or ragged:  # dense rows that all lose the same suffix: the crop is all
            self._set(self.mask & (self.pos < valid_length[:, None]), self.pos)
        self.seen = torch.minimum(self.seen, valid_length)
        if n_crop > 0:
            crop_to(self.cache, self.width - n_crop)
            if self._mask is None:
                self._width -= n_crop
            else:
                self._set(self.mask[:, :-n_crop], self.pos[:, :-n_crop])
        self.dense = self.dense and not ragged

    def masked_slots(self) -> torch.Tensor:
        """Number of masked (row, column) slots, as a 0-d tensor (read it with the loop's other counts)."""
        if self._mask is None:
            return self.seen.new_zeros(())
        return self.mask.numel() - self.mask.sum()

    def _plain(self) -> bool:
        # Column surgery is only safe on plain full-attention layers (sliding/linear layers keep extra state).
        return all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def _take_columns(self, idx: torch.Tensor | slice) -> None:
        for layer in self.cache.layers:
            if layer.keys is None or layer.keys.numel() == 0:
                continue
            if isinstance(idx, slice):
                layer.keys, layer.values = layer.keys[:, :, idx], layer.values[:, :, idx]
            else:
                g = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys, layer.values = layer.keys.gather(2, g), layer.values.gather(2, g)
        if isinstance(idx, slice):
            self._set(self.mask[:, idx], self.pos[:, idx])
        else:
            self._set(self.mask.gather(1, idx), self.pos.gather(1, idx))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (finished rows leave the batch), then drop leading columns no row uses."""
        self.cache.batch_select_indices(rows)
        self._set(self.mask[rows], self.pos[rows])
        self.seen = self.seen[rows]
        if self._plain() and self.width:
            # The longest prompt may have left: its padding columns are now padding for everyone.
            first = int(self.mask.any(dim=0).to(torch.int8).argmax())
            if first:
                self._take_columns(slice(first, None))
        self.dense = bool(self.mask.all())

    def excess(self, longest: int) -> int:
        """Columns beyond a hole-free left-padded layout (``longest``: the largest ``seen``)."""
        return self.width - longest

    def compact(self, longest: int) -> bool:
        """Move each row's valid columns to the right end, in order, and drop the freed columns.

        One gather per layer (a copy of the cache, like the ``torch.cat`` DynamicCache does on every
        pass). Positions and relative order are kept, so the attention is unchanged. False when the
        cache's layers do not allow it (then holes simply stay masked).
        """
        if not self._plain() or longest >= self.width:
            return False
        # Stable sort on the mask: masked columns first, then valid ones, each in physical order.
        order = torch.sort(self.mask.to(torch.int32), dim=1, stable=True).indices
        self._take_columns(order[:, self.width - longest:])
        self.dense = bool(self.mask.all())
        return True


def sliding_window(model: torch.nn.Module) -> int | None:
    """The attention window of ``model`` if it has sliding-window layers (else None), read from an empty cache
    laid out for it, without a pass: the rule ``RaggedKV`` refuses wide batches by, for checks made up front."""
    return _sliding_window(model, new_cache(model))
