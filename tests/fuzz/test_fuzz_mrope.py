"""A hostile ``mrope_section`` (rope_parameters, or the older rope_scaling of type mrope) in an M-RoPE text
tower's config.json ends in a layout whose every rotary pair has an axis 0, 1 or 2, or in one line naming
mrope_section, never in a traceback (docs/rotary.md section 7)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from specbound.archs.model import RotaryLayout
from specbound.archs.registry import builtin_specs
from specbound.archs.rotary import rotary_layout
from specbound.errors import SpecboundError
from support.fuzz import FUZZ, JSON, clean_outcome

D = 8  # head dim: 4 frequencies
SECTIONS = st.one_of(
    JSON,
    st.lists(st.integers(-2, 5), max_size=5),
    st.lists(st.integers(0, 2**70), max_size=3),
    st.sampled_from(
        [
            [1, 2, 1],
            [4, 0, 0],
            [0, 0, 4],
            [1, 1, 1],
            [2, 1, 1, 0],
            [True, 2, 1],
            [1.0, 2, 1],
            [2**63, 0, 0],
            [10**400, 1, 1],
            [],
        ]
    ),
)


def valid(sections, kind):
    if (
        not isinstance(sections, list)
        or not sections
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sections)
    ):
        return False
    return sum(sections) == D // 2 if kind == "sections" else len(sections) == 3


@settings(FUZZ, max_examples=8 * FUZZ.max_examples)  # a pure function: microseconds an example
@given(
    family=st.sampled_from(["qwen2_vl_text", "qwen3_vl_text"]),
    sections=SECTIONS,
    older=st.booleans(),
    positions=st.sampled_from([1, 4, 4096, 2**53]),
)
def test_every_mrope_section_is_read_or_refused_in_one_line(family, sections, older, positions):
    spec = builtin_specs()[family]
    rope = {"mrope_section": sections, "rope_theta": 100.0}
    config = {
        "max_position_embeddings": positions,
        **(
            {"rope_scaling": {"type": "mrope", **rope}}
            if older and family != "qwen3_vl_text"
            else {"rope_parameters": {"rope_type": "default", **rope}}
        ),
    }
    outcome = clean_outcome(rotary_layout, spec, config, D, where="m")
    if valid(sections, spec.rotary_options["mrope"]["kind"]):
        assert isinstance(outcome, RotaryLayout), outcome
        assert len(outcome.axes) == D // 2 and set(outcome.axes) <= {0, 1, 2}
        # every offset vector of the context on the axes used (an unused last axis changes no angle)
        assert outcome.max_offset_count == (2 * positions - 1) ** (max(outcome.axes) + 1)
    else:
        assert isinstance(outcome, SpecboundError), (sections, outcome)
        assert "mrope_section" in str(outcome) and "config.json of m" in str(outcome)
