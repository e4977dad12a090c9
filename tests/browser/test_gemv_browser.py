"""The quantized Linear kernels (webinfer/kernels/linear.py: gemv.wgsl for decode rows, gemm.wgsl for prefill
rows) on the browser's WebGPU device (Chromium, SwiftShader, through Pyodide), against numpy, for the INT4/INT8
formats and the GGUF K-quant, Q5 and IQ4 layouts: weights from random codes (tests/gpu/quant_ref.py), the reference is
their formats.py values times x in float64. A guard region after y must come back untouched, and padding columns
of x are NaN so reading past K would show.

One worker runs every case (Pyodide starts once)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from .conftest import attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CASES = [("q4", "gemv", 72, 320, 3), ("q4", "gemv", 37, 77, 1), ("q4a", "gemv", 40, 576, 2),
         ("q8", "gemv", 24, 96, 1), ("q4", "gemm", 64, 256, 5), ("q4a", "gemm", 36, 100, 7),
         ("q4k", "gemv", 40, 512, 2), ("q6k", "gemv", 24, 300, 1), ("q5_0", "gemv", 37, 96, 3),
         ("q5k", "gemm", 36, 256, 6), ("q3k", "gemv", 40, 512, 2), ("q2k", "gemm", 36, 256, 6),
         ("iq4nl", "gemv", 37, 96, 3), ("iq4xs", "gemm", 24, 300, 5)]
GUARD = b"\xab" * 256


def _case(dtype, kernel, n, k, t, seed):
    from tests.gpu.quant_ref import group_size_of, random_weight
    from webinfer.kernels.linear import pack_meta

    rng = np.random.default_rng(seed)
    gs = group_size_of(dtype)
    comps, w = random_weight(dtype, n, k, gs, seed)
    w = w.astype(np.float64)
    xs = -(-k // 4) * 4 + 4  # a stride with padding columns
    x = np.full((t, xs), np.nan, np.float32)
    x[:, :k] = rng.standard_normal((t, k))
    ref = x[:, :k].astype(np.float64) @ w.T
    b64 = lambda a: base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()  # noqa: E731
    spec = {"dtype": dtype, "kernel": kernel, "n": n, "k": k, "t": t, "group_size": gs, "x_stride": xs,
            "qweight": b64(comps["qweight"]), "meta": base64.b64encode(pack_meta(dtype, {c: v.tobytes() for c, v in
                                                                                        comps.items()}, n)).decode(),
            "x": b64(x)}
    if "qhigh" in comps:
        spec["qhigh"] = b64(comps["qhigh"])
    return spec, ref


def test_linear_kernels_in_browser_match_numpy(served, browser):
    cases = [_case(*c, seed=i) for i, c in enumerate(CASES)]
    logs: list[str] = []
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "index.html")
    res = page.evaluate("""async (cases) => {
        const w = await import("./webinfer.js");
        return await w.selftest("gemv", {cases});
    }""", [spec for spec, _ in cases])
    assert len(res["results"]) == len(CASES), (res, logs)
    for (dtype, kernel, n, k, t), (_, ref), out in zip(CASES, cases, res["results"]):
        raw = base64.b64decode(out["y"])
        assert out["y_bytes"] == 4 * t * n and raw[4 * t * n:] == GUARD, f"{dtype} {kernel}: guard region written"
        y = np.frombuffer(raw[: 4 * t * n], np.float32).reshape(t, n)
        # f32 sums in the kernel's order vs float64: about sqrt(K) ulps of outputs of size ~sqrt(K)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=4e-4 * np.sqrt(k), err_msg=f"{dtype} {kernel} {n}x{k} T={t}")
    print("browser linear kernels:", ", ".join(f"{c[0]}/{c[1]} {c[2]}x{c[3]} T={c[4]} {o['ms']:.1f} ms"
                                                 for c, o in zip(CASES, res["results"])), res["device"]["adapter"])
