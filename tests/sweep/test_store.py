"""The results store: keys from weights and options, atomic records, leftovers of killed writers,
and the contribution curves stored with every record."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from support.tiny_models import TINY_PATTERN

import specbound
from specbound import SpecboundError
from specbound.records.schema import RENAMED_COLUMNS
from specbound.report.plots import figure_spectral_decay
from specbound.report.scaling import scaling_table
from specbound.sweep.run import plan_task, run_sweep
from specbound.sweep.sources import Source, expand_sources
from specbound.sweep.store import (
    TABLES,
    Store,
    canonical_options,
    file_sha256,
    meta_checksum,
    record_from_analysis,
    record_key,
    weights_digest,
)


@pytest.fixture(scope="module")
def member(tiny_family):
    return tiny_family / "bert_uncased_L-2_H-64_A-4"


@pytest.fixture(scope="module")
def record(member):
    task = plan_task(Source("m", str(member), {"L": 2}), {})
    analysis = specbound.analyze(member, threads=1)
    return record_from_analysis(
        analysis,
        key=task.key,
        source="m",
        labels={"L": 2},
        weights_sha256=task.weights_sha256,
        options={},
        seconds=0.1,
        mode="local",
    )


def test_key_depends_on_the_weights_and_the_options_not_the_name(member, tmp_path):
    base = plan_task(Source("a", str(member)), {})
    copy = tmp_path / "copy"
    shutil.copytree(member, copy)
    assert plan_task(Source("b", str(copy)), {}).key == base.key  # same bytes, another name
    assert plan_task(Source("a", str(member)), {"rank_tol": 1e-10, "method": "factored"}).key == base.key
    assert plan_task(Source("a", str(member)), {"grid_m": 9}).key != base.key
    # one byte of one weight changed: another key
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    assert plan_task(Source("b", str(copy)), {}).key != base.key
    with pytest.raises(SpecboundError, match="unknown analysis option"):
        canonical_options({"grid": 3})


def test_remembered_file_hashes_follow_the_file(member, tmp_path):
    copy = tmp_path / "w.safetensors"
    copy.write_bytes((member / "model.safetensors").read_bytes())
    cache = {}
    first = file_sha256(copy, cache)
    assert first == file_sha256(member / "model.safetensors") and len(cache) == 1
    cache[next(iter(cache))] = "stale"  # a remembered hash is used while the file is unchanged
    assert file_sha256(copy, cache) == "stale"
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: hashed again
    assert file_sha256(copy, cache) == first and len(cache) == 2


def test_weights_digest_covers_the_config(member):
    config = json.loads((member / "config.json").read_text())
    files = [member / "model.safetensors"]
    assert weights_digest(config, files) != weights_digest({**config, "hidden_act": "relu"}, files)
    assert record_key("0" * 64, {}) != record_key("1" * 64, {})


def test_curves_reproduce_the_stored_minimisers(record):
    curves, mats = record.tables["curves"], record.tables["matrices"]
    m = record.meta["analysis"]["options"]["grid_m"]
    assert len(curves) == len(mats) * (2 * m + 1)
    best = curves.loc[curves.groupby("matrix")["c"].idxmin()]
    np.testing.assert_allclose(best["c"], mats["contribution"], rtol=1e-12)
    np.testing.assert_allclose(best["p"], mats["p_star"], rtol=0, atol=1e-12)
    at0 = curves[curves["p"] == 0]
    np.testing.assert_allclose(at0["c"], mats["c_p0"], rtol=1e-12)
    assert (at0["c_over_c0"] == 1).all()


def test_put_load_and_table(record, tmp_path):
    st = Store(tmp_path / "s")
    assert st.keys() == [] and len(st.table()) == 0
    assert st.put(record) is True
    assert st.put(record) is False  # already there: never a second copy
    assert st.keys() == [record.key] and record.key in st
    back = st.load(record.key)
    assert back.meta == json.loads(json.dumps(record.meta))
    for name in TABLES:
        pd.testing.assert_frame_equal(back.tables[name], record.tables[name], check_exact=True)
    row = st.table().iloc[0]
    assert (row["L"], row["N"], row["label_L"], row["source"]) == (2, 64, 2, "m")
    assert row["spectral_adaptive"] == pytest.approx(record.bounds["spectral_adaptive"], rel=1e-15)
    assert set(st.bound_names()) >= {"spectral_adaptive", "edelman"}
    assert os.listdir(st.incoming_dir) == []


def test_a_failed_write_publishes_nothing(record, tmp_path, monkeypatch):
    st = Store(tmp_path / "s")
    calls = []

    def broken(self, path, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        return original(self, path, **kwargs)

    original = pd.DataFrame.to_parquet
    monkeypatch.setattr(pd.DataFrame, "to_parquet", broken)
    with pytest.raises(SpecboundError, match="write record .* disk full"):  # one line, not a traceback
        st.put(record)
    assert st.keys() == [] and not (st.records_dir / record.key).exists()
    assert os.listdir(st.incoming_dir) == []


def test_leftovers_of_dead_writers_are_cleaned(record, tmp_path):
    st = Store(tmp_path / "s")
    st.put(record)

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = st.incoming_dir / f"{record.key}+{dead}+abcd1234+{socket.gethostname()}"
    (stale / "sub").mkdir(parents=True)
    live = st.incoming_dir / f"{record.key}+{os.getpid()}+abcd1234+{socket.gethostname()}"
    live.mkdir()
    assert st.keys() == [record.key]  # leftovers are never read as records
    assert st.clean_incoming() == 1
    assert not stale.exists() and live.exists()


def test_a_store_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecboundError, match="is a file"):
        Store(tmp_path / "f")


# Record format 1's contract: a key is the first 24 hex digits of SHA-256 over this JSON (sorted
# keys, no spaces).  Each case: the options asked for, and the options the key holds.
FORMAT_1_KEYS = [
    (
        {},
        {"grid_m": None, "rank_tol": 1e-10, "l_phi": None, "method": "factored", "gram_rtol": 1e-08, "arch_spec": None},
        "c77e414eaf052fa196466717",
    ),
    (
        {"grid_m": 9, "method": "dense"},
        {"grid_m": 9, "rank_tol": 1e-10, "l_phi": None, "method": "dense", "gram_rtol": 1e-08, "arch_spec": None},
        "461f199d87bedeade74d9821",
    ),
    (
        {"n": 1000, "margin": 0.5, "l_phi": 1.0},
        {
            "grid_m": None,
            "rank_tol": 1e-10,
            "l_phi": 1.0,
            "method": "factored",
            "gram_rtol": 1e-08,
            "arch_spec": None,
            "n": 1000,
            "margin": 0.5,
        },
        "63596ce63eb886fe863a0848",
    ),
    (
        {"jobs": 3, "device": "cpu", "threads": 2},
        {"grid_m": None, "rank_tol": 1e-10, "l_phi": None, "method": "factored", "gram_rtol": 1e-08, "arch_spec": None},
        "c77e414eaf052fa196466717",
    ),
]


@pytest.mark.parametrize("asked, held, key", FORMAT_1_KEYS)
def test_keys_are_those_of_record_format_1(asked, held, key):
    """Existing stores keep their keys: the key of every option set is format 1's (the hash of the
    documented JSON, and the value a store written by format 1 holds)."""

    weights = "ab" * 32
    text = json.dumps({"format": 1, "weights": weights, "options": held}, sort_keys=True, separators=(",", ":"))
    assert canonical_options(asked) == held and list(canonical_options(asked)) == list(held)
    assert record_key(weights, asked) == hashlib.sha256(text.encode()).hexdigest()[:24] == key


def test_a_store_with_the_other_spelling_of_format_1_reads_and_keeps_its_keys(tiny_store, tiny_family, tmp_path):
    """Schema 1 tables may name the singular values' index ``index``: such a store reads as one in
    today's spelling (``sv_index``, the figures drawn), and a sweep of the same checkpoints finds
    every record under its key."""

    root = tmp_path / "store"
    shutil.copytree(tiny_store.root, root)
    store = Store(root)
    keys = store.keys()
    for key in keys:
        path = root / "records" / key / "singular_values.parquet"
        pd.read_parquet(path).rename(columns={"sv_index": "index"}).to_parquet(path, index=False)
        meta_path = root / "records" / key / "record.json"  # such stores predate the record checksums
        meta = json.loads(meta_path.read_text())
        meta.pop("checksum", None), meta.pop("tables", None)
        meta_path.write_text(json.dumps(meta))
    record = store.load(keys[0])
    assert "sv_index" in record.tables["singular_values"] and "index" not in record.tables["singular_values"]
    assert figure_spectral_decay(store, keys[0]).axes
    report = run_sweep(expand_sources([str(tiny_family / TINY_PATTERN)]), root, progress=False)
    assert sorted(report.skipped) == keys and not report.written and Store(root).keys() == keys


def test_a_store_written_before_the_downstream_factor_was_renamed_reads(tiny_store, tiny_family, tmp_path):
    """A store the previous version wrote (schema 1: the downstream factor named ``alpha`` and
    ``log10_alpha`` in its tables, each table's SHA-256 and the record checksum over those files)
    reads in today's names with the same numbers: its records are sound, the scaling fits equal the
    new store's, and a sweep of the same checkpoints finds every record under its key."""

    old_names = {new: old for old, new in RENAMED_COLUMNS.items()}
    root = tmp_path / "store"
    shutil.copytree(tiny_store.root, root)
    keys = tiny_store.keys()
    for key in keys:
        folder = root / "records" / key
        meta = json.loads((folder / "record.json").read_text())
        for name in ("matrices", "layers"):
            path = folder / f"{name}.parquet"
            pd.read_parquet(path).rename(columns=old_names).to_parquet(path, index=False)
            meta["tables"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
        meta["analysis"]["schema_version"] = 1
        meta["checksum"] = meta_checksum(meta)
        (folder / "record.json").write_text(json.dumps(meta, indent=2))
    store = Store(root)
    assert store.keys() == keys  # nothing quarantined
    assert "alpha" in pd.read_parquet(root / "records" / keys[0] / "layers.parquet").columns
    for key in keys:
        old, new = store.load(key), tiny_store.load(key)
        for name in ("matrices", "layers"):
            assert "alpha" not in old.tables[name] and "log10_alpha" not in old.tables[name]
            pd.testing.assert_frame_equal(old.tables[name], new.tables[name], check_exact=True)
    pd.testing.assert_frame_equal(scaling_table(store), scaling_table(tiny_store))
    report = run_sweep(expand_sources([str(tiny_family / TINY_PATTERN)]), root, progress=False)
    assert sorted(report.skipped) == keys and not report.written
