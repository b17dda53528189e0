"""What a sweep refuses before any work, on one line with exit status 2: bad sweep configs, bad
patterns, stores it cannot write."""

import json
import pathlib
import shutil
from importlib import resources

import pytest
from support.one_line import assert_one_line_error, run_cli
from support.tiny_models import TINY_PATTERN

import specbound.sweep.run
from specbound.errors import SpecboundError
from specbound.sweep.run import iter_tasks, plan_task, read_header, run_sweep
from specbound.sweep.sources import Pattern, Source, load_sweep_config
from specbound.sweep.store import Store, file_sha256


def _toml(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


BAD_CONFIGS = {
    "not utf-8": (b'sources = ["\xff\xfe"]\n', ["not UTF-8"]),
    "deeply nested": ("a = " + "[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
    "not toml": ("sources = [\n", ["as TOML"]),
    "bad grid_m": ('sources = ["m"]\n[options]\ngrid_m = "x"\n', ["grid_m", "'x'"]),
    "huge grid_m": ('sources = ["m"]\n[options]\ngrid_m = 1000000000\n', ["grid_m", "10000"]),
    "boolean rank_tol": ('sources = ["m"]\n[options]\nrank_tol = true\n', ["rank_tol", "True"]),
    "list method": ('sources = ["m"]\n[options]\nmethod = ["dense"]\n', ["method", "['dense']"]),
    "missing arch spec": ('sources = ["m"]\n[options]\narch_spec = "nope.json"\n', ["nope.json", "not found"]),
    "bad arch spec": ('sources = ["m"]\n[options]\narch_spec = "spec.json"\n', ["spec.json", "JSON object"]),
    "sources not a list": ('sources = "m"\n', ["'sources' must be a non-empty list"]),
    "store a number": ('sources = ["m"]\nstore = 5\n', ["'store' must be a folder name"]),
    "unknown key": ('sources = ["m"]\nworkers = 3\n', ["unknown key(s) workers"]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_sweep_config_is_one_line_exit_2(tmp_path, capsys, case):
    """Bad values in a sweep TOML exited 1 (each source failing), a non-UTF-8 or deeply nested file
    raised a traceback."""
    text, needles = BAD_CONFIGS[case]
    (tmp_path / "spec.json").write_text("[1, 2]")
    path = _toml(tmp_path, text)
    assert_one_line_error(
        *run_cli(capsys, "--config", path, "--store", tmp_path / "s", command="sweep"),
        [str(path), *needles] if case not in ("not utf-8", "deeply nested", "not toml") else needles,
    )


def test_arch_spec_in_a_config_is_relative_to_the_config(tiny_family, tmp_path):
    (tmp_path / "specs").mkdir()
    spec = resources.files("specbound.archs").joinpath("data", "bert.json").read_text()
    (tmp_path / "specs" / "bert.json").write_text(spec)
    path = _toml(tmp_path, f'sources = ["{tiny_family}"]\n[options]\narch_spec = "specs/bert.json"\n')
    config = load_sweep_config(path)
    assert config.option_sets == [{"arch_spec": str(tmp_path / "specs" / "bert.json")}]


@pytest.mark.parametrize(
    "pattern, needle",
    [
        ("m_L-{1..3}_H-{L**2}", "found Pow"),
        ("m_L-{1..3}_H-{L.real}", "found Attribute"),
        ("m_{True}", "found Constant"),
        ("m_{__import__('os')}", "found Call"),
        ("m_{" + "(" * 300 + "1" + ")" * 300 + "}", "cannot read the pattern group"),
    ],
)
def test_pattern_expressions_are_checked_when_parsed(pattern, needle):
    with pytest.raises(SpecboundError, match=needle.replace("(", r"\(")):
        Pattern.parse(pattern)


def test_pattern_division_by_zero_matches_nothing():
    pattern = Pattern.parse("m_L-{1..3}_H-{L//0}")
    assert pattern.match("m_L-2_H-4") is None


def test_sweep_pattern_with_a_power_is_one_line(tiny_family, tmp_path, capsys):
    assert_one_line_error(
        *run_cli(
            capsys, str(tiny_family) + "/bert_uncased_L-{1..3}_H-{L**2}", "--store", tmp_path / "s", command="sweep"
        ),
        ["{L**2}", "found Pow"],
    )


def test_an_unwritable_store_fails_before_any_analysis(tiny_family, tmp_path, capsys, monkeypatch):
    """Simulated (the tests may run as root): the store's folders cannot be created."""

    def deny(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "mkdir", deny)
    monkeypatch.setattr(specbound.sweep.run, "analyze_task", lambda *a, **k: pytest.fail("analysed"))
    source = tiny_family / TINY_PATTERN.replace("{1..3}", "1").replace("{32..64}", "32").replace("{H/16}", "2")
    assert_one_line_error(
        *run_cli(capsys, source, "--store", tmp_path / "s", command="sweep"),
        ["cannot write to the results store", "Permission denied"],
    )


def test_a_store_below_a_file(tiny_family, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    source = next(tiny_family.iterdir())
    assert_one_line_error(
        *run_cli(capsys, source, "--store", tmp_path / "file" / "store", command="sweep"),
        ["cannot write to the results store", "Not a directory"],
    )


def test_sweep_over_a_missing_arch_spec_flag_is_one_line(tiny_family, tmp_path, capsys):
    source = next(tiny_family.iterdir())
    assert_one_line_error(
        *run_cli(capsys, source, "--store", tmp_path / "s", "--arch-spec", tmp_path / "no.json", command="sweep"),
        ["no.json", "not found"],
    )


def test_the_digest_cache_unreadable_is_only_a_cache(tiny_family, tmp_path):
    source = next(tiny_family.iterdir())
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "digests.json").write_text(json.dumps([1, 2]))
    report = run_sweep([Source("m", str(source))], tmp_path / "s", progress=False)
    assert len(report.written) == 1
    shutil.rmtree(tmp_path / "s" / "records")
    (tmp_path / "s" / "digests.json").write_bytes(b"\xff" * 100)
    assert len(run_sweep([Source("m", str(source))], tmp_path / "s", progress=False).written) == 1


def test_damaged_digest_entries_are_hashed_again(tiny_family, tmp_path):
    source = next(tiny_family.iterdir())
    st = Store(tmp_path / "s")
    st._ensure()
    expected = plan_task(Source("m", str(source)), {}).key
    cache = {}

    file_sha256(source / "model.safetensors", cache)
    (key,) = cache
    for bad in (5, None, "not a digest", "0" * 63, ["x"]):
        (st.root / "digests.json").write_text(json.dumps({key: bad}))
        assert st.load_digests() == {}

    (st.root / "digests.json").write_text(json.dumps({key: 5}))
    (task,) = iter_tasks([read_header(Source("m", str(source)), {})], st)
    assert task.key == expected
