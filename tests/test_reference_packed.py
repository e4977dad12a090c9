"""Packed (requantized) tiny random HF models: the reference model reading the package equals transformers running
the *same dequantized weights*, written back into the HF model. Checks the package reader path of the reference
(read_tensor / load_weights), half-split RoPE, GQA, qwen2 biases and untied heads end to end.

Run: python -m pytest tests/test_reference_packed.py -v -s
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.oracle

HF_NAMES = {"attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
            "v": "self_attn.v_proj.weight", "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
            "v_bias": "self_attn.v_proj.bias", "o": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
            "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"}


def hf_name(name: str) -> str:
    if name.startswith("layers."):
        _, i, leaf = name.split(".")
        return f"model.layers.{i}.{HF_NAMES[leaf]}"
    return {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}[name]


@pytest.mark.parametrize("arch,tied,asymmetric", [("llama", True, False), ("qwen2", False, True)])
def test_packed_tiny_model_matches_transformers_on_dequantized_weights(tmp_path, arch, tied, asymmetric):
    import torch
    from transformers import AutoModelForCausalLM
    from webinfer.package import Package
    from webinfer_packager.pack.build import pack
    from webinfer_packager.reference.model import ReferenceModel, read_tensor
    from tests.synthetic import write_hf

    src = write_hf(tmp_path / "hf", arch=arch, tied=tied, seed=3)
    package = Package.open(pack(src, tmp_path / "pkg", group_size=32, asymmetric=asymmetric, progress=False))
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, local_files_only=True).eval()
    sd = hf.state_dict()
    deq = {hf_name(n): read_tensor(package, n) for n in package.tensors}
    # the linears really were requantized (else this test would not be about the package's numbers)
    assert np.abs(deq["model.layers.0.self_attn.q_proj.weight"] - sd["model.layers.0.self_attn.q_proj.weight"].numpy()).max() > 1e-4
    assert set(deq) == {k for k in sd if not (tied and k == "lm_head.weight")}
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in deq.items()}, strict=False)
    if tied:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()

    ref = ReferenceModel.from_package(package)
    prompt, n = [5, 77, 123, 9, 250, 31], 24
    ref_out, ref_logits = [], [ref.forward(prompt, 0)[-1]]
    while True:
        ref_out.append(int(np.argmax(ref_logits[-1])))
        if len(ref_out) == n:
            break
        ref_logits.append(ref.forward([ref_out[-1]], len(prompt) + len(ref_out) - 1)[-1])
    with torch.no_grad():
        hf_out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0)[0, len(prompt):].tolist()
        hf_logits = hf(torch.tensor([prompt + ref_out])).logits[0, len(prompt) - 1: len(prompt) - 1 + n].numpy()
    diff = float(np.abs(np.stack(ref_logits) - hf_logits).max())
    print(f"\n{arch} tied={tied} q4a={asymmetric}: max |logit diff| {diff:.2e}, ids {ref_out[:8]}...")
    assert ref_out == hf_out
    assert diff < 1e-4
