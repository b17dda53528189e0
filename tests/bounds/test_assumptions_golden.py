"""Every assumption an analysis states, word for word, for the families' tiny models that together say every
text (support/golden_assumptions.py, which regenerates the file after an intended change)."""

from support.golden_assumptions import CASES, current, load


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
