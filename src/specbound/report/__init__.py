"""Stage 8, report: what many stored records show together, read from a results store (``sweep``) or saved analyses.

``compare.py`` (``specbound compare``: analyses side by side), ``html.py`` (``specbound report``: an HTML file
and a Markdown summary), ``plots.py`` (``specbound plot``), ``scaling.py`` (``specbound scaling``: bounds
against depth and width), ``trajectory.py`` (one training run's checkpoints), ``distance.py`` (the distance
from initialisation) and ``metrics.py`` (every bound against the user's own metrics).
"""
