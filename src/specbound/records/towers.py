"""A two-tower model's analyses (CLIP, SigLIP): one :class:`~.analysis.Analysis` per tower, each tower
a chain bounded on its own (docs/theory.md 3j), reported together under a ``tower`` key."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ..atomic import atomic_write
from ..errors import SpecboundError
from .analysis import Analysis, load_analysis
from .schema import SCHEMA_VERSION

TOWERS_FILE = "towers.json"


class TowerAnalyses(Mapping):
    """Tower name (``text``, ``vision``) -> that tower's :class:`Analysis`.

    ``result["vision"].bounds`` is one tower's headline; :attr:`bounds` every tower's;
    :meth:`tidy_table` a table of both with a ``tower`` column first; ``to_json`` one document with a
    ``towers`` object; ``save(dir)`` one folder per tower (``dir/text``, ``dir/vision``) and
    ``towers.json``, reopened by :meth:`load`.  ``print(result)`` prints each tower's summary.
    """

    def __init__(self, towers: Mapping[str, Analysis]):
        self.towers = dict(towers)

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
        return {"schema_version": SCHEMA_VERSION, "source": self.source,
                "towers": {t: a.to_dict() for t, a in self.towers.items()}}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Each tower's tables and summary in ``out_dir/<tower>``, and ``towers.json`` naming them."""
        out = Path(out_dir)
        written = []
        for tower, a in self.towers.items():
            written += a.save(out / tower)
        written.append(atomic_write(out / TOWERS_FILE, lambda p: Path(p).write_text(
            json.dumps({"schema_version": SCHEMA_VERSION, "towers": list(self.towers)}))))
        return written

    @classmethod
    def load(cls, out_dir: str | Path) -> "TowerAnalyses":
        """Reopen what :meth:`save` wrote."""
        folder = Path(out_dir)
        try:
            doc = json.loads((folder / TOWERS_FILE).read_text())
            towers = list(doc["towers"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecboundError(f"cannot read {folder / TOWERS_FILE} ({exc}); pass a folder written by "
                                 f"TowerAnalyses.save") from None
        return cls({t: load_analysis(folder / t) for t in towers})

    def headline(self) -> str:
        """``--quiet``: each tower's headline bounds, one per line, prefixed by the tower."""
        from .view import format_headline

        return "\n".join(f"{t}.{line}" for t, a in self.towers.items() for line in format_headline(a).splitlines())

    def summary(self, *, verbose: bool = False) -> str:
        """Each tower's summary, one after the other."""
        from .view import format_summary

        return "\n\n".join(f"=== tower {t} ===\n{format_summary(a, verbose=verbose)}" for t, a in self.towers.items())

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"<specbound.TowerAnalyses of {len(self)} towers: " + "; ".join(
            f"{t}: {a!r}" for t, a in self.towers.items()) + ">"

    def _repr_html_(self) -> str:
        return "".join(f"<h4>tower {t}</h4>{a._repr_html_()}" for t, a in self.towers.items())
