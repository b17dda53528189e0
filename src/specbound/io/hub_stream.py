"""A hub model analysed without downloading its weights: each safetensors shard's header, then each
tensor the analysis asks for, read with HTTP range requests (``--stream``).

What is read: config.json and the shard index (``model.safetensors.index.json``), whole, into
memory; of every shard its 8-byte header length and its JSON header (two range requests); then one
range request per tensor, when the layer that uses it is analysed.  Nothing is written to disk: the
disk used is none, the memory one layer's tensors in float64 plus one chunk (the pipeline releases
each layer before the next but one is read; :func:`specbound.pipeline.all_layer_spectra`).

The HTTP goes through ``huggingface_hub``: ``hf_hub_url`` for the ``resolve`` URL at the commit the
revision named when the analysis began (every read is of the same files), ``get_hf_file_metadata``
(a HEAD) for each file's size, and its shared session (``get_session``) with its auth headers
(``build_hf_headers``: ``HF_TOKEN`` or the stored login) for the ranges.  ``HfFileSystem`` is not
used: its buffered reads fetch whole blocks ahead, more than one tensor's bytes.

Every answer is checked: a range answered with another length or another ``Content-Range`` is an
error, never a silently shifted tensor; a header whose offsets lie beyond the size the server
reports is refused before any tensor is read (:func:`.safetensors_file.check_header`, the local
reader's check); a dropped connection is retried from the byte where it stopped, ``RETRIES`` times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .base import MAX_JSON_BYTES, Checkpoint, check_config, decode_json
from .formats import SAFETENSORS
from .hub_errors import display, hub_errors, transport_error
from .safetensors_file import STORED_DTYPES, check_header, header_length, stored_values, upcast
from .shard_index import check_weight_map

RETRIES = 3  # attempts per range after the first, each resuming where the last stopped
_BACKOFF_S = 0.2  # seconds before the first retry, doubled for each next one
_BODY_CHUNK = 1 << 20  # bytes of an HTTP body handed to the decoder at a time
# Bytes of a shard read first: its 8-byte length and, when the header is short (a few dozen tensors),
# the header itself, in one range request; a longer header is read by a second one.  Small, so that
# a shard of small tensors is not read whole for its header.
HEADER_GUESS = 4 << 10
# Shard headers read at once (each a network round trip; thousands of tiny shards otherwise cost
# one round trip after another).
HEADER_WORKERS = 8


@dataclass
class HubFiles:
    """The files of one repository at one commit, read by byte ranges.

    Attributes
    ----------
    repo_id, revision : str
        As the user named them.
    commit : str
        The commit ``revision`` named when the analysis began: every read is of that commit.
    endpoint, token : str or None
        ``HF_ENDPOINT`` and ``HF_TOKEN`` (None: huggingface_hub's defaults).
    sent : int
        Body bytes received so far (what streaming cost on the wire).
    """

    repo_id: str
    revision: str
    commit: str
    endpoint: str | None = None
    token: str | None = None
    sent: int = 0
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """``org/name[@revision]``, for messages."""
        return display(self.repo_id, self.revision)

    def _errors(self):
        """The Hub's failures, as one line each (an HTTP error or the network, mid-analysis too)."""
        return hub_errors(self.repo_id, self.revision, self.endpoint, doing="streaming")

    def url(self, filename: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo_id, filename, revision=self.commit, endpoint=self.endpoint)

    def size(self, filename: str) -> int:
        """The file's size in bytes, as the server reports it (a HEAD on its resolve URL)."""
        if filename not in self._sizes:
            from huggingface_hub import get_hf_file_metadata

            with self._errors():
                meta = self._retried(
                    lambda: get_hf_file_metadata(self.url(filename), token=self.token, endpoint=self.endpoint)
                )
            if meta.size is None:
                raise SpecboundError(
                    f"the server of {self.name} reports no size for {filename} (no Content-Length "
                    f"on its HEAD answer): streaming needs it; download the model instead"
                )
            self._sizes[filename] = int(meta.size)
        return self._sizes[filename]

    def chunks(self, filename: str, start: int, length: int) -> Iterator[bytes]:
        """Bytes ``start .. start + length - 1`` of ``filename``, in pieces as they arrive: one range
        request, resumed from the first byte not received when the connection drops."""
        if length <= 0:
            return
        got, failures = 0, 0
        with self._errors():  # an HTTP error answer, mid-analysis too
            while got < length:
                try:
                    for piece in self._range(filename, start + got, length - got):
                        got += len(piece)
                        yield piece
                except SpecboundError:
                    raise
                except Exception as exc:  # only the network failing is retried
                    if not transport_error(exc):
                        raise
                    failures += 1
                    if failures > RETRIES:
                        raise SpecboundError(
                            f"the connection to {self._host()} dropped {failures} times while reading {filename} "
                            f"of {self.name} (bytes {start + got:,}..{start + length - 1:,}; last: "
                            f"{type(exc).__name__}): check the network and run again, or download the model "
                            f"instead of --stream"
                        ) from None
                    time.sleep(_BACKOFF_S * 2 ** (failures - 1))

    def read(self, filename: str, start: int, length: int) -> bytes:
        return b"".join(self.chunks(filename, start, length))

    def _range(self, filename: str, start: int, length: int) -> Iterator[bytes]:
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        end = start + length - 1
        headers = build_hf_headers(token=self.token)
        headers.update({"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"})
        with get_session().stream("GET", self.url(filename), headers=headers) as response:
            if response.status_code >= 400:
                response.read()  # the error's body, which hf_raise_for_status reads for its code
                hf_raise_for_status(response)
            told = response.headers.get("Content-Range", "")
            size = self._sizes.get(filename)
            if (
                response.status_code != 206
                or told.split("/")[0] != f"bytes {start}-{end}"
                or (size is not None and told.split("/")[-1] not in (str(size), "*"))
            ):
                raise self._wrong(filename, start, end, f"HTTP {response.status_code}, Content-Range {told or 'none'}")
            got = 0
            for piece in response.iter_bytes(_BODY_CHUNK):
                got += len(piece)
                self.sent += len(piece)
                if got > length:
                    raise self._wrong(filename, start, end, f"more than {length:,} bytes")
                yield piece
            if got < length:  # a body cut short of its Content-Length is the client's error (retried)
                raise self._wrong(filename, start, end, f"{got:,} bytes")

    def _wrong(self, filename: str, start: int, end: int, found: str) -> SpecboundError:
        return SpecboundError(
            f"{self._host()} answered the range bytes={start}-{end} of {filename} ({self.name}) "
            f"with {found}, expected HTTP 206 and {end - start + 1:,} bytes: the server (or a "
            f"proxy) does not serve byte ranges faithfully; download the model instead of --stream"
        )

    def _retried(self, call):
        for failures in range(RETRIES + 1):
            try:
                return call()
            except Exception as exc:  # the network failing is retried, anything else raised
                if not transport_error(exc) or failures == RETRIES:
                    raise
                time.sleep(_BACKOFF_S * 2**failures)
        raise AssertionError("unreachable")

    def _host(self) -> str:
        return self.endpoint or "huggingface.co"


def read_json(files: HubFiles, filename: str, what: str) -> Any:
    """A small JSON file of the repository (config.json, the shard index), read whole into memory."""
    fix = f"the repository's {filename} is corrupt; download the model instead of --stream"
    size = files.size(filename)
    if size > MAX_JSON_BYTES:
        raise SpecboundError(
            f"{filename} of {files.name} is {size:,} bytes, more than any {what} holds ({MAX_JSON_BYTES:,}); {fix}"
        )
    return decode_json(files.read(filename, 0, size), f"the {what} {filename} of {files.name}", fix)


@dataclass
class StreamedCheckpoint(Checkpoint):
    """Safetensors shards on a hub server, read by byte ranges (module docstring).

    Attributes
    ----------
    shards : dict[str, str]
        Tensor name -> shard file name in the repository.
    remote : HubFiles
        The repository at its commit.
    """

    location: str
    config: dict[str, Any]
    shards: dict[str, str]
    reads_stored = True
    remote: HubFiles
    _headers: dict[str, tuple[int, dict]] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return sorted(self.shards)

    def where(self, name: str) -> str:
        return f"{self.shards[name]} of {self.remote.name}"

    def header(self, shard: str) -> tuple[int, dict]:
        """``(header length, header)`` of ``shard``, read once (two ranges) and checked against the
        size the server reports."""
        if shard not in self._headers:
            size = self.remote.size(shard)
            try:
                first = self.remote.read(shard, 0, min(HEADER_GUESS, size))  # the header too, mostly
                n = header_length(first[:8], size)
                raw = first[8 : 8 + n] if len(first) >= 8 + n else self.remote.read(shard, 8, n)
                self._headers[shard] = n, check_header(raw, size)
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                raise SpecboundError(
                    f"cannot read the safetensors header of {shard} ({self.remote.name}, "
                    f"{size:,} bytes as the server reports): {str(exc)[:200]}; the shard is "
                    f"corrupt or not the file its index names: download the model to check it"
                ) from None
        return self._headers[shard]

    def _entry(self, name: str) -> dict:
        header = self.header(self.shards[name])[1]
        if name not in header:
            raise SpecboundError(
                f"{self.shards[name]} of {self.remote.name} does not contain the tensor {name!r}, "
                f"but the shard index maps it there: the index and its shards do not belong "
                f"together; report it to the repository's owner"
            )
        return header[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def dtype(self, name: str) -> str:
        return str(self._entry(name)["dtype"])

    def _raw(self, name: str) -> np.ndarray:
        shard, entry = self.shards[name], self._entry(name)
        header_len = self.header(shard)[0]
        start, end = entry["data_offsets"]
        try:
            return upcast(entry, self.remote.chunks(shard, 8 + header_len + start, end - start))
        except ValueError as exc:
            raise SpecboundError(
                f"cannot read tensor {name!r} of {shard} ({self.remote.name}): {exc}; download "
                f"the model instead of --stream"
            ) from None

    def stored(self, name: str) -> np.ndarray:
        """``name``'s stored values in their own dtype (a quantized checkpoint's: :mod:`.quantized`)."""
        shard, entry = self.shards[name], self._entry(name)
        start, end = entry["data_offsets"]
        if entry["dtype"] not in STORED_DTYPES:
            raise SpecboundError(
                f"tensor {name!r} of {shard} ({self.remote.name}) is stored as {entry['dtype']}, "
                f"which no reader of specbound decodes"
            )
        try:
            return stored_values(entry, self.remote.chunks(shard, 8 + self.header(shard)[0] + start, end - start))
        except ValueError as exc:
            raise SpecboundError(
                f"cannot read tensor {name!r} of {shard} ({self.remote.name}): {exc}; download "
                f"the model instead of --stream"
            ) from None

    def close(self) -> None:
        self._headers.clear()


def read_json_weight_map(remote: HubFiles) -> dict[str, str]:
    """The checked ``weight_map`` of the repository's shard index, read into memory."""
    index = SAFETENSORS.index_files[0]
    return check_weight_map(read_json(remote, index, "shard index"), f"{index} of {remote.name}")


def open_streamed(
    remote: HubFiles, weight_map: dict[str, str] | None, sizes: dict[str, int | None] | None = None
) -> StreamedCheckpoint:
    """The checkpoint of ``remote``'s config.json and safetensors weights: the shards of
    ``weight_map`` (its shard index's, checked to be in the repository), or ``model.safetensors``
    when None.  Only config.json and every shard's header are read now."""
    single = SAFETENSORS.folder_files[0]
    # the sizes the listing gave (checked, hub_answers.check_siblings): no HEAD per shard
    remote._sizes.update({name: size for name, size in (sizes or {}).items() if size is not None})
    config = check_config(read_json(remote, "config.json", "model config"), f"config.json of {remote.name}")
    where = f"{remote.repo_id}@{remote.commit} (streamed from {remote._host()})"
    ckpt = StreamedCheckpoint(where, config, {}, remote)
    ckpt.set_facts(hub_source=f"{remote.repo_id}@{remote.commit}")
    ckpt.shards = dict(weight_map) if weight_map else {name: single for name in ckpt.header(single)[1]}
    shards = sorted(set(ckpt.shards.values()))  # every header now: a lying one fails before any tensor
    if len(shards) > 1:
        with ThreadPoolExecutor(min(HEADER_WORKERS, len(shards))) as pool:
            for _ in pool.map(ckpt.header, shards):  # (the first failure is raised, in shard order)
                pass
    for shard in shards:
        ckpt.header(shard)
    return ckpt
