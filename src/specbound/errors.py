"""The library's one exception type, its one warning type, and the one place that turns what the
environment raises (OS errors, exhausted memory, runaway nesting) into one-line errors."""

from __future__ import annotations

import contextlib
import errno
import os


class SpecboundError(Exception):
    """Bad input or an impossible request, with a message that says what was expected, what was
    found and how to fix it.  The CLI prints the message on one line and exits with status 2."""


class SpecboundWarning(UserWarning):
    """Something the user should know that does not stop the work (a corrupt store record set aside
    and recomputed, a request capped at what the machine has).  The CLI prints it on one line."""


# What to do about an OS error, by errno: the "how to fix it" half of the message.
_OS_FIXES = {
    errno.EACCES: "check the permissions (ls -l) or run as a user who may read/write it",
    errno.EPERM: "check the permissions (ls -l) or run as a user who may read/write it",
    errno.EROFS: "the file system is read-only: pass a location on a writable one",
    errno.ENOSPC: "the disk is full: free some space or pass a location on another disk",
    errno.EDQUOT: "the disk quota is exhausted: free some space or pass another location",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a component of the path is a file, not a folder: check the path",
    errno.EISDIR: "expected a file, found a folder: check the path",
    errno.EEXIST: "it exists already: remove it or pass another path",
    errno.ENAMETOOLONG: "the path is too long: pass a shorter one",
    errno.ELOOP: "the path has a symlink loop: fix the links",
    errno.EIO: "the disk reported an I/O error: check the device, or copy the files elsewhere",
}


def os_error(exc: OSError, doing: str) -> SpecboundError:
    """The one-line error for ``exc``, raised while ``doing`` (``"reading /x/config.json"``)."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) not in doing else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _OS_FIXES.get(exc.errno, "check the path and the file system")
    return SpecboundError(f"cannot finish {doing}{where}: {reason}; {fix}")


def one_line(exc: BaseException, doing: str) -> SpecboundError | None:
    """The one-line :class:`SpecboundError` for an exception the environment raises rather than
    the library (``OSError``, ``MemoryError``, ``RecursionError``), None for any other (a bug, which
    should keep its traceback).  Used at the boundaries only: the command line and each sweep task."""
    if isinstance(exc, SpecboundError):
        return exc
    if isinstance(exc, OSError):
        return os_error(exc, doing)
    if isinstance(exc, MemoryError):
        return SpecboundError(f"ran out of memory {doing}; free memory, analyse fewer layers at once "
                              f"(--jobs 1), or use a machine with more memory")
    if isinstance(exc, RecursionError):
        return SpecboundError(f"input nested too deeply {doing} (Python's recursion limit); a real config, "
                              f"index or record is a few levels deep: the file is corrupt or hostile")
    return None


ENVIRONMENT_ERRORS = (OSError, MemoryError, RecursionError)


@contextlib.contextmanager
def os_errors(doing: str):
    """Turn environment errors raised inside the block into one-line :class:`SpecboundError`\\ s."""
    try:
        yield
    except ENVIRONMENT_ERRORS as exc:
        raise one_line(exc, doing) from None


def writable_target(path, what: str, *, overwrite: bool = True) -> None:
    """Check before any work that ``path`` (a file to write) can be written: its folder exists
    (or can be created) and is writable, and it is not a folder; with ``overwrite=False`` an
    existing file is an error too."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise SpecboundError(f"cannot write the {what} to {path}: it is a folder; pass a file name")
    if os.path.exists(path) and not overwrite:
        raise SpecboundError(f"cannot write the {what} to {path}: the file exists; remove it or pass another name")
    folder = os.path.dirname(os.path.abspath(path))
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise SpecboundError(f"cannot write the {what} to {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise SpecboundError(f"cannot write the {what} to {path}: {probe if probe != path else path} is not "
                             f"writable; pass a location you can write to")
