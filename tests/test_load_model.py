"""The time model under load (speclab/costs/load_model.py): batch 1 is the batch-1 model, a steep pass curve loses
the gain as the load grows, a flat one keeps it, and bad input is one line."""
import pytest

from speclab.costs.load_model import PassCurve, predict_load

FLAT = PassCurve((1, 8, 40), (0.10, 0.10, 0.10))        # a pass costs the same whatever its tokens (weights-bound)
STEEP = PassCurve((1, 2, 4, 8), (0.10, 0.15, 0.25, 0.45))  # compute-bound: each token adds 0.05 s


def test_at_load_one_it_is_the_batch_one_model_with_the_draft_reading_the_prompt_too():
    draft = PassCurve((1, 8), (0.02, 0.04))
    p = predict_load(STEEP, draft, 1, 4, 3.0, 33, 0.5)
    spec = (4 * 0.02 + STEEP(5)) / 3.0
    assert p.spec_token_s == pytest.approx(spec)
    spec_ttft = 0.5 * (1 + 0.04 / 0.45)  # the draft reads the prompt at its longest passes' ratio to the target's
    assert p.latency_gain == pytest.approx((0.5 + 32 * 0.10) / (spec_ttft + 32 * spec))
    assert p.throughput_gain == p.latency_gain  # closed loop: Little's law


def test_a_measured_plain_step_scales_every_pass_of_that_load():
    p = predict_load(STEEP, None, 4, 2, 2.0, 11, 0.0, plain_step_s=0.5)  # the engine adds 0.25 s to T(4) = 0.25
    assert p.plain_step_s == 0.5 and p.spec_token_s == pytest.approx(2 * STEEP(12) / 2.0)
    assert p.latency_gain == pytest.approx(0.5 / (2 * STEEP(12) / 2.0))


def test_a_steep_pass_curve_loses_the_gain_as_the_load_grows_a_flat_one_keeps_it():
    steep = [predict_load(STEEP, None, b, 4, 3.0, 33, 0.0).latency_gain for b in (1, 2, 4, 8)]
    flat = [predict_load(FLAT, None, b, 4, 3.0, 33, 0.0).latency_gain for b in (1, 2, 4, 8)]
    assert steep == sorted(steep, reverse=True) and steep[0] > 1 > steep[-1]
    assert flat == pytest.approx([3.0] * 4)


def test_the_curve_extends_beyond_its_longest_pass_on_its_last_segment():
    assert STEEP(16) == pytest.approx(0.45 + 8 * 0.05) and STEEP(3) == pytest.approx(0.20)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="two pass lengths"):
        PassCurve((1,), (0.1,))
    with pytest.raises(ValueError, match="tokens per pass 0.5"):
        predict_load(FLAT, None, 2, 4, 0.5, 33, 0.0)
