"""The numpy reference model's blocks, KV cache and sampler, against independent references
(plain loops, algebraic identities, and Hugging Face transformers on tiny random models).

Run: python -m pytest tests/test_reference.py -v
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from webinfer_packager.reference.model import (Config, LayerWeights, ReferenceModel, Sampler, Weights, attention, generate,
                                         rmsnorm, rope, rope_inv_freq, softmax, swiglu)

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


def tiny_config(**kw) -> Config:
    base = dict(architecture="llama", vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False, eos_token_ids=[3])
    base.update(kw)
    return Config(**base)


def random_weights(cfg: Config, seed: int = 0) -> Weights:
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    D, F, qd, kd = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    layers = [LayerWeights(attn_norm=1 + r(D), q=r(qd, D), k=r(kd, D), v=r(kd, D), o=r(D, qd), ffn_norm=1 + r(D),
                           gate=r(F, D), up=r(F, D), down=r(D, F),
                           q_bias=r(qd) if cfg.attention_bias else None, k_bias=r(kd) if cfg.attention_bias else None,
                           v_bias=r(kd) if cfg.attention_bias else None)
              for _ in range(cfg.num_hidden_layers)]
    return Weights(embed=r(cfg.vocab_size, D), layers=layers, norm=1 + r(D),
                   lm_head=None if cfg.tie_word_embeddings else r(cfg.vocab_size, D))


# --- blocks ---------------------------------------------------------------------------------------------------


def test_rmsnorm_matches_definition():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 10)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    want = np.array([[x[i, j] / math.sqrt(sum(v * v for v in x[i]) / 10 + 1e-5) * w[j] for j in range(10)] for i in range(3)])
    np.testing.assert_allclose(rmsnorm(x, w, 1e-5), want, rtol=1e-5)


def test_softmax_survives_huge_logits():
    p = softmax(np.array([1e4, 1e4 - 1.0, -1e4], dtype=np.float32))
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[:2], [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))], rtol=1e-6)


def test_rope_is_a_rotation_with_relative_positions():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((1, 1, 16)).astype(np.float32), rng.standard_normal((1, 1, 16)).astype(np.float32)
    # half-split pairing: rotating by position 1 mixes x[i] with x[i+8] only
    e = np.zeros((1, 1, 16), np.float32); e[0, 0, 3] = 1.0
    r = rope(e, np.array([1]), 100.0, 16)[0, 0]
    assert set(np.nonzero(np.abs(r) > 1e-7)[0]) == {3, 11}
    # norms preserved, and q.k depends only on the position difference
    dots = []
    for p in (0, 5, 40):
        rq, rk = rope(q, np.array([p + 7]), 100.0, 16), rope(k, np.array([p]), 100.0, 16)
        np.testing.assert_allclose(np.linalg.norm(rq), np.linalg.norm(q), rtol=1e-5)
        dots.append(float((rq * rk).sum()))
    np.testing.assert_allclose(dots, dots[0], rtol=1e-4)


def test_attention_matches_loops_with_gqa_and_causal_mask():
    rng = np.random.default_rng(3)
    T, S, H, Hkv, hd, start = 3, 7, 4, 2, 5, 4
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k, v = rng.standard_normal((S, Hkv, hd)).astype(np.float32), rng.standard_normal((S, Hkv, hd)).astype(np.float32)
    pos = np.arange(start, start + T)
    out = attention(q, k, v, pos)
    for t in range(T):
        for h in range(H):
            kv = h // (H // Hkv)
            s = [float(q[t, h] @ k[j, kv]) / math.sqrt(hd) for j in range(pos[t] + 1)]
            w = np.exp(np.array(s) - max(s)); w /= w.sum()
            np.testing.assert_allclose(out[t, h], sum(w[j] * v[j, kv] for j in range(len(s))), rtol=1e-5, atol=1e-6)


def test_swiglu():
    g, u = np.array([-2.0, 0.0, 3.0], np.float32), np.array([1.0, 5.0, 2.0], np.float32)
    np.testing.assert_allclose(swiglu(g, u), [-2 / (1 + math.e**2), 0.0, 2 * 3 / (1 + math.e**-3)], rtol=1e-6)


# --- KV cache -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
def test_prefill_then_decode_equals_token_by_token(bias):
    cfg = tiny_config(attention_bias=bias, architecture="qwen2" if bias else "llama", rope_scaling=LLAMA3_SCALING)
    m = ReferenceModel(cfg, random_weights(cfg))
    ids = [5, 17, 2, 60, 33, 8, 91, 4]
    full = m.forward(ids, 0)                                   # [8, V] one causal prefill
    m.reset()
    steps = np.concatenate([m.forward(ids[:5], 0)] + [m.forward([t], 5 + i) for i, t in enumerate(ids[5:])])
    np.testing.assert_allclose(steps, full, rtol=1e-4, atol=1e-5)
    m.reset()
    one = np.concatenate([m.forward([t], i) for i, t in enumerate(ids)])
    np.testing.assert_allclose(one, full, rtol=1e-4, atol=1e-5)
    # the last position's logits depend on the earlier tokens (the cache is actually used)
    m.reset()
    other = m.forward([6] + ids[1:], 0)
    assert np.abs(other[-1] - full[-1]).max() > 1e-3


def test_forward_rejects_wrong_start_pos_and_overflow():
    from webinfer.errors import ContextOverflowError

    cfg = tiny_config()
    m = ReferenceModel(cfg, random_weights(cfg), max_seq_len=4)
    m.forward([1, 2], 0)
    with pytest.raises(ValueError, match="start_pos=5"):
        m.forward([1], 5)
    with pytest.raises(ContextOverflowError):
        m.forward([1, 2, 3], 2)


# --- sampler --------------------------------------------------------------------------------------------------


def test_sampler_greedy_lowest_id_on_ties():
    assert Sampler(0.0).sample(np.array([0.1, 3.0, -1.0, 3.0], np.float32)) == 1


def test_sampler_seeded_and_degenerate_cases_are_greedy():
    rng = np.random.default_rng(4)
    logits = [rng.standard_normal(50).astype(np.float32) * 3 for _ in range(30)]
    run = lambda seed: [s.sample(z) for s in [Sampler(0.9, top_k=20, top_p=0.9, seed=seed)] for z in logits]  # noqa: E731
    a = run(7)
    assert a == run(7)                                         # same seed, same stream
    assert a != run(8)
    greedy = [int(np.argmax(z)) for z in logits]
    s1, s2 = Sampler(1.5, top_k=1, seed=1), Sampler(1.5, top_p=1e-6, seed=1)
    assert [s1.sample(z) for z in logits] == greedy
    assert [s2.sample(z) for z in logits] == greedy


def test_sampler_distribution_follows_filtered_softmax():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))
    # top-k 3 keeps ids 0,1,2 -> renormalised 0.5/0.85, 0.2/0.85, 0.15/0.85; top-p 0.6 then keeps 0 and 1
    s = Sampler(1.0, top_k=3, top_p=0.6, seed=3)
    np.testing.assert_allclose(s.probs(logits), [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], rtol=1e-6)
    s = Sampler(2.0, seed=3)
    want = softmax(logits.astype(np.float64) / 2.0)
    counts = np.bincount([s.sample(logits) for _ in range(20000)], minlength=5) / 20000
    np.testing.assert_allclose(counts, want, atol=0.015)


def test_generate_stops_at_eos_and_max_tokens():
    cfg = tiny_config()
    w = random_weights(cfg)
    m = ReferenceModel(cfg, w)
    out = generate(m, [1, 2, 3], 6, Sampler(0.0))
    assert len(out) == 6
    eos = out[2]
    first = out.index(eos)
    assert generate(m, [1, 2, 3], 6, Sampler(0.0), eos_ids=[eos]) == out[: first + 1]


# --- against Hugging Face transformers on tiny random models --------------------------------------------------


def hf_weights(model, cfg: Config) -> Weights:
    """The HF model's own weights in the reference layout (HF q/k rows are already half-split)."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        layers.append(LayerWeights(
            attn_norm=sd[p + "input_layernorm.weight"], q=sd[p + "self_attn.q_proj.weight"],
            k=sd[p + "self_attn.k_proj.weight"], v=sd[p + "self_attn.v_proj.weight"], o=sd[p + "self_attn.o_proj.weight"],
            ffn_norm=sd[p + "post_attention_layernorm.weight"], gate=sd[p + "mlp.gate_proj.weight"],
            up=sd[p + "mlp.up_proj.weight"], down=sd[p + "mlp.down_proj.weight"],
            q_bias=sd.get(p + "self_attn.q_proj.bias"), k_bias=sd.get(p + "self_attn.k_proj.bias"),
            v_bias=sd.get(p + "self_attn.v_proj.bias")))
    return Weights(embed=sd["model.embed_tokens.weight"], layers=layers, norm=sd["model.norm.weight"],
                   lm_head=None if cfg.tie_word_embeddings else sd["lm_head.weight"])


@pytest.mark.oracle
@pytest.mark.parametrize("flavour", ["llama", "llama3-rope", "qwen2"])
def test_matches_transformers_on_tiny_random_model(flavour):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=256,
                  tie_word_embeddings=flavour == "qwen2")
    scaling = LLAMA3_SCALING if flavour == "llama3-rope" else None
    if flavour == "qwen2":
        hf = Qwen2ForCausalLM(Qwen2Config(rope_theta=10000.0, **common))
    else:
        rp = {"rope_theta": 500000.0, **(scaling or {"rope_type": "default"})}
        hf = LlamaForCausalLM(LlamaConfig(rope_parameters=rp, **common))
    hf.eval()
    with torch.no_grad():  # random init has tiny norms weights = 1; perturb them so the test sees them
        for n, p in hf.named_parameters():
            if n.endswith("norm.weight") or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    cfg = tiny_config(architecture="qwen2" if flavour == "qwen2" else "llama", head_dim=8, attention_bias=flavour == "qwen2",
                      tie_word_embeddings=flavour == "qwen2", rope_theta=10000.0 if flavour == "qwen2" else 500000.0,
                      rope_scaling=scaling)
    m = ReferenceModel(cfg, hf_weights(hf, cfg))
    ids = list(np.random.default_rng(5).integers(0, 97, 150))
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    got = m.forward(ids, 0)
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    # rope_inv_freq agrees with transformers' own rope initialisation
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if scaling:
        inv, _ = ROPE_INIT_FUNCTIONS["llama3"](hf.config, "cpu")
        np.testing.assert_allclose(rope_inv_freq(500000.0, 8, scaling), inv.numpy(), rtol=1e-6)
