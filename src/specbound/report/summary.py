"""The human-readable summary printed by ``specbound analyze``.

One analysis renders itself (:mod:`specbound.records_view`, which ``print(result)`` and the notebook
view use too); this module keeps the names the command line and existing code import.
"""

from __future__ import annotations

from ..records_view import LEGEND, comparison_table, fmt, format_headline, format_summary

__all__ = ["LEGEND", "comparison_table", "fmt", "format_headline", "format_summary"]
