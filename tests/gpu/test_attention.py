"""Paged attention kernels (shaders/attention.wgsl) against the numpy reference `attention` (packager/reference.py).

Run: python -m pytest tests/gpu/test_attention.py -q

Each case builds a random paged KV cache with shuffled block tables, gathers every sequence's K/V contiguously for
the reference, and checks the GPU output through check_op (guard regions around the output).
Tolerances: f32 KV 2e-5 abs + 1e-4 rel (f32 softmax, different summation order); f16 KV: the reference reads the
same f16-rounded K/V, so only f32 arithmetic differences remain: same tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.gpu.device import COPY_DST, STORAGE
from webinfer.kernels.attention import PagedAttention, SeqStep, pack_step
from webinfer.kernels.library import KernelLibrary
from webinfer_packager.reference.model import attention as ref_attention

pytestmark = pytest.mark.gpu

ATOL, RTOL = 2e-5, 1e-4


def _case(dev, lib, *, H, Hkv, hd, bs, seqs, split=None, kv_f16=False, q_pad=0, seed=0, max_seqs=None, **kw):
    """seqs: list of (ctx_len, n_q). Returns (out GpuArray, ref [T, H*hd]).

    Sequence i's K/V/q values come from rng(seed + i) alone, so the same sequence in another batch holds the same
    numbers (at other physical blocks and token rows): that is what the batch-invariance test compares."""
    rng = np.random.default_rng(seed + 1000)
    n_blocks_needed = [-(-ctx // bs) for ctx, _ in seqs]
    num_blocks = 1 + sum(n_blocks_needed) + 3  # block 0 = null, a few unused
    kv_dtype = np.float16 if kv_f16 else np.float32
    kc = rng.standard_normal((num_blocks, bs, Hkv, hd)).astype(kv_dtype)  # garbage everywhere not written below
    vc = rng.standard_normal((num_blocks, bs, Hkv, hd)).astype(kv_dtype)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    T = sum(n for _, n in seqs)
    q_stride = H * hd + q_pad
    q = rng.standard_normal((T, q_stride)).astype(np.float32)
    steps, ref, row = [], np.zeros((T, H * hd), np.float32), 0
    for i, ((ctx, nq), nb) in enumerate(zip(seqs, n_blocks_needed)):
        r = np.random.default_rng(seed + i)
        table = np.array([int(free.pop()) for _ in range(nb)])
        pos = np.arange(ctx)
        k = r.standard_normal((ctx, Hkv, hd)).astype(kv_dtype)
        v = r.standard_normal((ctx, Hkv, hd)).astype(kv_dtype)
        kc[table[pos // bs], pos % bs], vc[table[pos // bs], pos % bs] = k, v
        q[row:row + nq, q_pad:q_pad + H * hd] = r.standard_normal((nq, H * hd))
        steps.append(SeqStep(ctx, [int(b) for b in table], row, nq))
        qq = q[row:row + nq, q_pad:q_pad + H * hd].reshape(nq, H, hd)
        ref[row:row + nq] = ref_attention(qq, k.astype(np.float32), v.astype(np.float32),
                                          np.arange(ctx - nq, ctx)).reshape(nq, H * hd)
        row += nq
    info, tables, shape = pack_step(steps)
    attn = PagedAttention(lib, n_heads=H, n_kv_heads=Hkv, head_dim=hd, block_size=bs, max_model_len=4096,
                          max_seqs=max_seqs or len(seqs), q_stride=q_stride, q_offset=q_pad, kv_f16=kv_f16, split=split,
                          **kw)
    gq, gk, gv = GpuArray.upload(dev, q), GpuArray.upload(dev, kc), GpuArray.upload(dev, vc)
    gi = GpuArray.upload(dev, np.frombuffer(info, np.uint32))
    gt = GpuArray.upload(dev, np.frombuffer(tables, np.uint32))
    out = GpuArray.empty(dev, (T, H * hd), np.float32)
    b = attn.bind(gq.binding, gk.binding, gv.binding, gt.binding, gi.binding, out.binding)
    run(dev, lambda c: attn.encode(c, b, shape))
    return out, ref


@pytest.fixture(scope="module")
def lib32(gpu_f32):
    return KernelLibrary(gpu_f32)


# (ctx_len, n_q) per sequence: decode only, prefill only, chunked prefill with start_pos > 0, and a mix
CASES = {
    "decode_single_short": [(1, 1)],
    "decode_batch_splits": [(5, 1), (300, 1), (129, 1), (128, 1)],
    "prefill_17": [(17, 17)],
    "prefill_chunked": [(40, 17), (23, 2)],
    "mixed": [(200, 1), (33, 33), (7, 1), (70, 30)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_f32(gpu_f32, lib32, name):
    # split 128: the contexts above sit on both sides of split boundaries (128, 129, 300)
    out, ref = _case(gpu_f32, lib32, H=6, Hkv=2, hd=16, bs=16, seqs=CASES[name], seed=len(name), split=128)
    check_op(out, ref, ATOL, RTOL, name)


def test_attention_smollm2_shape_qkv_fused(gpu_f32, lib32):
    # SmolLM2: 9 heads, 3 kv heads, head_dim 64; q read from inside a wider (fused qkv-like) row with an offset;
    # default split length (32): 600 positions take 19 splits
    out, ref = _case(gpu_f32, lib32, H=9, Hkv=3, hd=64, bs=16, seqs=[(600, 1), (150, 1), (20, 20)], q_pad=8)
    check_op(out, ref, ATOL, RTOL, "smollm2")


@pytest.mark.parametrize("subgroups", [True, False], ids=["shuffle", "workgroup_memory"])
def test_attention_decode_lane_sum_paths(gpu_f32, lib32, subgroups):
    """Both ways of summing a score over the head_dim/16 lanes of a split (subgroup xor butterfly; workgroup
    memory, the path without subgroups) at SmolLM2's shape, contexts around the split length (32)."""
    if subgroups and not (gpu_f32.caps.subgroups and gpu_f32.caps.subgroup_size >= 4):
        pytest.skip("needs subgroups of >= 4 lanes")
    out, ref = _case(gpu_f32, lib32, H=9, Hkv=3, hd=64, bs=16, seqs=[(1, 1), (31, 1), (32, 1), (33, 1), (97, 1)],
                     subgroup_decode=subgroups, seed=5, one_split=1)
    check_op(out, ref, ATOL, RTOL, f"lane sum subgroups={subgroups}")
    # the same contexts walked as one split each (the default below 128 positions), and one of several splits
    out, ref = _case(gpu_f32, lib32, H=9, Hkv=3, hd=64, bs=16, seqs=[(1, 1), (31, 1), (33, 1), (128, 1), (129, 1)],
                     subgroup_decode=subgroups, seed=5)
    check_op(out, ref, ATOL, RTOL, f"lane sum subgroups={subgroups}")


@pytest.mark.parametrize("subgroups", [True, False], ids=["shuffle", "workgroup_memory"])
def test_attention_prefill_lane_sum_paths(gpu_f32, lib32, subgroups):
    """Prefill at SmolLM2's shape through both lane-sum paths: 4 queries per lane group, 8 per workgroup, so
    chunks of 2, 17 (a partial group and workgroup) and 37 (start_pos 263 > 0: earlier KV read from the paged
    cache, walk crossing many blocks), plus a decode sequence in the same step."""
    if subgroups and not (gpu_f32.caps.subgroups and gpu_f32.caps.subgroup_size >= 4):
        pytest.skip("needs subgroups of >= 4 lanes")
    out, ref = _case(gpu_f32, lib32, H=9, Hkv=3, hd=64, bs=16, seqs=[(2, 2), (17, 17), (300, 37), (45, 1)],
                     subgroup_decode=subgroups, seed=11)
    check_op(out, ref, ATOL, RTOL, f"prefill lane sum subgroups={subgroups}")


@pytest.mark.parametrize("H,Hkv,hd", [(14, 2, 64), (5, 1, 96), (8, 8, 32)], ids=["group7_blocks", "hd96_pad", "mha"])
def test_attention_decode_head_blocks_and_padding(gpu_f32, lib32, H, Hkv, hd):
    """GROUP 7 takes two head blocks of 4 (the last with a masked slot); head_dim 96 pads 6 lanes of 16 dims to 8
    (two idle lanes, PAD loads); MHA: one head per block. Decode and prefill (chunks of 4 and 13)."""
    out, ref = _case(gpu_f32, lib32, H=H, Hkv=Hkv, hd=hd, bs=8, seqs=[(70, 1), (5, 1), (12, 4), (40, 13)], seed=H)
    check_op(out, ref, ATOL, RTOL, f"H={H} Hkv={Hkv} hd={hd}")


def test_attention_head_dim_128_mha(gpu_f32, lib32):
    out, ref = _case(gpu_f32, lib32, H=2, Hkv=2, hd=128, bs=8, seqs=[(61, 1), (19, 11)], split=32)
    check_op(out, ref, ATOL, RTOL, "hd128")


def test_attention_f16_kv(gpu, kernels):
    if not gpu.caps.f16:
        pytest.skip("no shader-f16 on this adapter")
    # decode and prefill read f16 K/V 8 halves per vec4<u32> load (aligned rows), or one 4-half vector at a time
    # (hd 96: PAD); prefill chunks of 9 and 21 (start_pos 109 > 0)
    for hd in (32, 96):
        out, ref = _case(gpu, kernels, H=4, Hkv=1, hd=hd, bs=16, seqs=[(90, 1), (25, 9), (7, 1), (130, 21)],
                         kv_f16=True)
        check_op(out, ref, ATOL, RTOL, f"f16 kv hd={hd}")


def test_attention_batch_invariant(gpu_f32, lib32):
    """A sequence's output is bit-identical alone and inside bigger batches (decode and prefill sequences)."""
    kw = dict(H=4, Hkv=2, hd=16, bs=16, seed=3)
    alone_d = _case(gpu_f32, lib32, seqs=[(300, 1)], **kw)[0].read()
    alone_p = _case(gpu_f32, lib32, seqs=[(40, 20)], **kw)[0].read()
    for others in ([(5, 1)], [(500, 1), (64, 13), (2, 1)]):
        got = _case(gpu_f32, lib32, seqs=[(300, 1)] + others, **kw)[0].read()
        assert np.array_equal(got[:1], alone_d), f"decode output changed with {others} in the batch"
        got = _case(gpu_f32, lib32, seqs=[(40, 20)] + others, **kw)[0].read()
        assert np.array_equal(got[:20], alone_p), f"prefill output changed with {others} in the batch"


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 150), st.integers(1, 40)), min_size=1, max_size=3),
       st.sampled_from([(4, 1, 8), (3, 3, 16), (8, 2, 32), (3, 1, 12)]), st.sampled_from([4, 16]))
def test_attention_hypothesis(gpu_f32, lib32, raw, heads, bs):
    seqs = [(ctx, min(nq, ctx) if nq > 20 else 1) for ctx, nq in raw]  # about half decode, half prefill
    H, Hkv, hd = heads
    out, ref = _case(gpu_f32, lib32, H=H, Hkv=Hkv, hd=hd, bs=bs, seqs=seqs, split=32)
    check_op(out, ref, ATOL, RTOL, f"{seqs}")


LONGROPE = {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(16)], "attention_factor": 1.2}


@pytest.mark.parametrize("kv_f16", [False, True])
@pytest.mark.parametrize("subgroups", [True, False], ids=["shuffle", "workgroup_memory"])
def test_attention_decode_rope_and_kv_write(gpu, kernels, kv_f16, subgroups):
    """rope=True: decode rows come un-rotated in fused qkv rows (q | k | v, after a pad); the decode kernel ropes q
    and the token's k, writes k and v into the token's cache slot (checked element for element against rope.py's
    reference) and attends over earlier cache entries plus the new key. Contexts on both sides of the split
    length 32 (one split: output written by the decode kernel; several: the reduce), GROUP 5 (two head blocks
    writing the same K/V), LongRoPE's mscale; a prefill sequence in the same step is left to the rope kernel."""
    from webinfer.kernels.rope import rope_table
    from webinfer_packager.reference.model import rope

    if kv_f16 and not gpu.caps.f16:
        pytest.skip("no shader-f16")
    if subgroups and not (gpu.caps.subgroups and gpu.caps.subgroup_size >= 2):
        pytest.skip("needs subgroups")
    H, Hkv, hd, bs, pad, theta = 10, 2, 32, 8, 4, 1e4
    kvt = np.float16 if kv_f16 else np.float32
    seqs = [(1, 1), (32, 1), (33, 1), (90, 1), (12, 5)]
    rng = np.random.default_rng(7)
    qd, kvd = H * hd, Hkv * hd
    stride = pad + qd + 2 * kvd
    T = sum(n for _, n in seqs)
    qkv = rng.standard_normal((T, stride)).astype(np.float32)
    num_blocks = 1 + sum(-(-c // bs) for c, _ in seqs) + 2
    kc = rng.standard_normal((num_blocks, bs, Hkv, hd)).astype(kvt)
    vc = rng.standard_normal((num_blocks, bs, Hkv, hd)).astype(kvt)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    steps, ref, row = [], np.full((T, qd), np.nan, np.float32), 0
    want_k, want_v = kc.astype(np.float32), vc.astype(np.float32)
    for ctx, nq in seqs:
        table = [int(free.pop()) for _ in range(-(-ctx // bs))]
        steps.append(SeqStep(ctx, table, row, nq))
        if nq == 1:
            p = ctx - 1
            k_old = np.stack([kc[table[i // bs], i % bs] for i in range(p)]).astype(np.float32) if p else \
                np.zeros((0, Hkv, hd), np.float32)
            v_old = np.stack([vc[table[i // bs], i % bs] for i in range(p)]).astype(np.float32) if p else \
                np.zeros((0, Hkv, hd), np.float32)
            x = qkv[row]
            q = rope(x[pad:pad + qd].reshape(1, H, hd), np.array([p]), theta, hd, LONGROPE)
            k_new = rope(x[pad + qd:pad + qd + kvd].reshape(1, Hkv, hd), np.array([p]), theta, hd, LONGROPE)
            v_new = x[pad + qd + kvd:].reshape(1, Hkv, hd)
            k_new, v_new = k_new.astype(kvt).astype(np.float32), v_new.astype(kvt).astype(np.float32)
            ref[row] = ref_attention(q, np.concatenate([k_old, k_new]), np.concatenate([v_old, v_new]),
                                     np.array([p])).reshape(qd)
            want_k[table[p // bs], p % bs], want_v[table[p // bs], p % bs] = k_new[0], v_new[0]
        row += nq
    info, tables, shape = pack_step(steps)
    attn = PagedAttention(kernels, n_heads=H, n_kv_heads=Hkv, head_dim=hd, block_size=bs, max_model_len=256,
                          max_seqs=len(seqs), q_stride=stride, q_offset=pad, kv_f16=kv_f16, rope=True,
                          subgroup_decode=subgroups, one_split=32)
    gq, gk, gv = GpuArray.upload(gpu, qkv), GpuArray.upload(gpu, kc), GpuArray.upload(gpu, vc)
    gi = GpuArray.upload(gpu, np.frombuffer(info, np.uint32))
    gt = GpuArray.upload(gpu, np.frombuffer(tables, np.uint32))
    gr = GpuArray.upload(gpu, np.frombuffer(rope_table(hd, theta, LONGROPE), np.float32))
    out = GpuArray.empty(gpu, (T, qd), np.float32)
    b = attn.bind(gq.binding, gk.binding, gv.binding, gt.binding, gi.binding, out.binding, gr.binding)
    run(gpu, lambda c: attn.encode(c, b, shape))
    dec = np.isfinite(ref[:, 0])  # the prefill rows' output is not checked here (their q is not roped)
    np.testing.assert_allclose(out.read()[dec], ref[dec], atol=ATOL, rtol=RTOL)
    tol = 1e-3 if kv_f16 else 2e-5
    np.testing.assert_allclose(gk.read().astype(np.float32), want_k, atol=tol, rtol=tol)
    np.testing.assert_allclose(gv.read().astype(np.float32), want_v, atol=0, rtol=0)


def test_attention_one_split_needs_no_reduce(gpu_f32, lib32):
    """Contexts within one split record the decode dispatch only (its output is checked by the cases above,
    e.g. contexts 1, 31, 128 in test_attention_decode_lane_sum_paths); one context past it adds the reduce."""
    attn = PagedAttention(lib32, n_heads=4, n_kv_heads=2, head_dim=16, block_size=16, max_model_len=256,
                          max_seqs=2, split=32, one_split=32)
    dev = lib32.device
    bufs = [dev.create_buffer(n, STORAGE | COPY_DST) for n in (4 * 2 * 64, 16 * 16 * 32 * 4, 16 * 16 * 32 * 4, 64,
                                                               32, 4 * 2 * 64)]
    binding = attn.bind(*bufs)  # the reduce's pipeline and bind group are made at its first use
    cmds = dev.commands()
    attn.encode(cmds, binding, pack_step([SeqStep(32, [1, 2], 0, 1), SeqStep(3, [3], 1, 1)])[2])
    assert [op[-1] for op in cmds.ops if op[0] == "dispatch"] == ["attn.decode"]
    assert not attn.pipelines[1].ready  # the reduce: not compiled while no step needed it
    cmds = dev.commands()
    attn.encode(cmds, binding, pack_step([SeqStep(33, [1, 2, 3], 0, 1)])[2])
    assert [op[-1] for op in cmds.ops if op[0] == "dispatch"] == ["attn.decode", "attn.reduce"]


def test_bad_shapes_are_rejected(lib32):
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        PagedAttention(lib32, n_heads=6, n_kv_heads=4, head_dim=16, block_size=16, max_model_len=64, max_seqs=1)
    with pytest.raises(ValueError, match="partials need"):
        PagedAttention(lib32, n_heads=64, n_kv_heads=8, head_dim=128, block_size=16, max_model_len=1 << 20,
                       max_seqs=64)
    with pytest.raises(ValueError, match="n_q <= ctx_len"):
        pack_step([SeqStep(3, [1], 0, 4)])
    a = PagedAttention(lib32, n_heads=2, n_kv_heads=1, head_dim=16, block_size=16, max_model_len=64, max_seqs=1, split=32)
    _, _, shape = pack_step([SeqStep(65, [1] * 5, 0, 1)])
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        a.encode(lib32.device.commands(), None, shape)


def test_attention_decode_rope_fused_equals_rope_kernel_bitwise(gpu_f32, lib32):
    """Speculative verification puts several decode rows of one sequence in a step: the RoPE kernel then ropes
    every row and writes its K/V first, and the decode kernel runs without its own RoPE (`roped=True`). A row must
    get the same bits either way (the scheduler's promise: verification rows equal unspeculated steps)."""
    from webinfer.kernels.rope import Rope, inv_freq, rope_table

    H, Hkv, hd, bs, theta = 9, 3, 64, 16, 1e4
    seqs = [(40, 1), (150, 1), (7, 1)]  # (context, one query)
    rng = np.random.default_rng(3)
    stride = (H + 2 * Hkv) * hd
    qkv = rng.standard_normal((len(seqs), stride)).astype(np.float32)
    kc = rng.standard_normal((16, bs, Hkv, hd)).astype(np.float32)
    vc = rng.standard_normal((16, bs, Hkv, hd)).astype(np.float32)
    # contexts 40 and 7 (one split), 150 (five splits of 32 + the reduce); blocks 1-14 of 16
    steps = [SeqStep(40, [1, 2, 3], 0, 1), SeqStep(150, list(range(4, 14)), 1, 1), SeqStep(7, [14], 2, 1)]
    info, tbl, shape = pack_step(steps)
    attn = PagedAttention(lib32, n_heads=H, n_kv_heads=Hkv, head_dim=hd, block_size=bs, max_model_len=256,
                          max_seqs=3, q_stride=stride, rope=True)
    up = lambda a: GpuArray.upload(gpu_f32, a)  # noqa: E731
    res = []
    for roped in (False, True):
        gq, gk, gv, out = up(qkv), up(kc), up(vc), GpuArray.empty(gpu_f32, (len(seqs), H * hd))
        gi, gt = up(np.frombuffer(info, np.uint32)), up(np.frombuffer(tbl, np.uint32))
        b = attn.bind(gq.binding, gk.binding, gv.binding, gt.binding, gi.binding, out.binding,
                      up(np.frombuffer(rope_table(hd, theta), np.float32)).binding)
        if roped:
            pos = np.array([s.ctx_len - 1 for s in steps], np.uint32)
            slot = np.array([s.block_table[p // bs] * bs + p % bs for s, p in zip(steps, pos)], np.uint32)
            rope = Rope(lib32, H, Hkv, hd, gq.binding, stride, gk.binding, gv.binding, up(pos).binding,
                        up(slot).binding, up(np.float32(inv_freq(hd, theta))).binding,
                        up(np.array([len(seqs), 0, 0, 0], np.uint32)).binding)
            run(gpu_f32, lambda c: (rope.encode(c, len(seqs)), attn.encode(c, b, shape, roped=True)))
        else:
            run(gpu_f32, lambda c: attn.encode(c, b, shape))
        res.append((out.read(), gk.read(), gv.read()))
    for a, b, what in zip(res[0], res[1], ("output", "k cache", "v cache")):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), what
