"""A drafter added in two files, its module and its YAML, runs in every stage (issue 47, item 4).

The test writes a toy drafter (it proposes the text's last token again and again) and its option file into a
temporary folder, puts the folder on ``sys.path`` and on Hydra's search path, and runs the acceptance stage (the
replay on, as by default: it cannot replay the toy, so it runs the loop for it), the speed stage and the plan stage on
the tiny random pair. Nothing of the repository changes.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from pipeline.jobs.identity import output_path
from pipeline.run import run_parts
from pipeline_helpers import CONF
from speclab.specs.arms import DRAFTER_PARTS

ROOT = Path(__file__).resolve().parents[1]
MODULE = "toy_drafter_issue47"
NAME = "repeat_last"

TOY_MODULE = textwrap.dedent('''
    """A toy drafter: it proposes the text's last token, k times (at most ``most``)."""
    from speclab.decoding.drafters import Drafter


    class RepeatLastDrafter(Drafter):
        def __init__(self, most: int = 8) -> None:
            self.most = most

        def start_rows(self, seq, n_ctx, n_ctx_h):
            pass

        def label_rows(self, seq, length_h):
            return [None] * len(length_h)

        def propose_rows(self, seq, length, length_h, ks, sampling, generator):
            counts = []
            for b, (n, k) in enumerate(zip(length_h, ks)):
                k = min(k, self.most)
                seq[b, n: n + k] = seq[b, n - 1]
                counts.append(k)
            return counts, None

        def rollback_rows(self, valid_length, accepted_h):
            pass

        def select_rows(self, rows, rows_h):
            pass

        def caches(self):
            return []
''')

TOY_YAML = textwrap.dedent(f'''
    # A toy drafter: the text's last token again (tests/test_toy_drafter.py).
    _target_: {MODULE}.RepeatLastDrafter
    name: {NAME}
    most: 8
''')


def repo_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy drafter's two files: its module (on sys.path) and its option file (on Hydra's search path)."""
    code, conf = tmp_path / "code", tmp_path / "conf"
    (conf / "drafter").mkdir(parents=True)
    code.mkdir()
    (code / f"{MODULE}.py").write_text(TOY_MODULE)
    (conf / "drafter" / f"{NAME}.yaml").write_text(TOY_YAML)
    monkeypatch.syspath_prepend(str(code))
    yield conf
    sys.modules.pop(MODULE, None)


def cfg_with(tmp_path, conf: Path, *overrides: str):
    base = ["pair=tiny_random", "prompts=smoke", "prompts.per_kind=1", "prompts.kinds=[code]", "max_new_tokens=10",
            "device=cpu", f"outputs_dir={tmp_path / 'outputs'}", "mlflow.enabled=false",
            f"hydra.searchpath=[file://{conf}]", f"drafter={NAME}"]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))


def test_a_toy_drafter_in_two_files_runs_in_every_stage(tmp_path, toy, caplog):
    before = repo_state()

    acc_cfg = cfg_with(tmp_path, toy, "stage=acceptance", "stage.ks=[1,3]")
    assert acc_cfg.stage.replay  # the default: replay every configuration it can
    with caplog.at_level(logging.INFO, logger="speclab"):
        run_parts(acc_cfg)
    acc = pd.read_parquet(output_path(acc_cfg, "acceptance"))
    assert set(acc.drafter) == {NAME} and sorted(acc.k.unique()) == [1, 3]
    assert not acc.replayed.any()  # the replay does not know the toy: each configuration ran for real
    assert (acc.proposed <= acc.k).all() and (acc.proposed == acc.k).any() and (acc.accepted <= acc.proposed).all()
    assert (acc.new_tokens == acc.accepted + 1).all() and (acc.total_s > 0).all()
    assert (acc.draft_calls == 0).all()  # no draft model runs
    said = [r.getMessage() for r in caplog.records if "replay cannot reproduce" in r.getMessage()]
    assert len(said) == 1 and NAME in said[0]  # said once on the console

    speed_cfg = cfg_with(tmp_path, toy, "stage=speed", "stage.ks=[2]", "stage.timing_repeats=2",
                         "stage.timing_warmup=0")
    run_parts(speed_cfg)
    speed = pd.read_parquet(output_path(speed_cfg, "speed"))
    spec = speed[speed.arm == "speculative"]
    assert set(spec.drafter) == {NAME} and len(spec) and (spec.tokens_per_s > 0).all()
    assert spec.identical_to_plain.all()

    plan_cfg = cfg_with(tmp_path, toy, "stage=plan", "stage.sample_precision=null", "stage.repeats=2",
                        "stage.warmup=0", "stage.pass_lengths=[1,2,3]", "stage.context_extra=[0,8]",
                        "stage.acceptance_ks=[1,2]", "stage.bootstrap=100", f"stage.arms=[{{drafter:{NAME}}},{{drafter:model}},"
                        f"{{drafter:{NAME},k_policy:cost_model}}]")
    run_parts(plan_cfg)
    pacc = pd.read_parquet(output_path(plan_cfg, "acceptance"))
    assert not pacc[pacc.drafter == NAME].replayed.any() and pacc[pacc.drafter == "model"].replayed.any()
    plan = pd.read_parquet(output_path(plan_cfg, "plan"))
    toy_rows = plan[plan.drafter == NAME]
    assert set(zip(toy_rows.k_policy, toy_rows.k)) >= {("fixed", 1), ("fixed", 2)}
    assert (toy_rows.predicted > 0).all()
    assert plan.groupby("kind").recommended.sum().eq(1).all()

    assert DRAFTER_PARTS[NAME] == (False, False)  # its class said: no draft model, no n-gram lookup
    assert repo_state() == before  # no file of the repository was needed, nor written
    assert not (ROOT / "conf" / "drafter" / f"{NAME}.yaml").exists() and not list(ROOT.rglob(f"{MODULE}.py"))


def test_the_toy_is_checked_as_an_option_wherever_a_drafter_is_named(tmp_path, toy):
    from pipeline.config.schema import ConfigError, check_config
    from pipeline.engines.option_checks import check_engine
    from store.layout import STAGES

    for stage, arms in (("acceptance", f"[{{drafter:{NAME}}},{{drafter:model}}]"),
                        ("speed", f"[{{}},{{drafter:{NAME},ks:[2]}},{{drafter:prompt_lookup}}]")):
        cfg = cfg_with(tmp_path, toy, f"stage={stage}", f"stage.arms={arms}")
        check_config(cfg, STAGES)
        check_engine(cfg, [stage])
    cfg = cfg_with(tmp_path, toy, "stage=acceptance", "stage.arms=[{drafter:repeat_first}]")
    with pytest.raises(ConfigError, match="drafter 'repeat_first' is not a drafter option"):  # another name: refused
        check_engine(cfg, ["acceptance"])


def test_the_shipped_drafters_declare_what_stored_rows_are_read_with(tmp_path, toy, tiny_pair):
    """The pipeline asks the class; the table beside stored rows (speclab.specs.arms.DRAFTER_PARTS) says the same
    for the shipped options, and the replay reproduces exactly the classes that declare ``replay_as``."""
    import importlib

    import torch

    from pipeline.config.schema import DRAFTERS
    from pipeline.config.strategy_config import drafter_class, make_drafter
    from speclab.decoding.drafters import declared
    from speclab.drafting.replay import NotReplayable, ReplayDrafter, replayable
    from speclab.drafting.strategy import drafts_with_model
    from omegaconf import OmegaConf

    for name, schema in DRAFTERS.items():
        conf = OmegaConf.structured(schema)
        cls = drafter_class(conf)
        assert DRAFTER_PARTS[name] == (drafts_with_model(cls), declared(cls, "looks_up"))
        assert replayable(cls) and ReplayDrafter.of(make_drafter(conf, tiny_pair[1])).kind == name
    toy_cls = importlib.import_module(MODULE).RepeatLastDrafter
    assert not drafts_with_model(toy_cls) and not declared(toy_cls, "looks_up") and not replayable(toy_cls)
    with pytest.raises(NotReplayable, match="RepeatLastDrafter cannot be replayed"):
        ReplayDrafter.of(toy_cls())
    assert replayable(torch.nn.Linear(1, 1))  # a bare draft model replays as the model drafter
