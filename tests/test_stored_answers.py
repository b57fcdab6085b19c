"""Stored first answers are checked whenever they are read: an edited, garbage or absurd answer file is one line
naming the file and the prompt (never blamed on the prompt itself), a file written before hashes were stored
is still used and hashed as read, and the job's provenance records every answer's hash."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.prompts.answer_files import HASH, content_hash
from pipeline.prompts.chat import Answer
from pipeline.prompts.prompt import Prompt
from pipeline.prompts.turns import answers_dir, prompt_inputs
from pipeline_helpers import make_cfg
from speclab.models.loading import ModelPair, tiny_random_model
from test_chat_turns import _tokenizer

ROOT = Path(__file__).resolve().parents[1]
CHAT = Prompt("q1", "chat", "hello world", ("hello world", "how are you"), chat=True)


def _pair(tokenizer=None) -> ModelPair:
    vocab = len(tokenizer) if tokenizer is not None else 64
    return ModelPair(tiny_random_model(vocab, seed=0), tiny_random_model(vocab, seed=1), tokenizer, "t", "d",
                     torch.device("cpu"), tokenizer.eos_token_id if tokenizer is not None else None)


def _stored(tmp_path: Path, pair: ModelPair) -> tuple:
    """A job that generates and stores q1's first answer; its config, the answer file and what it holds."""
    cfg = make_cfg(tmp_path, "stage=speed", "max_new_tokens=6")
    made = prompt_inputs(cfg, pair, [CHAT], k_max=2)
    [path] = answers_dir(cfg.outputs_dir, "scratch").glob("*.json")
    return cfg, made, path, json.loads(path.read_text())


def _rewrite(path: Path, record: dict, keep_hash: str) -> None:
    """``keep_hash``: 'stale' leaves the written hash (an edit), 'none' drops it (a file of an older speclab),
    'fresh' recomputes it (an edit made to pass the hash)."""
    record = dict(record)
    record.pop(HASH, None)
    if keep_hash == "fresh":
        record[HASH] = content_hash(record)
    elif keep_hash == "stale":
        record[HASH] = json.loads(path.read_text())[HASH]
    path.write_text(json.dumps(record))


def _error(cfg, pair) -> str:
    with pytest.raises(ValueError) as err:
        prompt_inputs(cfg, pair, [CHAT], k_max=2)
    return str(err.value)


EDITS = {  # name: (tokenizer, how to edit the record, hash, what the line says)
    "ids edited": (False, lambda r: {**r, "answer_ids": [(r["answer_ids"][0] + 1) % 64, *r["answer_ids"][1:]]},
                   "stale", "does not match its content_sha256"),
    "text edited": (True, lambda r: {**r, "answer_text": r["answer_text"] + " more"}, "stale",
                    "does not match its content_sha256"),
    "null answer": (False, lambda r: {**r, "answer_ids": None}, "none", "has answer_ids=null, not a list"),
    "ids not integers": (False, lambda r: {**r, "answer_ids": [1, "2", True]}, "none", "not a list of integer"),
    "id out of range": (False, lambda r: {**r, "answer_ids": [3, 70000]}, "none",
                        "holds token id 70000 (answer_ids[1]), outside the target's vocabulary 0..63"),
    "negative id": (False, lambda r: {**r, "answer_ids": [-1]}, "fresh", "holds token id -1 (answer_ids[0])"),
    "100,000 ids": (False, lambda r: {**r, "answer_ids": [5] * 100_000}, "none",
                    "holds 100,000 answer ids, more than the max_new_tokens=6 the answer was generated with"),
    "100,000 ids, rehashed": (False, lambda r: {**r, "answer_ids": [5] * 100_000}, "fresh", "holds 100,000 answer ids"),
    "null text": (True, lambda r: {**r, "answer_text": None}, "none", "has answer_text=null, not the answer's text"),
    "another prompt's answer": (False, lambda r: {**r, "prompt_id": "q9"}, "none",
                                "says prompt_id='q9', but this job's answer has prompt_id='q1'"),
    "another budget": (False, lambda r: {**r, "max_new_tokens": 48}, "fresh", "says max_new_tokens=48"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_a_bad_stored_answer_is_one_line_naming_its_file(tmp_path, name):
    with_tok, edit, keep_hash, says = EDITS[name]
    pair = _pair(_tokenizer() if with_tok else None)
    cfg, _, path, record = _stored(tmp_path, pair)
    _rewrite(path, edit(record), keep_hash)
    line = _error(cfg, pair)
    assert "\n" not in line and says in line
    assert line.startswith(f"stored answer {str(path)!r} (the first turn of prompt 'q1') ")
    assert "delete the file" in line
    assert "has 100" not in line and "shorten the prompt" not in line  # not blamed on the prompt


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", "null", "[" * 100_000])
def test_a_garbage_answer_file_is_one_line(tmp_path, content):
    pair = _pair()
    cfg, _, path, _ = _stored(tmp_path, pair)
    path.write_text(content)
    line = _error(cfg, pair)
    assert "\n" not in line and line.startswith(f"stored answer {str(path)!r} (the first turn of prompt 'q1') ")
    assert "not valid JSON" in line or "not an answer record" in line


def test_an_answer_file_without_a_hash_is_used_and_hashed_as_read(tmp_path):
    """Files written before answers carried a hash (the published specbench campaign's) stay usable; the
    provenance records the same hash a hashed file of that content would carry."""
    pair = _pair(_tokenizer())
    cfg, made, path, record = _stored(tmp_path, pair)
    _rewrite(path, record, "none")
    again = prompt_inputs(cfg, pair, [CHAT], k_max=2)
    assert torch.equal(again.ids["q1"], made.ids["q1"])
    assert again.record["answers"] == {"q1": {"file": path.name, HASH: record[HASH], "hash_in_file": False}}
    assert made.record["answers"]["q1"]["hash_in_file"] is True
    assert json.loads(path.read_text()).get(HASH) is None  # read, never rewritten


def test_the_published_answers_still_pass_their_checks():
    """Every committed answer file (written before hashes) passes the checks made when it is read."""
    from pipeline.prompts.answer_files import ABOUT, read_answer

    files = sorted((ROOT / "outputs" / "campaigns").glob("*/answers/*.json"))
    for path in files:
        record = json.loads(path.read_text())
        about = {k: record[k] for k in ABOUT}
        stored = read_answer(path, about, vocab=151936 if "qwen" in record["target"] else 49152, needs_text=True)
        assert stored.answer == Answer(tuple(record["answer_ids"]), record["answer_text"])
        assert stored.sha256 == content_hash(record)


@pytest.mark.slow
def test_a_bad_stored_answer_from_the_command_line(tmp_path):
    rows = [{"question_id": 1, "category": "chat", "turns": ["Plan a trip to the sea.", "Now make it cheaper."]}]
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "pipeline.run", "pair=tiny_random", "stage=acceptance", "max_new_tokens=4",
           "device=cpu", "threads=1", f"outputs_dir={tmp_path / 'out'}", "mlflow.enabled=false",
           f"prompts.file={prompts}", "prompts.kinds=[chat]"]
    done = subprocess.run(cmd + ["k=2"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [path] = (tmp_path / "out" / "campaigns" / "scratch" / "answers").glob("*.json")
    record = json.loads(path.read_text())
    record["answer_ids"] = [1] * 100_000
    path.write_text(json.dumps(record))
    done = subprocess.run(cmd + ["k=3"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)  # a new job
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"speclab: error: stored answer {str(path)!r} (the first turn of prompt '1') ")
    assert "does not match its content_sha256" in lines[0]
