"""Writing without ever leaving a half-written file, and telling whether a writer is still alive.

Shared by the analysis tables (``records.py``), the sweep's results store (``store.py``) and the
study's run store (``study/runs.py``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def current_umask() -> int:
    """The process umask (read by setting it and putting it back: POSIX has no other way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file in ``path``'s folder, flush it to disk, then rename it
    to ``path``.

    The file gets the permissions any new file of the user gets (``0o666 & ~umask``), not the
    ``0o600`` of :func:`tempfile.mkstemp`; it is fsynced before the rename and the folder after it,
    so a machine crash leaves the old file or the new one, never an empty one.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def fsync_path(path: str | Path) -> None:
    """Flush a file's or a folder's contents to disk (a folder: the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (ours always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
