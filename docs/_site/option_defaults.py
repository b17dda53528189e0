"""A griffe extension (mkdocs.yml, mkdocstrings ``extensions``): a dataclass field declared with
``specbound.options._option(DEFAULT, help, ...)`` shows its default (``None``, ``1e-10``) in the API
reference's signature and attribute, not the internal ``_option(...)`` call that declares it."""

from __future__ import annotations

import dataclasses
import importlib

import griffe

DECLARING = "_option"


def field_default(class_path: str, name: str) -> str | None:
    """``repr`` of the default of dataclass field ``name`` of the class at ``class_path``
    (``specbound.options.AnalysisOptions``), imported; None when it has none."""
    module, _, cls = class_path.rpartition(".")
    fields = {f.name: f for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
    field = fields.get(name)
    return None if field is None or field.default is dataclasses.MISSING else repr(field.default)


class OptionDefaults(griffe.Extension):
    def on_attribute_instance(self, *, attr, **kwargs) -> None:
        value = attr.value
        if isinstance(value, griffe.ExprCall) and str(value.function) == DECLARING and attr.parent.is_class:
            default = field_default(attr.parent.path, attr.name)
            if default is not None:
                attr.value = default
