"""Stage 5, records: what one analysis produced, as the user sees it.

``analysis.py`` is :class:`Analysis` (tidy tables, JSON document, ``save`` / ``load``), built by
``build.py`` from the measures and the bounds; ``schema.py`` holds its columns and JSON conversions;
``view.py`` renders it as text and HTML, ``plot.py`` draws its figures and ``curves.py`` evaluates
its ``C(p)`` curves; ``style.py`` is the one figure style that ``report/`` and ``study/`` share;
``towers.py`` holds a two-tower model's analyses, one per tower.
"""

from .analysis import Analysis, load_analysis
from .build import build_analysis
from .towers import TowerAnalyses

__all__ = ["Analysis", "TowerAnalyses", "build_analysis", "load_analysis"]
