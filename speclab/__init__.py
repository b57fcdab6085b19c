"""speclab: measure speculative decoding (acceptance, cost of a guess, cost of a check) for any draft/target pair.

The names below are imported lazily (PEP 562): ``from speclab import speculative_generate`` works as
before, while ``import speclab.stats.estimators`` or ``import speclab.costs.cost_model`` (numpy only) does not pull
in torch, so the analysis scripts stay light.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "accept_greedy": "speclab.decoding.acceptance",
    "accept_keep_draft": "speclab.decoding.acceptance",
    "accept_sample": "speclab.decoding.acceptance",
    "accept_sample_resample_target": "speclab.decoding.acceptance",
    "sampling_rule": "speclab.decoding.acceptance",
    "alpha_hat": "speclab.stats.estimators",
    "checked_proposals": "speclab.stats.estimators",
    "break_even_alpha": "speclab.costs.cost_model",
    "expected_tokens_per_iteration": "speclab.costs.cost_model",
    "predicted_speedup": "speclab.costs.cost_model",
    "ModelDrafter": "speclab.decoding.drafters",
    "load_pair": "speclab.models.loading",
    "GenerationResult": "speclab.decoding.loop",
    "IterationStats": "speclab.decoding.loop",
    "plain_generate": "speclab.decoding.loop",
    "plain_greedy": "speclab.decoding.loop",
    "speculative_generate": "speclab.decoding.loop",
    "GREEDY": "speclab.decoding.sampling",
    "SamplingConfig": "speclab.decoding.sampling",
    "logits_to_probs": "speclab.decoding.sampling",
    "chi_square": "speclab.stats.goodness_of_fit",
    "chi_square_top": "speclab.stats.goodness_of_fit",
    "CostTable": "speclab.costs.time_model",
    "PassModel": "speclab.costs.time_model",
    "TimeModel": "speclab.costs.time_model",
    "Trace": "speclab.costs.time_model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'speclab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from speclab.decoding.acceptance import (accept_greedy, accept_keep_draft, accept_sample,  # noqa: F401
                                    accept_sample_resample_target, sampling_rule)
    from speclab.costs.cost_model import break_even_alpha, expected_tokens_per_iteration, predicted_speedup  # noqa: F401
    from speclab.decoding.drafters import ModelDrafter  # noqa: F401
    from speclab.models.loading import load_pair  # noqa: F401
    from speclab.stats.estimators import alpha_hat, checked_proposals  # noqa: F401
    from speclab.decoding.loop import (GenerationResult, IterationStats, plain_generate, plain_greedy,  # noqa: F401
                              speculative_generate)
    from speclab.decoding.sampling import GREEDY, SamplingConfig, logits_to_probs  # noqa: F401
    from speclab.stats.goodness_of_fit import chi_square, chi_square_top  # noqa: F401
    from speclab.costs.time_model import CostTable, PassModel, TimeModel, Trace  # noqa: F401
