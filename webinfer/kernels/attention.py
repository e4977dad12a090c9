"""Paged causal attention on the GPU (shaders/attention.wgsl): decode (flash-decoding + reduce) and chunked prefill.

Contract with the model graph (webinfer/engine/gpu_model.py):

- KV cache: per layer one K and one V buffer `[num_blocks, block_size, n_kv_heads, head_dim]`, f32 (or f16 with
  kv_f16=True, only where the device has shader-f16). Whoever computes k and v (the RoPE kernel) writes the
  roped k and the v of the token at position p of a sequence into block `block_table[p // block_size]`, slot
  `p % block_size`, BEFORE attention is dispatched (with rope=True the decode kernel does that itself for its
  one-token sequences, from the un-rotated qkv rows). Block 0 is the null block (padding).
- q: f32 rows `[T, q_stride]`; query head h of token row t at `t*q_stride + q_offset + h*head_dim` (so q can live
  inside a fused qkv buffer). out: f32 `[T, n_heads*head_dim]`, row t for token row t.
- Per-step inputs, written once per step and shared by every layer (`pack_step`):
    seq_info     u32 [max_seqs, 4]: (ctx_len, bt_offset, q_row, n_q) per sequence
    block_tables u32 flat: every sequence's block table at its bt_offset
  ctx_len counts this step's tokens too (their KV is already in the cache); the queries of a sequence are the
  token rows q_row .. q_row + n_q - 1 at positions ctx_len - n_q .. ctx_len - 1.

Bind groups are built once per layer (`bind`); a step calls `encode(cmds, binding, step)` which only records
dispatches whose grid depends on the step's shape (number of sequences, longest context, longest chunk).

Batch invariance: sequences with one query token always go through the decode kernel, those with more through
the prefill kernel; decode splits a context into fixed SPLIT-long pieces, prefill tiles a chunk's queries by its
own query count and walks positions in order. So a sequence's output depends only on
its own tokens, never on how many other sequences share the step. (A token's output may differ in the last bits
between a prefill chunk and a decode step; that is allowed.)

Pure Python (it runs in Pyodide).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..gpu.device import COPY_DST, STORAGE, BufferBinding
from .common import WG
from .library import LazyBindGroup

DECODE, REDUCE, PREFILL = 0, 1, 2
DECODE_WG = 8  # decode invocations per workgroup (shaders/attention.wgsl DWG)
PARTIALS_BUDGET = 32 << 20  # default split: the shortest whose partials buffer stays under this
ONE_SPLIT = 128  # decode contexts up to this many positions: one split, no reduce dispatch


@dataclass(frozen=True)
class SeqStep:
    """One sequence's share of a step: KV length after this step, its block table, first token row, query count."""

    ctx_len: int
    block_table: list[int]
    q_row: int
    n_q: int


@dataclass(frozen=True)
class StepShape:
    """What `encode` needs to size its grids (pack_step returns it)."""

    n_seqs: int
    max_ctx_decode: int  # longest context among one-token sequences (0: none)
    max_q_prefill: int  # longest chunk among multi-token sequences (0: none)


def pack_step(seqs: list[SeqStep]) -> tuple[bytes, bytes, StepShape]:
    """(seq_info bytes, block_tables bytes, shape) for one step. Raises ValueError on inconsistent input."""
    info, tables = [], []
    max_dec = max_pre = 0
    for i, s in enumerate(seqs):
        if s.n_q < 1 or s.ctx_len < s.n_q:
            raise ValueError(f"sequence {i}: need 1 <= n_q <= ctx_len, got n_q={s.n_q}, ctx_len={s.ctx_len}")
        info += [s.ctx_len, len(tables), s.q_row, s.n_q]
        tables += s.block_table
        if s.n_q == 1:
            max_dec = max(max_dec, s.ctx_len)
        else:
            max_pre = max(max_pre, s.n_q)
    return (struct.pack(f"<{len(info)}I", *info), struct.pack(f"<{len(tables)}I", *tables) or b"\0" * 4,
            StepShape(len(seqs), max_dec, max_pre))


@dataclass
class AttentionBinding:
    """The bind groups of one layer (built once; reduce and decode_roped are LazyBindGroups: with their pipelines,
    created at first use, since a short single chat never runs them)."""

    decode: Any
    reduce: Any
    prefill: Any
    decode_roped: Any = None  # rope=True: the decode kernel for q and K/V already roped and written (RoPE kernel)


class PagedAttention:
    """Pipelines and the split-partials scratch buffer for one model's attention shape.

    split: decode split length: the positions one split (head_dim/16 lanes) walks. None: 32, or longer when the
    partials buffer would pass PARTIALS_BUDGET bytes. Each split is a partial softmax record merged by the reduce
    kernel, so short splits give parallelism (ctx 640 -> 20 splits per kv head) at the price of a longer merge.
    max_model_len bounds the split count, max_seqs
    the number of sequences per step (both size the partials buffer, allocated once here, shared by all layers).
    decode_wg: invocations per decode and prefill workgroup (8 = one SIMD batch on llvmpipe; real GPUs may prefer
    32-64). Prefill gives each group of head_dim/16 lanes 4 consecutive queries: 4 * decode_wg / lanes queries per
    workgroup (8 at SmolLM2's head_dim 64).
    subgroup_decode: None = sum the lanes of a split (decode) or of a query group (prefill) with subgroup shuffles
    where the device has subgroups of at least head_dim/16 lanes, else through workgroup memory; False forces
    workgroup memory; True requires shuffles.
    rope: the decode kernel applies RoPE to q and k itself and writes the step's K and V into the cache (q, k, v
    un-rotated in the fused qkv rows: k right after the n_heads q heads, v after the k heads; needs head_dim % 16
    == 0 and a rope table at bind): a decode step then needs no separate RoPE dispatch. A sequence whose live
    positions fit one split gets its output from the decode kernel directly; the reduce runs only when some
    sequence of the step has more splits. one_split: contexts up to max(one_split, split) are walked as one split
    (no reduce dispatch for the step; on lavapipe a dispatch costs more than walking 128 positions in one lane
    group), longer ones in `split`-long pieces.
    scale: score scale (None: 1/sqrt(head_dim)); softcap: scores -> cap * tanh(score / cap); window: sliding
    window W (a query at p sees keys k with p - k < W). partials: share another instance's scratch buffer (the
    layers of one model run one at a time; a sliding and a full-attention instance need only one).
    """

    def __init__(self, lib, *, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int, max_model_len: int,
                 max_seqs: int, q_stride: int | None = None, q_offset: int = 0, kv_f16: bool = False,
                 split: int | None = None, decode_wg: int = DECODE_WG,
                 subgroup_decode: bool | None = None, label: str = "attn", scale: float | None = None,
                 softcap: float | None = None, window: int | None = None, partials=None, rope: bool = False,
                 one_split: int = ONE_SPLIT):
        if n_heads % n_kv_heads:
            raise ValueError(f"attention: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
        if head_dim % 4 or head_dim > 4 * WG:
            raise ValueError(f"attention: head_dim {head_dim} must be a multiple of 4 (vec4 loads) and <= {4 * WG}")
        q_stride = n_heads * head_dim if q_stride is None else q_stride
        if q_stride % 4 or q_offset % 4:
            raise ValueError(f"attention: q_stride {q_stride} and q_offset {q_offset} must be multiples of 4")
        if kv_f16 and not lib.device.caps.f16:
            raise ValueError("attention: kv_f16 needs a device with shader-f16")
        self.lib, self.label = lib, label
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        group = n_heads // n_kv_heads

        def partials_bytes(sp: int) -> int:
            return 4 * max_seqs * n_heads * -(-max_model_len // sp) * (head_dim + 4)

        if split is None:
            split = next((sp for sp in (32, 64, 128, 256, 512) if partials_bytes(sp) <= PARTIALS_BUDGET), 1024)
        if split < 1:
            raise ValueError(f"attention: split length must be >= 1, got {split}")
        self.block_size, self.split, self.max_seqs = block_size, split, max_seqs
        self.one_split = max(one_split, split)
        self.max_splits = -(-max_model_len // split)
        base = {"N_HEADS": n_heads, "N_KV_HEADS": n_kv_heads, "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size,
                "Q_STRIDE": q_stride, "Q_OFFSET": q_offset, "SPLIT": split, "MAX_SPLITS": self.max_splits,
                "ONE_SPLIT": self.one_split}
        if kv_f16:
            base["KV_F16"] = 1
        if rope:
            if head_dim % 16:
                raise ValueError(f"attention: rope in the decode kernel needs head_dim % 16 == 0, not {head_dim}")
            base["ROPE"] = 1
        self.rope = rope
        if scale is not None:
            base["SCALE"] = repr(float(scale))
        if softcap is not None:
            base["SOFTCAP"] = repr(float(softcap))
        if window is not None:
            if window < 1:
                raise ValueError(f"attention: sliding window {window} must be >= 1")
            base["WINDOW"] = f"{int(window)}u"
        # decode layout (see the decode section of attention.wgsl): `lanes` lanes per split, each owning 16 dims
        # of the head; up to 4 query heads per invocation (GROUP > 4: several head blocks, K/V read once per block)
        lanes = 1 << max(0, -(-head_dim // 16) - 1).bit_length()
        n_hb = -(-group // 4)
        hb = -(-group // n_hb)
        decode_wg = max(decode_wg, lanes)
        if decode_wg % lanes or decode_wg > 256:
            raise ValueError(f"attention: decode_wg {decode_wg} must be a multiple of {lanes} lanes and <= 256")
        caps = lib.device.caps
        sg_ok = bool(caps.subgroups) and lanes <= (caps.subgroup_size or 0)
        if subgroup_decode is None:
            subgroup_decode = sg_ok
        elif subgroup_decode and not sg_ok:
            raise ValueError(f"attention: the subgroup decode needs subgroups of >= {lanes} lanes (head_dim "
                             f"{head_dim}); this device has {caps.subgroup_size if caps.subgroups else 'none'}")
        self.subgroup_decode = bool(subgroup_decode)
        self.lanes, self.n_head_blocks, self.decode_wg = lanes, n_hb, decode_wg
        self.splits_per_wg = decode_wg // lanes
        # prefill: the same workgroups of decode_wg lanes, each lane group holding 4 consecutive queries
        self.bq = 4 * self.splits_per_wg
        base.update({"LANES": lanes, "HB": hb, "DWG": decode_wg})
        for j in range(1, hb):
            base[f"H{j}"] = 1
        if head_dim != 16 * lanes:
            base["PAD"] = 1
        if self.subgroup_decode:
            base["SG_DECODE"] = 1
        use_f16 = True if kv_f16 else False
        # the reduce runs only for decode contexts longer than one split: compiled at first use (LazyPipeline)
        self.pipelines = [lib.pipeline("attention", defines={**base, "KERNEL": DECODE}, use_f16=use_f16),
                          lib.lazy_pipeline("attention", defines={**base, "KERNEL": REDUCE}, use_f16=use_f16),
                          lib.pipeline("attention", defines={**base, "KERNEL": PREFILL}, use_f16=use_f16)]
        # rope=True still needs the plain decode kernel for steps where one sequence has several one-token rows
        # (speculative verification): a row's attention reads the K/V of the rows before it, which the RoPE
        # kernel must have written first. Same arithmetic, so the same bits as the fused kernel. Compiled at first
        # use: a chat without speculation never runs it.
        plain = {k: v for k, v in base.items() if k != "ROPE"}
        self.decode_plain = (lib.lazy_pipeline("attention", defines={**plain, "KERNEL": DECODE}, use_f16=use_f16)
                             if rope else None)
        self.partials_bytes = partials_bytes(split)
        limit = lib.device.caps.max_binding_bytes
        if self.partials_bytes > limit:
            raise ValueError(f"attention: the decode partials need {self.partials_bytes} bytes (> {limit} "
                             f"per binding); lower max_seqs ({max_seqs}) or max_model_len ({max_model_len})")
        self.partials = partials if partials is not None else lib.device.create_buffer(
            self.partials_bytes, STORAGE | COPY_DST, label=f"{label}.partials")

    def bind(self, q, k_cache, v_cache, block_tables, seq_info, out, rope_table=None) -> AttentionBinding:
        """Bind groups for one layer: buffers or BufferBindings (bound once, at model load). rope_table: the
        layer's kernels/rope.py `rope_table` bytes on the device (required with rope=True)."""
        dev = self.lib.device
        dec, red, pre = self.pipelines
        if self.rope != (rope_table is not None):
            raise ValueError(f"attention: rope={self.rope} {'needs' if self.rope else 'takes no'} rope_table")
        dec_bufs = [q, k_cache, v_cache, block_tables, seq_info, self.partials, out] + ([rope_table] if self.rope else [])
        return AttentionBinding(
            decode_roped=LazyBindGroup(self.decode_plain, dec_bufs[:7]) if self.rope else None,
            decode=dev.create_bind_group(dec, dec_bufs),
            reduce=LazyBindGroup(red, [self.partials, seq_info, out]),
            prefill=dev.create_bind_group(pre, [q, k_cache, v_cache, block_tables, seq_info, out]),
        )

    def grid(self, step: StepShape) -> tuple[int, int, bool, int]:
        """(sequences, decode workgroups along the splits (0: no decode), whether the reduce runs, prefill
        workgroups along the queries (0: no prefill)): everything of `step` that encode records. Equal grids,
        equal commands (the model reuses a step's recorded commands on that: gpu_model.py _record)."""
        if step.n_seqs > self.max_seqs:
            raise ValueError(f"attention: {step.n_seqs} sequences in a step, built for at most {self.max_seqs}")
        dec_x = 0
        if step.max_ctx_decode:
            splits = -(-step.max_ctx_decode // self.split)
            if splits > self.max_splits:
                raise ValueError(f"attention: context {step.max_ctx_decode} exceeds max_model_len "
                                 f"{self.max_splits * self.split}")
            dec_x = -(-splits // self.splits_per_wg)
        # no reduce where every decode sequence is one split: the decode kernel has written it
        reduce = bool(step.max_ctx_decode) and step.max_ctx_decode > self.one_split
        return step.n_seqs, dec_x, reduce, -(-step.max_q_prefill // self.bq)

    def encode(self, cmds, binding: AttentionBinding, step: StepShape, roped: bool = False) -> None:
        """Record this step's attention: decode (+ reduce when a context passes one split) if any one-token
        sequence, prefill if any longer one. roped (rope=True only): the RoPE kernel has roped every row and
        written its K/V this step, the decode kernel must not."""
        n_seqs, dec_x, reduce, pre_x = self.grid(step)
        dec, _, pre = self.pipelines
        if dec_x:
            if roped:
                dec, bg = binding.decode_roped.get()
            else:
                bg = binding.decode
            cmds.dispatch(dec, bg, dec_x, self.n_kv_heads * self.n_head_blocks, n_seqs, f"{self.label}.decode")
            if reduce:
                cmds.dispatch(*binding.reduce.get(), self.n_heads, n_seqs, 1, f"{self.label}.reduce")
        if pre_x:
            cmds.dispatch(pre, binding.prefill, pre_x, self.n_kv_heads * self.n_head_blocks, n_seqs,
                          f"{self.label}.prefill")


def step_buffers(device, max_seqs: int, max_blocks_total: int) -> tuple[Any, Any]:
    """(seq_info, block_tables) storage buffers sized for the worst step; write pack_step's bytes into them."""
    info = device.create_buffer(16 * max_seqs, STORAGE | COPY_DST, label="attn.seq_info")
    tables = device.create_buffer(4 * max(max_blocks_total, 1), STORAGE | COPY_DST, label="attn.block_tables")
    return info, tables


__all__ = ["PagedAttention", "AttentionBinding", "SeqStep", "StepShape", "pack_step", "step_buffers", "BufferBinding"]
