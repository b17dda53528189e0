"""Every answer of a hub server (``HF_ENDPOINT``: the Hub, a mirror, a proxy, anything) checked before
``huggingface_hub`` turns a part of it into a path: a server is input, like a file.

What becomes a path in the cache, and what is accepted for it:

* the commit of ``model_info`` (``sha``) and the ``X-Repo-Commit`` header: ``refs/<revision>`` holds it and
  ``snapshots/<commit>/`` is named by it: exactly 40 lowercase hex digits (:data:`COMMIT`);
* the ``ETag`` / ``X-Linked-Etag`` of a file: ``blobs/<etag>`` and ``.locks/.../<etag>.lock``: a git blob
  hash (40 hex digits) or a sha256 (64), quoted, optionally weak (``W/"..."``) (:data:`ETAG`);
* the file names of ``siblings`` (and of a shard index): ``snapshots/<commit>/<name>``: relative, no ``..``
  component, no backslash, no NUL or control character, at most :data:`MAX_NAME` characters
  (:func:`check_filename`); only the files the analysis reads are ever asked for;
* sizes (``siblings[].size``, ``X-Linked-Size``, ``Content-Length``): integers from 0 to :data:`MAX_SIZE`
  (:func:`check_size`); ``siblings`` itself a list of objects, at most :data:`MAX_SIBLINGS` of them.

Anything else is one :class:`~specbound.errors.SpecboundError` line naming the server and what it sent.
The headers are checked in a response hook on the HTTP session ``huggingface_hub`` shares
(:func:`guarded`), before ``hf_hub_download`` reads them: the ``HEAD`` it sends is its own, so checking a
separate request of ours would leave a window for a server that answers twice differently.
"""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

from ..errors import SpecboundError

COMMIT = re.compile(r"[0-9a-f]{40}")
ETAG = re.compile(r'(?:W/)?"?([0-9a-f]{40}|[0-9a-f]{64})"?')
MAX_NAME = 1000  # characters of a file name in a repository (the Hub's own limit is far below)
MAX_SIZE = 1 << 50  # bytes of one file (1 PiB: no checkpoint file comes near)
MAX_SIBLINGS = 1_000_000  # files of one repository listing
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def refuse(host: str, what: str, value: Any, expected: str) -> SpecboundError:
    return SpecboundError(
        f"the hub server {host} answered {what} {_shown(value)}, expected {expected}: "
        f"refused before anything is written (a broken or hostile HF_ENDPOINT, mirror or proxy); "
        f"check HF_ENDPOINT, or download the model yourself and pass the folder"
    )


def check_commit(value: Any, host: str, what: str = "the commit") -> str:
    if not (isinstance(value, str) and COMMIT.fullmatch(value)):
        raise refuse(host, what, value, "a commit hash of 40 lowercase hex digits")
    return value


def check_etag(value: Any, host: str, what: str = "the ETag") -> str:
    if not (isinstance(value, str) and ETAG.fullmatch(value.strip())):
        raise refuse(host, what, value, "a quoted git or sha256 hash (40 or 64 lowercase hex digits)")
    return value


def check_filename(value: Any, host: str, what: str = "the file name") -> str:
    ok = (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NAME
        and not _CONTROL.search(value)
        and not value.startswith("/")
        and not re.match(r"[A-Za-z]:", value)
        and all(part not in ("", ".", "..") for part in value.split("/"))
    )
    if not ok:
        raise refuse(
            host,
            what,
            value,
            f"a relative path of at most {MAX_NAME} characters with no '..', '.', "
            f"empty component, backslash or control character",
        )
    return value


def check_size(value: Any, host: str, what: str = "the size") -> int:
    if isinstance(value, str) and re.fullmatch(r"\d{1,17}", value):  # a header's text
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise refuse(host, what, value, f"an integer number of bytes from 0 to {MAX_SIZE:,}")
    return value


def check_siblings(siblings: Any, host: str) -> dict[str, int | None]:
    """``{file name: size}`` of a ``model_info`` answer's ``siblings`` (huggingface_hub's parsed
    ``RepoSibling`` objects or the raw JSON objects), each checked; a size may be absent (None)."""
    if siblings is None:
        return {}
    if not isinstance(siblings, (list, tuple)) or len(siblings) > MAX_SIBLINGS:
        raise refuse(host, "a 'siblings' of", type(siblings).__name__, f"a list of at most {MAX_SIBLINGS:,} objects")
    sizes: dict[str, int | None] = {}
    for entry in siblings:
        if isinstance(entry, dict):
            name, size = entry.get("rfilename"), entry.get("size")
        elif hasattr(entry, "rfilename"):
            name, size = entry.rfilename, getattr(entry, "size", None)
        else:
            raise refuse(host, "a sibling", entry, "an object with 'rfilename' and 'size'")
        name = check_filename(name, host, "a sibling file name")
        sizes[name] = None if size is None else check_size(size, host, f"the size of {name!r}")
    return sizes


def check_headers(headers: Any, host: str, status: int, method: str) -> None:
    """The headers of an answer on a ``resolve`` route that ``huggingface_hub`` makes paths of (the
    commit of any answer, a 404's too: ``.no_exist/<commit>/``), or sizes (the ``HEAD``'s)."""
    commit = headers.get("X-Repo-Commit")
    if commit is not None:
        check_commit(commit, host, "the header X-Repo-Commit")
    if method != "HEAD" or status >= 400:
        return  # a GET's ETag is the CDN's, never used as a path (huggingface_hub takes the HEAD's)
    linked = headers.get("X-Linked-Etag")
    if linked is not None:
        check_etag(linked, host, "the header X-Linked-Etag")
    elif headers.get("ETag") is not None:
        check_etag(headers.get("ETag"), host, "the header ETag")
    for name in ("X-Linked-Size", "Content-Length"):
        if headers.get(name) is not None:
            check_size(headers.get(name), host, f"the header {name}")


# ---- the response hook on huggingface_hub's shared session ---------------------------------------

_active = threading.local()
_lock = threading.Lock()


def _hook(response) -> None:
    host = getattr(_active, "host", None)
    if host is None:  # not inside guarded(): another user of huggingface_hub in this process
        return
    request = response.request
    check_headers(response.headers, host, response.status_code, request.method)
    sizes = getattr(_active, "sizes", None)
    path = request.url.path
    if request.method != "HEAD" or not sizes or "/resolve/" not in path or response.status_code >= 400:
        return

    filename = unquote(path.split("/resolve/", 1)[1].partition("/")[2])
    expected = sizes.get(filename)
    told = response.headers.get("X-Linked-Size") or (
        None if 300 <= response.status_code < 400 else response.headers.get("Content-Length")
    )
    if expected is not None and told is not None and int(told) != expected:
        raise refuse(
            host, f"a size of {filename!r}:", int(told), f"{expected:,} bytes, as its own listing (model_info) says"
        )


def _add_hook(session) -> None:
    with _lock:
        hooks = session.event_hooks
        if _hook not in hooks.get("response", []):
            session.event_hooks = {**hooks, "response": [*hooks.get("response", []), _hook]}


def _install() -> None:
    """Put :func:`_hook` on the session ``huggingface_hub`` shares, and on every session its client
    factory makes later (it closes and recreates the session after a connection error, mid-download
    too): the factory is wrapped once, and again if someone sets another."""
    from huggingface_hub import get_session, set_client_factory
    from huggingface_hub.utils import _http

    factory = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    if callable(factory) and not getattr(factory, "_specbound_checked", False):

        def checked_factory(make=factory):
            session = make()
            _add_hook(session)
            return session

        checked_factory._specbound_checked = True  # type: ignore[attr-defined]
        set_client_factory(checked_factory)
    _add_hook(get_session())


@contextmanager
def guarded(host: str):
    """Inside the block, every answer of ``huggingface_hub``'s session on this thread is checked
    (:func:`check_headers`) before the library reads it; ``host`` names the server in messages.  The
    dict it yields takes each file's size from the listing (:func:`check_siblings`): a ``HEAD`` that
    declares another size for that file is refused (a body the client would cut, or pad, to it)."""
    _install()
    previous = getattr(_active, "host", None), getattr(_active, "sizes", None)
    _active.host, _active.sizes = host, {}
    try:
        yield _active.sizes
    finally:
        _active.host, _active.sizes = previous
