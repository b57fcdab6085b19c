"""The llama.cpp build (engines/llama_cpp/build.py) without compiling anything: the CPU flags it reads, the
CMake options it chooses (never native, never AMX, an extension only where the CPU lists it), the cache folder per
options, the probe that falls back to the baseline flags when a binary dies of an illegal instruction, one-line
errors, and the llama_cpp test marker (skipped without a build, failed where CI requires it)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.jobs.errors import error_line
from engines.llama_cpp import build as llama_build
from engines.llama_cpp.build import BuildError, build_dir_name, cmake_options, cpu_flags
from engines.llama_cpp.server import ServerError

ROOT = Path(__file__).resolve().parents[1]
X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2 avx512f avx512_vnni amx_tile amx_int8 amx_bf16 avx512_bf16
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse
"""
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 sve\nCPU implementer\t: 0x41\n"
EVERY_FLAG = set(llama_build.X86_OPTIONS) | {"amx_tile", "amx_int8", "amx_bf16"}


def _on(options: list[str]) -> set[str]:
    return {o[2:-3] for o in options if o.endswith("=ON")}


@pytest.fixture
def x86(monkeypatch):
    monkeypatch.setattr(llama_build.platform, "machine", lambda: "x86_64")


def test_cpu_flags_are_the_first_cpus_listed_flags():
    assert cpu_flags(X86_CPUINFO) == {"fpu", "sse", "sse2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f",
                                      "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16", "avx512_bf16"}
    assert cpu_flags(ARM_CPUINFO) == {"fp", "asimd", "evtstrm", "aes", "crc32", "sve"}
    assert cpu_flags("processor\t: 0\n") == set()


@pytest.mark.parametrize("baseline", [False, True])
def test_native_and_amx_are_never_on(x86, baseline):
    options = cmake_options(EVERY_FLAG, baseline)
    for off in ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert f"-D{off}=OFF" in options
        assert f"-D{off}=ON" not in options


def test_an_extension_is_on_only_when_the_cpu_lists_it(x86):
    assert _on(cmake_options(cpu_flags(X86_CPUINFO))) == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C",
                                                          "GGML_BMI2", "GGML_AVX512", "GGML_AVX512_VNNI",
                                                          "GGML_AVX512_BF16"}
    assert _on(cmake_options({"avx", "sse2"})) == {"GGML_AVX"}
    assert _on(cmake_options(set())) == set()
    # every extension the build knows is said explicitly (ON or OFF), none left to ggml's own default
    assert {o[2:].split("=")[0] for o in cmake_options(set())} >= set(llama_build.X86_OPTIONS.values())


def test_the_baseline_is_avx2_fma_f16c_where_listed(x86):
    assert _on(cmake_options(EVERY_FLAG, baseline=True)) == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C"}
    assert _on(cmake_options({"avx", "avx512f"}, baseline=True)) == {"GGML_AVX"}


def test_other_machines_get_no_x86_options(monkeypatch):
    monkeypatch.setattr(llama_build.platform, "machine", lambda: "aarch64")
    options = cmake_options(cpu_flags(ARM_CPUINFO))
    assert not _on(options)
    assert "-DGGML_NATIVE=OFF" in options


def test_each_set_of_options_has_its_own_cache_folder(x86):
    names = {build_dir_name(cmake_options(EVERY_FLAG)), build_dir_name(cmake_options(EVERY_FLAG, baseline=True)),
             build_dir_name(cmake_options({"avx", "avx2"}))}
    assert len(names) == 3
    assert all(n.startswith(llama_build.SDIST_VERSION + "-") for n in names)
    assert build_dir_name(cmake_options(EVERY_FLAG)) == build_dir_name(cmake_options(set(EVERY_FLAG)))


# -- the build, with its download, source and compiler replaced by fakes ---------------------------------------------
FAKE_BENCH = """#!/bin/sh
{body}
"""
SIGILL = "kill -ILL $$"


@pytest.fixture
def fake_build(tmp_path, monkeypatch, x86):
    """A build whose compile step writes shell scripts: ``bench[options_are_baseline]`` is the llama-bench body
    (``SIGILL``: it dies of an illegal instruction, as a binary built for instructions the machine refuses)."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llama_build, "cpu_flags", lambda cpuinfo=None: set(EVERY_FLAG))
    monkeypatch.setattr(llama_build, "_tool_missing", lambda: None)
    sdist = tmp_path / "fake.tar.gz"
    sdist.write_bytes(b"")
    monkeypatch.setattr(llama_build, "fetch_sdist", lambda root: sdist)
    monkeypatch.setattr(llama_build, "_extract_source", lambda sdist, dest: dest)
    model = tmp_path / "probe.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(llama_build, "_probe_model", lambda: model)
    state = {"bench": {False: SIGILL, True: "exit 0"}, "compiled": []}

    def compile_(src, build, options, jobs, log):
        baseline = options == cmake_options(EVERY_FLAG, baseline=True)
        state["compiled"].append(baseline)
        (build / "bin").mkdir(parents=True)
        for target in llama_build.TARGETS:
            script = build / "bin" / target
            script.write_text(FAKE_BENCH.format(body=state["bench"][baseline] if target == "llama-bench" else "exit 0"))
            script.chmod(0o755)

    monkeypatch.setattr(llama_build, "_compile", compile_)
    return state


def test_a_binary_that_dies_of_sigill_is_rebuilt_with_the_baseline_flags(fake_build):
    bin_dir = llama_build.build(quiet=True)
    assert fake_build["compiled"] == [False, True]
    assert bin_dir.parent.name == build_dir_name(cmake_options(EVERY_FLAG, baseline=True))
    info = (bin_dir.parent / "build-info.json").read_text()
    assert '"baseline": true' in info and "-DGGML_AVX512=OFF" in info
    assert llama_build.installed() == bin_dir
    assert not list(llama_build.llama_root().glob(".building-*"))  # the failed attempt left nothing behind
    assert llama_build.build(quiet=True) == bin_dir  # cached: found, nothing compiled again
    assert fake_build["compiled"] == [False, True]


def test_the_listed_flags_are_kept_when_their_binaries_run(fake_build):
    fake_build["bench"][False] = "exit 0"
    bin_dir = llama_build.build(quiet=True)
    assert fake_build["compiled"] == [False]
    assert bin_dir.parent.name == build_dir_name(cmake_options(EVERY_FLAG))


def test_binaries_that_never_run_are_one_line_and_leave_no_build(fake_build):
    fake_build["bench"][True] = SIGILL
    with pytest.raises(BuildError) as err:
        llama_build.build(quiet=True)
    line = str(err.value)
    assert "\n" not in line
    assert f"listed flags: died of signal {int(signal.SIGILL)}" in line
    assert f"baseline flags: died of signal {int(signal.SIGILL)}" in line
    assert llama_build.installed() is None
    assert not [p for p in llama_build.llama_root().iterdir() if p.name not in (".build.lock",)]


def test_a_probe_that_exits_with_an_error_names_its_last_line(fake_build):
    fake_build["bench"] = {b: "echo 'loading'; echo 'error: failed to load model' >&2; exit 3" for b in (False, True)}
    with pytest.raises(BuildError, match=r"exit 3: error: failed to load model"):
        llama_build.build(quiet=True)


def test_a_missing_cmake_is_one_line(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(empty))
    assert llama_build.main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speclab: error: ")
    assert "'cmake'" in err and "apt-get install cmake" in err


def test_engine_faults_and_build_faults_are_one_line_errors():
    assert error_line(ServerError("llama-server exited at start (exit 1): bad")) == \
        "llama-server exited at start (exit 1): bad"
    assert error_line(BuildError("the llama.cpp binaries built here do not run")) == \
        "the llama.cpp binaries built here do not run"


@pytest.mark.llama_cpp
def test_the_build_of_this_machine_is_found():
    bin_dir = llama_build.installed()
    assert all(os.access(bin_dir / t, os.X_OK) for t in llama_build.TARGETS)
    assert subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, timeout=60).returncode == 0


# -- the marker --------------------------------------------------------------------------------------------------------
MARKED_TEST = """import pytest


@pytest.mark.llama_cpp
def test_needs_llama():
    pass
"""


def _pytest_without_a_build(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A marked test run under tests/conftest.py with an empty speclab cache (so no build is found)."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_marked.py").write_text(MARKED_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    llama_cpp: needs the llama.cpp build\n")
    full = {k: v for k, v in os.environ.items() if k != "SPECLAB_REQUIRE_LLAMA"}
    full.update(SPECLAB_CACHE=str(tmp_path / "empty-cache"), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)


def test_a_marked_test_skips_without_a_build_and_fails_where_ci_requires_it(tmp_path):
    skipped = _pytest_without_a_build(tmp_path)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout and "make llama-cpp" in skipped.stdout
    failed = _pytest_without_a_build(tmp_path, SPECLAB_REQUIRE_LLAMA="1")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "1 error" in failed.stdout and "SPECLAB_REQUIRE_LLAMA=1 and no llama.cpp build" in failed.stdout
