"""The benchmark's synthetic checkpoints are real checkpoints (they load, bf16 is rounded as torch
rounds it), and specbound bench --scenario miniatures on a tiny family (the real one takes minutes)."""

import importlib
import json
import shutil
from pathlib import Path

import numpy
import numpy as np
import pytest
import scipy

import specbound
import specbound.tools.bench
import specbound.tools.bench as bench
from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.io import open_checkpoint
from specbound.tools.bench import (
    LLAMA_7B,
    _to_bf16,
    core_budgets,
    format_bench,
    format_kernels_bench,
    format_llama7b_bench,
    format_miniatures_bench,
    run_bench,
    run_kernels_bench,
    run_llama7b_bench,
    run_miniatures_bench,
    stage_floors,
    two_stage_crossover,
    write_bert_checkpoint,
    write_llama_checkpoint,
)
from specbound.tools.bench_ab import format_ab_bench, run_ab_bench
from specbound.tools.bench_machine import KERNEL_OVERRIDES, format_machine, machine_info


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    x[:4] = [0.0, -0.0, 1.0, 3.140625]
    ours = _to_bf16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


def test_small_llama_checkpoint_analyses(tmp_path):
    folder, nbytes = write_llama_checkpoint(tmp_path / "llama", L=2, N=64, H=4, H_kv=2, d_ff=96, vocab=64)
    result = specbound.analyze(folder, threads=1)
    assert result.model["family"] == "llama" and result.model["H_kv"] == 2 and result.model["L"] == 2
    assert set(result.matrices["role"]) == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}
    layer_params = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 96 + 2 * 64
    assert nbytes >= 2 * (2 * layer_params + 2 * 64 * 64 + 64)  # bf16 payload of every tensor, headers


def test_small_bert_checkpoint_analyses(tmp_path):
    folder = write_bert_checkpoint(tmp_path / "bert", L=2, N=64, H=4, d_ff=128)
    dense = specbound.analyze(folder, threads=1, method="dense")
    fast = specbound.analyze(folder, threads=1)
    for name, value in dense.bounds.items():
        assert fast.bounds[name] == pytest.approx(value, rel=1e-9)


def test_miniatures_bench_reports_totals_and_every_checkpoint(tmp_path):
    report = run_miniatures_bench(depths=(1, 2), widths=(64, 128), jobs=2, workdir=str(tmp_path))
    assert report["checkpoints"] == 4 and [b["cores"] for b in report["budgets"]] == [1, 2]
    for budget in report["budgets"]:
        rows = budget["per_checkpoint"]
        assert [(r["L"], r["N"]) for r in rows] == [(1, 64), (1, 128), (2, 64), (2, 128)]
        assert budget["max_relative_bound_difference_vs_dense"] < 1e-10  # same bounds as the dense method
        assert budget["speedup_vs_dense"] == budget["dense_seconds"] / budget["sweep_seconds"]
    json.dumps(report)  # the --format json document
    text = format_miniatures_bench(report)
    assert "speedup vs dense" in text and "per checkpoint median" in text and "on 2 cores" in text
    assert text.splitlines()[-4].split()[:2] == ["1", "64"] and text.count("x") >= 8
    assert list(tmp_path.iterdir()) == []  # the family and the store lived in a temporary folder


def test_core_budgets():
    assert core_budgets(1) == [1] and core_budgets(4) == [1, 4]
    assert core_budgets(None)[0] == 1


def test_bench_scenarios_on_the_command_line(capsys, monkeypatch):
    monkeypatch.setattr(specbound.tools.bench, "run_miniatures_bench", lambda **kw: {"called": kw})
    monkeypatch.setattr(
        specbound.tools.bench, "format_miniatures_bench", lambda r: f"miniatures { {'called': r['called']} }"
    )
    assert main(["bench", "--scenario", "miniatures", "--threads", "1"]) == 0
    assert "miniatures {'called': {'threads': 1, 'jobs': None, 'workdir': None}}" in capsys.readouterr().out
    assert main(["bench", "--scenario", "miniatures", "--jobs", "2"]) == 0
    assert "'jobs': 2" in capsys.readouterr().out
    assert main(["bench", "--scenario", "nope"]) == 2


def test_bert_bench_on_one_and_two_cores(tmp_path):
    """The bert-base scenario's machinery on a tiny shape: every contender at each core budget, the
    results on two cores identical to one core, the same bounds as the dense method."""

    report = run_bench(repeats=1, jobs=2, workdir=str(tmp_path), shape=dict(L=2, N=64, H=4, d_ff=128))
    assert [b["cores"] for b in report["budgets"]] == [1, 2]
    for budget in report["budgets"]:
        assert budget["identical_to_one_core"] and budget["seconds"] > 0
        assert budget["speedup_vs_dense"] == budget["dense_seconds"] / budget["seconds"]
        assert budget["cpu_speedup_vs_dense"] == budget["dense_cpu_seconds"] / budget["cpu_seconds"] > 0
    assert report["ff_all_cpu_seconds"] == 2 * 2 * report["ff_gram_cpu_seconds"]  # 2 FF matrices a layer
    assert (
        report["cpu_speedup_ceiling_vs_dense"]
        == report["budgets"][0]["dense_cpu_seconds"] / report["ff_all_cpu_seconds"]
    )
    assert report["max_relative_bound_difference_vs_dense"] < 1e-10 and report["ff_shape"] == [64, 128]
    json.dumps(report)
    text = format_bench(report)
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2"] and all(r[3].endswith("x") for r in rows)
    assert "64 x 128" in text and "WARNING" not in text and "the 4 FF spectra alone" in text
    assert all(r[-1].endswith("x") for r in rows)
    assert list(tmp_path.iterdir()) == []


def test_llama7b_bench_on_a_tiny_shape(tmp_path):
    """The llama7b scenario's machinery on a tiny shape: sharded like LLaMA-2-7B (a layer split
    between two files), every key of its report, the reference path agreeing, and nothing left
    on disk."""

    shape = dict(L=3, N=64, H=4, H_kv=2, d_ff=96)
    report = run_llama7b_bench(shape=shape, jobs=2, workdir=str(tmp_path), probe_layers=1)
    assert report["layers"] == 3 and report["seconds"] > 0 and report["peak_rss_mb"] > 0
    assert report["reference_layers"] == [0, 2] and report["reference_matrices_compared"] == 2 * (2 * 4 + 3)
    assert report["max_relative_difference_vs_reference"] < 1e-12
    for key in ("stage_seconds_per_layer", "stage_cpu_seconds_per_layer"):
        assert set(report[key]) == {"1_blas_threads", "2_blas_threads"}
        assert set(report[key]["1_blas_threads"]) == {
            "read_attention",
            "attention_cores",
            "rotary_qk",
            "norm_1_1",
            "read_ff",
            "ff_norms",
            "gram",
            "eigenvalues",
        }
    assert report["cpu_seconds"] > 0 and report["cpu_seconds_over_cores"] == report["cpu_seconds"] / 2
    assert report["ff_sv_methods"] == {"gram": 9} and 0 < report["max_ff_sv_rel_error_bound"] <= 1e-8
    assert "extrapolated_seconds_all_layers" not in report
    assert {"spectral_adaptive", "edelman", "bft", "nbs", "l11_proxy", "param_count"} <= set(report["bounds"])
    for threads in ("1_blas_threads", "2_blas_threads"):
        floors = report["stage_floor_seconds_per_layer"][threads]
        assert set(floors) == set(report["stage_seconds_per_layer"][threads]) - {"rotary_qk"}
        assert all(f["seconds"] > 0 for f in floors.values()) and report["machine_rates"][threads]["flops_per_s"] > 0
    json.dumps(report)
    text = format_llama7b_bench(report)
    assert "every bound" in text and "EXTRAPOLATED" not in text
    gram = next(line.split() for line in text.splitlines() if line.strip().startswith("gram "))
    wall, floor = (
        report[key]["1_blas_threads"]["gram"] for key in ("stage_seconds_per_layer", "stage_floor_seconds_per_layer")
    )
    assert gram[3] == f"{wall / floor['seconds']:.1f}x" and "against its floor" in text
    cpu, cpu_floor = (
        report[key]["1_blas_threads"]["gram"]
        for key in ("stage_cpu_seconds_per_layer", "stage_floor_cpu_seconds_per_layer")
    )
    assert gram[6] == f"{cpu / cpu_floor['seconds']:.1f}x"
    assert list(tmp_path.iterdir()) == []
    short = run_llama7b_bench(shape=shape, layers=1, jobs=1, workdir=str(tmp_path), probe_layers=1)
    assert short["layers"] == 1 and short["extrapolated_seconds_all_layers"] == 3 * short["seconds"]
    assert "EXTRAPOLATED from 1 layers" in format_llama7b_bench(short)


def test_the_large_scenario_is_llama7b_on_a_few_layers(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(bench, "run_llama7b_bench", lambda **kw: calls.append(kw) or {"kw": kw})
    monkeypatch.setattr(bench, "format_llama7b_bench", lambda report: "formatted")
    assert main(["bench", "--scenario", "large", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.endswith("\n\nformatted\n")  # after the machine's header
    (kw,) = calls
    assert kw["layers"] == bench.LARGE_LAYERS < bench.LLAMA_7B["L"] and kw["jobs"] == 1 and kw["kernel"].device == "cpu"


def test_llama7b_checkpoint_is_sharded_like_the_real_one(tmp_path):
    folder, nbytes = write_llama_checkpoint(
        tmp_path / "m", L=4, N=64, H=4, H_kv=2, d_ff=96, vocab=64, shard_bytes=60_000
    )
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    per_layer = {}
    for name, f in index["weight_map"].items():
        if name.startswith("model.layers."):
            per_layer.setdefault(int(name.split(".")[2]), set()).add(f)
    assert any(len(f) == 2 for f in per_layer.values())  # a layer spans two shards
    assert index["metadata"]["total_size"] == nbytes == sum((folder / f).stat().st_size for f in files)
    result = specbound.analyze(folder, threads=1)
    assert result.model["L"] == 4 and result.model["H_kv"] == 2


def test_llama7b_bench_refuses_a_short_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**11, 10**11 - 10**9, 10**9))
    with pytest.raises(
        SpecboundError,
        match=r"needs 11\.9 GB but .* has 1\.0 GB free: pass --workdir DIR .* "
        r"--layers 1",
    ):
        run_llama7b_bench(workdir=str(tmp_path))


def test_llama7b_tensors_are_windows_of_the_pool_and_wrap_around(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "_POOL_VALUES", 1000)  # smaller than the 64 x 32 embeddings
    folder, _ = bench.write_llama_checkpoint(tmp_path / "m", L=1, N=32, H=2, H_kv=1, d_ff=24, vocab=64)
    ckpt = open_checkpoint(folder)
    embed = ckpt.read("model.embed_tokens.weight").ravel()
    assert embed.size == 2048
    # the pool: 1000 values, or the largest layer tensor (q, o: 32 x 32) where that is longer
    np.testing.assert_array_equal(embed[1024:2048], embed[:1024])  # a cyclic window of the pool
    assert not np.array_equal(embed[1:1025], embed[:1024])
    q = ckpt.read("model.layers.0.self_attn.q_proj.weight")
    assert abs(q.std() - 0.02) < 0.004


def test_no_analysed_tensor_wraps_around_the_pool(tmp_path, monkeypatch):
    """A layer tensor longer than the pool's default length gets a longer pool, so its values do not
    repeat (a 70B feed-forward matrix is 3.5 times the default pool)."""

    monkeypatch.setattr(bench, "_POOL_VALUES", 500)
    folder, _ = bench.write_llama_checkpoint(tmp_path / "m", L=2, N=32, H=2, H_kv=1, d_ff=40, vocab=64)
    ckpt = open_checkpoint(folder)
    for layer in (0, 1):
        gate = ckpt.read(f"model.layers.{layer}.mlp.gate_proj.weight").ravel()  # 1280 values, the longest
        assert gate.size == 1280 and not np.array_equal(gate[500:1000], gate[:500])
        assert np.unique(gate).size > 600  # 1280 draws rounded to bf16 (780 distinct), not a 500-value cycle
    embed = ckpt.read("model.embed_tokens.weight").ravel()
    np.testing.assert_array_equal(embed[1280:2048], embed[:768])  # the embeddings still wrap, at 1280


def test_kernels_bench_times_every_candidate(capsys):
    report = run_kernels_bench(sizes=(40, 70), repeats=1, head_dim=8)
    assert [r["n"] for r in report["sizes"]] == [40, 70]
    for r in report["sizes"]:
        assert {"numpy_dsyevd", "scipy_evd", "scipy_evr"} <= set(r["eigenvalues"])
        assert r["eigenvalues_fastest"] in r["eigenvalues"] and r["chosen"] == "numpy dsyevd"
        assert all(t > 0 for t in r["norm_1_1_one_head"].values())
        assert set(r["gram_block"]) == {"numpy_matmul_float64", "dsyrk_from_float32"}
    json.dumps(report)
    text = format_kernels_bench(report)
    assert "numpy_dsyevd" in text and "tiles <= 512" in text and text.count("numpy dsyevd") == 2
    assert text.splitlines()[-1].split()[0] == "70" and "dsyrk" in text
    assert "TWO_STAGE_MIN in use" in text and report["two_stage_min_in_use"] > 70


def test_two_stage_crossover_is_where_it_wins_at_every_larger_order():
    def rows(*pairs):  # (n, numpy seconds, two-stage seconds)
        return [{"n": n, "eigenvalues": {"numpy_dsyevd": one, "openblas_dsyevd_2stage": two}} for n, one, two in pairs]

    assert two_stage_crossover(rows((768, 1, 2), (2048, 2, 1), (4096, 9, 7))) == 2048
    assert two_stage_crossover(rows((768, 1, 0.5), (2048, 2, 3), (4096, 9, 7))) == 4096  # a win below a loss
    assert two_stage_crossover(rows((768, 1, 2), (4096, 9, 9))) is None  # a tie is no win
    assert two_stage_crossover([{"n": 768, "eigenvalues": {"numpy_dsyevd": 1.0}}]) is None  # not exported


def test_ab_bench_times_both_codes_interleaved_on_a_tiny_shape(tmp_path):
    """``--against``: both sides analyse the same checkpoint in fresh processes; against this very
    checkout the bounds are the same numbers and every round is reported."""

    here = Path(__file__).resolve().parents[2]
    report = run_ab_bench(here, layers=2, repeats=2, workdir=str(tmp_path), shape=dict(L=2, N=64, H=4, H_kv=2, d_ff=96))
    assert report["layers"] == 2 and report["bounds_compared"] >= 5
    assert report["max_bound_relative_difference"] == 0.0
    assert len(report["seconds"]["new"]) == len(report["seconds"]["old"]) == 2
    assert all(s > 0 for side in report["cpu_seconds"].values() for s in side)
    assert Path(report["old_code"]).parent.parent == here / "src"
    text = format_ab_bench(report)
    assert "new / old" in text and "2 interleaved rounds" in text
    assert list(tmp_path.iterdir()) == []


def test_ab_bench_refuses_a_folder_without_the_code_and_other_scenarios(tmp_path, capsys):
    assert main(["bench", "--scenario", "large", "--against", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "git worktree add --detach" in err
    assert main(["bench", "--scenario", "kernels", "--against", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--scenario kernels" in err


SCENARIO_RUNS = {
    "bert-base": ("run_bench", "format_bench"),
    "large": ("run_llama7b_bench", "format_llama7b_bench"),
    "llama7b": ("run_llama7b_bench", "format_llama7b_bench"),
    "kernels": ("run_kernels_bench", "format_kernels_bench"),
    "miniatures": ("run_miniatures_bench", "format_miniatures_bench"),
}
OTHER_MODULE_RUNS = {
    "threads": ("bench_threads", "run_threads_bench", "format_threads_bench"),
    "llama70b-layer": ("bench_dask", "run_dask_layer_bench", "format_dask_layer_bench"),
}


@pytest.mark.parametrize("scenario", [*SCENARIO_RUNS, *OTHER_MODULE_RUNS])
def test_every_scenario_prints_and_records_its_machine(scenario, capsys, monkeypatch):
    """The header (CPU, each BLAS with its kernel and threads, NumPy/SciPy) and the ``machine`` record,
    with the scenario itself replaced: nothing is timed."""

    if scenario in SCENARIO_RUNS:
        module, (run, fmt) = importlib.import_module("specbound.tools.bench"), SCENARIO_RUNS[scenario]
    else:
        name, run, fmt = OTHER_MODULE_RUNS[scenario]
        module = importlib.import_module(f"specbound.tools.{name}")
    monkeypatch.setattr(module, run, lambda **kw: {"ran": scenario})
    monkeypatch.setattr(module, fmt, lambda report: f"scenario text {report['ran']}")
    for name in KERNEL_OVERRIDES:  # whatever the machine running the test sets (OPENBLAS_L2_SIZE too)
        monkeypatch.delenv(name, raising=False)
    assert main(["bench", "--scenario", scenario]) == 0
    text = capsys.readouterr().out
    head = text.split("\n\n")[0].splitlines()
    assert head[0].startswith("CPU ") and text.rstrip().endswith(f"scenario text {scenario}")
    assert f"{numpy.__version__} / {scipy.__version__}" in head[1]
    blas = [line for line in head if line.startswith("BLAS (")]
    assert {line.split(")")[0] for line in blas} >= {"BLAS (numpy"} and all("kernel" in line for line in blas)
    assert "WARNING" not in text
    assert main(["bench", "--scenario", scenario, "--format", "json"]) == 0
    machine = json.loads(capsys.readouterr().out)["machine"]
    assert machine["numpy"] == numpy.__version__ and machine["scipy"] == scipy.__version__ and machine["cpu_model"]
    libraries = {lib["package"]: lib for lib in machine["blas"]}
    assert "numpy" in libraries and all(lib["threads"] >= 1 for lib in machine["blas"])
    assert all(lib["architecture"] for lib in machine["blas"] if lib["library"] == "openblas")
    assert machine["kernel_overrides"] == {}


def test_a_forced_blas_kernel_is_named_with_the_command_that_undoes_it(monkeypatch):
    for name in KERNEL_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    info = machine_info()
    assert info["kernel_overrides"] == {"OPENBLAS_CORETYPE": "Haswell"}
    assert info["blas_environment"]["OPENBLAS_NUM_THREADS"] == "1"
    warning = [line for line in format_machine(info).splitlines() if line.startswith("WARNING")]
    assert len(warning) == 1 and "OPENBLAS_CORETYPE forces" in warning[0]
    assert warning[0].endswith("env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE specbound bench ...")
    assert "OPENBLAS_CORETYPE=Haswell" in format_machine(info)


def test_stage_floors_count_the_necessary_work_of_a_7b_layer():
    """At one flop (byte) per second the floors are the work itself: 3 x 185 GFLOP of Gram (symmetric
    rank-11008 updates of order 4096), 3 x 92 GFLOP of tridiagonal reduction, 64 heads' (1,1) products."""

    unit = {"flops_per_s": 1.0, "bytes_per_s": 1.0}
    floors = {stage: f["seconds"] for stage, f in stage_floors(LLAMA_7B, unit).items()}
    assert floors["gram"] == 3 * 4096**2 * 11008 and round(floors["gram"] / 3e9) == 185
    assert floors["eigenvalues"] == pytest.approx(4 * 4096**3) and floors["norm_1_1"] == 64 * 2 * 4096**2 * 128
    assert floors["read_ff"] == 2 * 3 * 4096 * 11008 and floors["read_attention"] == 2 * 4096 * (2 * 4096 + 2 * 1024)
