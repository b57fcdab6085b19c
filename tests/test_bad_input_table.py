"""The bad-input table: each bad value is a one-line error naming it, found before any model computes,
and a result already written stays as it was."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.schema import register
from pipeline.jobs.context import build_context
from pipeline.jobs.errors import error_line
from pipeline.run import open_job

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
BASE = ["pair=tiny_random", "prompts=smoke", "max_new_tokens=8", "device=cpu", "mlflow.enabled=false",
        "stage=acceptance"]
register()

GOOD = "- {id: a, kind: prose, text: 'Once upon a time'}\n- {id: b, kind: code, text: 'def f(x):'}\n"
PROMPT_FILES = {
    "malformed": ("- {id: a, kind: prose, text: 'unclosed\n", "is not valid YAML at line"),
    "empty": ("", "holds no prompts"),
    "comments_only": ("# nothing here\n", "holds no prompts"),
    "mapping": ("id: a\nkind: prose\ntext: hi\n", "holds a dict"),
    "no_text": ("- {id: a, kind: prose}\n", "lacks ['text']"),
    "no_id": ("- {kind: prose, text: hello}\n", "lacks ['id']"),
    "no_kind": ("- {id: a, text: hello}\n", "lacks ['kind']"),
    "empty_text": ("- {id: a, kind: prose, text: '   '}\n", "prompt 'a' in"),
    "duplicate_ids": (GOOD + "- {id: a, kind: prose, text: 'another text'}\n", "prompt id 'a' appears twice"),
    "string_entry": ("- just a string\n", "each prompt is a mapping"),
    "empty_id": ("- {id: '', kind: prose, text: hi}\n", "empty id or kind"),
    # A text must be a string, not whatever YAML made of it ([1, 2] was measured as the text "[1, 2]").
    "text_list": ("- {id: a, kind: prose, text: [1, 2]}\n", "prompt #1 (id 'a') in text_list.yaml has a text of type list"),
    "text_number": ("- {id: a, kind: prose, text: 12}\n", "has a text of type int (12): write the text as a string"),
    "kind_list": ("- {id: a, kind: [prose], text: hi}\n", "has a 'kind' of type list: use a name"),
    "lone_surrogate": ('- {id: a, kind: prose, text: "bad \\ud800 here"}\n',
                       "prompt 'a' in lone_surrogate.yaml has an invalid character '\\ud800' at position 5 (a lone "
                       "surrogate): texts must be valid Unicode"),
    # Longer than the tiny model's 512 positions: refused, not cut to the stand-in tokenizer's 64 bytes.
    "too_long": (f"- {{id: a, kind: prose, text: '{'x' * 600_000}'}}\n",
                 "prompt 'a' has 600000 bytes (a tokenizer-less model's tokens), more than the target's context of 512"),
}

CASES = [
    # (overrides, expected substring)
    (["k=0"], "k=0 is not allowed: use an integer >= 1"),
    (["k=-1"], "k=-1 is not allowed"),
    (["k=2.5"], "k='2.5' is not allowed: use an integer >= 1"),
    (["k=abc"], "k='abc' is not allowed"),
    (["max_new_tokens=abc"], "max_new_tokens='abc' is not allowed: use an integer >= 1"),
    (["max_new_tokens=0"], "max_new_tokens=0 is not allowed"),
    (["seed=-1"], "seed=-1 is not allowed: use an integer >= 0"),
    (["threads=-1"], "threads=-1 is not allowed: use an integer >= 0"),
    (["round=-1"], "round=-1 is not allowed"),
    (["rotation=-2"], "rotation=-2 is not allowed"),
    (["device=tpu"], "device='tpu' is not allowed: use one of auto, cpu, cuda"),
    (["force=maybe"], "force='maybe' is not allowed: use true or false"),
    (["mlflow.enabled=perhaps"], "mlflow.enabled='perhaps' is not allowed: use true or false"),
    (["mlflow.experiment=' '"], "mlflow.experiment=' ' is not allowed"),
    (["sampling.do_sample=maybe"], "sampling.do_sample='maybe' is not allowed: use true or false"),
    (["sampling=t07", "sampling.temperature=0"], "sampling.temperature=0.0 is not allowed when sampling"),
    (["sampling=t07", "sampling.temperature=-1"], "sampling.temperature=-1.0 is not allowed when sampling"),
    (["sampling.top_p=1.5"], "sampling.top_p=1.5 is not allowed: use a number in (0, 1]"),
    (["sampling.top_p=0"], "sampling.top_p=0.0 is not allowed"),
    (["sampling.top_k=-2"], "sampling.top_k=-2 is not allowed"),
    (["sampling.temperature=hot"], "sampling.temperature='hot' is not allowed: use a number"),
    (["pair=nope"], "pair=nope is not allowed: use one of ["),
    (["pair.dtype=int3"], "pair.dtype='int3' is not allowed: use one of ['float32', 'bfloat16', 'float16']"),
    (["prompts.per_kind=-1"], "prompts.per_kind=-1 is not allowed: use an integer >= 0"),
    (["prompts.per_kind=two"], "prompts.per_kind='two' is not allowed"),
    (["prompts.kinds=[]"], "prompts.kinds=[] is not allowed: use a non-empty list"),
    (["prompts.kinds=code"], "prompts.kinds='code' is not allowed: use a non-empty list"),
    (["prompts.kinds=[poetry]"], "prompt kinds ['poetry'] not in default.yaml: allowed are"),
    (["prompts.file=missing.yaml"], "prompt file 'missing.yaml' not found: use one of"),
    (["stage.parts=[warp]"], "stage.parts=['warp'] is not allowed: use a non-empty list drawn from"),
    (["stage.parts=[]"], "stage.parts=[] is not allowed"),
    (["stage=nope"], "stage=nope is not allowed: use one of"),
    (["stage.typo=1"], "stage.typo is not a config key here"),
    (["stage=timing", "stage.repeats=0"], "stage.repeats=0 is not allowed: use an integer >= 1"),
    (["stage=timing", "stage.pass_lengths=[]"], "stage.pass_lengths=[] is not allowed"),
    (["stage=timing", "stage.prompts_to_time=0"], "stage.prompts_to_time=0 is not allowed"),
    (["stage=speed", "stage.timing_repeats=0"], "stage.timing_repeats=0 is not allowed: use an integer >= 1"),
    (["stage=speed", "stage.rounds=0"], "stage.rounds=0 is not allowed"),
    (["stage=acceptance", "stage.arms=[{drafter:oracle}]"], "stage.arms entry {'drafter': 'oracle'}: drafter 'oracle' is not a drafter option: use null or one of"),
    (["stage=acceptance", "stage.arms=[{ks:[0]}]"], "stage.arms entry {'ks': [0]}: stage.arms ks=[0] is not allowed: use null or a non-empty list"),
    (["stage=speed", "stage.arms=[{kss:[2]}]"], "kss is not a config key here"),
    (["stage=speed", "stage.arms=[{method:magic}]"], "stage.arms method='magic' is not allowed: use one of ['speculative'"),
    (["stage=speed", "stage.arms=[{settings:{p_min:0.5}}]"], "settings and default are an engine's own (engine=llama_cpp)"),
    (["stage=acceptance", "stage.arms=[{method:hf_default}]"], "method hf_default runs in the speed stage"),
    (["stage=speed", "stage.arms=[{tree:'static:2-0'}]"], "stage.arms entry {'tree': 'static:2-0'}:"),
    (["stage=speed", "stage.arms=4"], "stage.arms='4' is not allowed: use null or a list of arm entries"),
    (["stage=plan", "stage.context_extra=[]"], "stage.context_extra=[] is not allowed"),
    (["stage=plan", "stage.level=1.5"], "stage.level=1.5 is not allowed: use a number in (0, 1)"),
    (["stage=plan", "stage.bootstrap=5"], "stage.bootstrap=5 is not allowed: use an integer >= 100"),
    (["prompts.skip_per_kind=-1"], "prompts.skip_per_kind=-1 is not allowed: use an integer >= 0"),
    (["stage=speed", "stage.ks=[0,2]"], "stage.ks=[0, 2] is not allowed: use a list of integers >= 1"),
    (["stage=acceptance", "stage.arms=[{k_policy:magic}]"], "k_policy 'magic' is not allowed: use null or one of ['fixed'"),
    (["stage=distribution", "stage.draws=-5"], "stage.draws=-5 is not allowed: use an integer >= 100"),
    (["stage=distribution", "stage.alpha_level=1.5"], "stage.alpha_level=1.5 is not allowed"),
    (["stage=distribution", "stage.contexts=everywhere"], "stage.contexts='everywhere' is not allowed: use one of"),
    (["stage=distribution", "stage.seeds=[a]"], "stage.seeds='[a]' is not allowed: use a non-empty list of integers"),
    (["stage=divergence", "stage.tie_ulps=-1"], "stage.tie_ulps=-1 is not allowed"),
    (["k_policy=cost_model", "k_policy.decay=1.5"], "k_policy.decay=1.5 is not allowed: use a number in (0, 1)"),
    (["k_policy=cost_model", "k_policy.k_min=5", "k_policy.k_max=2"], "k_policy.k_min=5 with k_policy.k_max=2"),
    (["k_policy=cost_model", "k_policy.c_draft=-1"], "k_policy.c_draft=-1.0 is not allowed"),
    (["k_policy=heuristic", "k_policy.k_max=0"], "k_policy.k_max=0 is not allowed"),
    (["k_policy=cost_model", "k_policy.k_min=-1"], "k_policy.k_min=-1 is not allowed: use an integer >= 0"),
    (["k_policy=heuristic", "k_policy.k_min=0"], "k_policy.k_min=0 is not allowed with k_policy=heuristic: use an integer >= 1"),
    (["k_policy=cost_model", "k_policy.probe_every=0"], "k_policy.probe_every=0 is not allowed: use an integer >= 1"),
    (["stage=speed", "stage.block_timing_repeats=-2"], "stage.block_timing_repeats=-2 is not allowed: use an integer >= 0"),
    (["k_policy=cost_model", "k_policy.condition_on=ngram"], "k_policy.condition_on='ngram' is not allowed: use one of"),
    (["k_policy=cost_model", "k_policy.free_k_min=-1"], "k_policy.free_k_min=-1 is not allowed: use null (the same as k_min) or an integer >= 0"),
    (["k_policy=cost_model", "k_policy.free_k_min=11"], "k_policy.free_k_min=11 with k_policy.k_max=10 is not allowed"),
    (["k_policy=nope"], "k_policy=nope is not allowed: use one of"),
    (["drafter=prompt_lookup", "drafter.min_ngram=4", "drafter.max_ngram=2"], "drafter.min_ngram=4 with drafter.max_ngram=2"),
    (["drafter=nope"], "drafter=nope is not allowed: use one of"),
    (["campaign=../elsewhere"], "campaign='../elsewhere' is not allowed: use a name of letters"),
    (["campaign=''"], "campaign='' is not allowed"),
    # Found once the pair is known, still before any stage computes:
    (["max_new_tokens=500"], "needs 569 positions, more than the target's context of 512"),
    (["pair.draft=int4"], "int4"),
    (["pair.target=/nonexistent/model"], "/nonexistent/model"),
    (["pair.target=tiny-random:x"], "tiny-random:x"),
    # Nothing ignored: a key the schema does not know is refused with the close matches (not advised as +key).
    (["+sweeps=speed"], "sweeps is not a config key here: did you mean +sweep=speed? New keys are not allowed"),
    (["+stage.round=3"], "stage.round is not a config key here: did you mean round=3?"),
    (["+rund=1"], "rund is not a config key here: did you mean round=1"),
    (["+sampling.temprature=0.5"], "did you mean sampling.temperature=0.5"),
    (["+drafter.max_ngrams=3", "drafter=prompt_lookup"], "drafter.max_ngrams is not a config key here: did you mean "
                                                         "drafter.max_ngram=3"),
    (["stage.round=3"], "stage.round is not a config key here: did you mean round=3 or stage.rounds=3? New keys are "
                        "not allowed"),
    (["+sweep=sped"], "sweep=sped is not allowed: did you mean speed? use one of ["),
    (["+sweep=nosuch"], "sweep=nosuch is not allowed: use one of ['acceptance'"),
    (["pair=tiny_randm"], "pair=tiny_randm is not allowed: did you mean tiny_random?"),
    # An option no stage of the job reads is refused (it would only rename and rehash the same measurement).
    (["stage=distribution", "drafter=prompt_lookup"],
     "drafter=prompt_lookup is not used by stage=distribution (its stages ['distribution'] read sampling): leave it out"),
    (["stage=distribution", "k_policy=heuristic"], "k_policy=heuristic is not used by stage=distribution"),
    (["stage=divergence", "sampling=t07"],
     "sampling.do_sample=True, sampling.temperature=0.7 is not used by stage=divergence"),
    (["stage=timing", "drafter=hybrid"], "drafter=hybrid is not used by stage=timing (its stages ['timing'] read none of"),
    (["stage=timing", "sampling.top_p=0.9"], "sampling.top_p=0.9 is not used by stage=timing"),
    # A key of another option of the group: which options read it and what this one reads instead.
    (["stage=timing", "stage.ks=[2]"], "stage.ks is not read by the timing stage (it is a key of stage=acceptance, "
                                       "speed"),
    (["stage=timing", "stage.ks=[2]"], "the timing stage reads stage.pass_lengths, stage.repeats"),
    (["stage=speed", "stage.pass_lengths=[2]"], "stage.pass_lengths is not read by the speed stage (it is a key of "
                                                "stage=timing"),
    # Ranges that used to end in a traceback (or a MemoryError with runs left RUNNING).
    (["threads=100000"], "threads=100000 is not allowed: use an integer >= 0 (0 keeps torch's default) and <= "),
    (["seed=18446744073709551616"], "seed=18446744073709551616 is not allowed: use an integer >= 0 and <= "
                                    "9223372036854775807"),
    (["stage=distribution", "stage.power_sims=0"], "stage.power_sims=0 is not allowed: use an integer >= 1"),
    (["stage=distribution", "stage.seeds=[2147483648]"], "stage.seeds=[2147483648] is not allowed: use a non-empty "
                                                         "list of integers >= 0 and < 2147483648"),
    (["outputs_dir="], "outputs_dir='' is not allowed: use a folder path"),
    (["outputs_dir=' '"], "outputs_dir=' ' is not allowed"),
    (["prompts.skip_per_kind=4"], "prompts.skip_per_kind=4 leaves no prompt of kind 'prose': default.yaml has 4 of that "
                                  "kind; use prompts.skip_per_kind < 4"),
    # Hydra's grammar: what a value may hold, and what the key takes.
    (["campaign=réf"], "'campaign=réf' cannot be read at 'é' (character 11): a value without quotes may hold ASCII "
                       "letters, digits, spaces and"),
    (["campaign=a;b"], "cannot be read at ';' (character 11)"),
    (["campaign=a;b"], "campaign takes a name of letters, digits"),
    (["prompts.kinds=[prose&code]"], "cannot be read at '&'"),
    (["k=[1,2"], "'k=[1,2' cannot be read at '[1,2'"),
    (["prompts.kinds=[prose&code]"], "put any other text in quotes (prompts.kinds='...'); prompts.kinds takes a "
                                     "non-empty list of prompt kinds"),
]


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _error(tmp_path: Path, overrides: list[str]) -> str:
    """The one-line message a user would see for these overrides (empty when none is raised)."""
    try:
        cfg = _compose(BASE + [f"outputs_dir={tmp_path / 'outputs'}"] + overrides)
        open_job(cfg)
        build_context(cfg)
    except Exception as err:  # noqa: BLE001
        line = error_line(err)
        assert line is not None, f"{type(err).__name__} is not reported as bad input: {err}"
        return line
    return ""


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def written(tmp_path):
    """A result written before the bad call; it must come out byte-identical."""
    old = tmp_path / "outputs" / "campaigns" / "scratch" / "acceptance" / "tiny_random-earlier.parquet"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an earlier result")
    return tmp_path / "outputs"


@pytest.mark.parametrize("overrides, expected", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_value_is_one_line(tmp_path, written, overrides, expected):
    before = _digest(written)
    line = _error(tmp_path, overrides)
    assert line and "\n" not in line, line
    assert expected in line, line
    assert _digest(written) == before


@pytest.mark.parametrize("name", sorted(PROMPT_FILES))
def test_bad_prompt_file_is_one_line(tmp_path, written, name):
    text, expected = PROMPT_FILES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    before = _digest(written)
    line = _error(tmp_path, [f"prompts.file={path}", "prompts.kinds=[prose]"])
    assert line and "\n" not in line and expected in line, line
    assert _digest(written) == before


def test_two_prompts_with_one_id_are_refused_not_merged(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD + "- {id: b, kind: code, text: 'class A:'}\n")
    assert "prompt id 'b' appears twice in p.yaml (#2 and #3)" in _error(tmp_path, [f"prompts.file={path}"])


def test_unwritable_outputs_folder_fails_before_compute(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    line = _error(tmp_path, [f"outputs_dir={blocker / 'outputs'}"])
    assert "is not writable" in line and "outputs_dir=PATH" in line


def test_string_booleans_mean_what_they_say(tmp_path):
    cfg = _compose(BASE + [f"outputs_dir={tmp_path}", "sampling.do_sample=no", "force=off", "mlflow.enabled=false"])
    assert cfg.sampling.do_sample is False and cfg.force is False and cfg.mlflow.enabled is False
    assert _compose(BASE + [f"outputs_dir={tmp_path}", "sampling.do_sample=yes"]).sampling.do_sample is True


def _cli(tmp_path, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "pipeline.run", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("args, expected", [
    (("max_new_tokens=abc",), "max_new_tokens='abc' is not allowed: use an integer >= 1"),
    (("--cfg", "job", "k=0"), "k=0 is not allowed"),
    (("--cfg", "job", "sampling.top_p=2"), "sampling.top_p=2.0 is not allowed"),
    (("pair=no_such_pair",), "pair=no_such_pair is not allowed: use one of ["),
    (("pair=tiny_random", "prompts.per_kind=-1"), "prompts.per_kind=-1 is not allowed"),
    (("pair=tiny_random", "k=2", "-m", "k=1,2"), "-m must come before the overrides or after all of them"),
    (("pair=tiny_random", "+sweeps=speed"), "sweeps is not a config key here: did you mean +sweep=speed?"),
    (("pair=tiny_random", "campaign=é"), "'campaign=é' cannot be read at 'é'"),
    (("pair=tiny_random", "mlflow.tracking_uri=http://alice:S3cretPw@host:1/?token=T0kenX"),
     "'mlflow.tracking_uri=http://alice:***@host:1/?token=***' cannot be read at '='"),
])
def test_cli_says_it_in_one_line(tmp_path, args, expected):
    res = _cli(tmp_path, "mlflow.enabled=false", f"outputs_dir={tmp_path}", f"hydra.run.dir={tmp_path}/h", *args) \
        if args[0] != "--cfg" else _cli(tmp_path, *args)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and "%|" not in ln]
    assert lines == [f"speclab: error: {lines[0].removeprefix('speclab: error: ')}"] and expected in lines[0], res.stderr
    assert "S3cretPw" not in res.stderr + res.stdout and "T0kenX" not in res.stderr + res.stdout
