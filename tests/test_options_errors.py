"""Analysis options (options.AnalysisOptions, and the flags derived from it): bad values are one line."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from support.one_line import assert_one_line_error, run_cli

import specbound
from specbound import SpecboundError
from specbound.options import KERNEL_OPTIONS, AnalysisOptions

OPTION_CASES = [
    (["--grid-m", "0"], ["--grid-m", "positive integer", "'0'"]),
    (["--grid-m", "-3"], ["--grid-m", "'-3'"]),
    (["--grid-m", "1.5"], ["--grid-m", "'1.5'"]),
    (["--grid-m", "many"], ["--grid-m", "'many'"]),
    (["--rank-tol", "abc"], ["--rank-tol", "'abc'"]),
    (["--rank-tol=-1e-10"], ["rank_tol", "[0, 1)", "-1e-10"]),
    (["--rank-tol", "1"], ["rank_tol", "[0, 1)"]),
    (["--rank-tol", "nan"], ["rank_tol", "nan"]),
    (["--l-phi", "0"], ["l_phi", "positive"]),
    (["--l-phi", "inf"], ["l_phi", "finite", "inf"]),
    (["--threads", "0"], ["--threads", "'0'"]),
    (["--jobs", "0"], ["--jobs", "'0'", "'auto'"]),
    (["--format", "xml"], ["--format", "'xml'"]),
    (["--no-such-option"], ["--no-such-option"]),
]


@pytest.mark.parametrize("args, needles", OPTION_CASES, ids=[" ".join(a) for a, _ in OPTION_CASES])
def test_invalid_option(tiny_bert_dir, capsys, args, needles):
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, *args), needles)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(grid_m=0), "grid_m"),
        (dict(grid_m=1.5), "grid_m"),
        (dict(rank_tol=-1.0), "rank_tol"),
        (dict(rank_tol=float("nan")), "rank_tol"),
        (dict(l_phi=float("inf")), "l_phi"),
        (dict(threads=0), "threads"),
        (dict(method="exact"), "method"),
        (dict(jobs=0), "jobs"),
        (dict(jobs=1.5), "jobs"),
        (dict(jobs="many"), "jobs"),
        (dict(jobs=True), "jobs"),
    ],
)
def test_invalid_option_api(tiny_bert_dir, kwargs, needle):
    with pytest.raises(SpecboundError, match=needle):
        specbound.analyze(tiny_bert_dir, **kwargs)


def test_valid_options_still_work(tiny_bert_dir, capsys):
    rc, out, err = run_cli(capsys, tiny_bert_dir, "--grid-m", "3", "--rank-tol", "0", "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["options"]["grid_m"] == 3 and doc["options"]["rank_tol"] == 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(grid_m=10**9), "from 1 to 10000"),  # a grid that size would not fit in memory
        (dict(grid_m=True), "grid_m"),
        (dict(rank_tol=True), "rank_tol"),
        (dict(l_phi=True), "l_phi"),
        (dict(threads=True), "threads"),
        (dict(n=True, margin=0.1), "n "),
        (dict(n=100, margin=True), "margin"),
    ],
)
def test_absurd_and_boolean_values_are_refused(kwargs, needle):
    with pytest.raises(SpecboundError, match=needle):
        AnalysisOptions(**kwargs)


def test_numpy_scalars_are_numbers():
    opts = AnalysisOptions(rank_tol=np.float32(1e-10), grid_m=np.int64(7), l_phi=np.float64(1.1))
    assert opts.grid_m == 7 and type(opts.grid_m) is int and type(opts.rank_tol) is float


def test_grid_m_beyond_the_bound_is_one_line(tiny_bert_dir, capsys):
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--grid-m", str(10**9)), ["grid_m", "10000"])


def test_no_option_default_outside_options():
    """The kernel options' defaults live in specbound/options.py only: no function elsewhere declares
    a default for a parameter of theirs (it takes a KernelOptions, the value is required, or None
    stands for "not given": the option's own default)."""

    root = Path(specbound.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "options.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                positional = args.posonlyargs + args.args
                defaults = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
                defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
                found += [
                    f"{path.relative_to(root)}:{node.lineno} {node.name}({a.arg}={ast.unparse(d)})"
                    for a, d in defaults
                    if a.arg in KERNEL_OPTIONS and not (isinstance(d, ast.Constant) and d.value is None)
                ]
    assert not found, "option defaults outside options.py:\n" + "\n".join(found)
