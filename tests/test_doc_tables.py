"""The docs' generated tables hold the numbers the code computes (specbound.tools.doc_tables).

Every generated block of the docs is regenerated and compared with the document: the same text
once numbers are masked, and every number within the rounding of its 4 printed digits."""

import math
import re
from pathlib import Path

import pytest

import specbound
from specbound.archs import builtin_specs
from specbound.archs.hybrids import refused_families
from specbound.tools.doc_tables import GENERATORS, N_GAP, below_one_at, blocks

DOCS = Path(__file__).resolve().parents[1] / "docs"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def _numbers(text):
    return [float(t.replace(",", "")) for t in NUMBER.findall(text)], NUMBER.sub("#", text)


README = DOCS.parent / "README.md"


def _documented():
    found = {}
    for path in [*sorted(DOCS.glob("*.md")), README]:
        for name, body in blocks(path.read_text()).items():
            found[name] = (str(path.relative_to(DOCS.parent)), body)
    return found


def test_every_generator_has_its_block():
    assert set(_documented()) == set(GENERATORS)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_a_generated_block_matches_the_code(name):
    doc_name, body = _documented()[name]
    doc_numbers, doc_text = _numbers(body)
    new_numbers, new_text = _numbers(GENERATORS[name]())
    assert doc_text == new_text, (
        f"{doc_name}: the {name} block's text changed; rerun python -m specbound.tools.doc_tables --write {doc_name}"
    )
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
            "spectral_adaptive"
        ]["gap"]
        assert (gap < 1) == below, (factor, gap)


def test_the_readme_lists_every_family_once():
    """The README's table: one row per shipped family (Hugging Face and GGUF) and per refused hybrid,
    none missing, none twice, and every model type of theirs once."""

    body = blocks(README.read_text())["readme-families"]
    rows = [line.split(" | ") for line in body.splitlines()[2:]]
    listed = [row[0].strip("| `") for row in rows]
    expected = [*builtin_specs(), *(f.family for f in refused_families())]
    assert sorted(listed) == sorted(expected) and len(set(listed)) == len(listed)
    for spec in builtin_specs().values():
        row = rows[listed.index(spec.family)][1]
        assert all(f"`{t.removeprefix('gguf-')}`" in row for t in spec.model_types), (spec.family, row)
    for family in refused_families():
        assert "refused" in rows[listed.index(family.family)][1]
