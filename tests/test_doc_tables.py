"""The docs' generated tables hold the numbers the code computes (specbound.tools.doc_tables).

Every generated block of the docs is regenerated and compared with the document: the same text
once numbers are masked, and every number within the rounding of its 4 printed digits."""

import math
import re
from pathlib import Path

import pytest

import specbound
from specbound.tools.doc_tables import GENERATORS, N_GAP, below_one_at, blocks

DOCS = Path(__file__).resolve().parents[1] / "docs"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def _numbers(text):
    return [float(t.replace(",", "")) for t in NUMBER.findall(text)], NUMBER.sub("#", text)


def _documented():
    found = {}
    for path in sorted(DOCS.glob("*.md")):
        for name, body in blocks(path.read_text()).items():
            found[name] = (path.name, body)
    return found


def test_every_generator_has_its_block():
    assert set(_documented()) == set(GENERATORS)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_a_generated_block_matches_the_code(name):
    doc_name, body = _documented()[name]
    doc_numbers, doc_text = _numbers(body)
    new_numbers, new_text = _numbers(GENERATORS[name]())
    assert doc_text == new_text, f"{doc_name}: the {name} block's text changed; rerun " \
                                 f"python -m specbound.tools.doc_tables --write docs/{doc_name}"
    assert len(doc_numbers) == len(new_numbers)
    for old, new in zip(doc_numbers, new_numbers):
        assert old == pytest.approx(new, rel=1e-3), f"{doc_name}, block {name}: {old} is now {new}"


def test_the_sample_size_where_the_gap_falls_below_one():
    """The block's crossing assumes both terms of the adaptive gap scale as n^(-1/2): checked by
    analysing at 1% either side of it."""
    at = specbound.analyze(n=N_GAP, margin=1.0, threads=1).gap_bound["bounds"]["spectral_adaptive"]["gap"]
    n_one = below_one_at(at, N_GAP)
    for factor, below in ((1.01, True), (1 / 1.01, False)):
        gap = specbound.analyze(n=math.ceil(n_one * factor), margin=1.0, threads=1).gap_bound["bounds"][
            "spectral_adaptive"]["gap"]
        assert (gap < 1) == below, (factor, gap)
