"""A local stand-in for the Hugging Face Hub's HTTP API, enough for ``huggingface_hub`` to list and
download a model repository: the tests point ``HF_ENDPOINT`` at it and never reach the internet.

Routes (as ``huggingface_hub`` calls them):
* ``GET /api/models/{org}/{name}/revision/{rev}``: the model info, whose ``siblings`` list the files;
* ``HEAD /{org}/{name}/resolve/{rev}/{file}``: ``ETag``, ``X-Repo-Commit`` and ``Content-Length``;
* ``GET`` on the same route, honouring ``Range: bytes=a-`` / ``bytes=a-b`` (a resumed download).
Every request is logged in :attr:`HubServer.log` as ``(method, path, Range header)``.
Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``GatedRepo``, ``RevisionNotFound``).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class HubServer:
    """``repos``: ``{"org/name": folder}``; every repository has one revision ``main`` at ``commit``.
    ``gated``: ids answered 403 GatedRepo unless the request carries ``Authorization: Bearer hf_granted``.  ``cut``: file names whose first full GET stops after
    half the bytes and drops the connection (a network failure mid-download)."""

    def __init__(self, repos: dict[str, Path], commit: str = "a" * 40, gated: tuple[str, ...] = (),
                 cut: tuple[str, ...] = ()):
        self.repos, self.commit, self.gated = {k: Path(v) for k, v in repos.items()}, commit, set(gated)
        self.cut = set(cut)
        self.log: list[tuple[str, str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the log list is the record
                pass

            def do_HEAD(self):
                server._answer(self, body=False)

            def do_GET(self):
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

    def _answer(self, h, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.log.append((h.command, path, h.headers.get("Range", "")))
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo_id = (info or resolve).group(1) if (info or resolve) else None
        if repo_id not in self.repos:
            return self._error(h, 404, "RepoNotFound")
        if repo_id in self.gated and h.headers.get("Authorization") != "Bearer hf_granted":
            return self._error(h, 403, "GatedRepo")
        if (info or resolve).group(2) not in ("main", self.commit):
            return self._error(h, 404, "RevisionNotFound")
        folder = self.repos[repo_id]
        if info:
            files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            data = json.dumps({"id": repo_id, "modelId": repo_id, "sha": self.commit, "private": False,
                               "siblings": [{"rfilename": f} for f in files]}).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if body:
                h.wfile.write(data)
            return None
        file = folder / resolve.group(3)
        if not file.is_file():
            return self._error(h, 404, "EntryNotFound")
        data = file.read_bytes()
        start, end, status = 0, len(data) - 1, 200
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range", ""))
        if ranged and body:
            start, end, status = int(ranged.group(1)), int(ranged.group(2) or end), 206
        h.send_response(status)
        h.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        h.send_header("X-Repo-Commit", self.commit)
        h.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        h.end_headers()
        if body and status == 200 and resolve.group(3) in self.cut:
            self.cut.discard(resolve.group(3))
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return None
        if body:
            h.wfile.write(data[start:end + 1])
        return None
