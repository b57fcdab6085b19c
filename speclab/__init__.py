"""speclab: measure speculative decoding (acceptance, cost of a guess, cost of a check) for any draft/target pair."""
from speclab.acceptance import (
    accept_greedy,
    accept_keep_draft,
    accept_sample,
    accept_sample_resample_target,
    sampling_rule,
)
from speclab.cost_model import break_even_alpha, expected_tokens_per_iteration, predicted_speedup
from speclab.drafters import ModelDrafter
from speclab.loop import GenerationResult, IterationStats, plain_generate, plain_greedy, speculative_generate
from speclab.sampling import GREEDY, SamplingConfig, logits_to_probs
from speclab.stats import chi_square, chi_square_top

__all__ = [
    "GREEDY", "GenerationResult", "IterationStats", "ModelDrafter", "SamplingConfig", "accept_greedy",
    "accept_keep_draft", "accept_sample", "accept_sample_resample_target", "break_even_alpha", "chi_square",
    "chi_square_top", "expected_tokens_per_iteration", "logits_to_probs", "plain_generate", "plain_greedy",
    "predicted_speedup", "sampling_rule", "speculative_generate",
]
