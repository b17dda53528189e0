"""A two-tower model's analyses (CLIP, SigLIP): one :class:`~.analysis.Analysis` per tower, each tower
a chain bounded on its own (docs/theory.md 3j), reported together under a ``tower`` key."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ..atomic import atomic_write
from ..errors import SpecboundError
from ..io.base import decode_json, read_regular_file
from .analysis import Analysis, load_analysis
from .schema import SCHEMA_VERSION
from .view import format_headline, format_summary

TOWERS_FILE = "towers.json"
# towers.json is a few dozen bytes; a tower's name is its subfolder's: a plain name, never a path
TOWERS_FILE_MAX_BYTES = 1 << 20
MAX_TOWERS = 16
_TOWER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_LOAD_FIX = "pass a folder written by TowerAnalyses.save"


def tower_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a tower (and so its subfolder), or None: a tower is a plain name of
    letters, digits, ``_`` and ``-`` (at most 64), never empty, never a path (no separator, no ``..``,
    not absolute)."""
    if not isinstance(name, str):
        return f"a tower name must be a string, found {type(name).__name__} {str(name)[:40]!r}"
    if not _TOWER_NAME.fullmatch(name):
        return (
            f"the tower name {name[:80]!r} is not a plain name (letters, digits, '_' and '-', at most 64, "
            f"no path separator, no '..')"
        )
    return None


def check_tower_names(names: Any, where: str, fix: str) -> list[str]:
    """``names`` as a list of distinct plain tower names (:func:`tower_name_problem`); one line otherwise."""
    if not isinstance(names, (list, tuple)) or not names:
        raise SpecboundError(
            f"{where}: 'towers' must be a non-empty list of tower names, found {type(names).__name__}; {fix}"
        )
    if len(names) > MAX_TOWERS:
        raise SpecboundError(f"{where} names {len(names):,} towers, more than any model has ({MAX_TOWERS}); {fix}")
    for name in names:
        problem = tower_name_problem(name)
        if problem:
            raise SpecboundError(f"{where}: {problem}; {fix}")
    if len(set(names)) != len(names):
        raise SpecboundError(f"{where} names a tower twice ({', '.join(names)}); {fix}")
    return list(names)


class TowerAnalyses(Mapping):
    """Tower name (``text``, ``vision``) -> that tower's :class:`Analysis`.

    ``result["vision"].bounds`` is one tower's headline; :attr:`bounds` every tower's;
    :meth:`tidy_table` a table of both with a ``tower`` column first; ``to_json`` one document with a
    ``towers`` object; ``save(dir)`` one folder per tower (``dir/text``, ``dir/vision``) and
    ``towers.json``, reopened by :meth:`load`.  ``print(result)`` prints each tower's summary.
    """

    def __init__(self, towers: Mapping[str, Analysis]):
        self.towers = dict(towers)
        check_tower_names(list(self.towers), "TowerAnalyses", "name each tower plainly (text, vision)")

    def __getitem__(self, tower: str) -> Analysis:
        try:
            return self.towers[tower]
        except KeyError:
            raise SpecboundError(f"no tower {tower!r}; this model's towers are {', '.join(self.towers)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.towers)

    def __len__(self) -> int:
        return len(self.towers)

    @property
    def source(self) -> str:
        return next(iter(self.towers.values())).source

    @property
    def bounds(self) -> dict[str, dict[str, float]]:
        """Each tower's headline bounds."""
        return {t: a.bounds for t, a in self.towers.items()}

    def all_bounds(self) -> dict[str, dict[str, float]]:
        """Each tower's every bound and measure."""
        return {t: a.all_bounds() for t, a in self.towers.items()}

    def tidy_table(self, name: str, **ident) -> pd.DataFrame:
        """Table ``name`` of every tower, one after the other, with a ``tower`` column first."""
        parts = []
        for tower, a in self.towers.items():
            table = a.tidy_table(name, **ident)
            table.insert(0, "tower", pd.Series([tower] * len(table), dtype="string"))
            parts.append(table)
        return pd.concat(parts, ignore_index=True)

    def to_dict(self) -> dict[str, Any]:
        """``{"schema_version", "source", "towers": {tower: the tower's Analysis.to_dict()}}``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "towers": {t: a.to_dict() for t, a in self.towers.items()},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Each tower's tables and summary in ``out_dir/<tower>``, and ``towers.json`` naming them."""
        out = Path(out_dir)
        written = []
        for tower, a in self.towers.items():
            written += a.save(_inside(out, tower, out))
        written.append(
            atomic_write(
                out / TOWERS_FILE,
                lambda p: Path(p).write_text(
                    json.dumps({"schema_version": SCHEMA_VERSION, "towers": list(self.towers)})
                ),
            )
        )
        return written

    @classmethod
    def load(cls, out_dir: str | Path) -> "TowerAnalyses":
        """Reopen what :meth:`save` wrote."""
        folder = Path(out_dir)
        path = folder / TOWERS_FILE
        if not path.exists() and not path.is_symlink():
            raise SpecboundError(f"{folder} holds no {TOWERS_FILE}; {_LOAD_FIX}")
        doc = decode_json(
            read_regular_file(path, TOWERS_FILE_MAX_BYTES, "towers file", _LOAD_FIX),
            f"the towers file {path}",
            _LOAD_FIX,
        )
        if not isinstance(doc, dict) or "towers" not in doc:
            raise SpecboundError(
                f"{path} must hold a JSON object with a 'towers' list, found {type(doc).__name__}; {_LOAD_FIX}"
            )
        towers = check_tower_names(doc["towers"], str(path), _LOAD_FIX)
        return cls({t: load_analysis(_inside(folder, t, path)) for t in towers})

    def headline(self) -> str:
        """``--quiet``: each tower's headline bounds, one per line, prefixed by the tower."""
        return "\n".join(f"{t}.{line}" for t, a in self.towers.items() for line in format_headline(a).splitlines())

    def summary(self, *, verbose: bool = False) -> str:
        """Each tower's summary, one after the other."""
        return "\n\n".join(f"=== tower {t} ===\n{format_summary(a, verbose=verbose)}" for t, a in self.towers.items())

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (
            f"<specbound.TowerAnalyses of {len(self)} towers: "
            + "; ".join(f"{t}: {a!r}" for t, a in self.towers.items())
            + ">"
        )

    def _repr_html_(self) -> str:
        return "".join(f"<h4>tower {t}</h4>{a._repr_html_()}" for t, a in self.towers.items())


def _inside(folder: Path, tower: str, where: Any) -> Path:
    """``folder/tower``, which must stay inside ``folder`` once links are followed (a tower's
    subfolder that is a symlink out of it is refused, on load and on save)."""
    sub = folder / tower
    root = folder.resolve()
    if sub.is_symlink() or (sub.exists() and root not in sub.resolve().parents):
        raise SpecboundError(
            f"{where}: the tower folder {sub} is a link or leads outside {folder}; "
            f"a saved two-tower analysis keeps each tower in a plain subfolder"
        )
    return sub
