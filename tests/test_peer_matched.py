"""transformers' assisted generation in the peer's "matched" mode runs our algorithm: k proposals a pass."""
import copy

import torch

from speclab.models.loading import tiny_random_model
from speclab.measures.peer import hf_generate


def _target_passes(target, assistant, mode: str, k: int, n_new: int) -> tuple[int, list[int]]:
    calls = []
    handle = target.register_forward_hook(lambda *_: calls.append(1))
    try:
        tokens, _ = hf_generate(target, torch.tensor([[1, 5, 9, 3]]), n_new, assistant=assistant, k=k, mode=mode)
    finally:
        handle.remove()
    return len(calls), tokens


def test_matched_mode_proposes_k_tokens_per_target_pass_and_leaves_the_assistant_as_it_was(one_torch_thread):
    """A perfect draft (the target's copy) accepts everything: n new tokens take exactly one target pass per
    k + 1 tokens (the first pass also reads the prompt). The library's own settings (20 proposals, a
    confidence threshold that stops an unsure draft early) give another count."""
    target = tiny_random_model(64, seed=0)
    assistant = copy.deepcopy(target)
    before = assistant.generation_config.to_dict()
    n_new = 12
    plain, _ = hf_generate(target, torch.tensor([[1, 5, 9, 3]]), n_new)
    for k in (2, 3, 5):
        passes, tokens = _target_passes(target, assistant, "matched", k, n_new)
        assert tokens == plain
        assert passes == -(-n_new // (k + 1)), f"k={k}: {passes} target passes"
        assert assistant.generation_config.to_dict() == before
    default_passes, default_tokens = _target_passes(target, assistant, "default", 2, n_new)
    assert default_tokens == plain and default_passes != -(-n_new // 3)
