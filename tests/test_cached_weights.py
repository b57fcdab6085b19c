"""The converted weights cache is hashed when written and checked before each load: a flipped bit, a cache an
older speclab wrote without hashes, and what an interrupted conversion left are found and dealt with, on a
tiny model standing in for the packaged GGUF conversion (no download, no real conversion)."""
import json
import signal
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models as tk_models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import speclab.models.loading as models
from speclab.models.cache_files import RECORD, building, check_folder, partial_dir, partial_prefix, sweep_partials
from speclab.models.loading import load_model, tiny_random_model

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


def _tiny_folder(dest: Path) -> None:
    tiny_random_model().save_pretrained(dest)
    vocab = {f"t{i}": i for i in range(63)} | {"[UNK]": 63}
    tok = Tokenizer(tk_models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(dest)


@pytest.fixture
def fake_packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A packaged model whose 'GGUF conversion' writes a tiny model (counted)."""
    gguf = tmp_path / "pkg" / "fake.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" * 8)
    calls = {"convert": 0}

    def convert(src: Path, dest: Path) -> None:
        calls["convert"] += 1
        _tiny_folder(dest)

    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLAB_CACHE_CHECK", raising=False)
    monkeypatch.setitem(models.PACKAGED_GGUF, "fake-packaged", ("fake-pip", "json", "fake.gguf"))
    monkeypatch.setattr(models, "packaged_gguf_path", lambda name: gguf)
    monkeypatch.setattr(models, "_convert_gguf", convert)
    calls["cache"] = tmp_path / "cache" / f"fake-packaged-{gguf.stat().st_size}"
    return calls


def _flip_exponent_bit(path: Path, tensor: str) -> None:
    """Flip the top exponent bit of the first float32 of ``tensor`` in a safetensors file (same size)."""
    data = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    start = json.loads(data[8:8 + header_len])[tensor]["data_offsets"][0]
    data[8 + header_len + start + 3] ^= 0x40  # little endian: byte 3 holds the sign and 7 exponent bits
    path.write_bytes(data)


def _load_quietly() -> tuple[torch.nn.Module, list[str]]:
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        model, _ = load_model("fake-packaged", CPU, torch.float32)
    return model, [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("check", ["", "sha256"])
def test_a_flipped_exponent_bit_in_the_cache_is_caught_before_the_load(fake_packaged, monkeypatch, check):
    monkeypatch.setenv("SPECLAB_CACHE_CHECK", check)
    model, said = _load_quietly()
    good = model.lm_head.weight.detach().clone()
    assert fake_packaged["convert"] == 1 and said == []
    _flip_exponent_bit(fake_packaged["cache"] / "model.safetensors", "lm_head.weight")
    model, said = _load_quietly()
    assert torch.equal(model.lm_head.weight, good)  # the damaged weight was never used: the cache was rebuilt
    assert fake_packaged["convert"] == 2
    assert len(said) == 1 and "\n" not in said[0]
    assert repr(str(fake_packaged["cache"])) in said[0] and "model.safetensors has " + (check or "crc32") in said[0]
    assert "rebuilding it" in said[0]
    assert check_folder(fake_packaged["cache"]).state == "ok"


def test_every_file_of_the_cache_is_covered(fake_packaged):
    load_model("fake-packaged", CPU, torch.float32)
    cache = fake_packaged["cache"]
    recorded = json.loads((cache / RECORD).read_text())["files"]
    assert set(recorded) == {p.name for p in cache.iterdir()} - {RECORD}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(recorded)
    (cache / "config.json").write_text((cache / "config.json").read_text().replace('"vocab_size": 64', '"vocab_size": 65'))
    assert check_folder(cache).state == "damaged" and "config.json" in check_folder(cache).detail
    (cache / "extra.bin").write_bytes(b"x")
    assert check_folder(cache).detail.startswith("extra.bin was not there")
    (cache / RECORD).write_text("{garbage")
    assert check_folder(cache).state == "damaged" and RECORD in check_folder(cache).detail


def test_a_cache_written_without_hashes_is_rebuilt_once(fake_packaged):
    _tiny_folder(fake_packaged["cache"])  # what an older speclab left: no hash record
    _, said = _load_quietly()
    assert fake_packaged["convert"] == 1
    assert len(said) == 1 and "has no hash record" in said[0] and repr(str(fake_packaged["cache"])) in said[0]
    _, said = _load_quietly()
    assert fake_packaged["convert"] == 1 and said == []


def test_a_bad_check_setting_is_one_line(fake_packaged, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE_CHECK", "md5")
    with pytest.raises(ValueError, match=r"^SPECLAB_CACHE_CHECK='md5' is not allowed: use one of \['crc32', 'sha256'\]"):
        load_model("fake-packaged", CPU, torch.float32)


def _killed_build(dest: Path, what: str) -> Path:
    """A process that starts a build of ``dest`` as speclab does, writes part of it and is killed (SIGKILL):
    what it leaves is the partial file or folder it named."""
    code = ("import os, signal, sys\nfrom pathlib import Path\n"
            "from speclab.models.cache_files import building, partial_dir, partial_file\n"
            f"dest = Path({str(dest)!r})\n"
            "with building(dest):\n"
            f"    tmp = partial_{what}(dest)\n"
            "    target = tmp / 'model.safetensors' if tmp.is_dir() else tmp\n"
            "    target.write_bytes(b'w' * 100_000)\n"
            "    print(tmp, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = Path(done.stdout.strip())
    assert left.exists() and left.name.startswith(partial_prefix(dest))
    return left


def test_an_interrupted_conversion_is_cleaned_by_the_next_load(fake_packaged):
    cache = fake_packaged["cache"]
    cache.parent.mkdir(parents=True)
    left = _killed_build(cache, "dir")
    older = cache.parent / ".fake-packaged-ab12cd_3"  # the temporary folder name of an earlier speclab
    older.mkdir()
    _, said = _load_quietly()
    assert not left.exists() and not older.exists()
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]  # no lock file either
    assert sum("left by an interrupted build" in s for s in said) == 2


def test_leftovers_beside_a_complete_cache_are_swept(fake_packaged):
    load_model("fake-packaged", CPU, torch.float32)
    cache = fake_packaged["cache"]
    left = _killed_build(cache, "dir")
    _, said = _load_quietly()
    assert not left.exists() and fake_packaged["convert"] == 1
    assert any("left by an interrupted build" in s for s in said)


def test_a_running_build_keeps_its_partial_files(tmp_path):
    dest = tmp_path / "model"
    with building(dest):
        mine = partial_dir(dest)
        sweep_partials(dest)  # another loader, while this build runs
        assert mine.exists()
    with pytest.warns(RuntimeWarning, match="left by an interrupted build"):
        sweep_partials(dest)
    assert list(tmp_path.iterdir()) == []
