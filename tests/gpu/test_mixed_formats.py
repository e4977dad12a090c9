"""A model whose tensors mix formats per tensor, as a GGUF Q4_K_M file does: the GPU model must keep q/k/v and
gate/up of different formats unfused (separate dispatches) and still generate the reference's tokens.

The tiny synthetic package (q4 linears) is re-encoded in memory without changing any weight's value: layer 0's
q as q5_0 (code + 8 with a fifth bit), k as q8 (code - 8, signed), gate as q5_1 (min = -8 * scale); layer 1's
down as q8. The reference model reads the original package, so ids and logits are compared against unchanged
weights.

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


def test_mixed_formats_unfused_match_reference(gpu, tmp_path):
    from tests.synthetic import write_hf
    from webinfer.engine.gpu_model import GPUModel
    from tests.gpu_fixtures import generate_ids
    from webinfer_packager.pack.build import pack
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

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
    ref_model = ReferenceModel.from_package(Package.open(path))
    for prompt in ([5, 17, 200, 33, 1, 9, 250], list(range(3, 40))):
        got = generate_ids(pkg, prompt, 12, runner=runner)
        assert got == generate(ref_model, prompt, 12, Sampler(0.0)), f"prompt {prompt[:5]}"
    prompt = list(range(10, 24))  # one prefill chunk (max_batch_tokens=16)
    asyncio.run(runner.execute(StepBatch([SeqChunk(0, prompt, 0, [3, 1, 5], True)])))
    got = np.array(asyncio.run(runner.logits(1))[0], np.float32)
    ref_model.reset()
    np.testing.assert_allclose(got, ref_model.forward(prompt, 0)[-1], atol=1e-3, rtol=1e-3)
