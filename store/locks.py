"""File locks that die with their process: one writer per job, one creator per tracking store, one extension
of a published campaign at a time.

``flock`` locks are released by the kernel when their process ends, however it ends (SIGKILL,
out of memory), so a lock file left on disk never blocks anyone: only a live holder does.
"""
from __future__ import annotations

import fcntl
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ContextManager

from store.layout import campaign_dir

LOCKS = ".locks"  # under the outputs folder, beside the campaigns: a published campaign's folder is never written


def holder_line() -> str:
    """Who holds a lock: written into the lock file for the processes that wait on it."""
    return f"pid {os.getpid()} on {platform.node()}"


HOLDER_WRITE_S = 2.0  # a holder writes its line right after it takes the lock; a waiter allows it this long


def _try_lock(fd: int, wait_s: float = 0.0) -> bool:
    """Take the lock if it is free; while it is held and its file is empty (a holder that has just taken it
    has not written its line yet), retry for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline or _holder(fd):
                return False
            time.sleep(0.02)


def _holder(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip()


@contextmanager
def file_lock(path: str | Path, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block, waiting for it if it is held.

    ``on_wait(holder)`` is called once before waiting, with the holder's line (empty if the holder
    has not written it within ``HOLDER_WRITE_S``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if not _try_lock(fd, wait_s=HOLDER_WRITE_S):
            if on_wait is not None:
                on_wait(_holder(fd))
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_line() + "\n").encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # a waiter never reads the line of a holder that has let go
    finally:
        os.close(fd)  # releases the lock


def job_lock_path(outputs_dir: str | Path, campaign: str, stage: str, config_hash: str) -> Path:
    """The lock of one job's stage file: one writer per (campaign, stage, config hash)."""
    campaign_dir(outputs_dir, campaign)  # the campaign name is checked like everywhere else
    return Path(outputs_dir) / LOCKS / campaign / f"{stage}-{config_hash}.lock"


def extension_paths(outputs_dir: str | Path, campaign: str) -> tuple[Path, Path]:
    """The lock one extension of a published campaign holds (``store.extend``), and the permit it leaves for
    the jobs it starts while it runs."""
    folder = Path(outputs_dir) / LOCKS / campaign_dir(outputs_dir, campaign).name
    return folder / "extend.lock", folder / "extend.permit"


def tracking_store_lock(uri: str) -> ContextManager[None]:
    """A lock next to a sqlite store's file, so that the first process creates its schema alone
    (two creating it at once fail with an "online migration" error); other stores need none."""
    db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
    if not db or db == ":memory:" or not Path(db).parent.is_dir():
        return nullcontext()
    return file_lock(Path(db + ".lock"))
