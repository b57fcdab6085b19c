"""Bad input is a clear, one-line error naming the value and what is allowed."""
import pytest
import torch

from speclab.decoding.loop import plain_generate, speculative_generate
from speclab.models.loading import check_vocabularies, load_pair, resolve_device, resolve_dtype, tiny_random_model
from speclab.decoding.sampling import SamplingConfig


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_vocab_mismatch_names_both_sizes():
    with pytest.raises(ValueError) as exc:
        check_vocabularies(tiny_random_model(64), tiny_random_model(80))
    assert "target has 64" in _one_line(exc) and "draft has 80" in _one_line(exc)


@pytest.mark.parametrize("k", [0, -1])
def test_k_below_one(tiny_pair, k):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match=f"k={k} is not allowed") as exc:
        speculative_generate(target, draft, torch.tensor([[1, 2]]), 5, k=k)
    _one_line(exc)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*smollm2-135m") as exc:
        load_pair("no-such-model", "int8", "cpu")
    _one_line(exc)


def test_unknown_draft_variant():
    with pytest.raises(ValueError, match=r"unknown draft 'int4'.*'copy'.*'layers:N'.*local folder") as exc:
        load_pair("tiny-random", "int4", "cpu")
    _one_line(exc)
    with pytest.raises(ValueError, match="layers:9 is not allowed"):
        load_pair("tiny-random", "layers:9", "cpu")


@pytest.mark.parametrize("temperature", [0.0, -0.5])
def test_sampling_needs_positive_temperature(temperature):
    with pytest.raises(ValueError, match=f"temperature={temperature} is not allowed") as exc:
        SamplingConfig(do_sample=True, temperature=temperature)
    _one_line(exc)
    SamplingConfig(do_sample=False, temperature=temperature)  # greedy ignores temperature


def test_bad_top_p_top_k_device_dtype():
    with pytest.raises(ValueError, match="top_p=1.5"):
        SamplingConfig(do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="top_k=-2"):
        SamplingConfig(do_sample=True, top_k=-2)
    with pytest.raises(ValueError, match="device='tpu'"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="dtype='int3'"):
        resolve_dtype("int3")


def test_empty_prompt_and_zero_tokens(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="input_ids must have shape"):
        plain_generate(target, torch.zeros((1, 0), dtype=torch.long), 5)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        speculative_generate(target, draft, torch.tensor([[1]]), 0, k=2)
