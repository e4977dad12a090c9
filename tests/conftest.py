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


def _pack_tiny(tmp_path_factory, name, **kw):
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp(name)
    write_hf(tmp / "hf", **kw)
    return pack(tmp / "hf", tmp / "pkg", progress=False)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random-weight llama, packed (the default requantization)."""
    return _pack_tiny(tmp_path_factory, "llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """qwen2 flavour (q/k/v biases), untied LM head, odd sizes: K=72 is not a multiple of the 32-group."""
    return _pack_tiny(tmp_path_factory, "qwen", arch="qwen2", tied=False, hidden_size=72, intermediate_size=100,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=12)
