"""speclab: measure speculative decoding (acceptance, cost of a guess, cost of a check) for any draft/target pair.

The names below are imported lazily (PEP 562): ``from speclab import speculative_generate`` works as
before, while ``import speclab.estimators`` or ``import speclab.cost_model`` (numpy only) does not pull
in torch, so the analysis scripts stay light.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "accept_greedy": "speclab.acceptance",
    "accept_keep_draft": "speclab.acceptance",
    "accept_sample": "speclab.acceptance",
    "accept_sample_resample_target": "speclab.acceptance",
    "sampling_rule": "speclab.acceptance",
    "alpha_hat": "speclab.estimators",
    "checked_proposals": "speclab.estimators",
    "break_even_alpha": "speclab.cost_model",
    "expected_tokens_per_iteration": "speclab.cost_model",
    "predicted_speedup": "speclab.cost_model",
    "ModelDrafter": "speclab.drafters",
    "GenerationResult": "speclab.loop",
    "IterationStats": "speclab.loop",
    "plain_generate": "speclab.loop",
    "plain_greedy": "speclab.loop",
    "speculative_generate": "speclab.loop",
    "GREEDY": "speclab.sampling",
    "SamplingConfig": "speclab.sampling",
    "logits_to_probs": "speclab.sampling",
    "chi_square": "speclab.stats",
    "chi_square_top": "speclab.stats",
    "CostTable": "speclab.time_model",
    "PassModel": "speclab.time_model",
    "TimeModel": "speclab.time_model",
    "Trace": "speclab.time_model",
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
    from speclab.acceptance import (accept_greedy, accept_keep_draft, accept_sample,  # noqa: F401
                                    accept_sample_resample_target, sampling_rule)
    from speclab.cost_model import break_even_alpha, expected_tokens_per_iteration, predicted_speedup  # noqa: F401
    from speclab.drafters import ModelDrafter  # noqa: F401
    from speclab.estimators import alpha_hat, checked_proposals  # noqa: F401
    from speclab.loop import (GenerationResult, IterationStats, plain_generate, plain_greedy,  # noqa: F401
                              speculative_generate)
    from speclab.sampling import GREEDY, SamplingConfig, logits_to_probs  # noqa: F401
    from speclab.stats import chi_square, chi_square_top  # noqa: F401
    from speclab.time_model import CostTable, PassModel, TimeModel, Trace  # noqa: F401
