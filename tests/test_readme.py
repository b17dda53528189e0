"""The README says what the code and the Makefile do: the time `study --quick` takes (the same
number in its --help), the Debian packages `make` installs, and the whole `scaling` table."""

import re
from pathlib import Path

from specbound.bounds import in_group
from specbound.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _subparser(name):
    import argparse

    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def test_study_quick_takes_the_same_time_in_help_and_readme():
    quick = next(a for a in _subparser("study")._actions if "--quick" in a.option_strings)
    said = re.search(r"about (\d+) minutes on two idle cores", quick.help)
    assert said, quick.help
    lines = [l for l in README.splitlines() if l.startswith("specbound study --quick") and "minute" in l]
    assert lines and all(f"about {said.group(1)} minutes on two idle cores" in l for l in lines), lines


def test_readme_lists_the_debian_packages_of_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    debs = re.search(r"^DATA_DEBS := (.+)$", makefile, re.M).group(1).split()
    assert "fortunes" in debs  # the third task's data
    listed = re.search(r"`((?:[a-z0-9-]+ )+[a-z0-9-]+)`, and `make test` Debian's", README.replace("\n", " "))
    assert listed and listed.group(1).split() == debs
    browser = re.search(r"^BROWSER_DEBS := (.+)$", makefile, re.M).group(1).split()
    assert all(f"`{b}`" in README for b in browser)


def test_readme_scaling_sample_has_every_row():
    """Every bound a BERT analysis computes (rotary-only ones aside), then each headline bound per role."""
    block = README[README.index("$ specbound scaling --store results/miniatures\n"):]
    rows = [l.split()[:2] for l in block.split("```")[0].splitlines()[2:] if l.strip()]
    rotary_only = {"spectral_adaptive_rotation_blind", "edelman_rotation_blind"}
    bounds = [b for g in ("bounds", "adaptive_variants", "baselines") for b in in_group(g) if b not in rotary_only]
    roles = [[b, r] for b in in_group("bounds") for r in ("QK", "OV", "FF_in", "FF_out")]
    assert sorted(r[0] for r in rows if r[1] == "all") == sorted(bounds)
    assert [r for r in rows if r[1] != "all"] == roles
