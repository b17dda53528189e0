"""Option and config values past Python's int-string limit (4,300 digits): in ``--set``,
``--config``, a sweep TOML's ``[options]`` and the Python API each is one line and exit 2, never the
``ValueError`` of the conversion (or of a message that tried to print the value); integers too
large for a float are refused where a float is computed from them."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import FUZZ, clean_outcome
from support.numpy_bert import write_tiny_bert
from support.one_line import assert_one_line_error, run_cli

import specbound
from specbound.errors import SpecboundError
from specbound.integrations.monitor import BoundMonitor

BIG = "9" * 5000  # one digit past nothing: Python's limit is 4,300


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("opts") / "m", seed=0, L=1, N=8, H=2, d_ff=12)


def test_set_value(model, capsys):
    assert_one_line_error(
        *run_cli(capsys, model, "--set", f"num_hidden_layers={BIG}"),
        ["--set num_hidden_layers", "more than 4,300 digits"],
    )


def test_set_value_in_a_list(model, capsys):
    assert_one_line_error(*run_cli(capsys, model, "--set", f"layer_types=[1, {BIG}]"), ["more than 4,300 digits"])


def test_config_file(model, tmp_path, capsys):
    (tmp_path / "c.json").write_text(f'{{"num_attention_heads": {BIG}}}')
    assert_one_line_error(
        *run_cli(capsys, model, "--config", tmp_path / "c.json"), ["--config", "more than 4,300 digits"]
    )


@pytest.mark.parametrize("option", ["grid_m", "n", "margin", "rank_tol"])
def test_sweep_toml_options(model, tmp_path, capsys, option):
    path = tmp_path / "sweep.toml"
    path.write_text(f'sources = ["{model}"]\n[options]\n{option} = {BIG}\n')
    assert_one_line_error(
        *run_cli(capsys, "--config", path, "--store", tmp_path / "s", "--no-progress", command="sweep"),
        ["sweep.toml", "more than 4,300 digits"],
    )


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(config={"num_hidden_layers": 10**5000}), "config['num_hidden_layers']"),
        (dict(config={"rope_scaling": {"factor": [10**5000]}}), "config['rope_scaling']['factor'][0]"),
        (dict(grid_m=10**5000), "grid_m is an integer of more than"),
        (dict(n=10**5000, margin=0.1), "n (the number of training sequences) is an integer of more than"),
        (dict(n=10, margin=10**5000), "margin is an integer of more than"),
        (dict(n=10, margin=10**400), "margin must be a positive finite number"),
        (dict(n=10**400, margin=0.1), "from 2 to 1e300"),
    ],
)
def test_api_values(model, kwargs, needle):
    outcome = clean_outcome(specbound.analyze, model, threads=1, **kwargs)
    assert isinstance(outcome, SpecboundError) and needle in str(outcome), outcome


DIGITS = st.integers(4000, 6000)


@FUZZ
@given(
    digits=DIGITS,
    where=st.sampled_from(["set", "config", "toml"]),
    key=st.sampled_from(["num_hidden_layers", "hidden_size", "num_attention_heads"]),
    option=st.sampled_from(["grid_m", "n", "margin", "delta"]),
)
def test_long_integers_anywhere(model, tmp_path_factory, capsys, digits, where, key, option):
    """Below the limit a value is checked like any other (its message may quote it); above it the
    value is refused where it is read.  Either way: one line, exit 2."""
    folder = tmp_path_factory.mktemp("long")
    value = "7" * digits
    if where == "set":
        outcome = run_cli(capsys, model, "--set", f"{key}={value}")
    elif where == "config":
        (folder / "c.json").write_text(json.dumps({key: 0}).replace("0", value))
        outcome = run_cli(capsys, model, "--config", folder / "c.json")
    else:
        (folder / "s.toml").write_text(f'sources = ["{model}"]\n[options]\n{option} = {value}\n')
        outcome = run_cli(
            capsys, "--config", folder / "s.toml", "--store", folder / "s", "--no-progress", command="sweep"
        )
    assert_one_line_error(*outcome, [])


CALLBACK_ARGUMENTS = ("bounds", "store", "run_name", "at_start", "quiet")


@given(
    name=st.sampled_from(CALLBACK_ARGUMENTS),
    value=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=8),
        st.lists(st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=3),
        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
        st.binary(max_size=4),
    ),
)
@FUZZ
def test_a_training_callbacks_arguments_are_taken_or_refused_in_one_line(tmp_path_factory, name, value):
    """Every argument of the training callbacks' monitor (bounds, store, run_name, at_start, quiet), any JSON-ish or
    Python value: built, or one SpecboundError line naming the argument, never a TypeError from deep inside."""

    if name == "store" and isinstance(value, str) and value:
        value = str(tmp_path_factory.mktemp("store") / value.replace("/", "_").replace("\0", "_"))
    outcome = clean_outcome(BoundMonitor, 1, **{name: value})
    if isinstance(outcome, SpecboundError):
        assert name in str(outcome)
