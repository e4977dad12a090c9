"""A model whose tensors mix formats per tensor, as a GGUF Q4_K_M file does: the GPU model must keep q/k/v and
gate/up of different formats unfused (separate dispatches) and still generate the reference's tokens.

The tiny synthetic package (q4 linears) is re-encoded in memory without changing any weight's value: layer 0's
q as q5_0 (code + 8 with a fifth bit), k as q8 (code - 8, signed), gate as q5_1 (min = -8 * scale); layer 1's
down as q8. The reference model reads the original package, so ids and logits are compared against unchanged
weights. A second model requantizes some tensors (the embedding among them) to the GGUF-only formats q3k, q2k,
iq4nl and iq4xs; its reference gets those tensors' formats.py values.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_mixed_formats.py -q
"""

import asyncio
import dataclasses

import numpy as np
import pytest

from tests.gpu.quant_ref import _pack_bits
from webinfer.engine.batch import SeqChunk, StepBatch
from webinfer.package import Package

pytestmark = pytest.mark.gpu

CONVERT = {"layers.0.q": "q5_0", "layers.0.k": "q8", "layers.0.gate": "q5_1", "layers.1.down": "q8"}


def _reencode(pkg, name, to):
    t = pkg.tensors[name]
    assert (t.dtype, t.group_size) == ("q4", 32)
    qw = np.frombuffer(pkg.read_component(name, "qweight", 0), np.uint32).reshape(t.rows, -1)
    q = ((qw[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(t.rows, -1).astype(np.int64)
    scales = pkg.read_component(name, "scales", 0)
    if to == "q8":
        return {"qweight": (q - 8).astype(np.int8).tobytes(), "scales": scales}
    if to == "q5_0":
        c = q + 8
        return {"qweight": _pack_bits(c & 15, 4).tobytes(), "qhigh": _pack_bits(c >> 4, 1).tobytes(), "scales": scales}
    s = np.frombuffer(scales, np.float16)
    return {"qweight": qw.tobytes(), "qhigh": bytes(t.rows * t.k_padded // 8), "scales": scales,
            "mins": (s * np.float16(-8)).astype(np.float16).tobytes()}


def _same_as_reference(runner, pkg, ref_model):
    """Greedy ids of two prompts (the second in 3 prefill chunks) and one prefill chunk's logits."""
    from tests.gpu_fixtures import generate_ids
    from webinfer_packager.reference.model import Sampler, generate

    for prompt in ([5, 17, 200, 33, 1, 9, 250], list(range(3, 40))):
        got = generate_ids(pkg, prompt, 12, runner=runner)
        assert got == generate(ref_model, prompt, 12, Sampler(0.0)), f"prompt {prompt[:5]}"
    prompt = list(range(10, 24))  # one prefill chunk (max_batch_tokens=16)
    asyncio.run(runner.execute(StepBatch([SeqChunk(0, prompt, 0, [3, 1, 5], True)])))
    got = np.array(asyncio.run(runner.logits(1))[0], np.float32)
    ref_model.reset()
    np.testing.assert_allclose(got, ref_model.forward(prompt, 0)[-1], atol=1e-3, rtol=1e-3)


def test_mixed_formats_unfused_match_reference(gpu, tmp_path):
    from tests.synthetic import write_hf
    from webinfer.engine.gpu_model import GPUModel
    from webinfer_packager.pack.build import pack
    from webinfer_packager.reference.model import ReferenceModel

    path = pack(write_hf(tmp_path / "hf", arch="llama"), tmp_path / "pkg", quant="q4", progress=False)
    pkg = Package.open(path)
    data = {n: _reencode(pkg, n, to) for n, to in CONVERT.items()}
    for n, to in CONVERT.items():
        pkg.tensors[n] = dataclasses.replace(pkg.tensors[n], dtype=to)

    def read(name, component, binding):
        return data[name][component] if name in data else pkg.read_component(name, component, binding)

    runner = asyncio.run(GPUModel.load(gpu, pkg, num_blocks=12, block_size=8, max_batch_tokens=16, read=read))
    l0, l1 = runner.layers
    assert [d.gemv.dtype for d in l0.qkv] == ["q5_0", "q8", "q4"] and l0.swiglu is not None
    assert len(l1.qkv) == 1 and l1.swiglu is None and l1.down.gemv.dtype == "q8"
    _same_as_reference(runner, pkg, ReferenceModel.from_package(Package.open(path)))


# ----------------------------------------------------------------------------------------------------------
# the GGUF-only formats (q3k, q2k, iq4nl, iq4xs) cannot hold q4 values exactly: their tensors are requantized
# (lossy, a plain round-to-nearest here) and the reference gets the new tensors' formats.py values instead

NEW = {"embed": "iq4xs", "layers.0.q": "q3k", "layers.0.k": "iq4nl", "layers.0.gate": "q2k", "layers.1.o": "q2k",
       "layers.1.down": "iq4xs", "layers.1.up": "q3k"}


def _requantize(dtype, w):
    """A [n, k] float32 matrix as `dtype` components ([n, words] u32), round to nearest per sub-block."""
    from tests.gpu.quant_ref import KV, _bytes_words, _halves, _pack_bits, group_size_of
    from webinfer.formats import k_padded

    n, k = w.shape
    kp = k_padded(k, group_size_of(dtype))
    wp = np.zeros((n, kp), np.float32)
    wp[:, :k] = w
    sub = {"q3k": 16, "q2k": 16, "iq4nl": 32, "iq4xs": 32}[dtype]
    g = wp.reshape(n, kp // sub, sub)
    f16 = lambda a: a.astype(np.float16)  # noqa: E731

    def super_scales(t, lo, top):  # per-sub-block target scales -> (f16 d per 256, integer scales, d * scale)
        d = f16(np.abs(t).reshape(n, kp // 256, -1).max(axis=2) / top)
        dd = np.repeat(d.astype(np.float32), 256 // sub, axis=1)
        sc = np.where(dd > 0, np.round(t / np.where(dd > 0, dd, 1)), 0).clip(lo, top)
        return d, sc, dd * sc.astype(np.float32)

    def nearest_kv(eff):
        return np.abs(eff[..., None, None] * KV - g[..., None]).argmin(axis=-1)

    if dtype == "iq4nl":
        s = f16(np.abs(g).max(axis=2) / 127)
        return {"qweight": _pack_bits(nearest_kv(s.astype(np.float32)).reshape(n, kp), 4), "scales": _halves(s)}
    if dtype == "iq4xs":
        d, sc, eff = super_scales(np.abs(g).max(axis=2) / 127, -32, 31)
        return {"qweight": _pack_bits(nearest_kv(eff).reshape(n, kp), 4),
                "scales": _bytes_words(sc.astype(np.int8)), "super": _halves(d)}
    if dtype == "q3k":
        d, sc, eff = super_scales(np.abs(g).max(axis=2) / 4, -32, 31)
        q = np.where(eff[..., None] != 0, np.round(g / np.where(eff != 0, eff, 1)[..., None]) + 4, 4).clip(0, 7)
        q = q.astype(np.int64).reshape(n, kp)
        return {"qweight": _pack_bits(q & 3, 2), "qhigh": _pack_bits(q >> 2, 1),
                "scales": _bytes_words(sc.astype(np.int8)), "super": _halves(d)}
    lo, hi = np.minimum(g.min(axis=2), 0), g.max(axis=2)  # q2k: value = s * q - m, q in 0..3
    d, sc, eff = super_scales((hi - lo) / 3, 0, 15)
    dmin, mc, m = super_scales(-lo, 0, 15)
    q = np.where(eff[..., None] > 0, np.round((g + m[..., None]) / np.where(eff > 0, eff, 1)[..., None]), 0)
    sup = d.view(np.uint16).astype(np.uint32) | (dmin.view(np.uint16).astype(np.uint32) << 16)
    return {"qweight": _pack_bits(q.clip(0, 3).astype(np.int64).reshape(n, kp), 2),
            "scales": _bytes_words((sc + 16 * mc).astype(np.uint8)), "super": sup}


def test_new_gguf_formats_unfused_match_reference(gpu, tmp_path):
    """q, k, v of layer 0 in q3k / iq4nl / q4 and gate / up in q2k / q4 (unfused); layer 1's o in q2k, gate / up in
    q4 / q3k, down in iq4xs; the tied embedding and LM head in iq4xs (gather and a 300-row head GEMV). Greedy ids
    equal the reference's on the same values, and a prefill chunk's logits match."""
    from tests.gpu.quant_ref import decode
    from tests.synthetic import write_hf
    from webinfer.engine.gpu_model import GPUModel
    from webinfer_packager.pack.build import pack
    from webinfer_packager.reference.model import Config, ReferenceModel, load_weights

    path = pack(write_hf(tmp_path / "hf", arch="llama"), tmp_path / "pkg", quant="q4", progress=False)
    pkg = Package.open(path)
    cfg = Config.from_any(pkg.config)
    weights = load_weights(pkg, cfg)
    data = {}
    for name, to in NEW.items():
        t = pkg.tensors[name]
        assert t.dtype in ("q4", "q8") and len(t.bindings) == 1  # the embedding is q8
        owner = weights if name == "embed" else weights.layers[int(name.split(".")[1])]
        field = name.split(".")[-1]
        comps = _requantize(to, getattr(owner, field))
        setattr(owner, field, decode(to, comps, t.k))
        data[name] = {c: v.tobytes() for c, v in comps.items()}
        gs = 32 if to == "iq4nl" else 256
        pkg.tensors[name] = dataclasses.replace(t, dtype=to, group_size=gs, k_padded=-(-t.k // gs) * gs)

    def read(name, component, binding):
        return data[name][component] if name in data else pkg.read_component(name, component, binding)

    runner = asyncio.run(GPUModel.load(gpu, pkg, num_blocks=12, block_size=8, max_batch_tokens=16, read=read))
    l0, l1 = runner.layers
    assert [d.gemv.dtype for d in l0.qkv] == ["q3k", "iq4nl", "q4"]
    assert [d.gemv.dtype for d in l0.gate_up + l1.gate_up] == ["q2k", "q4", "q4", "q3k"]  # separate SwiGLU
    assert (l1.o.gemv.dtype, l1.down.gemv.dtype) == ("q2k", "iq4xs")
    assert runner.lm_head.dtype == "iq4xs"
    _same_as_reference(runner, pkg, ReferenceModel(cfg, weights))
