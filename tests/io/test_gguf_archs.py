"""The architecture table (specbound.io.gguf_archs) is what the GGUF reader knows of llama.cpp's
architectures: every row is read by the family spec it names, every GGUF family by a row, a file of each
row's architecture opens with the row's facts in its config (model type, activation, fixed constants),
the permuted rows are those the test converter permutes, the docs name every row and a file of an
architecture without one is refused naming them all.  Each row's numbers are held by its conversion test
(tests/io/test_gguf_families.py, test_gguf_layouts.py, test_gguf_moe.py, test_gguf_llama4.py, test_gguf.py)."""

from pathlib import Path

import pytest

from specbound import SpecboundError
from specbound.archs.registry import builtin_specs, spec_for_config
from specbound.compute.propagation import ACTIVATIONS
from specbound.io import open_checkpoint
from specbound.io.gguf_archs import ARCHS
from specbound.io.gguf_file import read_metadata
from specbound.io.gguf_header import read_header
from support.gguf_bytes import F32, LLAMA, STR, U32, gguf_file
from support.gguf_convert import PERMUTED

pytest.importorskip("gguf")

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROWS = list(ARCHS.values())


def _file(tmp_path, name, extra=()):
    """A one-block file of architecture ``name`` (the llama keys under its prefix)."""
    metadata = [
        ("general.architecture", STR, name),
        *((k.replace("llama.", f"{name}."), t, v) for k, t, v in LLAMA[1:]),
    ]
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(gguf_file([*metadata, *extra]))
    return path


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_is_read_by_the_family_it_names(row):
    specs = builtin_specs()
    assert f"gguf-{row.name}" in specs[row.family].model_types
    assert row.experts_family is None or f"gguf-{row.name}-moe" in specs[row.experts_family].model_types
    assert row.activation in ACTIVATIONS
    assert all(hook is None or callable(hook) for hook in (row.layers, row.keys, row.blocks, row.joined))


def test_every_gguf_family_reads_a_row():
    declared = {f"gguf-{r.name}": r.family for r in ROWS}
    declared.update({f"gguf-{r.name}-moe": r.experts_family for r in ROWS if r.experts_family})
    shipped = {t: s.family for s in builtin_specs().values() for t in s.model_types if t.startswith("gguf-")}
    # an mmproj file (arch 'clip') is read by io/gguf_mmproj.py, not by a row: the projector's vision tower
    assert shipped.pop("gguf-clip") == "mmproj_gguf"
    assert shipped == declared


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_a_file_of_every_row_reads_with_the_rows_facts(row, tmp_path):
    arch, config = read_metadata(read_header(_file(tmp_path, row.name)))
    assert arch == row.name
    assert config["model_type"] == f"gguf-{row.name}"
    assert spec_for_config(config).family == row.family
    assert config["hidden_act"] == row.activation
    assert {k: config[k] for k in row.fixed} == dict(row.fixed)


def test_a_file_with_experts_reads_as_the_experts_family(tmp_path):
    for row in (r for r in ROWS if r.experts_family):
        _, config = read_metadata(read_header(_file(tmp_path, row.name, [(f"{row.name}.expert_count", U32, 3)])))
        assert spec_for_config(config).family == row.experts_family


def test_a_constant_the_file_states_is_kept(tmp_path):
    row = next(r for r in ROWS if r.fixed)
    key = next(iter(row.fixed))
    _, config = read_metadata(read_header(_file(tmp_path, row.name, [(f"{row.name}.{key}", F32, 3.5)])))
    assert config[key] == 3.5 != row.fixed[key]


def test_the_permuted_rows_are_the_converters():
    assert {r.name for r in ROWS if r.permuted} == set(PERMUTED)


def test_the_docs_name_every_architecture():
    formats = (DOCS / "formats.md").read_text()
    assert [r.name for r in ROWS if f"`{r.name}`" not in formats] == []


def test_an_architecture_without_a_row_is_refused_naming_every_row(tmp_path):
    with pytest.raises(SpecboundError) as info:
        open_checkpoint(_file(tmp_path, "nonesuch"))
    message = str(info.value)
    assert "'nonesuch' is not supported" in message and "\n" not in message
    assert f"(supported: {', '.join(ARCHS)})" in message
