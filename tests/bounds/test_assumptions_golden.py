"""Every assumption an analysis states, word for word, for the families' tiny models that together say every
text (support/golden_assumptions.py, which regenerates the file after an intended change)."""

import re

from support.golden_assumptions import CASES, REPO, current, load

from specbound.bounds.assumptions import declared_names
from specbound.io.base import WEIGHTS_NOTE


def test_the_assumptions_are_the_golden_ones(tmp_path):
    golden, found = load(), current(tmp_path)
    assert sorted(golden) == sorted(found) == sorted(CASES)
    for case in CASES:
        assert sorted(found[case]) == sorted(golden[case]), case
        for tower, entries in found[case].items():
            names = [e["name"] for e in entries]
            assert names == [e["name"] for e in golden[case][tower]], (case, tower)
            for entry, stored in zip(entries, golden[case][tower]):
                assert entry == stored, (case, tower, entry["name"])


def _documented_names() -> set[str]:
    """The names in the first column of docs/theory.md section 6's table."""
    text = (REPO / "docs" / "theory.md").read_text()
    section = text[text.index("## 6. Which numbers are theorems") :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for first in rows for name in re.findall(r"`([a-z0-9_]+)`", first)}


def test_theory_md_lists_every_declared_assumption_and_no_other():
    """docs/theory.md section 6's table has a row for each name an ASSUMPTIONS row may give and the readers'
    quantized-weights note, and names nothing else (a renamed or removed assumption leaves the table)."""
    assert _documented_names() == set(declared_names()) | {WEIGHTS_NOTE}


def test_every_assumption_the_golden_cases_state_is_declared():
    """Each name an analysis gave is one its row declares (Assumptions.names), so the table above is complete."""
    declared = set(declared_names())
    assert len(declared) == len(declared_names()), "a name declared by two rows"
    stated = {e["name"] for towers in load().values() for entries in towers.values() for e in entries}
    assert stated <= declared, sorted(stated - declared)
