"""Contribution curves of stored records: moved to :mod:`specbound.records_curves` (one analysis'
figures draw them without a store); kept here for existing imports."""

from ..records_curves import CURVE_COLUMNS, contribution_curves

__all__ = ["CURVE_COLUMNS", "contribution_curves"]
