"""Files speclab builds once and reuses (the joined GGUF, the converted safetensors folder): built under a lock
and a recognizable temporary name, hashed when written, checked before each use.

A build holds ``.<name>.lock`` beside its destination (an ``flock``, released by the kernel however the process
ends), and first removes what an interrupted build left: entries named ``.<name>.partial-*``. The finished
result appears by an atomic rename, so the destination is either complete or absent.

A converted folder carries ``speclab-hashes.json``: every file's size, crc32 and sha256, written before the
folder becomes visible. Before each load the folder is checked against it: by default the size and crc32 of
every byte (any single flipped bit changes a crc32; about 4 GB/s on one core), or the sha256 of every byte
with ``SPECLAB_CACHE_CHECK=sha256`` (about 1.7 GB/s). ``python -m speclab.models.prepare`` checks with sha256.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RECORD = "speclab-hashes.json"  # inside a converted folder: what each file held when it was written
PARTIAL = ".partial-"
CHECKS = ("crc32", "sha256")
CHECK_ENV = "SPECLAB_CACHE_CHECK"
CHUNK = 1 << 23


def check_kind() -> str:
    """How a cached folder is checked before each load: ``SPECLAB_CACHE_CHECK``, default crc32."""
    kind = os.environ.get(CHECK_ENV) or "crc32"
    if kind not in CHECKS:
        raise ValueError(f"{CHECK_ENV}={kind!r} is not allowed: use one of {list(CHECKS)} (crc32: every byte, "
                         "fast; sha256: every byte, cryptographic)")
    return kind


def partial_prefix(dest: Path) -> str:
    """The name every temporary file or folder of a build of ``dest`` starts with."""
    return f".{dest.name}{PARTIAL}"


def partial_file(dest: Path) -> Path:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=partial_prefix(dest))
    os.close(fd)
    return Path(tmp)


def partial_dir(dest: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=dest.parent, prefix=partial_prefix(dest)))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _leftovers(dest: Path, legacy: re.Pattern[str] | None) -> list[Path]:
    if not dest.parent.is_dir():
        return []
    return [e for e in dest.parent.iterdir()
            if e.name.startswith(partial_prefix(dest)) or (legacy is not None and legacy.fullmatch(e.name))]


def _remove_partials(dest: Path, legacy: re.Pattern[str] | None) -> None:
    """Remove what interrupted builds of ``dest`` left (only called while holding its lock)."""
    for entry in _leftovers(dest, legacy):
        warnings.warn(f"removing {str(entry)!r}, left by an interrupted build of {str(dest)!r}",
                      RuntimeWarning, stacklevel=4)
        _remove(entry)


def _lock_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.lock"


def _take_lock(dest: Path, wait: bool) -> int | None:
    """An open descriptor holding ``dest``'s build lock, or None when another process holds it and ``wait`` is
    false. The holder removes the lock file as it releases it, so a lock taken on a file that is no longer
    the one at the path is dropped and taken again on the current one."""
    lock = _lock_path(dest)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                os.close(fd)
                return None
            warnings.warn(f"waiting for another process building {str(dest)!r}", RuntimeWarning, stacklevel=4)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _release_lock(dest: Path, fd: int) -> None:
    _lock_path(dest).unlink(missing_ok=True)
    os.close(fd)


def sweep_partials(dest: Path, legacy: re.Pattern[str] | None = None) -> None:
    """Remove leftovers of interrupted builds of ``dest`` when no build is running (a live build's partial
    files are its own): for a cache that is complete, which nothing would build again."""
    if not _leftovers(dest, legacy):
        return
    fd = _take_lock(dest, wait=False)
    if fd is None:
        return
    try:
        _remove_partials(dest, legacy)
    finally:
        _release_lock(dest, fd)


@contextmanager
def building(dest: Path, legacy: re.Pattern[str] | None = None) -> Iterator[None]:
    """Hold the build lock of ``dest`` with the leftovers of interrupted builds removed (``legacy``: names an
    earlier speclab gave its temporary files)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = _take_lock(dest, wait=True)
    assert fd is not None
    try:
        _remove_partials(dest, legacy)
        yield
    finally:
        _release_lock(dest, fd)


def replace_dir(new: Path, dest: Path) -> None:
    """Put the finished folder ``new`` at ``dest``, moving an old one aside under a partial name first (removed
    now, or by the next build if this process dies in between)."""
    if dest.exists():
        aside = partial_dir(dest)
        os.replace(dest, aside / dest.name)
        os.replace(new, dest)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(new, dest)


def file_hashes(path: Path, kinds: tuple[str, ...] = CHECKS) -> dict[str, str]:
    """The crc32 (8 hex digits) and/or sha256 of every byte of ``path``, read once."""
    crc, sha = 0, hashlib.sha256() if "sha256" in kinds else None
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            if "crc32" in kinds:
                crc = zlib.crc32(chunk, crc)
            if sha is not None:
                sha.update(chunk)
    return {**({"crc32": f"{crc:08x}"} if "crc32" in kinds else {}),
            **({"sha256": sha.hexdigest()} if sha is not None else {})}


def record_folder(folder: Path) -> None:
    """Write ``folder``'s hash record: size, crc32 and sha256 of every file in it."""
    files = {p.name: {"bytes": p.stat().st_size, **file_hashes(p)}
             for p in sorted(folder.iterdir()) if p.name != RECORD}
    (folder / RECORD).write_text(json.dumps({"written_by": "speclab", "files": files}, indent=1) + "\n")


@dataclass(frozen=True)
class FolderCheck:
    """``state``: ok, missing (no folder), unrecorded (a folder without a hash record) or damaged; ``detail``
    says what differs."""
    state: str
    detail: str = ""


def _recorded(folder: Path) -> dict[str, dict] | None:
    try:
        files = json.loads((folder / RECORD).read_text())["files"]
        ok = isinstance(files, dict) and all(isinstance(v, dict) and isinstance(v.get("bytes"), int)
                                             for v in files.values())
        return files if ok else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_folder(folder: Path, kind: str | None = None) -> FolderCheck:
    """``folder`` against its hash record: every recorded file present with its size and hash (``kind``: crc32
    or sha256, default ``check_kind()``), and no other file."""
    kind = kind or check_kind()
    if not folder.is_dir():
        return FolderCheck("missing")
    if not (folder / RECORD).exists():
        return FolderCheck("unrecorded", f"no {RECORD}")
    files = _recorded(folder)
    if files is None:
        return FolderCheck("damaged", f"its hash record {RECORD} cannot be read")
    present = {p.name for p in folder.iterdir()} - {RECORD}
    if extra := sorted(present - set(files)):
        return FolderCheck("damaged", f"{extra[0]} was not there when it was written")
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return FolderCheck("damaged", f"{name} is missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            return FolderCheck("damaged", f"{name} has {size:,} bytes, {want['bytes']:,} when it was written")
        found = file_hashes(path, (kind,))[kind]
        if found != want.get(kind):
            return FolderCheck("damaged", f"{name} has {kind} {found[:16]}, not the {str(want.get(kind))[:16]} "
                                          "recorded when it was written")
    return FolderCheck("ok")
