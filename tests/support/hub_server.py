"""A local stand-in for the Hugging Face Hub's HTTP API, enough for ``huggingface_hub`` to list,
download and range-read a model repository: the tests point ``HF_ENDPOINT`` at it and never reach
the internet.

Routes (as ``huggingface_hub`` calls them):
* ``GET /api/models/{org}/{name}[/revision/{rev}]``: the model info, whose ``siblings`` list the files
  with their sizes (``files_metadata=True``);
* ``GET /api/models/{org}/{name}/tree/{rev}[/{path}]``: the files under ``path`` (``list_repo_tree``,
  ``HfFileSystem.ls``), and ``POST /api/models/{org}/{name}/paths-info/{rev}`` (``get_paths_info``);
* ``HEAD /{org}/{name}/resolve/{rev}/{file}``: ``ETag``, ``X-Repo-Commit`` and ``Content-Length``;
* ``GET`` on the same route, honouring ``Range: bytes=a-`` / ``bytes=a-b`` (206 with ``Content-Range``);
  any other Range (several ranges, a suffix ``bytes=-n``, a start past the end) is refused with 416,
  never answered with the wrong bytes.
Every request is logged in :attr:`HubServer.log` as ``(method, path, Range header)``, the body bytes
sent in :attr:`HubServer.sent`; ``on_request`` (if set) is called before each answer (a test samples
the disk there).  Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``GatedRepo``,
``RevisionNotFound``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def isolate_hub_environment(monkeypatch, root: Path) -> None:
    """Point huggingface_hub at a cache and home under ``root``, with no token, offline flag or Xet
    transfer from the environment the tests run in (every test that talks to :class:`HubServer`)."""
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(root / "home"))  # no stored login is sent
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")


def walk_outside(root: Path, cache: Path) -> dict[str, tuple]:
    """Every path under ``root`` outside ``cache``, with its kind, size and modification time: taken
    before and after a hostile answer, the two must be equal (nothing written outside the cache)."""

    seen = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        if here == cache or cache in here.parents:
            continue
        for name in dirs + files:
            if here / name != cache:
                info = (here / name).lstat()
                seen[str(here / name)] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return seen


class HubServer:
    """``repos``: ``{"org/name": folder}``; every repository has one revision ``main`` at ``commit``.
    ``gated``: ids answered 403 GatedRepo unless the request carries ``Authorization: Bearer hf_granted``.  ``cut``:
    file names whose first full GET stops after
    half the bytes and drops the connection (a network failure mid-download)."""

    def __init__(
        self,
        repos: dict[str, Path],
        commit: str = "a" * 40,
        gated: tuple[str, ...] = (),
        cut: tuple[str, ...] = (),
        cut_ranges: int = 0,
        short: tuple[str, ...] = (),
        info_patch: dict | None = None,
        header_patch: dict | None = None,
        get_patch: dict | None = None,
        cut_always: tuple[str, ...] = (),
        bare_status: dict[str, int] | None = None,
    ):
        self.repos, self.commit, self.gated = {k: Path(v) for k, v in repos.items()}, commit, set(gated)
        # A hostile server: info_patch replaces fields of the model info (a hostile "sha", "siblings"),
        # header_patch the headers of every resolve answer (a hostile ETag, X-Linked-Etag, X-Repo-Commit).
        self.info_patch, self.header_patch = dict(info_patch or {}), dict(header_patch or {})
        # get_patch: headers of the GET answers only (a Content-Length the HEAD did not say);
        # cut_always: files whose every GET stops after half the bytes (a download that never completes).
        self.get_patch, self.cut_always = dict(get_patch or {}), set(cut_always)
        # bare_status: ids answered with that HTTP status and no X-Error-Code (a mirror's plain 404, a 401)
        self.bare_status = dict(bare_status or {})
        self.cut = set(cut)
        # cut_ranges: the next that many ranged GETs of a weights file send half their bytes and drop
        # the connection; short: files whose ranges are answered one byte short (a consistent but wrong
        # Content-Length).
        self.cut_ranges, self.short = cut_ranges, set(short)
        self.log: list[tuple[str, str, str]] = []
        self.sent = 0
        self.on_request = None
        # what on_request raised: re-raised when the server stops, never a dropped connection the client
        # would report as a network failure
        self.hook_errors: list[BaseException] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the log list is the record
                pass

            def do_HEAD(self):
                server._answer(self, body=False)

            def do_GET(self):
                server._answer(self, body=True)

            def do_POST(self):
                server._answer(self, body=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.hook_errors:
            raise AssertionError(f"the test's on_request hook raised: {self.hook_errors[0]!r}") from self.hook_errors[0]

    def fetched(self) -> set[str]:
        """The files whose bytes were sent (GET on the resolve route)."""
        return {p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.log if m == "GET" and "/resolve/" in p}

    def _error(self, h, status: int, code: str) -> None:
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Type", "application/json")
        body = json.dumps({"error": code}).encode()
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _json(self, h, doc, body: bool) -> None:
        data = json.dumps(doc).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
            self.sent += len(data)

    def _entries(self, folder: Path, under: str, recursive: bool) -> list[dict]:
        """The tree listing's entries below ``under`` (a file, or a folder's children)."""
        base = folder / under if under else folder
        if base.is_file():
            found = [base]
        else:
            found = sorted(base.rglob("*") if recursive else base.iterdir()) if base.is_dir() else []
        return [
            {
                "type": "file",
                "path": str(p.relative_to(folder)),
                "size": p.stat().st_size,
                "oid": hashlib.sha1(p.read_bytes()).hexdigest(),
            }
            if p.is_file()
            else {"type": "directory", "path": str(p.relative_to(folder)), "oid": "0" * 40, "size": 0}
            for p in found
        ]

    def _answer(self, h, body: bool) -> None:
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        self.log.append((h.command, path, h.headers.get("Range", "")))
        if self.on_request is not None:
            try:
                self.on_request()
            except Exception as err:  # a test's defect, reported at __exit__
                self.hook_errors.append(err)
        length = int(h.headers.get("Content-Length") or 0)
        payload = h.rfile.read(length) if h.command == "POST" and length else b""
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)/?(.*)", path)
        paths_info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/paths-info/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        route = info or tree or paths_info or resolve
        repo_id = route.group(1) if route else None
        if repo_id in self.bare_status:
            h.send_response(self.bare_status[repo_id])
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        if repo_id not in self.repos:
            return self._error(h, 404, "RepoNotFound")
        if repo_id in self.gated and h.headers.get("Authorization") != "Bearer hf_granted":
            return self._error(h, 403, "GatedRepo")
        if (route.group(2) or "main") not in ("main", self.commit):
            return self._error(h, 404, "RevisionNotFound")
        folder = self.repos[repo_id]
        if info:
            files = sorted(p for p in folder.rglob("*") if p.is_file())
            return self._json(
                h,
                {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": self.commit,
                    "private": False,
                    "siblings": [{"rfilename": str(p.relative_to(folder)), "size": p.stat().st_size} for p in files],
                    **self.info_patch,
                },
                body,
            )
        if tree:
            return self._json(h, self._entries(folder, tree.group(3), "recursive=true" in parts.query.lower()), body)
        if paths_info:
            asked = [
                unquote(v) for k, v in (f.partition("=")[::2] for f in payload.decode().split("&")) if k == "paths"
            ]
            return self._json(
                h, [e for p in asked for e in self._entries(folder, p, False)[:1] if e["path"] == p], body
            )
        file = folder / resolve.group(3)
        if not file.is_file():
            return self._error(h, 404, "EntryNotFound")
        data = file.read_bytes()
        start, end, status = 0, len(data) - 1, 200
        asked = h.headers.get("Range")
        if asked is not None:
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", asked.strip())
            if (
                ranged is None
                or int(ranged.group(1)) >= len(data)
                or (ranged.group(2) and int(ranged.group(2)) < int(ranged.group(1)))
            ):
                h.send_response(416)  # not understood or not satisfiable: refused, never guessed
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return None
            start, status = int(ranged.group(1)), 206
            end = min(int(ranged.group(2) or end), len(data) - 1)
        name, claimed = resolve.group(3), end
        if status == 206 and name in self.short and end > start:
            end -= 1  # one byte short, consistently declared
        h.send_response(status)
        headers = {
            "ETag": '"' + hashlib.sha256(data).hexdigest() + '"',
            "X-Repo-Commit": self.commit,
            "Content-Length": str(end - start + 1),
            **self.header_patch,
            **(self.get_patch if body else {}),
        }
        for key, value in headers.items():
            h.send_header(key, value)
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{claimed}/{len(data)}")
        h.end_headers()
        if not body:
            return None
        cut = (
            name in self.cut_always
            or (status == 200 and name in self.cut)
            or (status == 206 and self.cut_ranges > 0 and name.endswith(".safetensors") and end - start > 64)
        )
        if cut:
            if name in self.cut_always:
                pass
            elif status == 200:
                self.cut.discard(name)
            else:
                self.cut_ranges -= 1
            h.wfile.write(data[start : start + (end - start + 1) // 2])
            h.wfile.flush()
            self.sent += (end - start + 1) // 2
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return None
        h.wfile.write(data[start : end + 1])
        self.sent += end - start + 1
        return None
