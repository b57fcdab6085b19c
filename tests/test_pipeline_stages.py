"""Each stage on the tiny random pair: its Parquet schema and a property of its numbers."""
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.jobs.context import build_context
from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from pipeline.stages import acceptance, distribution, divergence, speed, timing
from pipeline_helpers import make_cfg


def _run(tmp_path, stage_module, *overrides):
    cfg = make_cfg(tmp_path, *overrides)
    run_parts(cfg)
    name = stage_module.__name__.rsplit(".", 1)[1]
    path = output_path(cfg, name)
    assert pq.read_schema(path).remove_metadata() == stage_module.SCHEMA
    return pd.read_parquet(path), cfg


def test_timing_stage(tmp_path, capfd):
    df, _ = _run(tmp_path, timing, "stage=timing", "stage.repeats=4", "stage.warmup=1", "stage.pass_lengths=[1,3,9]")
    assert "timing passes:   0%|" in capfd.readouterr().err  # its progress and the time left, prompt by prompt
    assert set(df.model) == {"target", "draft"} and sorted(set(df.pass_len)) == [1, 3, 9]
    assert ((df.q25_s <= df.median_s) & (df.median_s <= df.q75_s) & (df.median_s > 0)).all()
    assert (df.samples == 4).all() and df.memory_trusted.all() and (df.param_devices == "cpu").all()


def test_acceptance_stage_perfect_draft_accepts_all(tmp_path):
    df, _ = _run(tmp_path, acceptance, "stage=acceptance", "pair.draft=copy", "k=3")
    assert (df.accepted == df.proposed).all()
    assert (df.groupby("prompt_id").new_tokens.sum() == 12).all()


def test_acceptance_stage_several_k(tmp_path):
    df, _ = _run(tmp_path, acceptance, "stage=acceptance", "stage.ks=[1,2]")
    assert sorted(df.k.unique()) == [1, 2]
    assert (df.accepted <= df.proposed).all() and (df.proposed <= df.k).all()
    assert (df.new_tokens == df.accepted + 1).all()


@pytest.mark.slow
def test_speed_stage_ratios_use_adjacent_runs(tmp_path):
    df, _ = _run(tmp_path, speed, "stage=speed", "stage.ks=[1,3]", "stage.rounds=2", "stage.timing_repeats=2",
                 "stage.timing_warmup=0")
    for _, block in df.groupby("block"):
        plain = block[block.arm == "plain"]
        assert len(plain) == 1 and len(block) == 3 and block.prompt_id.nunique() == 1
        expected = block.tokens_per_s / plain.tokens_per_s.iloc[0]
        assert (block.ratio_to_adjacent_plain - expected).abs().max() < 1e-12
        assert sorted(block.position) == [0, 1, 2]
    first = df[df.position == 0].sort_values("block")
    assert first.arm.nunique() > 1 or first.k.nunique() > 1  # the order rotates
    spec = df[df.arm == "speculative"]
    assert spec.identical_to_plain.all()
    assert (spec.verify_before_s > 0).all() and df[df.arm == "plain"].verify_before_s.isna().all()
    assert (spec.draft_s_per_iter > 0).all() and (spec.rollback_s_per_iter >= 0).all()


def test_divergence_stage_identical_outputs(tmp_path):
    df, _ = _run(tmp_path, divergence, "stage=divergence", "stage.ks=[2]")
    assert df.identical.all() and (df.classification == "identical").all()


def _tie_context(tmp_path):
    """A context whose top two next tokens have (nearly) equal logits: a forced tie."""
    ctx = build_context(make_cfg(tmp_path, "stage=divergence"))
    model = ctx.pair.target
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
        a, b = torch.topk(logits, 2).indices.tolist()
        model.lm_head.weight[b] = model.lm_head.weight[a] * (1 + 1e-7)
    return ctx, ids, a, b


def test_divergence_classifies_forced_tie(tmp_path):
    ctx, ids, a, b = _tie_context(tmp_path)
    row = divergence.analyse(ctx, ids, [a, 5, 6], [b, 7, 8], k=2)
    assert row["position"] == 0 and row["classification"] == "near_tie"
    assert row["gap_ulps"] <= 4
    assert set(row) >= {"gap_single_step", "gap_verify_pass", "gap_full_prefill", "ulp", "top_logit"}


def test_divergence_flags_a_real_difference_as_bug(tmp_path):
    ctx, ids, a, _ = _tie_context(tmp_path)
    logits = ctx.pair.target(ids).logits[0, -1]
    worst = int(torch.argmin(logits))
    row = divergence.analyse(ctx, ids, [a], [worst], k=2)
    assert row["classification"] == "bug" and row["gap_ulps"] > 1000


def test_distribution_stage_separates_rules(tmp_path):
    df, _ = _run(tmp_path, distribution, "stage=distribution", "stage.draws=20000", "stage.seeds=[0,1]",
                 "prompts.per_kind=2")
    assert set(df.rule) == {"correct", "resample_target", "keep_draft"}
    powered = df[~df.no_power]
    assert len(powered) > 0
    assert powered[powered.rule == "correct"].pvalue.min() > 1e-4
    assert powered[powered.rule == "keep_draft"].rejected.all()
    assert ((df.total_variation >= 0) & (df.total_variation <= 1)).all()
    assert (df.expected_acceptance - (1 - df.total_variation)).abs().max() < 1e-6  # sum min(p,q) = 1 - TV


def test_speed_stage_peer_arms_default_and_lookup(tmp_path):
    df, _ = _run(tmp_path, speed, "stage=speed", "stage.arms=[{},{method:hf_assisted},{method:hf_default},{method:hf_lookup}]",
                 "stage.timing_repeats=2", "stage.timing_warmup=0", "prompts.per_kind=1", "prompts.kinds=[code]")
    arms = df.groupby("arm").agg(k=("k", "first"), drafter=("drafter", "first"), policy=("k_policy", "first"))
    assert set(arms.index) == {"plain", "speculative", "hf_assisted", "hf_default", "hf_lookup"}
    assert arms.loc["hf_default"].k == 0 and arms.loc["hf_default"].policy == "library_default"
    assert arms.loc["hf_lookup"].drafter == "prompt_lookup" and arms.loc["hf_lookup"].k == 4
    assert df[df.arm != "plain"].identical_to_plain.all()  # greedy: every peer mode reproduces plain greedy


@pytest.mark.slow
def test_batch_stage_pass_times_and_adjacent_runs(tmp_path):
    from pipeline.stages import batch

    df, _ = _run(tmp_path, batch, "stage=batch", "stage.batch_sizes=[1,3]", "stage.ks=[2]", "stage.timing_repeats=2",
                 "stage.timing_warmup=0", "stage.pass_lengths=[1,4]")
    passes, runs = df[df.measure == "pass"], df[df.measure == "run"]
    assert set(zip(passes.batch_size, passes.model, passes.pass_len)) == {
        (b, "target", n) for b in (1, 3) for n in (1, 4)} | {(b, "draft", 1) for b in (1, 3)}
    assert (passes.median_s > 0).all()
    for _, block in runs.groupby("block"):
        assert sorted(block.arm) == ["plain", "speculative"] and block.batch_size.nunique() == 1
        plain = block[block.arm == "plain"].tokens_per_s.iloc[0]
        assert ((block.ratio_to_adjacent_plain - block.tokens_per_s / plain).abs() < 1e-12).all()
    spec = runs[runs.arm == "speculative"]
    assert spec.identical_to_plain.all()  # greedy: every row equals the batched plain run's row
    assert spec.layout_share.between(0, 1).all() and spec.masked_share.between(0, 1).all()
    assert set(runs[runs.batch_size == 3].prompt_ids.str.count(",")) == {2}
