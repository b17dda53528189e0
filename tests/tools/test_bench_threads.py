"""``specbound bench --scenario threads``: every contender runs, in interleaved rounds, on the same
numbers (a benchmark, not a timed test: nothing here depends on the times)."""

from specbound.tools.bench_threads import CONTENDERS, format_threads_bench, run_threads_bench


def test_every_contender_is_timed_and_gives_the_same_bounds(tiny_bert_dir):
    report = run_threads_bench(repeats=2, load=1, source=tiny_bert_dir, max_load_seconds=30)
    assert [row["contender"] for row in report["rows"]] == list(CONTENDERS)
    assert all(row["runs"] == 2 and 0 < row["min_s"] <= row["median_s"] <= row["max_s"] for row in report["rows"])
    assert report["rows"][1]["ratio_to_threads_1"] == 1.0 and report["same_numbers"]
    text = format_threads_bench(report)
    assert "1 busy process(es)" in text and all(label in text for label in CONTENDERS)
    assert max(len(line) for line in text.splitlines()) <= 100
