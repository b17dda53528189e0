"""The library's one exception type, its one warning type, and the one place that turns what the
environment raises (OS errors, exhausted memory, runaway nesting) into one-line errors."""

from __future__ import annotations

import contextlib
import errno
import re


class SpecboundError(Exception):
    """Bad input or an impossible request, with a message that says what was expected, what was
    found and how to fix it.  The CLI prints the message on one line and exits with status 2.

    The message is kept on one line whatever it quotes (a library's multi-line reason, a file
    name with a newline): line breaks become spaces here, once for every message.
    """

    def __init__(self, message: str = "", *args):
        super().__init__(re.sub(r"\s*[\r\n]+\s*", " ", str(message)).strip(), *args)


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
    """The one-line error for ``exc``, raised trying to ``doing`` (``"read /x/config.json"``)."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) not in doing else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _OS_FIXES.get(exc.errno, "check the path and the file system")
    return SpecboundError(f"cannot {doing}{where}: {reason}; {fix}")


def one_line(exc: BaseException, doing: str) -> SpecboundError | None:
    """The one-line :class:`SpecboundError` for an exception the environment raises rather than
    the library (``OSError``, ``MemoryError``, ``RecursionError``), None for any other (a bug, which
    should keep its traceback).  ``doing`` is what was tried, as a verb phrase (``"analyse m1"``).
    Used at the boundaries only: the command line and each sweep task."""
    if isinstance(exc, SpecboundError):
        return exc
    if isinstance(exc, OSError):
        return os_error(exc, doing)
    if isinstance(exc, MemoryError):
        return SpecboundError(
            f"ran out of memory trying to {doing}; free memory, analyse fewer layers at once "
            f"(--jobs 1), or use a machine with more memory"
        )
    if isinstance(exc, RecursionError):
        return SpecboundError(
            f"input nested too deeply to {doing} (Python's recursion limit); a real config, "
            f"index or record is a few levels deep: the file is corrupt or hostile"
        )
    return None


ENVIRONMENT_ERRORS = (OSError, MemoryError, RecursionError)

# Python converts integers of at most this many digits to and from text (a guard against
# quadratic-time conversion): a JSON, TOML or --set value with more fails to parse, and an API value
# with more could not even be printed in a message.  Such a value is refused where it enters.
MAX_INT_DIGITS = 4300
_MAX_INT_BITS = 14_284  # 10^4300 < 2^14284


def oversized_integer(value, what: str, depth: int = 0) -> str | None:
    """Where in ``value`` (a scalar, or lists and dicts of them) an integer of more than
    :data:`MAX_INT_DIGITS` digits is (``"what['key'][0]"``), or None; not followed below 200 levels."""
    stack = [(value, what, 0)]
    while stack:
        item, where, level = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > _MAX_INT_BITS:
            return where
        if level < 200 and isinstance(item, dict):
            stack.extend((v, f"{where}[{k!r:.40}]", level + 1) for k, v in item.items())
        elif level < 200 and isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]", level + 1) for i, v in enumerate(item))
    return None


def refuse_oversized_integers(value, what: str, fix: str) -> None:
    """A one-line error when ``value`` holds an integer of more than :data:`MAX_INT_DIGITS` digits."""
    where = oversized_integer(value, what)
    if where is not None:
        raise SpecboundError(
            f"{where} is an integer of more than {MAX_INT_DIGITS:,} digits: no dimension, count or "
            f"option is that large; {fix}"
        )


def oversized_integer_text(doing: str, fix: str) -> SpecboundError:
    """The error for a document that Python refused to parse for an integer of more than
    :data:`MAX_INT_DIGITS` digits (its ``ValueError``)."""
    return SpecboundError(
        f"cannot {doing}: it holds an integer of more than {MAX_INT_DIGITS:,} digits (Python's "
        f"limit for integers written as text); no dimension, count or option is that large: {fix}"
    )


@contextlib.contextmanager
def os_errors(doing: str):
    """Turn environment errors raised inside the block into one-line :class:`SpecboundError`\\ s."""
    try:
        yield
    except ENVIRONMENT_ERRORS as exc:
        raise one_line(exc, doing) from None


# The optional packages and the extra that installs each (pyproject.toml's optional-dependencies).
EXTRAS = {
    "matplotlib": "plot",
    "torch": "torch",
    "onnx": "onnx",
    "h5py": "tf",
    "msgpack": "flax",
    "dask": "sweep",
    "distributed": "sweep",
    "transformers": "study",
}


def missing_extra(feature: str, package: str, extra: str | None = None) -> str:
    """The one-line message for an optional feature whose package is not installed, with the one
    install line that works for a wheel (``pip install 'specbound[EXTRA]'``)."""
    extra = extra or EXTRAS.get(package, package)
    return (
        f"{feature} needs {package}, which is not installed: pip install 'specbound[{extra}]' "
        f"(in a checkout of specbound: pip install -e '.[{extra}]')"
    )


def missing_module(exc: ModuleNotFoundError, doing: str) -> SpecboundError | None:
    """The one-line error for an optional package found missing while trying to ``doing``, None
    when the missing module is not one of specbound's optional packages (a bug)."""
    top = (exc.name or "").split(".")[0]
    return SpecboundError(missing_extra(doing, top)) if top in EXTRAS else None


def index_ranges(indices) -> str:
    """``0-2, 4-6, 8`` for ``[0, 1, 2, 4, 5, 6, 8]`` (sorted, distinct): layer indices in a message."""
    out, start = [], None
    indices = list(indices)
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)
