"""Nothing measured changes: every committed stage file whose provenance record holds the job's Hydra
overrides recomposes, with today's conf/ and code, to the config hash its record and its name hold.

A job recorded with ``inputs`` (what it read besides its config: the plan it followed, the best fixed
configuration) is recomposed with them frozen; one recorded without them resolves them now from the
committed campaign, as a rerun of the same command would. A file that cannot be recomposed from its
record alone is listed below with the reason; a new file without overrides fails the test until listed.
Composing needs no model: the whole test takes a few seconds.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from pipeline.config.legacy_flags import compose_recorded
from pipeline.config.schema import register
from pipeline.jobs.identity import config_hash, output_path
from store.layout import STAGES, campaigns, stage_paths
from store.manifest import is_published
from store.records import read_meta

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ROOT / "outputs"

MIGRATED = ("written before provenance records: its record was added afterwards (note `migrated`) and holds no "
            "overrides to recompose")
NOT_RECOMPOSED = {f"reference/{stage}/smollm2_int8-{h}": MIGRATED for stage, hashes in {
    "timing": ["04bcc785ecb0f378", "33f09c7ab7eb2bb4", "578ee947d358dbca", "6b40968304458b3f", "b6c02b7778a294cc",
               "ff0851b3cc1f3dc0"],
    "acceptance": ["04bcc785ecb0f378", "2ff4604bb38c8666", "33f09c7ab7eb2bb4", "578ee947d358dbca", "6b40968304458b3f",
                   "b6c02b7778a294cc", "e073e1652d1ae0b9", "ec02af573f95cd20", "ff0851b3cc1f3dc0"],
    "speed": ["04bcc785ecb0f378", "2988a4e333ed190e", "2ca040cb01cc1a19", "32fd1cae72e7ffb9", "33f09c7ab7eb2bb4",
              "38c424b3e27e3a9c", "578ee947d358dbca", "5ccf3414b0fef744", "692ce09c4f48547d", "6b40968304458b3f",
              "7c86fa4c9dc087e7", "903e94c85c7abecd", "b6c02b7778a294cc", "c133ecc99f0e4d48", "e63b191e52d6f707",
              "ff0851b3cc1f3dc0"],
    "divergence": ["04bcc785ecb0f378", "33f09c7ab7eb2bb4", "578ee947d358dbca", "6b40968304458b3f", "b6c02b7778a294cc",
                   "ff0851b3cc1f3dc0"],
    "distribution": ["04bcc785ecb0f378", "33f09c7ab7eb2bb4", "578ee947d358dbca", "6b40968304458b3f",
                     "b6c02b7778a294cc", "d2959af6e4cd2d96", "ff0851b3cc1f3dc0"],
}.items() for h in hashes}

# Jobs whose record needs more than its overrides, by config hash: the overrides that restore what a
# preset or a stage's YAML said when the job ran, and the inputs it was named by (frozen; {}: none).
NO_INPUTS = "written before a job's hash named what it reads besides its config (cfg.inputs): none"
EARLIER_CONF = {
    "14858f2fa28f96b4": (["stage.policy_drafters=[]"], {},
                         "conf/stage/plan.yaml ran the cost-model policy with the job's drafter only; " + NO_INPUTS),
    "1ab7edc099c9b890": (["stage.drafter_ks=[2,4,8]", "stage.block_timing_repeats=0"], {},
                         "conf/sweep/check_plan.yaml had lookup and the hybrid at k = 2, 4, 8 and no block "
                         "timings; " + NO_INPUTS),
    "0cbad74ac38db852": (["stage.peer=false", "stage.peer_modes=[matched]"], {},
                         "conf/sweep/confirm_plan.yaml ran no transformers peer; " + NO_INPUTS),
    "b137c34ff132a3a0": ([], {}, NO_INPUTS),
    "834fe90a79b82d54": ([], {}, NO_INPUTS),
    "85164dfad74e3f71": ([], {}, NO_INPUTS),
}


def _stage_files() -> list[Path]:
    """The committed stage files: those of the published campaigns (a user's `scratch` runs, git-ignored, are
    not records to recompose: `make run` before `make test` leaves some)."""
    return [p for c in campaigns(OUTPUTS) if is_published(OUTPUTS / "campaigns" / c)
            for s in STAGES for p in stage_paths(OUTPUTS, c, s)]


def _key(path: Path) -> str:
    return path.relative_to(OUTPUTS / "campaigns").with_suffix("").as_posix()


RECOMPOSABLE = [p for p in _stage_files() if read_meta(p).get("overrides")]


def test_every_file_without_overrides_is_listed_with_its_reason():
    unlisted = [_key(p) for p in _stage_files() if not read_meta(p).get("overrides") and _key(p) not in NOT_RECOMPOSED]
    assert not unlisted, f"stage files whose records cannot be recomposed, not listed in NOT_RECOMPOSED: {unlisted}"
    stale = set(NOT_RECOMPOSED) - {_key(p) for p in _stage_files()}
    assert not stale, f"NOT_RECOMPOSED lists files that are not committed: {sorted(stale)}"
    assert all(read_meta(OUTPUTS / "campaigns" / f"{key}.parquet").get("migrated") for key in NOT_RECOMPOSED)
    assert len(RECOMPOSABLE) >= 20  # the time-model campaigns and the batch jobs


# Every file finished before ``merge_prefill`` and ``stage.replay`` existed ran the loop with the prompt
# prefilled apart and ran every acceptance configuration: its job is the one that says so (a key's value
# before it existed is left out of the hash, store/compat.py).
MERGED_PREFILL_SINCE = "2026-12-02T02:20:00+00:00"


def earlier_conf(meta: dict) -> tuple[list[str], dict | None, str]:
    """What a file's record needs besides its overrides to recompose: ``EARLIER_CONF``'s entry, and
    ``merge_prefill=false`` for a file measured before the prompt rode in the first iteration
    (``as_before`` then sets the stage's replay off where the stage has one)."""
    extra, frozen, why = EARLIER_CONF.get(meta["config_hash"], ([], None, ""))
    if predates_merge(meta):
        extra = [*extra, "merge_prefill=false"]
    return extra, frozen, why


def predates_merge(meta: dict) -> bool:
    return meta.get("finished_at", "") < MERGED_PREFILL_SINCE


# Every plan finished before its sample could grow kept the sample prompts.per_kind chose and timed every
# selected prompt (conf/stage/plan.yaml: prompts_to_time 100, no time_per_kind).
SAMPLE_GROWS_SINCE = "2026-12-04T18:30:00+00:00"


# Every speed job finished before the speed stage raced by default ran its rounds in full (stage.race false,
# stage.precision null) and, where neither a conf file nor its command set stage.rounds, one round; the main job
# (stage=quick) ran the job's own arms only.
RACE_DEFAULT_SINCE = "2026-12-07T08:00:00+00:00"


def sweep_keys(meta: dict) -> set[str]:
    """The dotted keys the job's sweep presets (``+sweep=NAME``: conf/sweep/NAME.yaml) set."""
    import yaml

    def keys(d: dict, prefix: str = "") -> set[str]:
        return {k for name, v in d.items() for k in (keys(v, f"{prefix}{name}.") if isinstance(v, dict)
                                                      else {f"{prefix}{name}"})}

    out = set()
    for o in meta.get("overrides") or []:
        if o.startswith("+sweep="):
            out |= keys(yaml.safe_load((ROOT / "conf" / "sweep" / f"{o.split('=', 1)[1]}.yaml").read_text()) or {})
    return out


def as_before(cfg, meta: dict) -> None:
    """A composed job as it ran before ``stage.replay`` (every acceptance configuration ran the loop), a plan job
    as it ran before its sample grew, and a speed job as it ran before racing was the default."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in meta.get("overrides") or []} | sweep_keys(meta)
    if meta.get("finished_at", "") < RACE_DEFAULT_SINCE and "race" in cfg.stage:
        with open_dict(cfg):
            cfg.stage.race = cfg.stage.race if "stage.race" in given else False
            cfg.stage.precision = cfg.stage.precision if "stage.precision" in given else None
            if "stage.rounds" not in given and cfg.stage.rounds == 3:  # no conf file set 3 rounds before
                cfg.stage.rounds = 1
            if cfg.stage.name == "quick" and "stage.arms" not in given:
                cfg.stage.arms = None
    if predates_merge(meta) and "replay" in cfg.stage:
        with open_dict(cfg):
            cfg.stage.replay = False
    if meta.get("finished_at", "") < SAMPLE_GROWS_SINCE and cfg.stage.name == "plan":
        with open_dict(cfg):
            cfg.stage.sample_precision, cfg.stage.time_per_kind = None, 0
            if not any(o.startswith("stage.prompts_to_time=") for o in meta.get("overrides") or []):
                cfg.stage.prompts_to_time = 100


@pytest.fixture(scope="module")
def conf():
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield


@pytest.mark.parametrize("path", RECOMPOSABLE, ids=_key)
def test_recorded_overrides_recompose_to_the_recorded_hash(conf, path):
    meta = read_meta(path)
    extra, frozen, _why = earlier_conf(meta)
    cfg = compose_recorded([*meta["overrides"], *extra, f"outputs_dir={OUTPUTS}"],  # flags before stage.arms: arms
                           lambda o: compose(config_name="config", overrides=o))
    inputs = meta["inputs"] if "inputs" in meta else frozen
    as_before(cfg, meta)
    if inputs is not None:
        with open_dict(cfg):
            cfg.inputs = inputs
    assert config_hash(cfg) == meta["config_hash"]
    assert output_path(cfg, meta["stage"]) == path


def test_every_earlier_conf_entry_is_a_committed_job():
    hashes = {read_meta(p)["config_hash"] for p in RECOMPOSABLE}
    assert set(EARLIER_CONF) <= hashes
