"""GGUF files below 4.5 bits a weight (llama.cpp's Q2_K, Q3_K_M and IQ4_XS downloads: Q2_K, Q3_K, IQ4_NL and
IQ4_XS tensors beside Q4_K..Q6_K) run as themselves: repacked losslessly, and the model they hold generates the
ids transformers generates from the same file, natively on the GPU and on the CPU engine.

One tiny llama mixes all four types (gate and up of different types stay unfused; the tied embedding and LM head
read IQ4_NL). The blocks are written by tests/synthetic.gguf_blocks from ggml's block structs; transformers
dequantizes the file with gguf-py, so it checks the packer's repack independently.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/test_low_bit_gguf.py -q
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests import synthetic
from webinfer.package import Package

KQ = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
MIX = {"linear": "Q3_K", "v": "Q2_K", "down": "IQ4_XS", "gate": "IQ4_NL", "up": "Q5_0", "embed": "IQ4_NL"}
WANT = {"layers.0.q": "q3k", "layers.1.k": "q3k", "layers.0.o": "q3k", "layers.0.v": "q2k", "layers.1.down": "iq4xs",
        "layers.0.gate": "iq4nl", "layers.1.up": "q5_0", "embed": "iq4nl"}
PROMPTS = [[5, 17, 200, 33, 1, 9, 250], list(range(3, 40))]
N = 12


@pytest.fixture(scope="module")
def low_bit(tmp_path_factory):
    """(GGUF path, package path)."""
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("lowbit")
    src = synthetic.write_gguf(tmp / "m.gguf", types=MIX, **KQ)
    return src, pack(src, tmp / "pkg", progress=False)


def _reference(pkg, prompt, n):
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    return generate(ReferenceModel.from_package(pkg), prompt, n, Sampler(0.0))


def test_every_tensor_is_repacked_losslessly(low_bit):
    import gguf
    from gguf.quants import dequantize

    src, path = low_bit
    pkg = Package.open(path)
    raw = {t.name: t for t in gguf.GGUFReader(src).tensors}
    assert {n: pkg.tensors[n].dtype for n in WANT} == WANT
    for name, t in pkg.tensors.items():
        if t.dtype == "f32":
            continue
        assert t.lossless and t.error == {"max_rel": 0.0, "rms_rel": 0.0}, name
    for name, gname, heads in (("layers.0.q", "blk.0.attn_q.weight", 4), ("layers.0.v", "blk.0.attn_v.weight", None),
                               ("layers.1.down", "blk.1.ffn_down.weight", None),
                               ("layers.0.gate", "blk.0.ffn_gate.weight", None), ("embed", "token_embd.weight", None)):
        t = pkg.tensors[name]
        ref = dequantize(raw[gname].data, raw[gname].tensor_type)
        if heads:  # llama.cpp's adjacent-pair rows, undone independently of the packer
            n = ref.shape[0]
            ref = ref.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(n, -1)
        from webinfer_packager.pack import quant

        comps = {c: b"".join(pkg.read_component(name, c, i) for i in range(len(t.bindings))) for c in t.components}
        got = quant.dequantize(t.dtype, comps, t.shape, t.group_size, t.k_padded)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), name
    # the bytes a weight takes, against the GGUF type's: int8 sub-block scales where GGUF packs 6 bits, and two f16
    # d per word (a row of one super-block, K = 256, pads it to a word)
    per_weight = {t.dtype: sum(t.row_bytes(c) for c in t.components) / t.k for t in pkg.tensors.values()}
    assert per_weight["q2k"] == pytest.approx(84 / 256) and per_weight["iq4nl"] == pytest.approx(18 / 32)
    assert per_weight["q3k"] == pytest.approx((64 + 32 + 16 + 4) / 256)  # GGUF: 110
    assert per_weight["iq4xs"] == pytest.approx((256 + 16 + 4) / 512)  # down: K = 512; GGUF: 272


@pytest.mark.oracle
def test_reference_model_generates_what_transformers_generates(low_bit):
    import torch
    from transformers import AutoModelForCausalLM

    src, path = low_bit
    hf = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32).eval()
    pkg = Package.open(path)
    with torch.no_grad():
        for prompt in PROMPTS:
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(prompt):].tolist()
            assert _reference(pkg, prompt, N) == want, prompt[:5]


@pytest.mark.gpu
@pytest.mark.parametrize("ksplit", [1, 8])
def test_gpu_greedy_ids_equal_reference(gpu, low_bit, ksplit):
    from tests.gpu_fixtures import generate_ids, load_runner

    pkg = Package.open(low_bit[1])
    runner = load_runner(pkg, device=gpu, num_blocks=12, block_size=8, max_batch_tokens=16, gemv_ksplit=ksplit)
    for prompt in PROMPTS:  # the 37-token prompt: 3 prefill chunks through the GEMM
        assert generate_ids(pkg, prompt, N, runner=runner) == _reference(pkg, prompt, N), prompt[:5]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_cpu_engine_greedy_ids(low_bit, mode):
    """Exact mode: the reference's ids. Fast mode (int8 activations) is not bit-exact: its logits stay close."""
    from tests.gpu_fixtures import generate_ids
    from webinfer.cpu import load_cpu_runner

    pkg = Package.open(low_bit[1])
    runner = asyncio.run(load_cpu_runner(pkg, mode=mode, threads=1, num_blocks=24, block_size=4, max_batch_tokens=8,
                                         max_seqs=4))
    if mode == "exact":
        for prompt in PROMPTS:
            assert generate_ids(pkg, prompt, N, runner=runner) == _reference(pkg, prompt, N), prompt[:5]
        return
    from webinfer.engine.batch import SeqChunk, StepBatch
    from webinfer_packager.reference.model import ReferenceModel

    prompt = PROMPTS[0]
    runner.full_logits = True
    asyncio.run(runner.execute(StepBatch([SeqChunk(0, prompt, 0, [1, 2], True)])))
    got = np.asarray(runner.logits(1)[0], np.float32)
    ref = ReferenceModel.from_package(pkg).forward(prompt, 0)[-1]
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    assert int(np.argmax(got)) == int(np.argmax(ref))
