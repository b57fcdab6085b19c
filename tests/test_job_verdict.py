"""A speed job ends with its answer per kind (pipeline/jobs/verdict.py), and a sweep's closing table carries each
job's trust state and the best configuration per kind over its jobs (pipeline/jobs/summary.py)."""
import json
import math

from pipeline.jobs.verdict import as_records, kind_verdicts, verdict_lines
from pipeline.jobs.stage_output import ArmResult
from pipeline.jobs.summary import RECORD, multirun_summary

NAN = math.nan


def _arm(label, kind, speedup, lo, hi, runs=8):
    return ArmResult(f"run {label} {kind}", {"kind": kind},
                     {"speedup": speedup, "speedup_lo": lo, "speedup_hi": hi, "runs": runs, "level": 0.95}, label)


ARMS = [_arm("draft model k=2", "code", 1.21, 1.10, 1.30), _arm("draft model k=4", "code", 1.34, 1.20, 1.45),
        _arm("draft model k=4", "prose", 0.84, 0.73, 0.98), _arm("prompt lookup k=4", "prose", 0.97, 0.90, 1.05),
        _arm("draft model k=4", "structured", 1.40, NAN, NAN, runs=2), _arm("draft model k=4", "all", 1.2, 1.0, 1.3)]


def test_each_kind_gets_its_fastest_arm_and_verdict():
    """Per kind the highest median speed-up wins; pooled 'all' is left out when kinds exist."""
    got = {v.kind: (v.config, v.verdict) for v in kind_verdicts(ARMS)}
    # prose: its best, 0.97 (0.90-1.05), is below 1 but not shown to lose: unclear, not use plain
    assert got == {"code": ("draft model k=4", "speculate"), "prose": ("prompt lookup k=4", "unclear"),
                   "structured": ("draft model k=4", "too few runs (2 of 6)")}


def test_a_job_of_one_kind_answers_for_it():
    assert [v.kind for v in kind_verdicts([_arm("draft model k=4", "all", 1.2, 1.1, 1.3)])] == ["all"]


def test_closing_lines_say_interval_or_its_absence_trust_and_machine():
    lines = verdict_lines(kind_verdicts(ARMS), "load", "Some CPU, 2 cores")
    assert lines[0] == "verdict code: draft model k=4 x1.34 (95% interval 1.20-1.45, 8 runs): speculate (faster than plain)"
    assert lines[2] == ("verdict structured: draft model k=4 x1.40 (too few runs for an interval, 2 runs): "
                        "too few runs (2 of 6)")
    assert lines[-1].startswith("trust: NOT TRUSTED (load") and "Some CPU, 2 cores" in lines[-1]
    assert verdict_lines(kind_verdicts(ARMS), "ok", "m")[-1].startswith("trust: ok; measured on m")
    assert verdict_lines([], "ok", "m") == []


def _sweep(tmp_path, jobs):
    for job, (trust, arms) in enumerate(jobs):
        folder = tmp_path / str(job)
        folder.mkdir()
        record = {"job": job, "overrides": f"k={job + 2} pair=tiny_random", "parts": [
            {"stage": "speed", "status": "computed", "file": "", "headline": "speedup 1.2", "trust": trust,
             "verdicts": as_records(kind_verdicts(arms))}]}
        (folder / RECORD).write_text(json.dumps(record))


def test_sweep_table_has_trust_and_the_best_per_kind_over_jobs(tmp_path, capsys):
    """The trust column shows each job's state, untrusted jobs are named under the table, and the best per kind
    is taken over every job's verdicts."""
    _sweep(tmp_path, [("ok", ARMS[:2]), ("load,drift", [_arm("draft model k=6", "code", 1.5, 1.05, 1.9)])])
    table, lines = multirun_summary(tmp_path)
    assert list(table.trust) == ["ok", "load,drift"]
    text = "\n".join(lines)
    assert "| trust " in lines[1] and "NOT TRUSTED: jobs 1 (load,drift)" in text
    assert ("best for code: draft model k=6 x1.50 (95% interval 1.05-1.90, 8 runs) in job 1: speculate (faster than plain), "
            "NOT TRUSTED (load,drift)") in text


def test_sweep_of_records_without_trust_still_reads(tmp_path):
    """Records written before trust and verdicts joined them show '-' and no best line."""
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / RECORD).write_text(json.dumps({"job": 0, "overrides": "k=2", "parts": [
        {"stage": "speed", "status": "computed", "file": "", "headline": ""}]}))
    table, lines = multirun_summary(tmp_path)
    assert list(table.trust) == ["-"] and not any(line.startswith("best for") for line in lines)


def test_the_plans_choice_not_to_speculate_is_use_plain_whatever_its_noise():
    """Plain beside plain measures the machine's noise: an interval above 1 there is no reason to speculate."""
    [v] = kind_verdicts([_arm("plain decoding (plan)", "chat", 1.07, 1.01, 1.17)])
    assert v.verdict == "use plain"


def test_use_plain_needs_an_interval_below_one():
    """A best whose median is below 1 but whose interval reaches 1 is not shown to lose (issue 49)."""
    from speclab.stats.verdict import verdict
    assert verdict(0.97, 0.80, 1.20, 8) == "unclear"
    assert verdict(0.97, 0.90, 0.99, 8) == "use plain"
    assert verdict(1.05, 1.01, 1.20, 8) == "speculate"


def test_the_words_say_slower_only_where_the_interval_lies_below_one():
    from pipeline.jobs.verdict import KindVerdict
    from speclab.stats.verdict import verdict

    not_shown = KindVerdict("prose", "draft model k=4", 0.97, 0.80, 1.20, 8, 0.95, verdict(0.97, 0.80, 1.20, 8))
    assert not_shown.text().endswith(": unclear (not shown faster than plain)") and "slower" not in not_shown.text()
    slower = KindVerdict("prose", "draft model k=4", 0.93, 0.90, 0.99, 8, 0.95, verdict(0.93, 0.90, 0.99, 8))
    assert slower.text().endswith(": use plain (slower than plain)")
    few = KindVerdict("prose", "draft model k=4", 0.93, float("nan"), float("nan"), 4, 0.95, verdict(0.93, float("nan"), 0, 4))
    assert few.text().endswith(": too few runs (4 of 6)")
