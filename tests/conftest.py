"""Shared fixtures. GPU fixtures live in tests/gpu_fixtures.py (loaded below) so that CPU-only tests never import wgpu."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.gpu_fixtures"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm2_package(tmp_path_factory) -> Path:
    """The real default model, packed once per test session (or WEBINFER_TEST_PACKAGE to reuse one)."""
    pre = os.environ.get("WEBINFER_TEST_PACKAGE")
    if pre:
        return Path(pre)
    from webinfer_packager.pack.build import pack
    from webinfer_packager.paths import default_gguf_path

    out = tmp_path_factory.mktemp("pkg") / "SmolLM2-135M-Instruct"
    pack(default_gguf_path(), out, progress=False)
    return out


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from webinfer_packager.paths import default_gguf_path

    return default_gguf_path()
