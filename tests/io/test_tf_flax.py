"""TF/Keras ``tf_model.h5`` and Flax ``flax_model.msgpack`` weights.

TensorFlow and JAX/Flax are not installed here (hundreds of MB each), so the files are written the
way those libraries write them, with the libraries they use for it: h5py in Keras' HDF5 weights
layout (``save_weights_to_hdf5_group``: ``layer_names`` / ``weight_names`` attributes, split into
``weight_names0, 1, ...`` past HDF5's header limit, one dataset per variable under its TF name with
Dense kernels stored ``(in, out)``), and msgpack in ``flax.serialization.to_bytes``' encoding
(extension type 1 = msgpack ``(shape, dtype name, bytes)``, chunked arrays as dicts).  Names follow
transformers' TF and Flax naming for a BertModel (``tf_bert_model/bert/encoder/layer_._0/...``).

Oracle: the same tiny BertModel saved with save_pretrained (safetensors): every role matrix equal to
1e-9 and every number of the analysis to 1e-12.  Bad files are one-line errors.

The msgpack writer here was checked against the real library: its bytes equal
``flax.serialization.to_bytes`` of the same tree (flax 0.12.8, jax 0.10.2 in a scratch environment),
and files written by flax itself (float32, bfloat16, chunked arrays) analysed to the safetensors
numbers (largest relative difference 2e-16); :func:`test_writer_is_flax_to_bytes` repeats the
byte comparison wherever flax is installed.
"""

import shutil
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.conformance import check_reader

import specbound
from specbound import SpecboundError
from specbound.io import open_checkpoint

h5py = pytest.importorskip("h5py")
msgpack = pytest.importorskip("msgpack")


@pytest.fixture(scope="module")
def bert_state(tiny_bert_dir):
    """The tiny BertModel's tensors (PyTorch names, as stored), read from its safetensors file."""

    return tiny_bert_dir, load_file(str(tiny_bert_dir / "model.safetensors"))


def _is_norm(name):
    return "LayerNorm" in name


def _is_embedding(name):
    return name.startswith("embeddings.") and name.endswith("_embeddings.weight")


def tf_variable(pt_name):
    """The TF variable name transformers' TFBertModel gives the parameter ``pt_name``, and whether
    its value is the transpose (Dense kernel)."""
    parts = pt_name.split(".")
    leaf = parts.pop()
    if _is_embedding(pt_name):
        leaf = "weight" if parts[-1] == "word_embeddings" else "embeddings"
    elif _is_norm(pt_name):
        leaf = {"weight": "gamma", "bias": "beta"}[leaf]
    elif leaf == "weight":
        leaf = "kernel"
    path = "/".join(parts).replace("layer/", "layer_._", 1) if "layer/" in "/".join(parts) else "/".join(parts)
    # encoder/layer/0/... -> encoder/layer_._0/...
    path = path.replace("layer_._/", "layer_._")
    return f"tf_bert_model/bert/{path}/{leaf}:0", leaf == "kernel"


def write_keras_h5(path, state, split_names=False, dtype=np.float32):
    """Keras' save_weights_to_hdf5_group for a model whose only layer is the main layer ``bert``."""
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"bert"]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.15.0"
        group = f.create_group("bert")
        names = []
        for pt_name, value in state.items():
            if pt_name.endswith("position_ids"):
                continue
            name, transposed = tf_variable(pt_name)
            value = np.ascontiguousarray(value.T if transposed else value).astype(dtype)
            dset = group.create_dataset(name, value.shape, dtype=value.dtype)
            dset[:] = value
            names.append(name.encode("utf8"))
        if split_names:  # as Keras does past HDF5's 64 KiB attribute limit
            half = len(names) // 2
            group.attrs["weight_names0"] = names[:half]
            group.attrs["weight_names1"] = names[half:]
        else:
            group.attrs["weight_names"] = names
    return path


def _ndarray_ext(array):
    return msgpack.ExtType(1, msgpack.packb((array.shape, array.dtype.name, array.tobytes("C")), use_bin_type=True))


def flax_tree(state, dtype=np.float32):
    """FlaxBertModel's parameter tree for ``state`` (kernels (in, out), LayerNorm scale, embedding)."""
    tree = {}
    for pt_name, value in state.items():
        if pt_name.endswith("position_ids"):
            continue
        parts = pt_name.split(".")
        leaf = parts.pop()
        if _is_embedding(pt_name):
            leaf = "embedding"
        elif _is_norm(pt_name):
            leaf = {"weight": "scale", "bias": "bias"}[leaf]
        elif leaf == "weight":
            leaf, value = "kernel", value.T
        node = tree
        for part in parts:
            node = node.setdefault(part, {})
        node[leaf] = np.ascontiguousarray(value).astype(dtype)
    return tree


def write_flax(path, tree, chunk=None):
    """``flax.serialization.to_bytes(tree)``; ``chunk``: a key path whose array is stored as a
    chunked array (flax does so over 1 GiB) in two parts."""
    if chunk is not None:
        node = tree
        for key in chunk[:-1]:
            node = node[key]
        array = node[chunk[-1]]
        flat = array.ravel()
        half = flat.size // 2
        node[chunk[-1]] = {
            "__msgpack_chunked_array__": True,
            "shape": {str(i): d for i, d in enumerate(array.shape)},
            "chunks": {"0": flat[:half], "1": flat[half:]},
        }

    def default(obj):
        if isinstance(obj, np.ndarray):
            return _ndarray_ext(obj)
        raise TypeError(type(obj))

    path.write_bytes(msgpack.packb(tree, default=default, strict_types=True, use_bin_type=True))
    return path


def _folder_with(tmp_path, source_dir, name):
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(source_dir / "config.json", folder / "config.json")
    return folder


def test_tf_variable_names_follow_transformers():
    from specbound.io.tf_file import pt_name  # noqa: PLC0415 - the helpers' argument has the same name

    assert tf_variable("encoder.layer.1.attention.self.query.weight") == (
        "tf_bert_model/bert/encoder/layer_._1/attention/self/query/kernel:0",
        True,
    )
    assert pt_name("tf_bert_model/bert/encoder/layer_._1/attention/self/query/kernel:0") == (
        "bert.encoder.layer.1.attention.self.query.weight",
        True,
    )
    assert pt_name("tf_bert_model/bert/embeddings/LayerNorm/gamma:0") == ("bert.embeddings.LayerNorm.weight", False)
    assert pt_name("tf_bart_model/model/decoder___shared/weight:0")[0] == "model.shared.weight"


@pytest.mark.parametrize("split", [False, True], ids=["names", "split-names"])
def test_keras_h5_matches_safetensors(bert_state, tmp_path, split):
    reference_dir, state = bert_state
    folder = _folder_with(tmp_path, reference_dir, "tf")
    write_keras_h5(folder / "tf_model.h5", state, split_names=split)
    ckpt = open_checkpoint(folder)
    query = "bert.encoder.layer.0.attention.self.query.weight"
    assert ckpt.layout(query) == "conv1d" and ckpt.shape(query) == (32, 32)
    np.testing.assert_array_equal(
        ckpt.read("bert.encoder.layer.0.intermediate.dense.weight"),
        state["encoder.layer.0.intermediate.dense.weight"].T.astype(np.float64),
    )
    check_reader(folder, reference_dir)
    check_reader(folder / "tf_model.h5", reference_dir)


def test_keras_h5_float16(bert_state, tmp_path):
    reference_dir, state = bert_state
    folder = _folder_with(tmp_path, reference_dir, "tf16")
    write_keras_h5(folder / "tf_model.h5", state, dtype=np.float16)
    ckpt = open_checkpoint(folder)
    name = "bert.encoder.layer.1.output.dense.weight"
    assert ckpt.dtype(name) == "F16"
    np.testing.assert_array_equal(
        ckpt.read(name), state["encoder.layer.1.output.dense.weight"].T.astype(np.float16).astype(np.float64)
    )


@pytest.mark.parametrize("chunked", [False, True], ids=["arrays", "chunked"])
def test_flax_msgpack_matches_safetensors(bert_state, tmp_path, chunked):
    reference_dir, state = bert_state
    folder = _folder_with(tmp_path, reference_dir, "flax")
    chunk = ("encoder", "layer", "1", "intermediate", "dense", "kernel") if chunked else None
    write_flax(folder / "flax_model.msgpack", flax_tree(state), chunk)
    ckpt = open_checkpoint(folder)
    assert ckpt.layout("encoder.layer.1.intermediate.dense.weight") == "conv1d"
    assert ckpt.shape("encoder.layer.1.intermediate.dense.weight") == (32, 48)
    check_reader(folder, reference_dir)


def test_writer_is_flax_to_bytes(bert_state, tmp_path):
    serialization = pytest.importorskip("flax.serialization")  # not in the test environment: heavy
    jnp = pytest.importorskip("jax.numpy")
    _, state = bert_state
    tree = flax_tree(state)

    def as_jax(node):
        return {k: as_jax(v) for k, v in node.items()} if isinstance(node, dict) else jnp.asarray(node)

    expected = serialization.to_bytes(as_jax(tree))
    assert write_flax(tmp_path / "m.msgpack", tree).read_bytes() == expected


def test_flax_bfloat16_is_read_exactly(bert_state, tmp_path):
    reference_dir, state = bert_state
    bf16 = __import__("ml_dtypes").bfloat16
    tree = flax_tree(state, dtype=bf16)
    folder = _folder_with(tmp_path, reference_dir, "flaxbf16")
    write_flax(folder / "flax_model.msgpack", tree)
    ckpt = open_checkpoint(folder)
    name = "encoder.layer.0.attention.self.key.weight"
    assert ckpt.dtype(name) == "BF16"
    expected = state["encoder.layer.0.attention.self.key.weight"].T.astype(bf16).astype(np.float64)
    np.testing.assert_array_equal(ckpt.read(name), expected)


# --- bad files --------------------------------------------------------------------------------------


def _one_line_error(source, *needles):
    with pytest.raises(SpecboundError) as info:
        specbound.analyze(source, threads=1)
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message


def test_bad_h5_files(bert_state, tmp_path):
    reference_dir, state = bert_state
    folder = _folder_with(tmp_path, reference_dir, "bad")
    good = write_keras_h5(tmp_path / "good.h5", state).read_bytes()
    target = folder / "tf_model.h5"
    target.write_bytes(good[: len(good) // 3])
    _one_line_error(folder, "truncated or corrupt")
    target.write_bytes(b"not hdf5 at all" * 10)
    _one_line_error(folder, "cannot read", "HDF5")
    with h5py.File(target, "w") as f:
        f.create_dataset("x", data=np.zeros(3))
    _one_line_error(folder, "not Keras weights")
    write_keras_h5(target, state)
    with h5py.File(target, "a") as f:
        del f["bert/tf_bert_model/bert/encoder/layer_._1/output/dense/kernel:0"]
    _one_line_error(folder, "is listed but absent")


def test_bad_msgpack_files(bert_state, tmp_path):
    reference_dir, state = bert_state
    folder = _folder_with(tmp_path, reference_dir, "badflax")
    target = folder / "flax_model.msgpack"
    good = write_flax(tmp_path / "good.msgpack", flax_tree(state)).read_bytes()
    target.write_bytes(good[: len(good) // 2])
    _one_line_error(folder, "truncated or corrupt")
    target.write_bytes(msgpack.packb({"w": msgpack.ExtType(9, b"xx")}, use_bin_type=True))
    _one_line_error(folder, "unknown msgpack extension type 9")
    target.write_bytes(msgpack.packb([1, 2, 3]))
    _one_line_error(folder, "holds no arrays")
    tree = flax_tree(state)
    kernel = tree["encoder"]["layer"]["0"]["attention"]["self"]["query"]
    short = msgpack.ExtType(1, msgpack.packb(((32, 32), "float32", b"\0" * 100), use_bin_type=True))

    def default(obj):
        if isinstance(obj, np.ndarray):
            return short if obj is kernel["kernel"] else _ndarray_ext(obj)
        raise TypeError(type(obj))

    target.write_bytes(msgpack.packb(tree, default=default, strict_types=True, use_bin_type=True))
    _one_line_error(folder, "encoder.layer.0.attention.self.query.weight", "corrupt")


def test_missing_packages_say_how_to_install(bert_state, tmp_path, monkeypatch):
    reference_dir, state = bert_state
    folder = _folder_with(tmp_path, reference_dir, "nopkg")
    write_keras_h5(folder / "tf_model.h5", state)
    monkeypatch.setitem(sys.modules, "h5py", None)
    _one_line_error(folder, "pip install 'specbound[tf]'")
    flax_folder = _folder_with(tmp_path, reference_dir, "nopkg2")
    write_flax(flax_folder / "flax_model.msgpack", flax_tree(state))
    monkeypatch.setitem(sys.modules, "msgpack", None)
    _one_line_error(flax_folder, "pip install 'specbound[flax]'")


# --- files written by TensorFlow and Flax themselves (tests/io/data/README.md) ------------------------

DATA = __import__("pathlib").Path(__file__).parent / "data"


def test_real_flax_file_holds_chunked_arrays():
    """The flax_model.msgpack written by flax.serialization.to_bytes holds chunked arrays (it and the
    tf_model.h5 written by TFBertModel.save_pretrained are read as their safetensors twin:
    tests/io/test_reader_conformance.py)."""
    flax = open_checkpoint(DATA / "tiny_bert_flax")
    big = [
        a for a in flax.arrays.values() if 4 * int(np.prod(a.shape)) > 256
    ]  # over the chunk size it was written with
    assert big and all(len(a.parts) > 1 for a in big)


def test_real_flax_bfloat16_file():
    bf16 = __import__("ml_dtypes").bfloat16
    state = load_file(str(DATA / "tiny_bert_safetensors" / "model.safetensors"))
    ckpt = open_checkpoint(DATA / "tiny_bert_flax_bf16")
    for name in ("encoder.layer.1.attention.output.dense.weight", "encoder.layer.0.output.dense.weight"):
        assert ckpt.dtype(name) == "BF16" and ckpt.layout(name) == "conv1d"
        np.testing.assert_array_equal(ckpt.read(name), state[name].T.astype(bf16).astype(np.float64))
