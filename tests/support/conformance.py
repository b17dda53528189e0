"""One conformance check for every reader (what scikit-learn's ``check_estimator`` is for estimators): a
model read from any format keeps the :class:`~specbound.io.base.Checkpoint` contract and is the model
its float safetensors twin is (the same dimensions, role matrices, notes and numbers).

:func:`check_reader` is what a format's test calls with a tiny model written in that format and the
safetensors folder it was written from; tests/io/test_reader_conformance.py runs it over every row of
``io/formats.py``."""

from __future__ import annotations

import numpy as np

import specbound
from specbound.pipeline import open_model
from support.same_numbers import assert_close_tree, assert_same_layer_weights, numbers


def check_contract(ckpt) -> None:
    """Every tensor of ``ckpt`` as :class:`~specbound.io.base.Checkpoint` promises: unique names, a
    float64 array of the shape :meth:`shape` gives, all finite, a dtype named, a location naming one of
    the files it lists."""
    names = ckpt.names
    assert names and len(set(names)) == len(names), "names: empty or repeated"
    files = [str(f) for f in ckpt.files()]
    assert files, "no files"
    for name in names:
        array = ckpt.read(name)
        assert isinstance(array, np.ndarray) and array.dtype == np.float64, (name, type(array), array.dtype)
        assert array.shape == tuple(ckpt.shape(name)), (name, array.shape, ckpt.shape(name))
        assert np.isfinite(array).all(), name
        assert isinstance(ckpt.dtype(name), str) and ckpt.dtype(name), name
        where = ckpt.where(name)
        assert any(f in where for f in files), (name, where, files)


def check_reader(
    source,
    twin,
    *,
    rel: float = 1e-12,
    atol: float = 1e-9,
    family: bool = True,
    ordered: bool = True,
    notes: tuple[str, ...] = (),
) -> None:
    """The model read from ``source`` (a file or folder of any format) conforms and equals the one read
    from ``twin`` (its float safetensors folder): :func:`check_contract`, the same
    :class:`~specbound.archs.model.ModelDims`, every layer's role matrices to ``atol``, and every number of the
    analysis within ``rel``.  ``notes``: the names of the reader's notes (none: float weights read as stored,
    nothing assumed); each is in the analysis' assumptions, a convention with the note's sentence, the one
    difference from the twin's.

    ``family``: whether the family's name is compared too (False for a format read by a family of its
    own, e.g. ``llama`` vs ``llama_gguf``); ``ordered``: whether the feed-forward roles come in the same
    order (:func:`~support.same_numbers.assert_same_layer_weights`)."""
    reference, opened = open_model(twin), open_model(source)
    try:
        check_contract(opened.ckpt)
        assert opened.dims == reference.dims, (opened.dims, reference.dims)
        said = opened.notes
        assert sorted(said) == sorted(notes), (said, notes)
        assert_same_layer_weights(reference, opened, reference.dims.L, atol=atol, ordered=ordered)
    finally:
        opened.ckpt.close()
        reference.ckpt.close()
    read, expected = (
        numbers(specbound.analyze(source, threads=1), family=family),
        numbers(specbound.analyze(twin, threads=1), family=family),
    )
    listed = {e["name"]: e for e in read["assumptions"]}
    assert {n: (listed[n]["kind"], listed[n]["effect"]) for n in notes} == {n: ("convention", said[n]) for n in notes}
    read["assumptions"] = [e for e in read["assumptions"] if e["name"] not in notes]
    assert_close_tree(read, expected, rel)
