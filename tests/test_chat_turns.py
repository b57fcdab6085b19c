"""Chat templates and two-turn items: which prompts go through the template, how turns are joined without
one, the first-turn answer generated once and stored (every later job and arm reads it), the fit and
sliding-window checks made before any compute, and a user's two-turn JSONL through the pipeline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

import pipeline.prompts.turns as turns
from pipeline.prompts.chat import PLAIN_JOIN, Answer, conversation_ids, uses_template
from pipeline.jobs.identity import output_path
from pipeline.prompts.prompt import Prompt
from pipeline.prompts.sets import STAND_IN_TOKENS, check_window, encode, load_prompts
from pipeline.run import run_parts
from pipeline.prompts.turns import answers_dir, prompt_inputs, stored_answer
from pipeline_helpers import make_cfg
from speclab.decoding.batch_cache import sliding_window
from speclab.models.loading import ModelPair, tiny_random_model
from store.records import read_meta

ROOT = Path(__file__).resolve().parents[1]
WORDS = "hello world how are you fine thanks again tell me more please".split()
TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' ' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
CHAT = Prompt("q1", "chat", "hello world", ("hello world", "how are you"), chat=True)
TEXT = Prompt("t1", "prose", "hello world")  # a YAML text: a beginning to continue


def _tokenizer(template: str | None = TEMPLATE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built offline (no hub), with a chat template of its own."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    out.chat_template = template
    return out


def _pair(tokenizer=None, target=None, vocab: int = 64) -> ModelPair:
    target = target if target is not None else tiny_random_model(vocab, seed=0)
    return ModelPair(target, tiny_random_model(vocab, seed=1), tokenizer, "t", "d", torch.device("cpu"),
                     tokenizer.eos_token_id if tokenizer is not None else None)


@pytest.fixture
def counted(monkeypatch):
    """plain_greedy as the turns module calls it, counting the calls (each is a first-turn answer generated)."""
    calls = []
    real = turns.plain_greedy

    def counting(*args, **kwargs):
        calls.append(args[1].shape[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(turns, "plain_greedy", counting)
    return calls


def test_which_prompts_use_the_template():
    tok = _tokenizer()
    assert uses_template("auto", tok, CHAT) and not uses_template("auto", tok, TEXT)  # YAML texts stay raw
    assert uses_template("on", tok, TEXT) and not uses_template("off", tok, CHAT)
    assert not uses_template("auto", _tokenizer(None), CHAT) and not uses_template("auto", None, CHAT)
    with pytest.raises(ValueError, match=r"prompts.chat_template='on' is not allowed with this pair: a tokenizer-less"):
        uses_template("on", None, CHAT)
    with pytest.raises(ValueError, match=r"its tokenizer has none; use auto or off"):
        uses_template("on", _tokenizer(None), CHAT)


def test_template_on_and_off_with_a_tokenizer():
    tok, dev = _tokenizer(), torch.device("cpu")
    answer = Answer((10, 11), "fine thanks")
    on = conversation_ids(CHAT, CHAT.turns, [answer], tok, True, len(tok), dev)[0].tolist()
    text = "<|user|> hello world <|assistant|> fine thanks <|user|> how are you <|assistant|>"
    assert tok.convert_ids_to_tokens(on) == text.split()
    off = conversation_ids(CHAT, CHAT.turns, [answer], tok, False, len(tok), dev)[0].tolist()
    assert off == tok(PLAIN_JOIN.join(["hello world", "fine thanks", "how are you"])).input_ids
    # one turn joined plainly is what encode gives: the shipped YAML sets' ids are unchanged
    assert conversation_ids(TEXT, TEXT.turns, [], tok, False, len(tok), dev).tolist() == \
        encode(TEXT, tok, len(tok), dev).tolist()


def test_turns_joined_plainly_without_a_tokenizer():
    dev = torch.device("cpu")
    long = Prompt("x", "k", "a" * 100, ("a" * 100, "bc"), chat=True)
    ids = conversation_ids(long, long.turns, [Answer((40, 41, 42))], None, False, 64, dev)[0].tolist()
    sep = [b % 64 for b in PLAIN_JOIN.encode()]
    assert ids == [ord("a") % 64] * STAND_IN_TOKENS + sep + [40, 41, 42] + sep + [ord("b") % 64, ord("c") % 64]
    assert conversation_ids(TEXT, TEXT.turns, [], None, False, 64, dev).tolist() == encode(TEXT, None, 64, dev).tolist()
    with pytest.raises(ValueError, match="2 turns need 1 earlier answers, got 0"):
        conversation_ids(long, long.turns, [], None, False, 64, dev)


ABOUT = {"prompt_id": "q1", "turn": 1, "target": "t", "dtype": "float32", "max_new_tokens": 6, "chat_template": True,
         "context_tokens": 4}


def test_stored_answer_is_generated_once(tmp_path):
    calls = []

    def generate():
        calls.append(1)
        return [5, 6, 2]

    tok = _tokenizer()
    first, made = stored_answer(tmp_path, "abc", generate, tok, ABOUT, len(tok))
    again, made_again = stored_answer(tmp_path, "abc", generate, tok, ABOUT, len(tok))
    assert (made, made_again, len(calls)) == (True, False, 1)
    assert first.answer == again.answer == Answer((5, 6, 2), "hello world")  # EOS left out of the text
    assert first.sha256 == again.sha256 and again.hash_in_file
    written = json.loads((tmp_path / "abc.json").read_text())
    assert written["prompt_id"] == "q1" and written["content_sha256"] == first.sha256
    (tmp_path / "abc.json").write_text("{not json")  # a damaged file is an error, never silently remade
    with pytest.raises(ValueError, match=r"^stored answer '.*abc.json' \(the first turn of prompt 'q1'\) is not valid JSON"):
        stored_answer(tmp_path, "abc", generate, tok, ABOUT, len(tok))
    assert len(calls) == 1


def test_two_turn_context_reuses_the_stored_answer(tmp_path, counted):
    tok = _tokenizer()
    pair = _pair(tok, vocab=len(tok))
    cfg = make_cfg(tmp_path, "stage=speed", "max_new_tokens=6")
    made = prompt_inputs(cfg, pair, [CHAT, TEXT], k_max=4)
    assert counted == [len("<|user|> hello world <|assistant|>".split())]  # turn 1, through the template
    again = prompt_inputs(cfg, pair, [CHAT, TEXT], k_max=4)
    assert len(counted) == 1  # the second job reads the answer: no second generation
    assert all(torch.equal(made.ids[k], again.ids[k]) for k in made.ids)
    stored = list(answers_dir(cfg.outputs_dir, "scratch").glob("*.json"))
    assert len(stored) == 1
    answer = json.loads(stored[0].read_text())
    assert answer["prompt_id"] == "q1" and answer["chat_template"] is True and len(answer["answer_ids"]) <= 6
    tokens = tok.convert_ids_to_tokens(made.ids["q1"][0].tolist())
    assert tokens[:4] == ["<|user|>", "hello", "world", "<|assistant|>"] and tokens[-1] == "<|assistant|>"
    assert made.ids["t1"].tolist() == encode(TEXT, tok, len(tok), pair.device).tolist()  # auto: YAML text raw
    assert made.record == {"chat_template": "auto", "template_used": "mixed", "two_turn_prompts": 1,
                           "answers_dir": str(answers_dir(cfg.outputs_dir, "scratch")),
                           "answers": {"q1": {"file": stored[0].name, "content_sha256": answer["content_sha256"],
                                              "hash_in_file": True}}}
    assert again.record == made.record  # read back: the same file and hash
    # another max_new_tokens is another answer
    prompt_inputs(make_cfg(tmp_path, "stage=speed", "max_new_tokens=5"), pair, [CHAT], k_max=4)
    assert len(counted) == 2


def test_too_long_for_the_context_refused_before_any_generation(tmp_path, counted):
    # tiny models: 512 positions; a two-turn item is sized with a first answer of the full budget
    long = Prompt("q2", "chat", "a" * 64, ("a" * 64, "b" * 64), chat=True)
    cfg = make_cfg(tmp_path, "stage=speed", "max_new_tokens=200")
    with pytest.raises(ValueError, match=r"prompt 'q2' \(turn 2 after a first answer of up to 200 tokens\) has 332 "
                                         r"tokens: .* needs 537 positions, more than the target's context of 512"):
        prompt_inputs(cfg, _pair(), [CHAT, long], k_max=4)
    assert counted == []


def _gemma(window: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=window,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return Gemma3ForCausalLM(cfg).eval()


def test_sliding_window_checked_for_batches_before_compute(tmp_path, counted):
    gemma = _gemma(8)
    assert sliding_window(gemma) == 8 and sliding_window(tiny_random_model(64)) is None
    check_window("p", 40, 16, 4, 1, {"target": 8})  # one row: exact past the window
    with pytest.raises(ValueError, match=r"prompt 'p' has 40 tokens: .* a batch of 2 rows is 61 columns wide, more "
                                         r"than the target's sliding window of 8 .*stage.batch_sizes=\[1\]"):
        check_window("p", 40, 16, 4, 2, {"target": 8, "draft": None})
    batch = make_cfg(tmp_path, "stage=batch", "stage.batch_sizes=[1,2]", "max_new_tokens=4")
    with pytest.raises(ValueError, match=r"prompt 'q1' \(turn 2 .*\) has .* sliding window of 8"):
        prompt_inputs(batch, _pair(target=gemma), [CHAT], k_max=4)
    assert counted == []
    prompt_inputs(make_cfg(tmp_path, "stage=speed", "max_new_tokens=4"), _pair(target=gemma), [CHAT], k_max=4)


def _user_file(tmp_path: Path) -> Path:
    path = tmp_path / "mine.jsonl"
    rows = [{"question_id": 1, "category": "chat", "turns": ["Plan a trip to the sea.", "Now make it cheaper."]},
            {"question_id": 2, "category": "chat", "turns": ["What is 2 + 2?"]},
            {"question_id": 3, "category": "code", "turns": ["Write a sort.", "Now in C."], "reference": ["-"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.usefixtures("one_torch_thread")
def test_user_jsonl_with_two_turns_through_the_pipeline(tmp_path, counted):
    path = _user_file(tmp_path)
    common = (f"prompts.file={path}", "prompts.kinds=[chat,code]", "prompts.per_kind=0", "max_new_tokens=8")
    speed = make_cfg(tmp_path, "stage=speed", "stage.ks=[2]", "stage.timing_repeats=1", "stage.timing_warmup=0",
                     *common)
    run_parts(speed)
    assert len(counted) == 2  # one first answer per two-turn item
    df = pd.read_parquet(output_path(speed, "speed"))
    assert sorted(df.prompt_id.unique()) == ["1", "2", "3"] and set(df.kind) == {"chat", "code"}
    assert df[df.arm == "speculative"].identical_to_plain.all()
    meta = read_meta(output_path(speed, "speed"))
    assert meta["prompt_format"]["two_turn_prompts"] == 2 and meta["prompt_format"]["template_used"] == "off"
    files = {p.name: json.loads(p.read_text()) for p in answers_dir(speed.outputs_dir, "scratch").glob("*.json")}
    # the provenance names each answer's file and content hash
    assert {q: (a["file"], a["content_sha256"]) for q, a in meta["prompt_format"]["answers"].items()} == \
        {f["prompt_id"]: (name, f["content_sha256"]) for name, f in files.items()}
    acceptance = make_cfg(tmp_path, "stage=acceptance", "k=3", *common)
    run_parts(acceptance)
    assert len(counted) == 2  # another job, other arms: the same stored answers
    assert len(list(answers_dir(speed.outputs_dir, "scratch").glob("*.json"))) == 2
    # the per-kind sample applies to files too
    assert [p.id for p in load_prompts(str(path), ["chat", "code"], per_kind=1)] == ["1", "3"]


@pytest.mark.slow
def test_user_jsonl_from_the_command_line(tmp_path):
    path = _user_file(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    base = [sys.executable, "-m", "pipeline.run", "pair=tiny_random", "stage=acceptance", "max_new_tokens=6",
            "device=cpu", "threads=1", f"outputs_dir={tmp_path / 'out'}", "mlflow.enabled=false",
            f"prompts.file={path}", "prompts.kinds=[chat,code]"]
    done = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((tmp_path / "out" / "campaigns" / "scratch" / "answers").glob("*.json"))) == 2
    assert len(list((tmp_path / "out" / "campaigns" / "scratch" / "acceptance").glob("*.parquet"))) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "chat", "turns": ["a", "b", "c"]}\n')
    done = subprocess.run(base[:-2] + [f"prompts.file={bad}", "prompts.kinds=[chat]"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speclab: error: line 1 of ") and "has 3 turns" in lines[0]


def test_resolved_template_is_tagged():
    from pipeline.jobs.runs import format_tags

    record = {"chat_template": "auto", "template_used": "on", "two_turn_prompts": 4, "answers_dir": "x"}
    assert format_tags(record) == {"chat_template_used": "on", "two_turn_prompts": "4"}
    assert format_tags(None) == {}  # a file written before the record: no tag rather than a wrong one


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_template_choice_in_mlflow(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg(tmp_path, "stage=acceptance", "k=2", f"prompts.file={_user_file(tmp_path)}",
                   "prompts.kinds=[chat]", "max_new_tokens=4", "mlflow.enabled=true", f"mlflow.tracking_uri={uri}")
    run_parts(cfg)
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("speclab").experiment_id],
                              "tags.stage = 'acceptance' and tags.level = 'stage'")
    assert len(runs) == 1
    run = runs[0].data
    assert run.params["prompts.chat_template"] == "auto"
    assert run.tags["chat_template_used"] == "off" and run.tags["two_turn_prompts"] == "1"  # tiny: no tokenizer
