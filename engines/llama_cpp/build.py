"""Build llama.cpp's ``llama-server`` and ``llama-bench`` from the source vendored in a pinned PyPI sdist.

``python -m engines.llama_cpp.build`` (``make llama-cpp``) downloads ``llama-cpp-python`` 0.3.36's
sdist with pip (hash-checked: ``--require-hashes``), configures llama.cpp with the CPU flags this
machine both lists and runs, builds the two binaries statically and caches them under
``<speclab cache>/llama.cpp/<version>-<flags digest>/bin``. A second call finds the build and returns.

Flags: ``GGML_NATIVE`` stays off because ``-march=native`` takes what the CPU *lists*, and a VM can list
instructions it does not let a process use (AMX was listed and refused on a machine of this kind: the
binaries died with an illegal instruction). Each x86 extension is switched on only when
``/proc/cpuinfo`` lists it; AMX stays off (Linux hands AMX state to a process only on request, and
ggml's AMX kernels only pay on large batches). The built ``llama-bench`` then runs a tiny model once:
if it dies of a signal, the build is redone with the baseline AVX2 set, and failing that the error
says so in one line.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDOR_DIR = "vendor/llama.cpp"
TARGETS = ("llama-server", "llama-bench")

# /proc/cpuinfo flag -> ggml CMake option; an option is ON only when its flag is listed.
X86_OPTIONS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
BASELINE = ("avx", "avx2", "fma", "f16c")
ALWAYS_OFF = ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
COMMON = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
          "-DBUILD_SHARED_LIBS=OFF")


class BuildError(RuntimeError):
    """A build that cannot be done here, said in one line."""

    one_line = True  # the pipeline prints it as it is (pipeline/jobs/errors.py)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags the kernel lists for the first CPU."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_options(flags: set[str], baseline: bool = False) -> list[str]:
    """ggml's CPU options for these flags (or only the AVX2 baseline), with native and AMX off."""
    chosen = set(BASELINE) & flags if baseline else flags
    opts = [f"-D{opt}=OFF" for opt in ALWAYS_OFF]
    if platform.machine() in ("x86_64", "AMD64"):
        opts += [f"-D{opt}={'ON' if flag in chosen else 'OFF'}" for flag, opt in X86_OPTIONS.items()]
    return opts


def build_dir_name(options: list[str]) -> str:
    digest = hashlib.sha256("\n".join([SDIST_SHA256, *COMMON, *options]).encode()).hexdigest()[:12]
    return f"{SDIST_VERSION}-{digest}"


def llama_root() -> Path:
    from speclab.models.cache_dir import cache_root  # the one home of the cache folder (SPECLAB_CACHE)
    return cache_root() / "llama.cpp"


def fetch_sdist(root: Path) -> Path:
    """The pinned sdist, downloaded once with pip and checked against its sha256."""
    dest = root / "sdist"
    path = dest / SDIST_FILE
    if path.exists() and _sha256(path) == SDIST_SHA256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text(f"{SDIST_NAME}=={SDIST_VERSION} --hash=sha256:{SDIST_SHA256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               "--require-hashes", "-r", str(req), "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / SDIST_FILE
        if done.returncode != 0 or not got.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"pip could not download {SDIST_NAME}=={SDIST_VERSION} (sha256 {SDIST_SHA256[:12]}...): "
                             f"{last}")
        os.replace(got, path)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extract_source(sdist: Path, dest: Path) -> Path:
    prefix = f"llama_cpp_python-{SDIST_VERSION}/{VENDOR_DIR}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def _tool_missing() -> str | None:
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            return tool
    return None


def probe(bin_dir: Path, gguf: Path | None) -> str | None:
    """Run the built llama-bench once on a small model (without one: llama-server --version); the reason it
    failed, or None."""
    cmd = ([str(bin_dir / "llama-server"), "--version"] if gguf is None else
           [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", "1", "-p", "8", "-n", "2", "-r", "1", "-o", "json"])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "the probe ran for 300 s"
    if done.returncode < 0:
        return f"died of signal {-done.returncode} (an instruction this machine refuses?)"
    if done.returncode != 0:
        return "exit {}: {}".format(done.returncode, (done.stderr.strip().splitlines() or ["no output"])[-1])
    return None


def _probe_model() -> Path | None:
    try:
        from speclab.models.loading import packaged_gguf_path
        return packaged_gguf_path("smollm2-135m")
    except (FileNotFoundError, ImportError):
        return None


def _compile(src: Path, build: Path, options: list[str], jobs: int, log) -> None:
    for cmd in (["cmake", "-S", str(src), "-B", str(build), *COMMON, *options],
                ["cmake", "--build", str(build), "-j", str(jobs), "--target", *TARGETS]):
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise BuildError(f"{cmd[0]} {cmd[1]} failed (exit {done.returncode}); its log: {log.name}")


def installed(root: Path | None = None) -> Path | None:
    """The bin folder of a finished build for this machine's flags, or None."""
    root = root or llama_root()
    for baseline in (False, True):
        bin_dir = root / build_dir_name(cmake_options(cpu_flags(), baseline)) / "bin"
        if (bin_dir.parent / "build-info.json").exists() and all((bin_dir / t).exists() for t in TARGETS):
            return bin_dir
    return None


def build(jobs: int | None = None, quiet: bool = False) -> Path:
    """The bin folder holding llama-server and llama-bench, built when not cached."""
    root = llama_root()
    found = installed(root)
    if found:
        return found
    missing = _tool_missing()
    if missing:
        raise BuildError(f"building llama.cpp needs {missing!r} on PATH (Debian: apt-get install cmake g++)")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build waits for the first, then finds it
        found = installed(root)
        if found:
            return found
        sdist = fetch_sdist(root)
        flags = cpu_flags()
        model = _probe_model()
        failures = []
        for baseline in (False, True):
            options = cmake_options(flags, baseline)
            final = root / build_dir_name(options)
            work = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
            try:
                if not quiet:
                    print(f"building llama.cpp {SDIST_VERSION} into {final} ({' '.join(options)}); "
                          "about 8 minutes on 2 cores", flush=True)
                start = time.monotonic()
                src = _extract_source(sdist, work / "src")
                with open(work / "build.log", "w") as log:
                    _compile(src, work / "build", options, jobs or os.cpu_count() or 2, log)
                bin_dir = work / "out" / "bin"
                bin_dir.mkdir(parents=True)
                for target in TARGETS:
                    shutil.copy2(work / "build" / "bin" / target, bin_dir / target)
                why = probe(bin_dir, model)
                if why:
                    failures.append(f"{'baseline' if baseline else 'listed'} flags: {why}")
                    continue
                info = {"sdist": f"{SDIST_NAME}=={SDIST_VERSION}", "sdist_sha256": SDIST_SHA256,
                        "cmake_options": [*COMMON, *options], "cpu_flags": sorted(flags),
                        "baseline": baseline, "build_seconds": round(time.monotonic() - start, 1),
                        "probe_model": str(model) if model else None}
                (work / "out" / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
                shutil.copy2(work / "build.log", work / "out" / "build.log")
                if final.exists():
                    shutil.rmtree(final)
                os.replace(work / "out", final)
                return final / "bin"
            finally:
                shutil.rmtree(work, ignore_errors=True)
        raise BuildError("the llama.cpp binaries built here do not run: " + "; ".join(failures))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.llama_cpp.build", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    parser.add_argument("--print-options", action="store_true", help="print the CMake options for this machine")
    args = parser.parse_args(argv)
    if args.print_options:
        print(" ".join([*COMMON, *cmake_options(cpu_flags())]))
        return 0
    try:
        bin_dir = build(args.jobs)
    except (BuildError, OSError) as exc:
        print(f"speclab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("speclab: interrupted (Ctrl-C): the unfinished build was removed; nothing was cached", file=sys.stderr)
        return 130
    print(bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
