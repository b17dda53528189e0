"""Writing without ever leaving a half-written file, and telling whether a writer is still alive.

Shared by the analysis tables (``records.py``), the sweep's results store (``store.py``) and the
study's run store (``study/runs.py``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file in ``path``'s folder, then rename it to ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


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
