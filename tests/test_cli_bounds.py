"""The command line with the baselines, --init and the gap-bound options; the analysis path stays
free of torch/transformers."""

import json
import subprocess
import sys

from specbound.bounds import in_group
from specbound.cli import main


def test_json_document(tiny_pair, capsys):
    src, init = tiny_pair
    assert (
        main(
            [
                "analyze",
                str(src),
                "--init",
                str(init),
                "--n",
                "1000",
                "--margin",
                "0.5",
                "--delta",
                "0.1",
                "--format",
                "json",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["bounds"]) == {"spectral_adaptive", "edelman"}
    rotary_only = {"spectral_adaptive_rotation_blind", "edelman_rotation_blind"}  # a BERT model has no rotary heads
    assert set(doc["baselines"]) == set(in_group("baselines")) - rotary_only
    assert set(doc["adaptive_variants"]) == set(in_group("adaptive_variants")) - rotary_only
    assert doc["adaptive_variants"]["spectral_fixed_p0"] >= doc["bounds"]["spectral_adaptive"]
    assert set(doc["bound_references"]) == set(doc["bounds"]) | set(doc["baselines"]) | set(doc["adaptive_variants"])
    assert doc["gap_bound"]["parameters"]["delta"] == 0.1
    assert set(doc["gap_bound"]["from_init"]) <= set(doc["from_init"])
    layer = doc["layers"][0]
    for key in ("adaptive", "adaptive_p0", "adaptive_p1", "adaptive_p2", "adaptive_three_type", "xi"):
        assert key in layer


def test_text_comparison_table(tiny_pair, capsys):
    src, init = tiny_pair
    assert main(["analyze", str(src), "--init", str(init), "--n", "1000", "--margin", "0.5", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[1]
    for name in in_group("bounds") + in_group("baselines") + in_group("adaptive_variants"):
        if "rotation_blind" not in name:  # only for rotary models
            assert f"\n{name} " in table, name
    assert "from init" in table and "gap" in table and "vacuous" in table
    assert "c_lead=1" in out and "unstated" in out
    assert "adaptivity gain per layer" in out and "per role" in out


def test_bad_gap_option_is_one_line_error(tiny_pair, capsys):
    src, _ = tiny_pair
    assert main(["analyze", str(src), "--n", "1000", "--margin", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specbound: error: margin must be a positive") and err.count("\n") == 1


def test_analysis_path_imports_no_heavy_framework(tiny_pair):
    src, init = tiny_pair
    code = (
        "import sys, specbound\n"
        "from specbound.records.view import format_summary\n"
        f"a = specbound.analyze({str(src)!r}, init={str(init)!r}, n=100, margin=1.0, threads=1)\n"
        "format_summary(a); a.to_json()\n"
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
