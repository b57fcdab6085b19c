"""No option is silently ignored: a stage's run name holds only the options it reads, a stage of a multi-stage
job says which of the job's options it does not read, and the batch stage runs the job's drafter and k policy."""
from __future__ import annotations

import pandas as pd

from pipeline.jobs.identity import config_hash, output_path
from pipeline.run import run_parts, validate
from pipeline.stages import stage_module
from pipeline.config.stage_options import USES, check_used, unused_note
from pipeline_helpers import make_cfg
from store.layout import STAGES


def test_every_stage_part_says_what_it_reads():
    assert set(USES) == set(STAGES)


def test_a_multi_stage_job_leaves_an_option_out_of_the_names_of_stages_that_ignore_it(tmp_path):
    cfg = make_cfg(tmp_path, "stage=all", "drafter=prompt_lookup", "sampling=t07")
    check_used(cfg, list(cfg.stage.parts))  # acceptance and speed read both
    names = {part: stage_module(part).describe(cfg) for part in cfg.stage.parts}
    assert "prompt_lookup" in names["acceptance"] and "T0.7" in names["acceptance"]
    assert "prompt_lookup" not in names["timing"] and "T0.7" not in names["timing"]
    assert "prompt_lookup" not in names["distribution"] and "T0.7" in names["distribution"]
    assert "prompt_lookup" in names["divergence"] and "T0.7" not in names["divergence"]
    assert unused_note(cfg, "distribution") == [
        "distribution does not read drafter=prompt_lookup (left out of this run's name; the job's other stages read it)"]
    assert "sampling.do_sample=True" in unused_note(cfg, "divergence")[0]
    assert unused_note(cfg, "acceptance") == []


def test_defaults_are_not_options_to_refuse(tmp_path):
    for stage in ("timing", "distribution", "divergence", "batch", "plan", "all", "quick"):
        cfg = make_cfg(tmp_path, f"stage={stage}")
        check_used(cfg, list(cfg.stage.parts))
    validate(make_cfg(tmp_path, "stage=distribution", "sampling=t10"))  # the conformance sweep's job


def test_batch_stage_runs_the_jobs_drafter_and_k_policy(tmp_path, monkeypatch):
    from pipeline.stages import batch

    seen = []
    real = batch.batch_speculative_generate

    def spy(target, drafter, prompts, n, k, *args, **kwargs):
        seen.append((type(drafter).__name__, type(k).__name__))
        return real(target, drafter, prompts, n, k, *args, **kwargs)

    monkeypatch.setattr(batch, "batch_speculative_generate", spy)
    small = ("stage=batch", "stage.batch_sizes=[2]", "stage.ks=[2]", "stage.timing_repeats=1", "stage.timing_warmup=0",
             "stage.pass_lengths=[1]", "max_new_tokens=6")
    cfg = make_cfg(tmp_path, *small, "drafter=prompt_lookup", "k_policy=heuristic")
    assert "prompt_lookup heuristic" in batch.describe(cfg)
    run_parts(cfg)
    assert seen and set(seen) == {("PromptLookupDrafter", "HeuristicK")}
    runs = pd.read_parquet(output_path(cfg, "batch")).query("measure == 'run'")
    assert runs[runs.arm == "speculative"].identical_to_plain.all()  # greedy, whatever proposes

    seen.clear()
    default = make_cfg(tmp_path, *small)
    run_parts(default)
    assert set(seen) == {("ModelDrafter", "FixedK")}  # the committed batch jobs' arm: the draft model, k fixed
    assert config_hash(default) != config_hash(cfg)
