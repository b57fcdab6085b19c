"""Workloads from files: Spec-Bench JSONL parsing and its errors, kinds pooled as mt_bench, the per-kind
sample, the vendored subset and its licences, and the prompts.chat_template key in the config."""
import json
from pathlib import Path

import pytest

from pipeline.config.schema import HASH_NEUTRAL, VOLATILE, ConfigError, check_config
from pipeline.jobs.identity import config_hash, plain_config
from pipeline.prompts.prompt_files import parse_jsonl
from pipeline.prompts.sets import MT_BENCH, PROMPT_DIR, load_prompts, shipped_files
from pipeline_helpers import make_cfg
from store.identity import config_hash as store_hash
from store.layout import STAGES

SPEC = "spec_bench/question.jsonl"


def _jsonl(tmp_path: Path, lines: list, name: str = "mine.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def _item(qid, category="writing", turns=("Say hi.",), **extra) -> dict:
    return {"question_id": qid, "category": category, "turns": turns if isinstance(turns, str) else list(turns), **extra}


def test_jsonl_items_in_file_order(tmp_path):
    path = _jsonl(tmp_path, [_item(7, "chat", ["Hello?", "And again?"], reference=["x"]), "",
                             _item("q-2", "math", ["1 + 1?"])])
    prompts = parse_jsonl(path)
    assert [(p.id, p.kind, p.turns, p.chat) for p in prompts] == [
        ("7", "chat", ("Hello?", "And again?"), True), ("q-2", "math", ("1 + 1?",), True)]
    assert prompts[0].text == "Hello?" and prompts[0].category == "chat"


@pytest.mark.parametrize("line, message", [
    ('{"question_id": 1, "category": "x", "turns": ["a"]', r"line 2 of '.*bad.jsonl' is not valid JSON \("),
    ('[1, 2]', r"line 2 of '.*bad.jsonl' holds a JSON list, not an object"),
    (_item(2, turns=[]), r"line 2 of '.*bad.jsonl' has turns \[\]: use a list of 1 to 2 non-empty strings"),
    ({"question_id": 2, "turns": ["a"]}, r"line 2 of '.*bad.jsonl' lacks \['category'\]"),
    ({"category": "x", "turns": ["a"]}, r"lacks \['question_id'\]"),
    (_item(2, turns=["a", 3]), r"line 2 of '.*bad.jsonl' has turn 2 of type int \(3\): each turn is a string"),
    (_item(2, turns=["a", "  "]), r"has an empty turn 2"),
    (_item(2, turns=["a", "b", "c"]), r"line 2 of '.*bad.jsonl' has 3 turns: at most 2 are allowed"),
    (_item(1), r"question_id '1' appears twice in '.*bad.jsonl' \(lines 1 and 2\)"),
    (_item(True), r"has question_id True: use an integer or a non-empty string"),
    (_item(2, category=""), r"has category '': use a non-empty string"),
    (_item(2, turns="just text"), r"has turns 'just text': use a list"),
    ('{"question_id": 2, "category": "x", "turns": ["\\ud800"]}', r"turn 1 of line 2 .* lone surrogate"),
])
def test_bad_jsonl_is_one_line_naming_file_and_line(tmp_path, line, message):
    path = _jsonl(tmp_path, [_item(1), line], "bad.jsonl")
    with pytest.raises(ValueError, match=message) as exc:
        load_prompts(str(path), ["writing"])
    assert "\n" not in str(exc.value)


def test_empty_jsonl_and_missing_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=r"holds no items: write one JSON object a line with question_id"):
        load_prompts(str(path), ["x"])
    with pytest.raises(ValueError, match=r"not found: use one of .*spec_bench/question.jsonl.*YAML or JSONL"):
        load_prompts(str(tmp_path / "nope.jsonl"), ["x"])


def test_vendored_spec_bench_with_its_licences():
    folder = PROMPT_DIR / "spec_bench"
    assert SPEC in shipped_files()
    prompts = load_prompts(SPEC, [*MT_BENCH, "math_reasoning", "rag"])
    assert len(prompts) == 240 and len({p.id for p in prompts}) == 240
    assert sum(len(p.turns) == 2 for p in prompts) == 80
    assert all(len(p.turns) == 2 for p in prompts if p.kind in MT_BENCH)
    assert "Apache License" in (folder / "LICENSE").read_text()
    readme = (folder / "README.md").read_text()
    assert "CC BY-SA 3.0" in readme and "fd2c1cd7d2201ef71db4c5f4e455008f017967bf" in readme


def test_mt_bench_pools_its_categories_in_turn():
    pooled = load_prompts(SPEC, ["mt_bench", "math_reasoning", "rag"])
    mt = [p for p in pooled if p.kind == "mt_bench"]
    assert len(mt) == 80 and {p.category for p in mt} == set(MT_BENCH)
    assert [p.category for p in mt[:8]] == list(MT_BENCH)  # any first n covers the categories in turn
    writing = load_prompts(SPEC, ["writing"])
    assert [p.id for p in mt if p.category == "writing"] == [p.id for p in writing]  # file order kept
    assert {p.kind for p in pooled} == {"mt_bench", "math_reasoning", "rag"}


def test_pools_and_kinds_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"prompt kinds \['mt_bench', 'writing'\] overlap"):
        load_prompts(SPEC, ["mt_bench", "writing"])
    with pytest.raises(ValueError, match=r"prompt kinds \['poetry'\] not in question.jsonl: allowed are .*'mt_bench'"):
        load_prompts(SPEC, ["poetry"])
    with pytest.raises(ValueError, match=r"names a kind twice"):
        load_prompts(SPEC, ["rag", "rag"])
    # a file without MT-bench categories offers no mt_bench kind
    path = _jsonl(tmp_path, [_item(1, "chat")])
    with pytest.raises(ValueError, match=r"allowed are \['chat'\]"):
        load_prompts(str(path), ["mt_bench"])


def test_sample_is_a_fixed_function_of_the_file_and_plan_check_disjoint():
    kinds = ["mt_bench", "math_reasoning", "rag"]
    plan = load_prompts(SPEC, kinds, per_kind=2)
    assert plan == load_prompts(SPEC, kinds, per_kind=2)
    check = load_prompts(SPEC, kinds, per_kind=4, skip_per_kind=2)
    assert not {p.id for p in plan} & {p.id for p in check}
    first4 = load_prompts(SPEC, kinds, per_kind=4)
    assert {p.id for p in plan} | {p.id for p in check} <= {p.id for p in load_prompts(SPEC, kinds, per_kind=6)}
    assert [p.id for p in first4][:2] == [p.id for p in plan][:2]
    for kind in kinds:
        assert len([p for p in plan if p.kind == kind]) == 2 and len([p for p in check if p.kind == kind]) == 4
    with pytest.raises(ValueError, match=r"prompts.skip_per_kind=80 leaves no prompt of kind 'rag'"):
        load_prompts(SPEC, ["rag"], skip_per_kind=80)


def test_spec_bench_config_group(tmp_path):
    cfg = make_cfg(tmp_path, "prompts=spec_bench")
    check_config(cfg, STAGES)
    p = cfg.prompts
    assert (p.file, list(p.kinds), p.per_kind, p.chat_template) == (SPEC, ["mt_bench", "math_reasoning", "rag"], 4,
                                                                   "auto")
    assert len(load_prompts(p.file, list(p.kinds), p.per_kind)) == 12


@pytest.mark.parametrize("value", ["maybe", "true"])
def test_chat_template_values(tmp_path, value):
    with pytest.raises(ConfigError, match=r"prompts.chat_template=.* is not allowed: use one of \['auto', 'on', 'off'\]"):
        check_config(make_cfg(tmp_path, f"prompts.chat_template={value}"), STAGES)
    for ok in ("auto", "on", "off"):
        check_config(make_cfg(tmp_path, f"prompts.chat_template={ok}"), STAGES)


def test_chat_template_auto_keeps_old_hashes_and_on_off_are_new_jobs(tmp_path):
    """auto runs the YAML sets raw, as every stored result was measured: the key at auto leaves the hash
    as it was before the key existed; on and off are other measurements, so other hashes."""
    cfg = make_cfg(tmp_path, "stage=speed")
    before = plain_config(cfg)
    del before["prompts"]["chat_template"]
    assert config_hash(cfg) == store_hash(before, {}, neutral=HASH_NEUTRAL, volatile=VOLATILE)
    hashes = {config_hash(make_cfg(tmp_path, "stage=speed", f"prompts.chat_template={v}")) for v in ("on", "off")}
    assert len(hashes) == 2 and config_hash(cfg) not in hashes


@pytest.mark.parametrize("name", ["mine.JSONL", "mine.Jsonl", "mine.jsonl"])
def test_jsonl_suffix_in_any_case_is_jsonl(tmp_path, name):
    path = _jsonl(tmp_path, [_item(1, "chat", ["Hello?"])], name)
    assert [(p.id, p.kind, p.chat) for p in load_prompts(str(path), ["chat"])] == [("1", "chat", True)]


DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize("name, lines, message", [
    ("deep.jsonl", [json.dumps(_item(1)), DEEP], r"^line 2 of '.*deep.jsonl' nests too deep to read: write one JSON"),
    ("deep.yaml", ["- {id: a, kind: prose, text: hi}", f"- {DEEP}"],
     r"^prompt file '.*deep.yaml' nests too deep to read \(more than \d+ brackets deep at line 2\)"),
])
def test_deeply_nested_line_is_one_line_naming_file_and_line(tmp_path, name, lines, message):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message) as exc:
        load_prompts(str(path), ["writing"])
    assert "\n" not in str(exc.value)
