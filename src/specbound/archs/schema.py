"""The spec document's keys, each declared once: on the :class:`~.spec.ArchSpec` field it fills, with its
constraint, its default and one line of documentation (as :mod:`specbound.options` declares options).

:func:`declare` makes such a field; :func:`read_keys` is the one loop that reads a document's declared keys into
field values, :func:`document_keys` the keys a document may hold, and docs/architectures.md's key table is
generated from the same declarations (``python -m specbound.tools.doc_tables spec-keys``).  A key whose value
is regular (a string, a list of strings, one of some choices, a number) declares its constraint (``accepted``,
:func:`specbound.options.check`'s vocabulary plus :class:`Strings`, :class:`Text`, :class:`NameMap`,
:class:`Keys`); a key whose value is an object with rules of its own (``tensors``, ``rotary``, ``experts``)
declares the function that reads it (``read``).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable

from ..errors import SpecboundError
from ..options import Choice


def fail(origin: str, what: str) -> SpecboundError:
    """The one-line error of an invalid spec document."""
    return SpecboundError(f"invalid architecture spec {origin}: {what} (see docs/architectures.md for the format)")


# --- constraints (besides options.Interval and options.Choice) ------------------------------------


@dataclass(frozen=True)
class Text:
    """A string (``empty=False``: a non-empty one)."""

    empty: bool = True

    def accepts(self, value) -> bool:
        return isinstance(value, str) and (self.empty or bool(value))

    def convert(self, value):
        return value


@dataclass(frozen=True)
class Flag:
    """``true`` or ``false``."""

    def accepts(self, value) -> bool:
        return isinstance(value, bool)

    def convert(self, value):
        return value


@dataclass(frozen=True)
class Strings:
    """A list of strings, kept as a tuple (``or_else``: the tuple an empty list stands for)."""

    or_else: tuple = ()

    def accepts(self, value) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    def convert(self, value):
        return tuple(value) or self.or_else


@dataclass(frozen=True)
class NameMap:
    """An object mapping strings to strings."""

    def accepts(self, value) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())

    def convert(self, value):
        return value


@dataclass(frozen=True)
class Keys:
    """An object with the ``required`` keys and some of the ``optional`` ones, every value a string."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def accepts(self, value) -> bool:
        return (
            isinstance(value, dict)
            and set(self.required) <= set(value) <= {*self.required, *self.optional}
            and all(isinstance(v, str) for v in value.values())
        )

    def convert(self, value):
        return value


# --- declaring and reading keys --------------------------------------------------------------------

# a document a key may appear in: one chain, an encoder-decoder (``stacks``), a two-tower family, a
# vision-language wrapper whose towers name families, a variant's overrides
DOCUMENTS = ("chain", "stacks", "towers", "wrapper", "variant")


def declare(
    doc: str,
    *,
    default: Any = MISSING,
    accepted: tuple = (),
    requirement: str | None = None,
    read: Callable | None = None,
    name: str | None = None,
    required: bool = False,
    absent: Any = MISSING,
    fills: tuple[str, ...] = (),
    documents: tuple[str, ...] = ("chain", "stacks", "towers", "variant"),
):
    """An :class:`~.spec.ArchSpec` field that a spec document's key fills.

    ``doc``: the key's line in docs/architectures.md.  ``default``: the field's default (none: a field every
    spec sets).  ``name``: the document key, when it is not the field's name.  ``accepted`` and
    ``requirement``: a regular key's constraints (the value None only where None is among them) and the words
    of its error (``'KEY' must be REQUIREMENT, found VALUE``); ``read(value, doc)``: an irregular key's reader
    (``doc``: the :class:`Reading` so far), returning the field's value, or with ``fills`` a tuple of it and
    the other fields' values.  A key without either is read by code of its own (``variants``, ``stacks``,
    ``towers``, ``projector``).  ``required``: an absent key is read as None (and so refused); ``absent``: the
    value read when the key is absent from a document (none: the field's default).  ``documents``: the kinds
    of document that may hold the key (:data:`DOCUMENTS`)."""
    metadata = {
        "doc": doc,
        "accepted": accepted,
        "requirement": requirement,
        "read": read,
        "key": name,
        "required": required,
        "absent": absent,
        "fills": fills,
        "documents": documents,
    }
    return field(metadata=metadata) if default is MISSING else field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One declared key: its name in a document, the field it fills and the field's declaration (``meta``)."""

    name: str
    field: Any

    @property
    def meta(self) -> dict:
        return self.field.metadata

    def default_text(self) -> str:
        """The key's default as docs/architectures.md shows it: ``required``, or its JSON value when absent."""
        if self.meta["required"]:
            return "required"
        value = self.meta["absent"] if self.meta["absent"] is not MISSING else self.field.default
        return "`" + json.dumps(list(value) if isinstance(value, tuple) else value) + "`"


def declared(cls) -> list[Declared]:
    """Every document key ``cls`` declares, in field order."""
    return [Declared(f.metadata["key"] or f.name, f) for f in fields(cls) if "doc" in f.metadata]


def document_keys(cls, document: str = "chain") -> set[str]:
    """The keys a document of kind ``document`` (:data:`DOCUMENTS`) may hold."""
    return {d.name for d in declared(cls) if document in d.meta["documents"]}


@dataclass
class Reading:
    """A document being read: its raw object, its origin and the field values read so far."""

    raw: dict
    origin: str
    values: dict


def check_key(
    raw: dict,
    name: str,
    accepted: tuple,
    requirement: str | None,
    origin: str,
    *,
    required: bool = False,
    absent: Any = None,
):
    """``raw[name]`` (``absent`` when it is missing, None when the key is ``required``) if it meets one of
    ``accepted`` (constraints, or None for the value None), converted; else a one-line :func:`fail`."""
    value = raw.get(name, None if required else absent)
    for constraint in accepted:
        if constraint is None:
            if value is None:
                return None
        elif constraint.accepts(value):
            return constraint.convert(value)
    if requirement is None:
        choices = next(c.values for c in accepted if isinstance(c, Choice))
        requirement = f"one of {list(choices)}"
    raise fail(origin, f"'{name}' must be {requirement}, found {value!r}")


def read_key(cls, raw: dict, name: str, origin: str):
    """The regular key ``name`` that ``cls`` declares, read from the document ``raw`` (:func:`check_key`)."""
    meta = next(d.meta for d in declared(cls) if d.name == name)
    absent = None if meta["absent"] is MISSING else meta["absent"]
    return check_key(raw, name, meta["accepted"], meta["requirement"], origin, required=meta["required"], absent=absent)


def read_keys(cls, raw: dict, origin: str) -> dict[str, Any]:
    """The field values of the keys ``cls`` declares, read from the document ``raw`` in declaration order:
    a regular key checked against its constraints, an irregular one by its reader; an absent optional key
    leaves its field's default (or gives ``absent``).  The structural keys (no constraint, no reader) are
    left to their own code."""
    reading = Reading(raw, origin, {})
    for d in declared(cls):
        meta = d.meta
        if not meta["accepted"] and meta["read"] is None:
            continue
        if d.name not in raw and not meta["required"]:
            if meta["absent"] is not MISSING:
                reading.values[d.field.name] = meta["absent"]
            continue
        if meta["read"] is None:
            value = check_key(raw, d.name, meta["accepted"], meta["requirement"], origin, required=meta["required"])
        else:
            value = meta["read"](raw.get(d.name), reading)
        if meta["fills"]:
            reading.values.update(zip((d.field.name, *meta["fills"]), value))
        else:
            reading.values[d.field.name] = value
    return reading.values
