"""The activation table's constants hold for the activations' own definitions (HF's ACT2FN), and an
activation the table does not know is refused with one line naming --l-phi.

On a fine grid (step 1e-4 over [-40, 40], float64 autograd) ``max |phi'|`` never exceeds the table's
``L_phi`` and ``max |phi(t) / t|`` never exceeds its ``c_phi``.  The grid resolves every maximum
(smooth interior maxima to O(step^2) ~ 1e-8, kinks exactly), and the table's values are rounded up
by at least 1e-5: the former SiLU value 1.0998, 4e-5 below its supremum 1.099839, fails here."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
activations = pytest.importorskip("transformers.activations")

import json

from support.one_line import assert_one_line_error, run_cli  # noqa: E402

import specbound
from specbound.compute.propagation import ACTIVATIONS, activation_lipschitz, check_gated_activation  # noqa: E402
from specbound.errors import SpecboundError  # noqa: E402


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_table_constants_bound_the_definitions(name):
    l_phi, c_phi = ACTIVATIONS[name]
    x = torch.linspace(-40.0, 40.0, 800_001, dtype=torch.float64, requires_grad=True)
    phi = activations.ACT2FN[name]
    y = phi(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert float(grad.abs().max()) <= l_phi
    if c_phi is not None:
        t = x.detach()
        nonzero = t != 0
        assert float((y.detach()[nonzero] / t[nonzero]).abs().max()) <= c_phi * (1 + 1e-12)
    assert activation_lipschitz(name) == (l_phi, f"hidden_act={name}")


def test_relu2_has_no_global_constant_and_is_refused():
    x = torch.tensor([10.0, 100.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(activations.ACT2FN["relu2"](x).sum(), x)
    assert np.allclose(grad.numpy(), [20.0, 200.0])  # phi'(t) = 2t: unbounded
    with pytest.raises(SpecboundError, match="--l-phi") as info:
        activation_lipschitz("relu2")
    assert "\n" not in str(info.value)


def test_no_activation_named_takes_gelu_and_says_so():
    l_phi, source = activation_lipschitz(None)
    assert l_phi == 1.13 and source.startswith("default")


def test_a_gated_block_needs_c_phi():
    with pytest.raises(SpecboundError, match="c_phi"):
        check_gated_activation("sigmoid", "gated")
    check_gated_activation("sigmoid", "plain")
    check_gated_activation("silu", "gated")


def test_an_unknown_activation_is_refused_before_any_weight_is_read(healthy, capsys):
    config = json.loads((healthy / "config.json").read_text())
    (healthy / "config.json").write_text(json.dumps({**config, "hidden_act": "relu2"}))
    assert_one_line_error(*run_cli(capsys, healthy), ["'relu2'", "--l-phi"])
    a = specbound.analyze(healthy, l_phi=2.5, threads=1)  # the user's constant, stated
    assert a.options["l_phi"] == 2.5 and a.options["l_phi_source"] == "user"
