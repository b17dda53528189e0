"""Hostile vision-tower configs (docs/rotary.md section 9): whatever config.json holds in the keys a 2D rotary
layout reads (image_size, patch_size, window_size, spatial_merge_size, fullatt_block_indexes, rope_parameters,
rope_theta, head_dim), reading it gives every layer a valid layout or one line naming what is wrong; a saved tower
with such a config analyses or says so in one line (never a traceback, a hang or an offset list the grid cannot
hold)."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.families import save_family
from support.fuzz import FUZZ, JSON, clean_outcome

import specbound
from specbound.archs.model import RotaryLayout
from specbound.archs.registry import builtin_specs
from specbound.archs.rotary import rotary_layouts
from specbound.errors import SpecboundError

FAMILIES = ("pixtral_vision", "qwen2_vl_vision", "qwen2_5_vl_vision", "qwen3_vl_vision", "llama4_vision")
KEYS = (
    "image_size",
    "patch_size",
    "window_size",
    "spatial_merge_size",
    "fullatt_block_indexes",
    "rope_parameters",
    "rope_theta",
    "head_dim",
)
VALUES = st.one_of(
    JSON,
    st.sampled_from(
        [
            math.inf,
            -math.inf,
            math.nan,
            True,
            0,
            -14,
            14,
            16,
            56,
            112,
            448,
            2**53,
            2**53 + 1,
            10**400,
            [448, 336],
            [14],
            [0, 1],
            [2**62],
            {"rope_type": "axial"},
            {"rope_theta": math.inf, "rope_type": "axial"},
            {"rope_type": "mrope"},
        ]
    ),
    st.integers(-(2**70), 2**70),
)
CONFIGS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=len(KEYS))


@FUZZ
@given(family=st.sampled_from(FAMILIES), config=CONFIGS, d_head=st.sampled_from([8, 10, 64]), layers=st.integers(1, 6))
def test_any_vision_config_reads_to_valid_layouts_or_one_line(family, config, d_head, layers):
    outcome = clean_outcome(rotary_layouts, builtin_specs()[family], config, d_head, layers, where="m")
    if isinstance(outcome, SpecboundError):
        assert "config.json of m" in str(outcome)
        return
    assert len(outcome) == layers
    for layout in outcome:
        assert isinstance(layout, RotaryLayout) and layout.axes is not None and len(layout.axes) == d_head // 2
        assert all(isinstance(g, int) and 0 < g for g in layout.grid) and layout.max_offset_count >= 1
        assert math.isfinite(layout.base) and layout.base > 0


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    root = tmp_path_factory.mktemp("towers")
    for name in FAMILIES:
        save_family(name, root / name, layers=1)
    return root


@FUZZ
@given(family=st.sampled_from(FAMILIES), changes=CONFIGS)
def test_a_saved_tower_with_any_config_analyses_or_is_one_line(towers, tmp_path_factory, family, changes):
    folder = tmp_path_factory.mktemp("hostile")
    for item in (towers / family).iterdir():
        (folder / item.name).symlink_to(item)
    (folder / "config.json").unlink()
    config = {**json.loads((towers / family / "config.json").read_text()), **changes}
    (folder / "config.json").write_text(json.dumps(config))
    outcome = clean_outcome(specbound.analyze, folder, threads=1)
    if not isinstance(outcome, SpecboundError):
        assert outcome.model["rotary"] is not None and math.isfinite(outcome.bounds["spectral_adaptive"])
