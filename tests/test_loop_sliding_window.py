"""Batch 1 with a sliding-window model (Gemma 3 layers) past its window: the speculative loop stays exact.

At one row the layout is dense (rollback crops every rejected slot), so a physical column is a
logical position and HF's window, which counts physical columns, is the one batch 1 would use.
"""
import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from speclab.decoding.loop import plain_greedy, speculative_generate

V, WINDOW = 64, 8


def _gemma(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    return model


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_past_the_window_equals_plain(k):
    target, draft = _gemma(0), _gemma(1)
    ids = torch.tensor([[5, 9, 4, 1, 7]])
    plain = plain_greedy(target, ids, 3 * WINDOW).tokens
    assert speculative_generate(target, draft, ids, 3 * WINDOW, k=k).tokens == plain
    assert speculative_generate(target, target, ids, 3 * WINDOW, k=k).tokens == plain


@pytest.mark.usefixtures("one_torch_thread")
def test_prefill_apart_past_the_window_equals_plain():
    """Prefilled apart, one row's prompt is a uniform feed: the layout stays dense and exact past the window."""
    target, draft = _gemma(0), _gemma(1)
    ids = torch.tensor([[5, 9, 4, 1, 7]])
    plain = plain_greedy(target, ids, 3 * WINDOW).tokens
    assert speculative_generate(target, draft, ids, 3 * WINDOW, k=2, merge_prefill=False).tokens == plain
