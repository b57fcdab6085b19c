"""Atomic file writes that respect the umask: a reader never sees half a file, a colleague can read it."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    mkstemp creates files with mode 0600 and the rename keeps it; the file is given the mode a
    plain ``open()`` would have (0666 minus the umask) so results on a shared disk stay readable.
    On any failure the temporary file is removed and an existing ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))
