"""The API reference (docs/api.md, rendered by mkdocstrings) documents every public name: each name of
``specbound.__all__`` and each name of the ``__all__`` of every module of ``specbound.integrations``
has a ``::: path`` entry that resolves to that very object (read without importing the training
frameworks: the integrations' ``__all__`` is read from their source)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import specbound
import specbound.integrations

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def documented(text: str) -> list[str]:
    return ENTRY.findall(text)


def resolve(path: str):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def public_integrations() -> list[str]:
    """``specbound.integrations.MODULE.NAME`` for every name of each module's ``__all__``."""
    names = []
    for info in pkgutil.iter_modules(specbound.integrations.__path__):
        tree = ast.parse((Path(specbound.integrations.__path__[0]) / f"{info.name}.py").read_text())
        exported = [
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
        ]
        assert exported, f"specbound.integrations.{info.name} declares no __all__ (its public names)"
        names += [f"specbound.integrations.{info.name}.{n}" for n in ast.literal_eval(exported[0])]
    return names


def missing_names(text: str) -> list[str]:
    """The public names ``text`` (an api.md) has no entry for."""
    entries = documented(text)
    objects = [resolve(p) for p in entries if not p.startswith("specbound.integrations.")]
    missing = [
        name
        for name in specbound.__all__
        if not name.startswith("__") and not any(obj is getattr(specbound, name) for obj in objects)
    ]
    return missing + [p for p in public_integrations() if p not in entries]


def test_every_public_name_is_in_the_api_reference():
    assert missing_names((ROOT / "docs" / "api.md").read_text()) == []


def test_a_name_left_out_is_found():
    text = (ROOT / "docs" / "api.md").read_text()
    for entry, name in (
        ("specbound.report.compare.Comparison", "Comparison"),
        ("specbound.report.compare.compare", "compare"),
        ("specbound.integrations.lightning.SpecboundCallback", "specbound.integrations.lightning.SpecboundCallback"),
    ):
        cut = text.replace(f"::: {entry}\n", "")
        assert cut != text, entry
        assert missing_names(cut) == [name]


def test_every_entry_resolves():
    for path in documented((ROOT / "docs" / "api.md").read_text()):
        if not path.startswith("specbound.integrations."):  # their frameworks are imported by the docs build
            assert resolve(path) is not None, path
