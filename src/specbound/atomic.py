"""Writing without ever leaving a half-written file, and telling whether a writer is still alive.

Shared by the analysis tables (``records.py``), the sweep's results store (``store.py``) and the
study's run store (``study/runs.py``).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid
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


def temp_path(folder: Path, stem: str) -> Path:
    """A writer's private path ``folder/<stem>+<pid>+<random>+<host>``: :func:`remove_stale` tells a
    dead writer's leftovers from a live one's by it."""
    return Path(folder) / f"{stem}+{os.getpid()}+{uuid.uuid4().hex[:8]}+{socket.gethostname()}"


def is_stale(path: Path, max_age: float | None = None) -> bool:
    """Whether ``path`` (named by :func:`temp_path`) was left by a writer that is gone: one of this
    host whose process no longer exists, or any older than ``max_age`` seconds."""
    parts = Path(path).name.rsplit("+", 3)
    try:
        age = time.time() - Path(path).stat().st_mtime
    except OSError:  # published or removed by a concurrent writer meanwhile
        return False
    if max_age is not None and age > max_age:
        return True
    return (
        len(parts) == 4 and parts[3] == socket.gethostname() and parts[1].isdigit() and not process_alive(int(parts[1]))
    )


def remove_stale(paths, max_age: float | None = None) -> list[Path]:
    """Delete every stale leftover among ``paths`` (files or folders); returns those removed."""
    removed = []
    for path in paths:
        if is_stale(path, max_age):
            if Path(path).is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                Path(path).unlink(missing_ok=True)
            removed.append(Path(path))
    return removed
