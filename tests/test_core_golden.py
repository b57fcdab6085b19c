"""The core's outputs on a seeded battery (tests/core_battery.py) are the recorded ones, to 6 significant digits
(within one unit of the 6th: another CPU's or BLAS's last bits may round a value the other way).

Catches any bug that changes an output (a token, an iteration's counts, a probability, a k chosen, a p-value, an
error message), including the ones no behavioural test states a value for. After an intended change of output:
``.venv/bin/python tests/core_battery.py --write``, and say why in the commit.
"""
import json
import math

import pytest

from core_battery import GOLDEN, SECTIONS, run_section

RECORDED = json.loads(GOLDEN.read_text())


def same(got, want) -> bool:
    """Equal, floats to one unit of their 6th significant digit (both were rounded to 6 digits)."""
    if isinstance(want, float) and isinstance(got, float):
        if got == want:
            return True
        unit = 10 ** (math.floor(math.log10(max(abs(got), abs(want)))) - 5)
        return abs(got - want) <= 1.01 * unit
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_core_outputs_are_the_recorded_ones(section):
    got, want = run_section(section), RECORDED[section]
    changed = sorted(k for k in want.keys() | got.keys() if k not in got or k not in want or not same(got[k], want[k]))
    assert not changed, f"{len(changed)} of {len(want)} {section} outputs changed, first: {changed[0]}: " \
                        f"recorded {json.dumps(want.get(changed[0]))[:300]}, now {json.dumps(got.get(changed[0]))[:300]}"


def test_the_record_covers_every_section_and_varied_outcomes():
    assert set(RECORDED) == set(SECTIONS)
    loop = [v for name, section in RECORDED.items() if name.startswith("loop/") for v in section.values()]
    iterations = [it for v in loop if isinstance(v, list) and len(v) == 4 for it in v[2]]
    assert any(0 < it[1] < it[0] for it in iterations)  # partial acceptance
    assert any(it[2] for it in iterations) and any(it[0] == 0 for it in iterations)  # bonus tokens, plain steps
    errors = [v for sec in RECORDED.values() for v in sec.values() if isinstance(v, str) and "Error: " in v]
    assert len(errors) > 30  # bad input's messages are recorded too
    # Checked inputs (and the meta-device placement probes), no call the battery got wrong.
    assert {e.split(":")[0] for e in errors} == {"ValueError", "NotImplementedError", "RuntimeError"}
    assert all("meta tensors" in e for e in errors if e.startswith("RuntimeError"))


def test_every_drafter_has_its_sections():
    from core_battery import PARTS, _drafters

    assert set(_drafters(None, None)) | {"misc"} == set(PARTS)


@pytest.mark.parametrize("got, want, equal", [
    (0.00359644, 0.00359645, True), (3.71262, 3.71263, True), (1.0, 1.00001, True), (9.99999, 10.0, True),
    (0.00359643, 0.00359645, False), (3.7126, 3.71263, False), (1.0, 1.00002, False), (1, 1.0, False),
    ([1, [2.5, "x"]], [1, [2.5, "x"]], True), ([1, 2], [1, 2, 3], False), ({"a": 1}, {"a": 2}, False),
])
def test_floats_are_equal_to_one_unit_of_their_sixth_digit_and_nothing_else_is_loosened(got, want, equal):
    assert same(got, want) is equal
