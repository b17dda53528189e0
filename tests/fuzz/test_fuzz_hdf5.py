"""Hostile tf_model.h5 files: nothing outside the file is read (external links, external storage,
virtual datasets: refused before the object is opened, so a FIFO cannot hang and /dev/zero cannot
pass for weights), soft links stay inside the file (dangling or looping: one line), a null
dataspace is one line; byte edits of a real file end in a result or one line."""

import math
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given

import specbound
from support.fuzz import EDITS, FUZZ, clean_outcome, mutate
from specbound.errors import SpecboundError

h5py = pytest.importorskip("h5py")

TF_MODEL = Path(__file__).parents[1] / "io" / "data" / "tiny_bert_tf"
QUERY = "tf_bert_model/bert/encoder/layer_._0/attention/self/query/kernel:0"


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A folder beside the model's: an HDF5 file with a plausible weight, and a FIFO."""
    folder = tmp_path_factory.mktemp("outside")
    with h5py.File(TF_MODEL / "tf_model.h5") as f:
        value = f["bert"][QUERY][()]
    with h5py.File(folder / "other.h5", "w") as g:
        g["w"] = 1000 * value
    os.mkfifo(folder / "fifo")
    return folder


def _replace_query(folder, edit):
    with h5py.File(folder / "tf_model.h5", "r+") as f:
        group = f["bert"]
        shape, dtype = group[QUERY].shape, group[QUERY].dtype
        del group[QUERY]
        edit(f, group, shape, dtype)


def _virtual(outside):
    def edit(f, group, shape, dtype):
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[...] = h5py.VirtualSource(str(outside / "other.h5"), "w", shape=shape)
        group.create_virtual_dataset(QUERY, layout)

    return edit


def _external_layer(outside):
    def edit(f, group, shape, dtype):
        f.move("bert", "bert_moved")
        f["bert"] = h5py.ExternalLink(str(outside / "fifo"), "/bert")

    return edit


# name -> (edit(f, group, shape, dtype) given the outside folder, words the one line must hold)
HOSTILE = {
    "external_link": (
        lambda o: lambda f, g, s, d: g.__setitem__(QUERY, h5py.ExternalLink(str(o / "other.h5"), "/w")),
        ["is an external link", "other.h5"],
    ),
    "external_link_to_a_fifo": (
        lambda o: lambda f, g, s, d: g.__setitem__(QUERY, h5py.ExternalLink(str(o / "fifo"), "/w")),
        ["is an external link", "fifo"],
    ),
    "external_layer_group": (_external_layer, ["'bert' is an external link"]),
    "external_storage_dev_zero": (
        lambda o: lambda f, g, s, d: g.create_dataset(QUERY, s, d, external=[("/dev/zero", 0, h5py.h5f.UNLIMITED)]),
        ["external storage", "/dev/zero"],
    ),
    "external_storage_fifo": (
        lambda o: lambda f, g, s, d: g.create_dataset(QUERY, s, d, external=[(str(o / "fifo"), 0, h5py.h5f.UNLIMITED)]),
        ["external storage", "fifo"],
    ),
    "virtual_dataset": (_virtual, ["virtual dataset", "other.h5"]),
    "dangling_soft_link": (
        lambda o: lambda f, g, s, d: g.__setitem__(QUERY, h5py.SoftLink("/nowhere")),
        ["listed but absent", "soft link"],
    ),
    "soft_link_loop": (
        lambda o: (
            lambda f, g, s, d: (
                f.__setitem__("a", h5py.SoftLink("/b")),
                f.__setitem__("b", h5py.SoftLink("/a")),
                g.__setitem__(QUERY, h5py.SoftLink("/a")),
            )
        ),
        ["soft links (a loop?)"],
    ),
    "null_dataspace": (lambda o: lambda f, g, s, d: g.create_dataset(QUERY, data=h5py.Empty("f4")), ["null dataspace"]),
    "group_for_a_dataset": (lambda o: lambda f, g, s, d: g.create_group(QUERY), ["is a Group, not a dataset"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_hdf5_is_one_line(case, outside, tmp_path):
    make, needles = HOSTILE[case]
    folder = shutil.copytree(TF_MODEL, tmp_path / "m")
    _replace_query(folder, make(outside))
    started = time.perf_counter()
    outcome = clean_outcome(specbound.analyze, folder, threads=1)
    assert time.perf_counter() - started < 10
    assert isinstance(outcome, SpecboundError), outcome
    for needle in needles:
        assert needle in str(outcome), (needle, str(outcome))


def test_a_soft_link_inside_the_file_reads_the_same_numbers(tmp_path):
    """A soft link that stays in the file is followed: the numbers of the file without it."""
    reference = specbound.analyze(TF_MODEL, threads=1)
    folder = shutil.copytree(TF_MODEL, tmp_path / "m")

    def edit(f, group, shape, dtype):
        f.create_dataset("stash/query", data=value)
        group[QUERY] = h5py.SoftLink("/stash/query")

    with h5py.File(TF_MODEL / "tf_model.h5") as f:
        value = f["bert"][QUERY][()]
    _replace_query(folder, edit)
    assert specbound.analyze(folder, threads=1).bounds == reference.bounds


@FUZZ
@given(edits=EDITS)
def test_mutated_tf_model_h5(tmp_path_factory, edits):
    folder = shutil.copytree(TF_MODEL, tmp_path_factory.mktemp("h5") / "m")
    path = folder / "tf_model.h5"
    data = path.read_bytes()
    edits = [(k, p % 4096, v) for k, p, v in edits]  # the superblock, object headers and B-trees come first
    path.write_bytes(mutate(data, edits))
    result = clean_outcome(specbound.analyze, folder, threads=1)
    if not isinstance(result, Exception):
        assert all(math.isfinite(v) and v >= 0 for v in result.bounds.values())
