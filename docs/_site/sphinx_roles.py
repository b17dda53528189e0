"""A griffe extension (mkdocs.yml, mkdocstrings ``extensions``): the docstrings' Sphinx roles
(``:class:`~specbound.options.AnalysisOptions```, ``:func:`analyze```) shown as code, the name
``~`` asks for, instead of the raw role text; the docstrings stay readable by ``help()``."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|obj|exc|ref):`(?P<tilde>~?)(?P<target>[^`]+)`")


def plain(text: str) -> str:
    """``:role:`~a.b.C``` -> ```C```; ``:role:`a.b.C``` -> ```a.b.C```."""
    return ROLE.sub(lambda m: f"`{m['target'].rsplit('.', 1)[-1] if m['tilde'] else m['target']}`", text)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj, loader, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
