"""One hostile checkpoint of each reader never stops a sweep: beside a GGUF file declaring a
2^63-element array (it used to hang the sweep with no record written), an HDF5 file linking a weight
to a FIFO, a Flax file with an infinite shape and an ONNX export with a NaN Reshape target, the good
checkpoints are analysed and stored, locally and on Dask, and each hostile one is one ``failed:``
line."""

import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.gguf_bytes import ARR, LLAMA, U8, gguf_file
from support.numpy_bert import write_tiny_bert
from support.onnx_hints import bert_graph, save

from specbound.sweep.run import run_sweep
from specbound.sweep.sources import Source
from specbound.sweep.store import Store

DATA = Path(__file__).parents[1] / "io" / "data"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    h5py = pytest.importorskip("h5py")
    msgpack = pytest.importorskip("msgpack")
    pytest.importorskip("onnx")
    from onnx import numpy_helper

    root = tmp_path_factory.mktemp("hostile_sweep")
    good = [
        Source(f"good{i}", str(write_tiny_bert(root / f"good{i}", seed=i, L=1, N=8, H=2, d_ff=12))) for i in range(2)
    ]
    (root / "gguf").mkdir()
    (root / "gguf" / "model.gguf").write_bytes(gguf_file([*LLAMA, ("tokenizer.ggml.scores", ARR, (U8, [], 2**63))]))
    tf = shutil.copytree(DATA / "tiny_bert_tf", root / "tf")

    os.mkfifo(root / "fifo")
    with h5py.File(tf / "tf_model.h5", "r+") as f:
        query = "tf_bert_model/bert/encoder/layer_._0/attention/self/query/kernel:0"
        del f["bert"][query]
        f["bert"][query] = h5py.ExternalLink(str(root / "fifo"), "/w")
    flax = shutil.copytree(DATA / "tiny_bert_flax", root / "flax")
    tree = msgpack.unpackb((flax / "flax_model.msgpack").read_bytes(), raw=False, strict_map_key=False)
    tree["encoder"]["layer"]["0"]["attention"]["self"]["query"]["kernel"] = msgpack.ExtType(
        1, msgpack.packb(([math.inf, 32], "float32", bytes(4096)), use_bin_type=True)
    )
    (flax / "flax_model.msgpack").write_bytes(msgpack.packb(tree, use_bin_type=True))
    onnx_path = save(
        bert_graph(reshapes=[numpy_helper.from_array(np.array([0, 0, np.nan, 4], np.float32))]), root / "onnx"
    )
    hostile = [
        Source("gguf", str(root / "gguf" / "model.gguf")),
        Source("tf", str(tf)),
        Source("flax", str(flax)),
        Source("onnx", str(onnx_path.parent)),
    ]
    return good, hostile


def _check(report, good, hostile, store):
    assert len(report.written) == len(good), report.failed
    assert sorted(name for name, _ in report.failed) == sorted(s.name for s in hostile)
    assert all("\n" not in message and message for _, message in report.failed)
    assert sorted(Store(store).table()["source"]) == sorted(s.name for s in good)


def test_a_local_sweep_stores_the_good_checkpoints(sources, tmp_path):
    good, hostile = sources
    report = run_sweep([*hostile[:2], *good, *hostile[2:]], tmp_path / "store", progress=False)
    _check(report, good, hostile, tmp_path / "store")


def test_a_dask_sweep_stores_the_good_checkpoints(sources, tmp_path):
    pytest.importorskip("dask.distributed")
    good, hostile = sources
    report = run_sweep([*hostile[:2], *good, *hostile[2:]], tmp_path / "store", workers=2, progress=False)
    assert report.mode.startswith("dask")
    _check(report, good, hostile, tmp_path / "store")
