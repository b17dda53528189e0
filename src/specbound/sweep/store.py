"""The results store: one record per (checkpoint, option set), in a plain directory.

Layout::

    STORE/
      records/<key>/record.json            what was analysed, with which options, the bounds, timing
      records/<key>/matrices.parquet       Analysis.matrices
      records/<key>/layers.parquet         Analysis.layers
      records/<key>/singular_values.parquet
      records/<key>/curves.parquet         C(p) of every matrix on the grid (specbound.records.curves)
      .incoming/                           records being written (never read)
      digests.json                         SHA-256 of weight files already hashed, by path/size/mtime/ctime/inode

``key`` is a hash of the weights (config.json and every weight file, byte for byte) and of the
options that change the numbers, so a record is found again whatever the checkpoint is called
and a re-run skips it.  A file's hash is remembered in ``digests.json`` under its path, size,
modification and change times and inode, so a re-run does not read unchanged weights again.  A record is written
whole in ``.incoming/`` and then published by one
``rename`` of its folder: a reader (or a sweep killed with ``kill -9`` at any moment) sees a
complete record or none.  Two writers of the same key cannot both publish; the loser's copy is
dropped.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import socket
import stat
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow.parquet as pq

from ..atomic import remove_stale, temp_path
from ..errors import SpecboundError, SpecboundWarning, os_errors
from ..io.base import fingerprint, read_regular_file
from ..options import AnalysisOptions, option_fields
from ..records.analysis import analysis_from_document
from ..records.curves import contribution_curves
from ..records.schema import column_types_problem, read_table

# The store format, in every key and record.json.  Format 1's key is a hash of the weights and of
# KEY_OPTIONS (always, in this order) plus every other option that changes the numbers and differs
# from its default: an option added to AnalysisOptions with a default leaves every key as it is.
# Changing what a key holds is a new format (and a migration of the stores written in this one).
RECORD_FORMAT = 1
KEY_OPTIONS = ("grid_m", "rank_tol", "l_phi", "method", "gram_rtol", "arch_spec")
TABLES = ("matrices", "layers", "singular_values", "curves")
QUARANTINE = "quarantine"  # records that cannot be read, set aside by Store.quarantine
_HASH_CHUNK = 1 << 22


# --- keys --------------------------------------------------------------------------------------


def canonical_options(options: dict[str, Any] | AnalysisOptions | None) -> dict[str, Any]:
    """The options of a record key (:data:`KEY_OPTIONS`, then every other option that changes the
    numbers and differs from its default; paths as strings), in that order; unknown names and bad
    values are an error."""
    opts = AnalysisOptions.build(options)
    out = {}
    for f in option_fields():
        value = getattr(opts, f.name)
        if f.metadata["key"] and (f.name in KEY_OPTIONS or value != f.default):
            out[f.name] = str(value) if f.metadata["kind"] == "path" and value is not None else value
    return {**{k: out[k] for k in KEY_OPTIONS}, **{k: v for k, v in out.items() if k not in KEY_OPTIONS}}


def _file_sha256(path: Path, digest=None):
    h = digest or hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h


def file_sha256(path: Path, cache: dict[str, str] | None = None) -> str:
    """SHA-256 of a file's bytes, remembered in ``cache`` under its :func:`fingerprint`.

    The fingerprint is taken before and after hashing: a file written meanwhile is an error (its
    bytes are none of its versions), so a remembered hash is always that of one whole version.
    """
    with os_errors(f"hash {path}"):
        before = fingerprint(path)
        if cache is not None and before in cache:
            return cache[before]
        digest = _file_sha256(path).hexdigest()
        if fingerprint(path) != before:
            raise SpecboundError(
                f"{path} changed while it was being hashed; wait until it is written completely and run the sweep again"
            )
    if cache is not None:
        cache[before] = digest
    return digest


def weights_digest(config: dict[str, Any], weight_files: list[Path], cache: dict[str, str] | None = None) -> str:
    """SHA-256 over the decoded config (canonical JSON) and the SHA-256 of every weight file."""
    return hash_weights(config, weight_files, cache)[0]


def hash_weights(
    config: dict[str, Any], weight_files: list[Path], cache: dict[str, str] | None = None
) -> tuple[str, tuple[str, ...]]:
    """``(digest, fingerprints)``: :func:`weights_digest` and the :func:`fingerprint` of every
    weight file at the moment its hash was taken, for :func:`check_unchanged` at analysis time."""
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    prints = []
    for path in sorted(set(weight_files), key=lambda p: p.name):
        with os_errors(f"hash {path}"):
            prints.append(fingerprint(path))
        digest = file_sha256(path, cache)
        with os_errors(f"hash {path}"):
            if fingerprint(path) != prints[-1]:
                raise SpecboundError(f"{path} changed while it was being hashed; run the sweep again")
        h.update(b"\0" + path.name.encode() + b"\0" + digest.encode())
    return h.hexdigest(), tuple(prints)


def check_unchanged(fingerprints: tuple[str, ...], source: str) -> None:
    """Raise when any file is no longer the version whose fingerprint was taken when it was hashed.

    A record's key is the digest of the bytes it analysed only if no weight file (nor config.json)
    changed between hashing and the end of the analysis; a sweep checks this right before and right
    after each analysis, so a file replaced meanwhile fails that task instead of storing another
    file's numbers under the old key.
    """
    for then in fingerprints:
        path = Path(then.rsplit("|", 4)[0])
        try:
            now = fingerprint(path)
        except OSError:
            now = None
        if now != then:
            raise SpecboundError(
                f"{path} changed since the sweep hashed it (while {source} was waiting or being analysed): "
                f"its record would not match its key; run the sweep again once the files stay put"
            )


def record_key(weights_sha256: str, options: dict[str, Any], init_sha256: str | None = None) -> str:
    """The store key of one checkpoint analysed with one option set (24 hex digits); with an
    ``init`` option, ``init_sha256`` is the digest of the initial weights (their content, not their
    path, is in the key)."""
    options = canonical_options(options)
    if options["arch_spec"] is not None:  # the spec's content, not where it lies, changes the numbers
        options["arch_spec"] = _file_sha256(Path(options["arch_spec"])).hexdigest()
    if options.get("init") is not None:
        if init_sha256 is None:
            raise SpecboundError("a record key with initial weights needs their digest (init_sha256)")
        options["init"] = init_sha256
    text = json.dumps(
        {"format": RECORD_FORMAT, "weights": weights_sha256, "options": options}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# --- records -----------------------------------------------------------------------------------


@dataclass
class Record:
    """One stored analysis.

    Attributes
    ----------
    meta : dict
        The contents of ``record.json``: ``format, key, source, labels, location, weights_sha256,
        options`` (as requested), ``model``, ``bounds`` (every bound and baseline by name),
        ``analysis`` (the analysis' JSON document without its tables) and ``run`` (``seconds``,
        ``cpu_seconds`` (of the analysing thread), ``host``, ``finished``, ``mode``: how this copy was
        made, not part of its identity).
    tables : dict[str, DataFrame]
        ``matrices, layers, singular_values, curves``.
    """

    meta: dict[str, Any]
    tables: dict[str, Any] = field(repr=False)

    @property
    def key(self) -> str:
        return self.meta["key"]

    @property
    def model(self) -> dict[str, Any]:
        return self.meta["model"]

    @property
    def bounds(self) -> dict[str, float]:
        return self.meta["bounds"]

    def analysis(self):
        """This record as an :class:`~specbound.records.Analysis` (its stored document and tables;
        load it with the ``matrices``, ``layers`` and ``singular_values`` tables)."""
        missing = [t for t in ("matrices", "layers", "singular_values") if t not in self.tables]
        if missing:
            raise SpecboundError(
                f"record {self.key} was loaded without its {', '.join(missing)} table(s); load it with Store.load(key)"
            )
        return analysis_from_document(self.meta["analysis"], self.tables)

    def __getattr__(self, name: str):
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)


def bound_values(analysis) -> dict[str, float]:
    """Every bound of an analysis by name: the headline ``bounds`` and any other group of bound
    values the analysis carries (``adaptive_variants``, ``baselines``)."""
    values = dict(analysis.bounds)
    for group in ("adaptive_variants", "baselines"):
        values.update(getattr(analysis, group, None) or {})
    return {k: float(v) for k, v in values.items()}


def record_from_analysis(
    analysis,
    *,
    key: str,
    source: str,
    labels: dict[str, Any],
    weights_sha256: str,
    options: dict[str, Any],
    seconds: float,
    mode: str,
    cpu_seconds: float | None = None,
    metrics: dict[str, float] | None = None,
) -> Record:
    """Build the record of one analysis (the contribution curves are evaluated here); ``metrics``:
    the user's own numbers for the checkpoint (:mod:`specbound.sweep.metrics`), not part of the key."""
    doc = analysis.to_dict()
    for big in ("matrices", "layers"):
        doc.pop(big, None)
    curves = contribution_curves(
        analysis.matrices,
        analysis.singular_values,
        n=analysis.model["N"],
        grid_m=analysis.options["grid_m"],
        rank_tol=analysis.options["rank_tol"],
    )
    meta = {
        "format": RECORD_FORMAT,
        "key": key,
        "source": source,
        "labels": labels,
        "location": getattr(analysis, "location", None) or analysis.source,
        "weights_sha256": weights_sha256,
        "options": canonical_options(options),
        "model": analysis.model,
        "bounds": {k: _json_float(v) for k, v in bound_values(analysis).items()},
        "log10_bounds": log10_bounds(analysis),
        "matrices": int(len(analysis.matrices)),
        "analysis": doc,
        "metrics": dict(metrics or {}),
        "run": {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "host": socket.gethostname(),
            "mode": mode,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }
    # Every table carries its record's key and source first, so the tables of a whole store concatenate
    # into one tidy frame (dask.dataframe.read_parquet("STORE/records/*/matrices.parquet")).
    tables = {
        name: analysis.tidy_table(name, key=key, source=source) for name in ("matrices", "layers", "singular_values")
    }
    tables["curves"] = _with_ids(curves, key=key, source=source)
    return Record(meta, tables)


def _with_ids(table, *, key: str, source: str):
    """``table`` with ``key`` and ``source`` columns first (string dtype)."""
    ids = pd.DataFrame(
        {
            "key": pd.Series([key] * len(table), dtype="string"),
            "source": pd.Series([source] * len(table), dtype="string"),
        }
    )
    return pd.concat([ids, table.reset_index(drop=True)], axis=1)


def _json_float(value: float) -> float | None:
    """A bound as record.json holds it: finite, or null (too large for float64: its ``log10_bounds``
    entry says how large)."""
    return value if math.isfinite(value) else None


def log10_bounds(analysis) -> dict[str, float | None]:
    """``log10`` of every bound (:func:`bound_values`), finite however large the bound; null for a
    bound that is zero or undefined."""
    known = getattr(analysis, "log10_bounds", None) or {}
    out = {}
    for name, value in bound_values(analysis).items():
        log10 = known.get(name)
        if log10 is None:
            log10 = math.log10(value) if 0 < value < math.inf else math.nan
        out[name] = float(log10) if math.isfinite(log10) else None
    return out


def meta_checksum(meta: dict[str, Any]) -> str:
    """SHA-256 of a record's ``record.json`` without its ``checksum`` (canonical JSON): every field,
    the SHA-256 of each table file among them, so that an edit anywhere in a record is noticed."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()).hexdigest()


# --- the store ---------------------------------------------------------------------------------


class Store:
    """A results store folder (created when missing).

    Parameters
    ----------
    root : path
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        if self.root.exists() and not self.root.is_dir():
            raise SpecboundError(f"the results store {self.root} is a file; pass a folder (created if missing)")
        self.records_dir = self.root / "records"
        self.incoming_dir = self.root / ".incoming"
        self._checked: dict[str, int] = {}  # key -> record.json mtime when found sound

    def _ensure(self) -> None:
        """Create the store's folders and check that a record can be written there."""
        try:
            self.records_dir.mkdir(parents=True, exist_ok=True)
            self.incoming_dir.mkdir(parents=True, exist_ok=True)
            probe = temp_path(self.incoming_dir, "probe")
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            raise SpecboundError(
                f"cannot write to the results store {self.root} ({exc.strerror or exc}); "
                f"pass --store a folder you can write to"
            ) from None

    def keys(self) -> list[str]:
        """Keys of the complete, readable records, sorted; a record that cannot be read is set
        aside (:meth:`quarantine`) with a :class:`~specbound.errors.SpecboundWarning`."""
        if not self.records_dir.is_dir():
            return []
        with os_errors(f"list the results store {self.root}"):
            found = sorted(p.name for p in self.records_dir.iterdir() if (p / "record.json").exists())
        return [key for key in found if self._sound(key)]

    def __contains__(self, key: str) -> bool:
        return (self.records_dir / key / "record.json").exists() and self._sound(key)

    def __len__(self) -> int:
        return len(self.keys())

    def _sound(self, key: str) -> bool:
        """Whether record ``key`` can be read; one that cannot is quarantined (and so recomputed by
        the next sweep).  Checked once per record and store object."""
        folder = self.records_dir / key
        try:
            stamp = (folder / "record.json").stat().st_mtime_ns
        except OSError:
            return False
        if self._checked.get(key) == stamp:
            return True
        problem = record_problem(folder, key)
        if problem is None:
            self._checked[key] = stamp
            return True
        self.quarantine(key, problem)
        return False

    def quarantine(self, key: str, problem: str) -> Path | None:
        """Move record ``key`` to ``quarantine/`` (kept for inspection, out of every reader's way),
        warn, and return where it went (None when the store is read-only: the record is then only
        skipped)."""
        self._checked.pop(key, None)
        target = self.root / QUARANTINE / f"{key}+{time.strftime('%Y%m%dT%H%M%S')}+{uuid.uuid4().hex[:6]}"
        try:
            target.parent.mkdir(exist_ok=True)
            os.rename(self.records_dir / key, target)
        except OSError:
            target = None
        where = f"moved to {target}" if target else "skipped (the store is read-only)"
        warnings.warn(
            SpecboundWarning(
                f"record {key} in {self.root} cannot be read ({problem}): {where}; "
                f"the next sweep over its checkpoint recomputes it"
            ),
            stacklevel=3,
        )
        return target

    def put(self, record: Record) -> bool:
        """Write ``record`` atomically; False when a record with its key is already there."""
        self._ensure()
        if record.key in self:
            return False
        # <key>+<pid>+<random>+<host>: clean_incoming tells a dead writer's leftovers from a live one's
        tmp = temp_path(self.incoming_dir, record.key)
        with os_errors(f"write record {record.key} to the results store {self.root}"):
            return self._publish(record, tmp)

    def _publish(self, record: Record, tmp: Path) -> bool:
        tmp.mkdir()
        try:
            hashes = {}
            for name in TABLES:
                path = tmp / f"{name}.parquet"
                record.tables[name].to_parquet(path, index=False)
                _fsync(path)
                hashes[name] = _file_sha256(path).hexdigest()
            record.meta["tables"] = hashes
            record.meta["checksum"] = meta_checksum(record.meta)
            (tmp / "record.json").write_text(json.dumps(record.meta, indent=2, allow_nan=False))
            _fsync(tmp / "record.json")
            _fsync(tmp)
            try:
                os.rename(tmp, self.records_dir / record.key)  # atomic publication of the whole folder
            except OSError:
                if record.key in self:  # another writer published the same key first
                    return False
                raise
            _fsync(self.records_dir)
            return True
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def load_meta(self, key: str) -> dict[str, Any]:
        """The ``record.json`` of record ``key`` (no table is read)."""
        if key not in self:
            raise SpecboundError(f"no readable record {key} in the store {self.root}")
        return json.loads(_read_record_file(self.records_dir / key / "record.json"))

    def load(self, key: str, tables: tuple[str, ...] = TABLES) -> Record:
        """The record ``key`` with the named tables read (one that cannot be read is quarantined
        and is an error)."""
        meta = self.load_meta(key)
        try:
            read = {}
            for t in tables:
                data = _read_record_file(self.records_dir / key / f"{t}.parquet")
                expected = (meta.get("tables") or {}).get(t)
                if expected is not None and hashlib.sha256(data).hexdigest() != expected:
                    raise ValueError(
                        f"{t}.parquet is not the file the record was written with (its SHA-256 "
                        f"differs from record.json's)"
                    )
                read[t] = read_table(t, pd.read_parquet(io.BytesIO(data)))
                problem = column_types_problem(t, read[t])
                if problem:  # a record written before the tables' checksums, edited (schema 1's alpha as text)
                    raise ValueError(problem)
            return Record(meta, read)
        except Exception as exc:  # noqa: BLE001  (pyarrow raises many types for a corrupt file)
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
        self.quarantine(key, problem)
        raise SpecboundError(
            f"record {key} in {self.root} cannot be read ({problem}); it was set aside: run "
            f"the sweep again to recompute it"
        )

    def records(self, tables: tuple[str, ...] = TABLES) -> Iterator[Record]:
        """Every complete record, in key order, with the named tables read."""
        for key in self.keys():
            yield self.load(key, tables)

    def table(self):
        """One row per record: ``key, source, family, L, N, H, H_kv, d_head, d_ff``, the options,
        ``label_<name>`` for each pattern label and one column per bound; sorted by L, N, source."""
        rows = []
        for key in self.keys():
            meta = self.load_meta(key)
            row = {"key": key, "source": meta["source"]}
            row.update({k: meta["model"].get(k) for k in ("family", "L", "N", "H", "H_kv", "d_head", "d_ff")})
            row.update({k: v for k, v in meta["options"].items() if k != "arch_spec"})
            row["grid_m"] = meta["analysis"]["options"]["grid_m"]
            row.update({f"label_{k}": v for k, v in meta.get("labels", {}).items()})
            metrics = meta.get("metrics")
            row.update(
                {
                    f"metric_{k}": float(v)
                    for k, v in (metrics if isinstance(metrics, dict) else {}).items()
                    if _is_number(v)
                }
            )
            log10 = meta.get("log10_bounds") or (meta["analysis"].get("log10_bounds") or {})
            for name, value in meta["bounds"].items():
                row[name] = _finite(value)
                row[f"log10_{name}"] = _finite(log10.get(name)) if isinstance(log10, dict) else math.nan
                if not math.isfinite(row[f"log10_{name}"]) and row[name] > 0:
                    row[f"log10_{name}"] = math.log10(row[name])
            row["seconds"] = meta["run"]["seconds"]
            row["cpu_seconds"] = meta["run"].get("cpu_seconds")
            rows.append(row)
        if not rows:
            return pd.DataFrame(columns=["key", "source", "family", "L", "N"])
        return pd.DataFrame(rows).sort_values(["L", "N", "source"], kind="stable").reset_index(drop=True)

    def bound_names(self) -> list[str]:
        """Every bound name found in the records, in first-seen order."""
        names: dict[str, None] = {}
        for key in self.keys():  # sound records: their bounds are a dict
            names.update(dict.fromkeys(self.load_meta(key)["bounds"]))
        return list(names)

    def load_digests(self) -> dict[str, str]:
        """The remembered file hashes (empty when none or unreadable: it is only a cache)."""
        try:
            cache = json.loads(_read_record_file(self.root / "digests.json").decode("utf-8"))
        except (SpecboundError, OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return {}
        if not isinstance(cache, dict):
            return {}
        # only well-formed entries: a damaged cache costs a re-hash, never a wrong key
        return {
            k: v
            for k, v in cache.items()
            if isinstance(k, str) and isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
        }

    def save_digests(self, cache: dict[str, str]) -> None:
        """Write the file-hash cache atomically (the last writer wins; entries never go stale)."""
        if not cache:
            return
        self._ensure()
        tmp = temp_path(self.incoming_dir, "digests")
        tmp.write_text(json.dumps(cache, indent=0, sort_keys=True))
        os.replace(tmp, self.root / "digests.json")

    def clean_incoming(self, max_age: float = 86400.0) -> int:
        """Remove leftovers of killed writers: this host's whose process is gone, and any older than
        ``max_age`` seconds.  Returns how many were removed."""
        if not self.incoming_dir.is_dir():
            return 0
        return len(remove_stale(self.incoming_dir.iterdir(), max_age))


# What every reader of record.json uses (Store.table, the reports), with the type it must have.
_META_FIELDS = {
    "key": str,
    "source": str,
    "model": dict,
    "options": dict,
    "bounds": dict,
    "analysis": dict,
    "run": dict,
}
_MODEL_FIELDS = ("family", "L", "N")
# Dimensions and integer labels a record may hold: far above any model, far below where converting
# them to a float (scaling fits, plots) or printing them could fail.
_MAX_RECORD_INT = 2**53
_RECORD_BYTES = 64 << 20  # record.json: kilobytes; a table file: its stored bytes, read whole
_TABLE_BYTES = 4 << 30
_SHA256 = frozenset("0123456789abcdef")


def _read_record_file(path: Path, limit: int | None = None) -> bytes:
    """A store file's bytes: a regular file of bounded size only (a FIFO or ``/dev/zero`` put in
    its place is refused before it is opened)."""
    limit = limit or (_RECORD_BYTES if path.suffix == ".json" else _TABLE_BYTES)
    return read_regular_file(path, limit, f"store file {path.name}", "the record is recomputed by the next sweep")


def _no_constant(name: str):
    raise ValueError(f"the non-standard JSON constant {name}")


def _is_digest(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _SHA256


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < _MAX_RECORD_INT


def _is_number(value) -> bool:
    """A finite float, or an integer below 2^53 in size (a float holds it exactly)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) < _MAX_RECORD_INT
    return isinstance(value, float) and math.isfinite(value)


def _label_problem(labels) -> str | None:
    if not isinstance(labels, dict):
        return f"record.json's labels are a {type(labels).__name__}, not an object"
    for name, value in labels.items():
        if not (value is None or isinstance(value, (str, bool)) or _is_number(value)):
            return f"record.json's label {name!r:.40} is {str(value)[:40]!r}, not a number, string or null"
    return None


def _bound_problem(meta) -> str | None:
    for group in ("bounds", "log10_bounds"):
        values = meta.get(group, {})
        if not isinstance(values, dict):
            return f"record.json's {group} is a {type(values).__name__}, not an object"
        for name, value in values.items():
            legacy = group == "bounds" and value in ("inf", "nan")  # written before log10_bounds
            if not (value is None or legacy or _is_number(value)):
                return f"record.json's {group[:-1]} {name!r:.40} is {str(value)[:40]!r}, not a finite number or null"
    return None


def meta_problem(meta: Any, key: str) -> str | None:
    """Why a decoded ``record.json`` is not one every reader can use, or None: the fields and types
    they read, dimensions and labels in range, finite bounds (or null), its own key, and, for a
    record written with one, its checksum (an edited record is caught here like a damaged one)."""
    if not isinstance(meta, dict):
        return f"record.json holds a JSON {type(meta).__name__}, not an object"
    for name, kind in _META_FIELDS.items():
        if not isinstance(meta.get(name), kind):
            return f"record.json has no {kind.__name__} '{name}'"
    if meta["key"] != key:
        return f"record.json says key {meta['key'][:40]!r}, its folder {key!r}"
    if "checksum" in meta and meta.get("checksum") != meta_checksum(meta):
        return "record.json was altered after it was written (its checksum does not match its contents)"
    if "weights_sha256" in meta and not _is_digest(meta["weights_sha256"]):
        return "record.json's weights_sha256 is not a SHA-256 digest"
    tables = meta.get("tables", {})
    if not isinstance(tables, dict) or not all(_is_digest(tables.get(t)) for t in tables):
        return "record.json's table digests are malformed"
    model = meta["model"]
    missing = [f for f in _MODEL_FIELDS if f not in model]
    if missing or not isinstance(model["family"], str) or not _is_count(model["L"]) or not _is_count(model["N"]):
        return (
            f"record.json's model lacks a family and positive integer L and N below 2^53 "
            f"({', '.join(missing) or 'wrong type or range'})"
        )
    for name in ("H", "H_kv", "d_head", "d_ff"):
        if model.get(name) is not None and not _is_count(model[name]):
            return f"record.json's model {name} is {str(model[name])[:40]!r}, not a positive integer below 2^53"
    grid = meta["analysis"].get("options", {}) if isinstance(meta["analysis"].get("options"), dict) else {}
    seconds = meta["run"].get("seconds")
    if not _is_count(grid.get("grid_m")) or not _is_number(seconds):
        return "record.json lacks analysis.options.grid_m or run.seconds"
    return _label_problem(meta.get("labels", {})) or _bound_problem(meta)


def record_problem(folder: Path, key: str) -> str | None:
    """Why the record in ``folder`` cannot be read, or None when it can: ``record.json`` must be a
    regular file of bounded size holding a UTF-8 JSON object that :func:`meta_problem` accepts,
    and every table a regular file whose Parquet footer reads (truncated and overwritten files fail
    there; a table edited in place fails its SHA-256 when it is read, :meth:`Store.load`)."""
    try:
        raw = _read_record_file(folder / "record.json")
        meta = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except SpecboundError as exc:
        return str(exc)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"record.json: {type(exc).__name__}: {str(exc)[:120]}"
    problem = meta_problem(meta, key)
    if problem is not None:
        return problem

    for table in TABLES:
        path = folder / f"{table}.parquet"
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode) or info.st_size > _TABLE_BYTES:
                return f"{table}.parquet is not a regular file of at most {_TABLE_BYTES:,} bytes"
            pq.read_metadata(path)
        except Exception as exc:  # noqa: BLE001  (OSError, ArrowInvalid, ...)
            return f"{table}.parquet: {type(exc).__name__}: {str(exc)[:120]}"
    return None


def _finite(value) -> float:
    """A stored number as a float, NaN for null, a legacy ``"inf"`` or anything non-finite: what the
    store's tables hold, so that no output ever prints an infinity."""
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def _fsync(path: Path) -> None:
    """Flush a file or folder to disk, so that a published record survives a machine crash too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
