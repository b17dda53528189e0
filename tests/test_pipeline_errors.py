"""The pipeline's resource decisions: layers at a time and BLAS threads follow the machine."""

import os

import pytest

import specbound
import specbound.pipeline as analysis
from specbound.cli import main
from specbound.errors import SpecboundWarning
from specbound.pipeline import cgroup_cpu_quota


def test_auto_jobs_follow_cores_layers_and_memory(tiny_bert_dir, monkeypatch):
    """jobs="auto" (the command line's default): one layer per core, never more than the layers,
    and no more than half the available memory holds at a layer's float64 weights a job."""

    model = analysis.open_model(tiny_bert_dir)
    assert analysis.layer_float64_bytes(model.dims) == 8 * (2 * 32 * 8 * (4 + 4) + 2 * 32 * 48)  # N=32, 4x8, d_ff=48
    per_job = analysis._LAYER_PEAK_FACTOR * analysis.layer_float64_bytes(model.dims)
    monkeypatch.setattr(analysis, "available_cores", lambda: 8)
    monkeypatch.setattr(analysis, "available_memory", lambda: 100 * per_job)
    assert analysis.auto_jobs(model) == 2  # two layers
    monkeypatch.setattr(analysis, "available_memory", lambda: 3 * per_job)
    assert analysis.auto_jobs(model) == 1  # half the memory holds one layer and a half
    assert analysis.auto_jobs(model, readers=2) == 1
    monkeypatch.setattr(analysis, "available_memory", lambda: None)
    monkeypatch.setattr(analysis, "available_cores", lambda: 1)
    assert analysis.auto_jobs(model) == 1
    one = specbound.analyze(tiny_bert_dir, threads=1)
    monkeypatch.setattr(analysis, "available_cores", lambda: 2)
    assert specbound.analyze(tiny_bert_dir, jobs="auto").all_bounds() == one.all_bounds()


def test_threads_beyond_the_cores_are_capped_and_said(tiny_bert_dir, monkeypatch, capsys):
    """--threads 100000 started that many BLAS threads (72 s instead of 1.2 s)."""

    monkeypatch.setattr(analysis, "available_cores", lambda: 2)
    seen = []
    original = analysis.threadpool_limits

    def spy(limits=None, **kwargs):
        seen.append(limits)
        return original(limits=limits, **kwargs)

    monkeypatch.setattr(analysis, "threadpool_limits", spy)
    with pytest.warns(SpecboundWarning, match="100000 threads capped at the 2 core"):
        capped = specbound.analyze(tiny_bert_dir, threads=100000, jobs=1)
    assert seen == [2]
    # The same numbers up to the order of BLAS's sums: two threads may split a product differently
    # (OpenBLAS leaves matrices this small to one thread, other BLAS builds need not), so no bit
    # identity; a different BLAS altogether moves no bound by more than 7e-15 relative (torch/MKL
    # against NumPy/OpenBLAS on eleven families, tests/compute/test_backend.py).
    one_thread = specbound.analyze(tiny_bert_dir, threads=1).all_bounds()
    assert capped.all_bounds().keys() == one_thread.keys()
    assert capped.all_bounds() == pytest.approx(one_thread, rel=1e-12)
    capsys.readouterr()
    assert main(["analyze", str(tiny_bert_dir), "--threads", "100000", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["specbound: warning: 100000 threads capped at the 2 core(s) this process may use"]


def test_the_defaults_take_a_layer_per_core_with_one_blas_thread(tiny_bert_dir, monkeypatch):
    """analyze() with defaults once took 8.25 s against 1.62 s with threads=1 on a busy 2-core
    machine (one layer at a time on BLAS's default thread count).  The defaults now run a layer per
    usable core, one BLAS thread each: jobs x threads never exceeds the cores."""

    monkeypatch.setattr(analysis, "available_cores", lambda: 2)
    seen, jobs_seen = [], []
    original, spectra = analysis.threadpool_limits, analysis.all_layer_spectra
    monkeypatch.setattr(
        analysis, "threadpool_limits", lambda limits=None, **kw: seen.append(limits) or original(limits=limits, **kw)
    )
    monkeypatch.setattr(
        analysis, "all_layer_spectra", lambda *a, jobs, **kw: jobs_seen.append(jobs) or spectra(*a, jobs=jobs, **kw)
    )
    default = specbound.analyze(tiny_bert_dir)
    assert seen == [1] and jobs_seen == [2]  # two layers, two cores
    assert default.all_bounds() == specbound.analyze(tiny_bert_dir, threads=1, jobs=1).all_bounds()


@pytest.mark.parametrize(
    "files, quota",
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "garbage"}, None),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({}, None),
    ],
)
def test_the_cgroup_cpu_quota_is_read_as_the_kernel_writes_it(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota


def test_usable_cores_are_the_affinity_within_the_quota(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(analysis, "cgroup_cpu_quota", lambda: None)
    assert analysis.available_cores() == affinity
    monkeypatch.setattr(analysis, "cgroup_cpu_quota", lambda: 0.5)  # half a CPU: one thread
    assert analysis.available_cores() == 1
    monkeypatch.setattr(analysis, "cgroup_cpu_quota", lambda: 1000.0)
    assert analysis.available_cores() == affinity
