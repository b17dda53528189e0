"""A sweep's records are the numbers of the bytes their keys name, whatever happens to the files
and the store meanwhile: files replaced between hashing and analysis, same-size
rewrites that keep the old mtime, corrupt records, one bad checkpoint among good ones, two
sweeps on one store, ONNX folders."""

import json
import os
import shutil
import warnings
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.tiny_models import TINY_PATTERN

import specbound
import specbound.sweep.run
from specbound.errors import SpecboundError, SpecboundWarning
from specbound.io.base import Checkpoint
from specbound.report.scaling import scaling_table
from specbound.sweep.run import analyze_task, plan_task, run_sweep
from specbound.sweep.sources import Source, expand_sources
from specbound.sweep.store import QUARANTINE, Store, file_sha256


@pytest.fixture(scope="module")
def sources(tiny_family):
    return expand_sources([str(tiny_family / TINY_PATTERN)])[:3]


@pytest.fixture
def member(sources, tmp_path):
    return shutil.copytree(sources[0].target, tmp_path / "member")


def _rewrite_same_size(path: Path, keep_times: bool = True) -> None:
    """Alter one weight byte in place, size unchanged, then (optionally) restore atime and mtime."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.write(bytes(data))
    if keep_times:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_ino == st.st_ino


# --- the key is the digest of the bytes analysed -------------------------------------------------


def test_same_size_rewrite_with_the_old_mtime_is_hashed_again(member):
    """The remembered hash was keyed on (path, size, mtime, inode): this rewrite kept all four."""
    path = member / "model.safetensors"
    cache = {}
    before = file_sha256(path, cache)
    _rewrite_same_size(path)
    after = file_sha256(path, cache)
    assert after != before and after == file_sha256(path)


def test_a_file_replaced_after_planning_is_not_stored_under_the_old_key(member, tmp_path):
    task = plan_task(Source("m", str(member)), {})
    _rewrite_same_size(member / "model.safetensors")
    with pytest.raises(SpecboundError, match="changed since the sweep hashed it"):
        analyze_task(task)
    # a re-run hashes the new bytes: a new key, and the record is of these bytes
    again = plan_task(Source("m", str(member)), {})
    assert again.key != task.key
    record = analyze_task(again)
    direct = specbound.analyze(str(member), threads=1)
    assert record.bounds["spectral_adaptive"] == pytest.approx(direct.bounds["spectral_adaptive"], rel=1e-12)


def test_a_file_replaced_during_the_analysis_fails_that_task_only(sources, tmp_path, monkeypatch):
    copies = [shutil.copytree(s.target, tmp_path / f"m{i}") for i, s in enumerate(sources)]
    real = specbound.sweep.run.analyze

    def analyze_then_rewrite(source, *args, **kwargs):
        result = real(source, *args, **kwargs)
        if Path(source) == copies[1]:  # replaced while being analysed: after reading, before storing
            _rewrite_same_size(copies[1] / "model.safetensors")
        return result

    monkeypatch.setattr(specbound.sweep.run, "analyze", analyze_then_rewrite)
    report = run_sweep([Source(str(c), str(c)) for c in copies], tmp_path / "store", progress=False)
    assert len(report.written) == 2 and len(report.failed) == 1
    assert report.failed[0][0] == str(copies[1]) and "changed since" in report.failed[0][1]
    monkeypatch.setattr(specbound.sweep.run, "analyze", real)
    again = run_sweep([Source(str(c), str(c)) for c in copies], tmp_path / "store", progress=False)
    assert len(again.written) == 1 and len(again.skipped) == 2 and not again.failed


def test_a_changed_config_after_planning_fails_the_task(member):
    task = plan_task(Source("m", str(member)), {})
    config = json.loads((member / "config.json").read_text())
    (member / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(SpecboundError, match="config.json changed since"):
        analyze_task(task)


# --- one bad checkpoint never stops a sweep --------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [MemoryError(), RecursionError("maximum recursion depth exceeded"), PermissionError(13, "Permission denied")],
)
def test_an_environment_error_in_one_checkpoint_is_reported_and_the_sweep_goes_on(
    sources, tmp_path, monkeypatch, error
):
    real = Checkpoint.read
    bad = str(Path(sources[1].target).resolve())

    def read(self, name, **options):
        if str(Path(self.location).resolve()) == bad:
            raise error
        return real(self, name, **options)

    monkeypatch.setattr(Checkpoint, "read", read)
    report = run_sweep(sources, tmp_path / "store", progress=False)
    assert len(report.written) == 2 and len(report.failed) == 1 and report.failed[0][0] == sources[1].name
    assert "\n" not in report.failed[0][1]


# --- corrupt records are set aside and recomputed ---------------------------------------------------

CORRUPTIONS = {
    "truncated json": lambda d: (d / "record.json").write_bytes((d / "record.json").read_bytes()[:100]),
    "binary json": lambda d: (d / "record.json").write_bytes(bytes(range(256)) * 4),
    "json list": lambda d: (d / "record.json").write_text("[1, 2]"),
    "missing bounds": lambda d: (d / "record.json").write_text(
        json.dumps({k: v for k, v in json.loads((d / "record.json").read_text()).items() if k != "bounds"})
    ),
    "bound not a number": lambda d: (d / "record.json").write_text(
        json.dumps({**json.loads((d / "record.json").read_text()), "bounds": {"edelman": [1]}})
    ),
    "bad parquet": lambda d: (d / "matrices.parquet").write_bytes(b"PAR1 not really"),
    "truncated parquet": lambda d: (d / "curves.parquet").write_bytes((d / "curves.parquet").read_bytes()[:50]),
    "record.json a folder": lambda d: ((d / "record.json").unlink(), (d / "record.json").mkdir()),
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS))
def test_a_corrupt_record_is_quarantined_recomputed_and_never_crashes_a_report(sources, tmp_path, corrupt):
    root = tmp_path / "store"
    first = run_sweep(sources, root, progress=False)
    assert len(first.written) == 3
    victim = sorted(first.written)[0]
    CORRUPTIONS[corrupt](root / "records" / victim)
    with pytest.warns(SpecboundWarning, match=f"record {victim}.*cannot be read"):
        assert len(Store(root).table()) == 2  # reported and set aside, the others read
    assert list((root / QUARANTINE).iterdir())[0].name.startswith(victim)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing else left to complain about
        scaling_table(Store(root))
        again = run_sweep(sources, root, progress=False)
    assert again.written == [victim] and len(again.skipped) == 2
    assert len(Store(root)) == 3


# --- two sweeps on one store --------------------------------------------------------------------------


def test_two_sweeps_on_one_store_count_every_task_once(sources, tmp_path, monkeypatch):
    """Sweep B publishes every record while sweep A is still analysing: A's counts still add up."""
    root = tmp_path / "store"
    real_put, other = Store.put, {}

    def put_after_another_sweep(self, record):
        if not other:
            monkeypatch.setattr(Store, "put", real_put)
            other["report"] = run_sweep(sources, root, progress=False)
            monkeypatch.setattr(Store, "put", put_after_another_sweep)
        return real_put(self, record)

    monkeypatch.setattr(Store, "put", put_after_another_sweep)
    first = run_sweep(sources, root, progress=False)
    second = other["report"]
    assert len(second.written) == 3
    assert first.written == [] and len(first.skipped) == 3 and first.total == 3
    assert first.summary().startswith("sweep: 3 checkpoint(s) x option set(s): 0 analysed, 3 already in the store")
    assert len(Store(root)) == 3


def test_summary_counts_sources_that_cannot_be_opened(sources, tmp_path):
    (tmp_path / "empty").mkdir()
    report = run_sweep(sources[:1] + [Source("empty", str(tmp_path / "empty"))], tmp_path / "store", progress=False)
    assert report.summary().startswith(
        "sweep: 2 checkpoint(s) x option set(s): 1 analysed, 0 already in the store, 1 failed"
    )


# --- ONNX folders ---------------------------------------------------------------------------------------


def _onnx_copy(folder: Path, target: Path) -> Path:
    """``folder``'s BERT Linear weights as MatMul initializers of an ONNX graph (legacy exporter
    node names), config.json beside it."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weights = load_file(str(folder / "model.safetensors"))
    nodes, inits = [], []
    for i, (name, w) in enumerate(sorted(weights.items())):
        if name.endswith(".weight") and w.ndim == 2 and ".layer." in name:
            path = "/" + "/".join(name.split(".")[:-1])
            nodes.append(helper.make_node("MatMul", ["x", f"W{i}"], [f"y{i}"], name=f"{path}/MatMul"))
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), f"W{i}"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=inits,
    )
    target.mkdir()
    onnx.save(helper.make_model(graph), str(target / "model.onnx"))
    shutil.copy(folder / "config.json", target / "config.json")
    return target


def test_a_sweep_over_onnx_folders(sources, tmp_path):
    """Crashed with 'OnnxCheckpoint' object has no attribute 'shards'."""
    onnx_folder = _onnx_copy(Path(sources[0].target), tmp_path / "onnx")
    report = run_sweep([Source("onnx", str(onnx_folder))], tmp_path / "store", progress=False)
    assert len(report.written) == 1 and not report.failed, report.summary()
    record = Store(tmp_path / "store").load(report.written[0])
    direct = specbound.analyze(sources[0].target, threads=1)
    assert record.bounds["spectral_adaptive"] == pytest.approx(direct.bounds["spectral_adaptive"], rel=1e-6)


def test_a_changed_arch_spec_after_planning_fails_the_task(member, tmp_path):
    spec = tmp_path / "bert.json"
    spec.write_text(resources.files("specbound.archs").joinpath("data", "bert.json").read_text())
    task = plan_task(Source("m", str(member)), {"arch_spec": str(spec)})
    spec.write_text(spec.read_text().replace('"family": "bert"', '"family": "bert2"'))
    with pytest.raises(SpecboundError, match="bert.json changed since"):
        analyze_task(task)


def test_a_corrupt_record_in_a_read_only_store_is_skipped(sources, tmp_path, monkeypatch):
    """Nothing can be moved: the record is skipped with a warning, readers carry on."""
    root = tmp_path / "store"
    run_sweep(sources, root, progress=False)
    victim = sorted((root / "records").iterdir())[0]
    (victim / "record.json").write_text("{")

    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", deny)
    with pytest.warns(SpecboundWarning, match="skipped \\(the store is read-only\\)"):
        assert len(Store(root).table()) == 2
    assert victim.exists()
