"""Each model family (tests/families.py), built with transformers' own class, packed through the HF source, run on
the numpy reference model: greedy ids over 32 tokens and the logits of every step equal transformers (float32)
running the package's dequantized weights.

The reference decodes token by token (KV cache, sliding windows in decode); transformers runs the whole sequence
at once, so its argmax at every position is its own greedy choice given the same prefix.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.families import FAMILIES

pytestmark = pytest.mark.oracle

PROMPT = [5, 77, 123, 9, 250, 31, 14, 200]
N = 32


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """family -> (transformers model holding the package's weights, Package)."""
    from webinfer.package import Package
    from webinfer_packager.pack.build import pack
    from tests.families import build, load_package_weights, save

    out = {}

    def get(family):
        if family not in out:
            tmp = tmp_path_factory.mktemp(family)
            hf = build(family)
            pkg = Package.open(pack(save(hf, tmp / "hf"), tmp / "pkg", progress=False))
            load_package_weights(hf, pkg)
            out[family] = (hf, pkg)
        return out[family]

    return get


def reference_greedy(pkg, prompt, n):
    from webinfer_packager.reference.model import ReferenceModel

    ref = ReferenceModel.from_package(pkg)
    ids, logits = [], [ref.forward(prompt, 0)[-1]]
    while True:
        ids.append(int(np.argmax(logits[-1])))
        if len(ids) == n:
            return ids, np.stack(logits)
        logits.append(ref.forward([ids[-1]], len(prompt) + len(ids) - 1)[-1])


def hf_logits(hf, ids):
    import torch

    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_equals_transformers(packed, family):
    hf, pkg = packed(family)
    ids, logits = reference_greedy(pkg, PROMPT, N)
    want = hf_logits(hf, PROMPT + ids)[len(PROMPT) - 1: len(PROMPT) - 1 + N]  # [N, V]
    diff = float(np.abs(logits - want).max())
    print(f"\n{family}: max |logit diff| {diff:.2e}, ids {ids[:10]}...")
    assert ids == [int(i) for i in np.argmax(want, axis=-1)], family
    assert diff < 1e-4, family


@pytest.fixture(scope="module")
def packed_gguf(tmp_path_factory):
    """family -> (transformers model holding the GGUF package's weights, Package), packed from a GGUF."""
    from webinfer.package import Package
    from webinfer_packager.pack.build import pack
    from tests.families import GGUF_OVERRIDES, build, load_package_weights, write_gguf_from_hf

    out = {}

    def get(family):
        if family not in out:
            tmp = tmp_path_factory.mktemp(family + "-gguf")
            hf = build(family, **GGUF_OVERRIDES.get(family, {}))
            pkg = Package.open(pack(write_gguf_from_hf(hf, family, tmp / "m.gguf"), tmp / "pkg", progress=False))
            load_package_weights(hf, pkg)
            out[family] = (hf, pkg)
        return out[family]

    return get


@pytest.mark.parametrize("family", ["llama3", "qwen3", "gemma2", "gemma3", "phi3"])
def test_gguf_reference_equals_transformers(packed_gguf, family):
    """The same families packed from a GGUF (llama.cpp's names, Q/K permutation, Gemma's 1 + w norms, Llama 3.1's
    rope_freqs tensor, Gemma's fixed layer patterns, Phi-3's fused attn_qkv / ffn_up and LongRoPE factor tensors)
    give the model transformers runs."""
    hf, pkg = packed_gguf(family)
    if family == "llama3":
        assert pkg.config.rope_scaling["rope_type"] == "freq_factors"
    if family == "gemma3":
        assert pkg.config.layer_types[5] == "full_attention" and pkg.config.is_sliding(4)
    if family == "phi3":
        assert pkg.config.rope_scaling["rope_type"] == "longrope" and pkg.config.max_position_embeddings == 128
    if family == "gemma2":
        assert (pkg.config.attn_logit_softcapping, pkg.config.final_logit_softcapping) == (2.0, 5.0)
        assert pkg.config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    ids, logits = reference_greedy(pkg, PROMPT, N)
    want = hf_logits(hf, PROMPT + ids)[len(PROMPT) - 1: len(PROMPT) - 1 + N]
    diff = float(np.abs(logits - want).max())
    print(f"\n{family} (gguf): max |logit diff| {diff:.2e}, ids {ids[:10]}...")
    assert ids == [int(i) for i in np.argmax(want, axis=-1)], family
    assert diff < 1e-4, family


def test_family_configs(packed):
    """What the packer read from each config (the features the comparison above exercises are really on)."""
    c = {f: packed(f)[1].config for f in FAMILIES}
    assert c["llama3"].rope_scaling["rope_type"] == "llama3"
    assert c["qwen3"].qk_norm and not c["qwen3"].attention_bias
    g2 = c["gemma2"]
    assert (g2.activation, g2.post_norms, g2.attn_logit_softcapping, g2.final_logit_softcapping) == ("gelu_tanh", True, 2.0, 5.0)
    assert g2.query_pre_attn_scalar == 24 and g2.embedding_multiplier == 8.0 and g2.tie_word_embeddings
    assert g2.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    g3 = c["gemma3"]
    assert g3.qk_norm and g3.rope_local_theta == 10000.0 and g3.rope_theta == 1e6 and g3.sliding_window == 6
    assert c["phi3"].rope_scaling["rope_type"] == "longrope" and c["phi3"].max_position_embeddings == 128
    assert c["mistral"].layer_types == ("sliding_attention",) * 3 and c["mistral"].sliding_window == 6
    assert len(PROMPT) + N > c["mistral"].sliding_window  # windows are shorter than the generation


def test_reference_rope_matches_transformers_init():
    """rope_inv_freq and the LongRoPE attention factor agree with transformers' own RoPE initialisation."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tests.families import config
    from webinfer_packager.reference.model import rope_attention_factor, rope_inv_freq

    cfg = config("phi3")
    inv, att = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu")
    rp = cfg.rope_parameters
    scaling = {"rope_type": "longrope", "short_factor": rp["short_factor"], "long_factor": rp["long_factor"],
               "original_max_position_embeddings": 128, "attention_factor": att}
    np.testing.assert_allclose(rope_inv_freq(10000.0, 16, scaling), inv.numpy(), rtol=1e-6)
    assert att > 1.0 and rope_attention_factor(scaling) == att
    cfg = config("llama3")
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    rp = cfg.rope_parameters
    scaling = {"rope_type": "llama3", **{k: rp[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                            "original_max_position_embeddings")}}
    np.testing.assert_allclose(rope_inv_freq(500000.0, 16, scaling), inv.numpy(), rtol=1e-6)
    # a GGUF's rope_freqs (llama.cpp's precomputed divisors) give the same frequencies
    from tests.families import llama3_rope_freqs

    factors = {"rope_type": "freq_factors", "factors": llama3_rope_freqs(rp, 16)}
    np.testing.assert_allclose(rope_inv_freq(500000.0, 16, factors), inv.numpy(), rtol=1e-6)
