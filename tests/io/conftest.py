"""What the tests that talk to a local stand-in for the Hub (support/hub_server.py) share."""

from __future__ import annotations

import pytest

from support.hub_server import isolate_hub_environment


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """``monkeypatch``, with huggingface_hub's cache and home under ``tmp_path`` and no token, offline flag
    or Xet transfer from the environment (:func:`support.hub_server.isolate_hub_environment`)."""
    isolate_hub_environment(monkeypatch, tmp_path)
    return monkeypatch
