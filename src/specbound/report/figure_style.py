"""What the store figures share: markers, colours, the order of family members and bound labels
(used by :mod:`.plots` and :mod:`.trajectory`, so neither imports the other for them)."""

from __future__ import annotations

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">"]


def bound_colors(n: int) -> list:
    """``n`` distinct colours: tab10 up to 10, tab20 (dark shades first) up to 20, then evenly spaced hues."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        tab20 = colormaps["tab20"]
        return [tab20(2 * i) for i in range(10)] + [tab20(2 * i + 1) for i in range(n - 10)]
    hsv = colormaps["hsv"]
    return [hsv(i / n) for i in range(n)]


def natural_order(table):
    """Records by depth, width, every pattern label, then source with its numbers compared as numbers
    (``step-200`` before ``step-1000``)."""
    import re

    def key(text: str):
        return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(text)))

    order = sorted(range(len(table)), key=lambda i: (
        int(table["L"].iloc[i]), int(table["N"].iloc[i]),
        *[key(table[c].iloc[i]) for c in table.columns if c.startswith("label_")], key(table["source"].iloc[i])))
    return table.iloc[order].reset_index(drop=True)


def _bound_label(name: str) -> str:
    """The registry's title of a bound (``name`` for one this version does not know)."""
    from ..bounds import REGISTRY

    bound = REGISTRY.get(name)
    return bound.title if bound else name
