"""Source patterns (ranges, lists, expressions, wildcards), the Hugging Face cache, config files."""

import os

import pytest

from specbound import SpecboundError
from specbound.tools.miniatures import HUB_PATTERN, write_miniatures
from specbound.sweep.sources import Pattern, cached_model_ids, expand_pattern, expand_sources, load_sweep_config

from support.tiny_models import TINY_PATTERN


def test_the_miniatures_pattern_matches_exactly_the_24_ids():
    pattern = Pattern.parse(HUB_PATTERN)
    good = [f"google/bert_uncased_L-{L}_H-{N}_A-{N // 64}" for L in (2, 4, 6, 8, 10, 12) for N in (128, 256, 512, 768)]
    assert all(pattern.match(g) for g in good)
    assert pattern.match(good[0]) == {"L": 2, "H": 128, "A": 2}
    for bad in (
        "google/bert_uncased_L-12_H-768_A-11",
        "google/bert_uncased_L-14_H-128_A-2",
        "google/bert_uncased_L-2_H-1024_A-16",
        "google/bert_uncased_L-2_H-130_A-2",
        "google/bert_cased_L-2_H-128_A-2",
        "google/bert_uncased_L-2_H-128_A-2/extra",
    ):
        assert pattern.match(bad) is None, bad


@pytest.mark.parametrize(
    "text, candidate, labels",
    [
        ("run/step-{1000..5000..1000}", "run/step-3000", {"step": 3000}),
        ("run/step-{1000..5000..1000}", "run/step-3500", None),
        ("ft/{cola,sst2}-seed{0..2}", "ft/sst2-seed1", {"g0": "sst2", "seed": 1}),
        ("ft/{task=cola,sst2}-*", "ft/cola-anything", {"task": "cola"}),
        ("m/L{L=1..4}-N{N=8,16}-H{N/8}", "m/L2-N16-H2", {"L": 2, "N": 16, "H": 2}),
        ("m/L{L=1..4}-N{N=8,16}-H{N/8}", "m/L2-N16-H3", None),
        ("m/x{3..1}", "m/x2", {"x": 2}),
    ],
)
def test_pattern_groups(text, candidate, labels):
    assert Pattern.parse(text).match(candidate) == labels


@pytest.mark.parametrize(
    "text, needle",
    [
        ("a/{}", "cannot read the pattern group"),
        ("a/{x..y}", "cannot read the pattern group"),
        ("a/{1..3", "unbalanced braces"),
    ],
)
def test_bad_patterns(text, needle):
    with pytest.raises(SpecboundError, match=needle):
        Pattern.parse(text).match("a/1")


def test_unbound_name_in_an_expression():
    with pytest.raises(SpecboundError, match="uses Q"):
        Pattern.parse("a/x{Q/2}").match("a/x1")


def test_expansion_on_the_file_system_is_ordered_and_labelled(tiny_family, monkeypatch):
    monkeypatch.chdir(tiny_family)
    sources = expand_pattern(TINY_PATTERN)
    assert [(s.labels["L"], s.labels["H"]) for s in sources] == [(1, 32), (1, 64), (2, 32), (2, 64), (3, 32), (3, 64)]
    assert sources[0].name == sources[0].target == "bert_uncased_L-1_H-32_A-2"
    # a glob, and the same folders twice: kept once
    both = expand_sources(["bert_uncased_L-1_*", "bert_uncased_L-{1..1}_H-{32,64}_A-{H/16}"])
    assert [s.name for s in both] == ["bert_uncased_L-1_H-32_A-2", "bert_uncased_L-1_H-64_A-4"]
    with pytest.raises(SpecboundError, match="matches no model folder"):
        expand_pattern("bert_uncased_L-{4..9}_H-*")


def test_hub_ids_resolve_from_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    write_miniatures(cache, depths=(2, 4), widths=(64, 128), head_size=32, vocab=16)
    (cache / "models--google--bert_uncased_L-2_H-64_A-2" / "blobs").mkdir()  # as the real cache has
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    assert len(cached_model_ids()) == 4
    sources = expand_pattern("google/bert_uncased_L-{2..12}_H-{64..768}_A-{H/32}")
    assert [s.name.partition("@")[0] for s in sources] == [
        f"google/bert_uncased_L-{L}_H-{N}_A-{N // 32}" for L in (2, 4) for N in (64, 128)
    ]
    for s in sources:  # recorded as ORG/NAME@commit
        assert s.name.partition("@")[2] == os.path.basename(s.target)
    for s in sources:
        assert os.path.isfile(os.path.join(s.target, "model.safetensors")) and "/snapshots/" in s.target
    # a plain id in the cache resolves too; HF_HOME/hub is the fallback location
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    (plain,) = expand_sources(["google/bert_uncased_L-4_H-128_A-4"])
    assert plain.target.endswith(os.path.join("snapshots", plain.target.rsplit("/", 1)[1]))


def test_config_file(tmp_path, tiny_family):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'sources = ["{tiny_family}/{TINY_PATTERN}", "google/some-id"]\nstore = "out"\n'
        "[[options]]\nrank_tol = 1e-12\n[[options]]\ngrid_m = 5\n"
    )
    config = load_sweep_config(cfg)
    assert config.sources == [f"{tiny_family}/{TINY_PATTERN}", "google/some-id"]
    assert config.option_sets == [{"rank_tol": 1e-12}, {"grid_m": 5}]
    assert config.store == str(tmp_path / "out")
    cfg.write_text('sources = ["a"]\n[options]\ngrid = 5\n')
    with pytest.raises(SpecboundError, match="unknown option"):
        load_sweep_config(cfg)
    cfg.write_text('sources = "a"\n')
    with pytest.raises(SpecboundError, match="non-empty list"):
        load_sweep_config(cfg)
    cfg.write_text("sources = [\n")
    with pytest.raises(SpecboundError, match="TOML"):
        load_sweep_config(cfg)
