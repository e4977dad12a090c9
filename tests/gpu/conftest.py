"""Fixtures of the kernel tests (the devices themselves come from tests/gpu_fixtures.py)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def lib_nosg(gpu):
    """A KernelLibrary on a device without subgroups: the fallback path where every lane loads x itself."""
    from webinfer.gpu.native import request_device_sync
    from webinfer.kernels.library import KernelLibrary

    old = os.environ.get("WEBINFER_DISABLE_SUBGROUPS")
    os.environ["WEBINFER_DISABLE_SUBGROUPS"] = "1"
    try:
        dev = request_device_sync(limits="browser")
    finally:
        if old is None:
            os.environ.pop("WEBINFER_DISABLE_SUBGROUPS", None)
        else:
            os.environ["WEBINFER_DISABLE_SUBGROUPS"] = old
    assert not dev.caps.subgroups
    return KernelLibrary(dev)
