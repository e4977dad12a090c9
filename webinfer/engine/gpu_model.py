"""The GPU model runner: a package's transformer as a fixed graph of WebGPU dispatches (ModelRunner in batch.py).

Everything is allocated and bound at load: weights, the paged KV cache, activations sized for max_batch_tokens,
the per-step input buffers and one uniform arena holding every dispatch's constant parameters. A step then only
uploads its few small inputs (token ids, positions, cache slots, row counts, attention's sequence table, the
sampled rows' parameters) in one write that its own commands copy into place, takes the dispatches of its shape
(their grids depend on the row counts and attention grids: recorded once per shape and reused), submits once, and
reads back the sampled token ids.

One step, T tokens of any mix of prefill chunks and decode tokens (rows of every activation buffer = tokens):
    embed(ids) -> r                                          r: the residual stream [T, D]
    per layer:  xn = rmsnorm(r) * attn_norm                  prefill rows only: decode rows fold it into the GEMV
                qkv = Wqkv xn (+ bias)                       q, k, v fused into one weight: one dispatch
                rope(q, k) in place; k, v -> cache slots     (shaders/rope.wgsl; prefill rows only where the
                                                             attention decode kernel ropes the decode rows)
                a = attention(q, cache)                      (webinfer/kernels/attention.py)
                r += Wo a                                    (accumulate epilogue: no separate add)
                xn = rmsnorm(r) * ffn_norm                   prefill rows only, as above
                m = silu(Wg xn) * (Wu xn)                    gate/up interleaved, swiglu epilogue: one dispatch
                r += Wd m
    xs = rmsnorm(r[last row of each sampled chunk]) * norm    (row gather)
    logits = Wout xs; next ids = sample(logits)
Decode rows (GEMV) read r itself and recompute the RMSNorm inside the kernel (gemv.wgsl NORM: cheap at these
widths), so a decode step has no norm dispatches, and (head_dim % 16 == 0) the attention decode kernel applies
RoPE and writes the step's K/V itself: 1 + 5 per layer (qkv, attention, o, gate_up, down; + the attention reduce
when a context passes one split, 128 positions) + 3 (final norm, LM head, sampling; + the sampler's argmax scan
for vocabularies of 16,384 tokens or more: kernels/sampling.py SCAN_MIN_VOCAB). A step with
prefill chunks adds the two norms, a GEMM dispatch per matrix and the prefill attention kernel. Unfused q/k/v or
gate/up add one dispatch per matrix: they stay unfused when their formats differ (a Q4_K_M file mixes q4k, q6k,
q5_0 and q8 per tensor) or the fused weight would not fit one binding.

Weights are `QuantWeight`s (kernels/linear.py) in any format of webinfer/formats.py, one part per package binding:
an embedding table or LM head over several bindings (vocabularies of 150k-262k tokens) costs one dispatch per
binding.

Family variants (ModelConfig): the embedding is scaled in the gather (Gemma); qk_norm adds a per-head RMSNorm of
q and k before RoPE (one dispatch); post_norms (Gemma) make Wo and Wd write to xn instead of accumulating, and an
accumulating RMSNorm adds the normed output to r (two dispatches); GeGLU runs gate/up unfused plus the swiglu
kernel's GELU_TANH variant (the fused GEMV epilogue is SiLU only); sliding layers and the query scale /
soft-capping are attention pipeline variants, a layer's RoPE base picks its inv_freq table; final logit
soft-capping is one in-place dispatch after the LM head.

Batch invariance: every kernel reduces a row in an order that depends only on that row (see linear.py and
attention.py), so a sequence's tokens come out the same alone or batched with others.

Pure Python (runs in Pyodide): bytes and struct only.
"""

from __future__ import annotations

import inspect
import struct
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from ..errors import ContextOverflowError, GPUError
from ..gpu.device import COPY_DST, COPY_SRC, STORAGE, UNIFORM, BufferBinding, Device
from ..kernels.attention import AttentionBinding, PagedAttention, SeqStep, pack_step, step_buffers
from ..kernels.embed import Embed
from ..kernels.library import KernelLibrary
from ..kernels.linear import (Epilogue, Linear, LinearIO, QuantWeight, WeightPart, default_ksplit, interleave_gate_up,
                              pack_meta, split_rows, tiles_for)
from ..kernels.norm import HeadNorm, RMSNorm
from ..kernels.rope import Rope, attention_factor, inv_freq, rope_table
from ..kernels.swiglu import SoftCap, SwiGLU
from ..kernels.sampling import LOGPROB_BYTES, pack_scores, unpack_logprobs
from .batch import Sampled, StepBatch

# step[] entries read by the kernels: all token rows, sampled rows, decode rows [0, Td), prefill rows [Td, T)
STEP_TOKENS, STEP_SAMPLED, STEP_DECODE, STEP_PREFILL = 0, 1, 2, 3

ComponentReader = Callable[[str, str, int], Awaitable[bytes] | bytes]


class UniformArena:
    """Every dispatch's constant parameters, one 256-byte slot each, written once at load. Slots are handed out
    from pages of PAGE slots, a new page when one is full: the arena holds exactly the slots the kernels took
    (rounded up to a page), so no estimate can be overflowed by a kernel added later."""

    SLOT = 256
    PAGE = 64

    def __init__(self, device: Device):
        self.device = device
        self.pages: list[Any] = []
        self.used = 0  # slots handed out

    def __call__(self, data: bytes) -> BufferBinding:
        if len(data) > self.SLOT:
            raise GPUError(f"uniform parameters of {len(data)} bytes exceed a {self.SLOT}-byte arena slot")
        if self.used == len(self.pages) * self.PAGE:
            self.pages.append(self.device.create_buffer(self.PAGE * self.SLOT, UNIFORM | COPY_DST,
                                                        label=f"params.arena.{len(self.pages)}"))
        page, slot = divmod(self.used, self.PAGE)
        data = data + b"\0" * (-len(data) % 16)
        self.device.write_buffer(self.pages[page], slot * self.SLOT, data)
        self.used += 1
        return BufferBinding(self.pages[page], slot * self.SLOT, len(data))


@dataclass
class Buffers:
    """The step's inputs and activations, allocated once for the worst step (llama2.c's RunState). T = token rows
    of a step (<= max_batch_tokens), S = sampled rows (<= max_seqs); f32 widths are rounded up to 4 (vec4 loads):
    d4 = round4(hidden), f4 = round4(intermediate), qkv4 = round4(q_dim + 2 kv_dim), q4 = round4(q_dim)."""

    step: Any       # u32 [4]       row counts: STEP_TOKENS, STEP_SAMPLED, STEP_DECODE, STEP_PREFILL
    ids: Any        # u32 [T]       token ids; decode rows first, then prefill chunks
    pos: Any        # u32 [T]       positions
    slot: Any       # u32 [T]       KV cache slot of each token (block * block_size + offset)
    rows: Any       # u32 [S]       the token row each sampled row reads
    seq_info: Any   # u32 [S, 4]    attention's per-sequence table (kernels/attention.py pack_step)
    tables: Any     # u32 [S * max_blocks_per_seq]  the sequences' block tables
    r: Any          # f32 [T, d4]   the residual stream
    xn: Any         # f32 [T, d4]   rmsnorm(r) * weight (prefill rows; decode rows fold the norm into the GEMV)
    qkv: Any        # f32 [T, qkv4] q | k | v
    attn: Any       # f32 [T, q4]   attention output
    act: Any        # f32 [T, f4]   silu(gate) * up
    xs: Any         # f32 [S, d4]   final-normed sampled rows
    logits: Any     # f32 [S, vocab]
    gu: Any = None  # f32 [T, 2 f4] gate | up, only when some layer cannot fuse them


@dataclass
class _Layer:
    attn_norm: RMSNorm
    qkv: list["DualLinear"]  # one fused q|k|v, or q, k, v
    rope: Rope  # prefill rows only when attention.rope (the decode kernel ropes decode rows), else all rows
    attn: AttentionBinding
    o: "DualLinear"
    ffn_norm: RMSNorm
    gate_up: list["DualLinear"]  # one fused gate/up with the swiglu epilogue, or gate and up
    swiglu: SwiGLU | None  # only when gate and up are separate
    down: "DualLinear"
    attention: PagedAttention  # this layer's variant (sliding window or not)
    qk_norm: HeadNorm | None = None  # qk_norm models (Qwen3, Gemma 3)
    post_attn_norm: RMSNorm | None = None  # post_norms models (Gemma): r += rmsnorm(xn) * w
    post_ffn_norm: RMSNorm | None = None
    rope_all: Rope | None = None  # attention.rope: every row, for steps where a sequence has several decode rows


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def _pad16(data: bytes) -> bytes:
    """A vector's bytes padded to whole vec4s (kernels that fold the norm load its weight as vec4<f32>)."""
    return data + b"\0" * (-len(data) % 16)


class DualLinear:
    """One weight, two bind groups: GEMV over the decode rows [0, Td), GEMM over the prefill rows [Td, T).

    Rows are ordered by the model so that one-token chunks come first; which kernel a row gets then depends only
    on its own sequence's chunk length (the batch invariance rule of linear.py).
    norm=(weight, eps): the GEMV reads the raw residual `norm_x` and applies the RMSNorm itself; the GEMM reads
    io.x, which the model fills with the normalised rows (only needed when there are prefill rows)."""

    def __init__(self, lib, weight: QuantWeight, io: LinearIO, *, params, epilogue: Epilogue = Epilogue(),
                 norm_x=None, label: str = "linear", tiles: tuple[int, ...] | None = None, ksplit: int = 1):
        dec_io = replace(io, count_index=STEP_DECODE, x=norm_x if epilogue.norm is not None else io.x)
        self.gemv = Linear(lib, weight, dec_io, kernel="gemv", epilogue=epilogue, params=params, label=label,
                           tiles=tiles, ksplit=ksplit)
        self.gemm = Linear(lib, weight, replace(io, count_index=STEP_PREFILL, start_index=STEP_DECODE),
                           kernel="gemm", epilogue=replace(epilogue, norm=None), params=params, label=label)

    def encode(self, cmds, n_decode: int, n_prefill: int) -> None:
        self.gemv.encode(cmds, n_decode)
        self.gemm.encode(cmds, n_prefill)


def score_rows(batch: StepBatch) -> list[tuple[int, int, int, int]]:
    """(chunk index, token row of the step, score id, top k) of every prompt-logprob row (SeqChunk.score_ids), in
    chunk order: the token rows of GPUModel._prepare (one-token chunks first, then the others, each in order)."""
    order = [i for i, c in enumerate(batch.chunks) if len(c.token_ids) == 1]
    order += [i for i, c in enumerate(batch.chunks) if len(c.token_ids) > 1]
    first, row = {}, 0
    for i in order:
        first[i] = row
        row += len(batch.chunks[i].token_ids)
    return [(i, first[i] + j, t, c.score_top) for i, c in enumerate(batch.chunks) for j, t in enumerate(c.score_ids)]


def group_scores(batch: StepBatch, rows: list, results: list) -> list | None:
    """Sampled.scores from score_rows' rows and their results (same order): per chunk None or its rows' results."""
    if not rows:
        return None
    out: list = [None] * len(batch.chunks)
    for (i, *_), r in zip(rows, results):
        if out[i] is None:
            out[i] = []
        out[i].append(r)
    return out


class GPUModel:
    """ModelRunner over one device. Build with `await GPUModel.load(device, package, ...)`."""

    kind = "gpu"

    def __init__(self):  # use load()
        self.block_size = self.num_blocks = self.max_model_len = 0

    # ------------------------------------------------------------------------------------------------ load
    @classmethod
    async def load(cls, device: Device, package, *, num_blocks: int, block_size: int = 16,
                   max_batch_tokens: int = 256, max_seqs: int = 16, max_model_len: int | None = None,
                   read: ComponentReader | None = None, fuse: bool = True, kv_f16: bool = False,
                   max_steps: int = 16, gemv_ksplit: int | None = None) -> "GPUModel":
        """Upload `package` (webinfer.package.Package) and build the graph.

        read(tensor_name, component, binding) -> bytes or an awaitable of bytes (the browser fetches
        asynchronously); default: package.read_component. num_blocks includes the null block 0.
        fuse=False keeps q/k/v and gate/up as separate dispatches (for tests of the unfused path); tensors of
        different formats are never fused.
        kv_f16=True stores the KV cache in f16 (half the memory; needs shader-f16); all math stays f32.
        max_steps: the longest decode block execute() takes (batch.py StepBatch.steps).
        gemv_ksplit: lanes per row group of the decode GEMVs and the LM head (gemv.wgsl KSPLIT; the logits' last
        bits depend on it); default `default_ksplit(device)`: 1 on a CPU or fallback adapter, 8 on a GPU.
        """
        self = cls()
        cfg = package.config
        self.cfg, self.device, self.package = cfg, device, package
        self.host_ms, self.steps = 0.0, 0  # running totals (execute)
        self.lib = KernelLibrary(device)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.vocab_size = cfg.vocab_size
        self.max_tokens, self.max_seqs = max_batch_tokens, max_seqs
        self.max_steps = max(1, max_steps)
        self.tiles = tiles_for(max_seqs)  # decode rows per step <= max_seqs: only the GEMV tiles that can be picked
        self.ksplit = default_ksplit(device) if gemv_ksplit is None else gemv_ksplit
        self._block_staging, self._block_staging_size = None, 0
        self._score_staging = self._score_out = None  # prompt logprobs' upload and read-back (_encode_scores)
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks}: need the null block plus at least one")
        reader = read or (lambda n, c, b: package.read_component(n, c, b))

        async def get(name: str, comp: str, binding: int = 0) -> bytes:
            data = reader(name, comp, binding)
            return await data if inspect.isawaitable(data) else data

        self._get = get
        d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        qd, kvd = cfg.q_dim, cfg.kv_dim
        T, S = max_batch_tokens, max_seqs
        self.arena = UniformArena(device)

        def buf(nbytes: int, label: str, usage: int = STORAGE | COPY_DST):
            return device.create_buffer(max(nbytes, 16), usage, label=label)

        max_blocks_per_seq = -(-self.max_model_len // block_size)
        seq_info, tables = step_buffers(device, S, S * max_blocks_per_seq)
        self.d_stride, self.f_stride, self.qkv_stride = _round4(d), _round4(f), _round4(qd + 2 * kvd)
        self.bufs = bf = Buffers(
            step=buf(16, "step"), ids=buf(4 * T, "ids"), pos=buf(4 * T, "pos"), slot=buf(4 * T, "slot"),
            rows=buf(4 * S, "sample_rows"), seq_info=seq_info, tables=tables,
            r=buf(4 * T * self.d_stride, "residual"), xn=buf(4 * T * self.d_stride, "normed"),
            qkv=buf(4 * T * self.qkv_stride, "qkv"), attn=buf(4 * T * _round4(qd), "attn_out"),
            act=buf(4 * T * self.f_stride, "mlp_act"), xs=buf(4 * S * self.d_stride, "final_rows"),
            logits=buf(4 * S * cfg.vocab_size, "logits", STORAGE | COPY_DST | COPY_SRC))
        self.block_ids = buf(4 * S * self.max_steps, "block.ids", COPY_SRC | COPY_DST)  # a decode block's ids
        self.block_logprobs = buf(LOGPROB_BYTES * S * self.max_steps, "block.logprobs", COPY_SRC | COPY_DST)
        # KV cache: per layer K and V [num_blocks, block_size, n_kv_heads, head_dim], f32 (or f16)
        if kv_f16 and not device.caps.f16:
            raise GPUError("kv_f16=True needs a device with shader-f16 (this one has none, or WEBINFER_FORCE_F32=1)")
        self.kv_f16 = kv_f16
        cache_bytes = num_blocks * block_size * kvd * (2 if kv_f16 else 4)
        limit = device.caps.max_binding_bytes
        if cache_bytes > limit:
            raise GPUError(f"a layer's KV cache needs {cache_bytes} bytes, more than one binding allows ({limit}); "
                           f"lower num_blocks (now {num_blocks})")
        self.k_cache = [buf(cache_bytes, f"k_cache.{i}") for i in range(L)]
        self.v_cache = [buf(cache_bytes, f"v_cache.{i}") for i in range(L)]

        p, lib, step = self.arena, self.lib, bf.step
        # embedding table (also the LM head when tied), split by rows over the package's bindings
        emb = await self._weight(["embed"])
        self.embed = Embed(lib, emb, bf.ids, bf.r, self.d_stride, step, STEP_TOKENS, p, scale=cfg.embedding_multiplier)
        # one attention variant per kind of layer (full / sliding), sharing the decode scratch buffer
        attn_kw = dict(n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                       block_size=block_size, max_model_len=self.max_model_len, max_seqs=S, q_stride=self.qkv_stride,
                       q_offset=0, kv_f16=kv_f16, softcap=cfg.attn_logit_softcapping,
                       scale=cfg.attn_scale if cfg.query_pre_attn_scalar is not None else None,
                       rope=cfg.head_dim % 16 == 0)  # decode rows: RoPE + KV write inside attention
        self.attention = PagedAttention(lib, **attn_kw)
        sliding = None
        if any(cfg.is_sliding(i) for i in range(L)) and cfg.sliding_window < self.max_model_len:
            sliding = PagedAttention(lib, **attn_kw, window=cfg.sliding_window, partials=self.attention.partials,
                                     label="attn.sliding")
        self._inv_freq: dict[tuple, Any] = {}
        eps = cfg.rms_norm_eps
        self.layers: list[_Layer] = []
        for i in range(L):
            pre = f"layers.{i}."
            wn_attn = await self._upload(_pad16(await get(pre + "attn_norm", "data")), f"{pre}attn_norm")
            attn_norm = RMSNorm(lib, d, eps, bf.r, wn_attn, bf.xn, self.d_stride, self.d_stride, step,
                                STEP_TOKENS, p, label=f"{pre}attn_norm")
            qkv = await self._qkv(pre, fuse, (wn_attn, eps))
            qk_norm = None
            if cfg.qk_norm:
                wqk = await self._upload(await get(pre + "q_norm", "data") + await get(pre + "k_norm", "data"),
                                         f"{pre}qk_norm")
                qk_norm = HeadNorm(lib, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, eps,
                                   bf.qkv, wqk, self.qkv_stride, step, STEP_TOKENS, p, label=f"{pre}qk_norm")
            theta, scaling = cfg.layer_rope(i)
            attention = sliding if cfg.is_sliding(i) and sliding else self.attention
            # with attention.rope the decode kernel ropes the decode rows: this kernel only the prefill rows
            rope = Rope(lib, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, bf.qkv,
                        self.qkv_stride, self.k_cache[i], self.v_cache[i], bf.pos, bf.slot,
                        await self._inv_freq_buf(theta, scaling), step,
                        STEP_PREFILL if attention.rope else STEP_TOKENS, p, label=f"{pre}rope", kv_f16=kv_f16,
                        mscale=attention_factor(scaling), start_index=STEP_DECODE if attention.rope else None)
            table = rope_all = None
            if attention.rope:
                table = await self._upload(rope_table(cfg.head_dim, theta, scaling), f"{pre}rope_table")
                rope_all = Rope(lib, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, bf.qkv,
                                self.qkv_stride, self.k_cache[i], self.v_cache[i], bf.pos, bf.slot,
                                await self._inv_freq_buf(theta, scaling), step, STEP_TOKENS, p, label=f"{pre}rope",
                                kv_f16=kv_f16, mscale=attention_factor(scaling))
            attn = attention.bind(bf.qkv, self.k_cache[i], self.v_cache[i], bf.tables, bf.seq_info, bf.attn, table)
            # post norms: the projection writes xn (free at that point), an accumulating RMSNorm adds it to r
            post = cfg.post_norms
            out = bf.xn if post else bf.r
            o = await self._linear([pre + "o"], bf.attn, _round4(qd), out, self.d_stride,
                                   Epilogue(accumulate=not post))
            post_attn = await self._post_norm(pre + "post_attn_norm") if post else None
            wn_ffn = await self._upload(_pad16(await get(pre + "ffn_norm", "data")), f"{pre}ffn_norm")
            ffn_norm = RMSNorm(lib, d, eps, bf.r, wn_ffn, bf.xn, self.d_stride, self.d_stride, step,
                               STEP_TOKENS, p, label=f"{pre}ffn_norm")
            gate_up, swiglu = await self._gate_up(pre, fuse, (wn_ffn, eps))
            down = await self._linear([pre + "down"], bf.act, self.f_stride, out, self.d_stride,
                                      Epilogue(accumulate=not post))
            post_ffn = await self._post_norm(pre + "post_ffn_norm") if post else None
            self.layers.append(_Layer(attn_norm, qkv, rope, attn, o, ffn_norm, gate_up, swiglu, down, attention,
                                      qk_norm, post_attn, post_ffn, rope_all))
        self.final_norm = RMSNorm(lib, d, eps, bf.r, await self._upload(await get("norm", "data"), "norm"),
                                  bf.xs, self.d_stride, self.d_stride, step, STEP_SAMPLED, p,
                                  row_map=bf.rows, label="final_norm")
        head = emb if cfg.tie_word_embeddings else await self._weight(["lm_head"])
        self.lm_head = Linear(lib, head, LinearIO(bf.xs, bf.logits, self.d_stride, cfg.vocab_size, step, STEP_SAMPLED),
                              tiles=self.tiles, params=p, label="lm_head", ksplit=self.ksplit)
        self.logit_cap = None
        if cfg.final_logit_softcapping is not None:
            self.logit_cap = SoftCap(lib, cfg.vocab_size, cfg.final_logit_softcapping, bf.logits, cfg.vocab_size,
                                     step, STEP_SAMPLED, p, label="logit_softcap")
        self.sampler = self._make_sampler()
        self._attentions = list({id(ly.attention): ly.attention for ly in self.layers}.values())
        self._recorded: dict[tuple, tuple] = {}
        return self

    async def _inv_freq_buf(self, theta: float, scaling: dict | None):
        """One inv_freq table per distinct (base, scaling): Gemma 3 has two (local and global layers)."""
        key = (theta, repr(scaling))
        if key not in self._inv_freq:
            hd = self.cfg.head_dim
            self._inv_freq[key] = await self._upload(struct.pack(f"<{hd // 2}f", *inv_freq(hd, theta, scaling)),
                                                     f"inv_freq.{len(self._inv_freq)}")
        return self._inv_freq[key]

    async def _post_norm(self, name: str) -> RMSNorm:
        """r += rmsnorm(xn) * w: Gemma's norm of a block's output, added to the residual."""
        w = await self._upload(_pad16(await self._get(name, "data")), name)
        return RMSNorm(self.lib, self.cfg.hidden_size, self.cfg.rms_norm_eps, self.bufs.xn, w, self.bufs.r,
                       self.d_stride, self.d_stride, self.bufs.step, STEP_TOKENS, self.arena, accumulate=True,
                       label=name)

    # the step buffers under their old names (tests and benchmarks read them)
    @property
    def step_buf(self):
        return self.bufs.step

    @property
    def logits_buf(self):
        return self.bufs.logits

    async def _upload(self, data: bytes, label: str):
        b = self.device.create_buffer(len(data), STORAGE | COPY_DST, label=label)
        self.device.write_buffer(b, 0, data)
        return b

    async def _weight(self, names: list[str], gate_up_rows: int | None = None) -> QuantWeight:
        """Upload a weight as a QuantWeight. One name: its package bindings become the parts. Several names (all
        of one format, one binding each: see _fusable): their rows concatenated into one part, or with
        gate_up_rows=F the two F-row tensors interleaved in blocks of 4 for the swiglu epilogue."""
        ts = [self.package.tensors[n] for n in names]
        t, label = ts[0], "+".join(names)
        if len(names) == 1:
            groups = [(b.rows[0], b.rows[1] - b.rows[0], {c: await self._get(t.name, c, bi) for c in t.components})
                      for bi, b in enumerate(t.bindings)]
        else:
            comps = {}
            for c in t.components:
                datas = [await self._get(n, c) for n in names]
                comps[c] = (interleave_gate_up(split_rows(datas[0], gate_up_rows), split_rows(datas[1], gate_up_rows))
                            if gate_up_rows else b"".join(datas))
            groups = [(0, sum(x.rows for x in ts), comps)]
        parts = []
        for row0, rows, comps in groups:
            qhigh = await self._upload(comps["qhigh"], f"{label}.qhigh") if "qhigh" in comps else None
            parts.append(WeightPart(row0, rows, await self._upload(comps["qweight"], f"{label}.qweight"),
                                    await self._upload(pack_meta(t.dtype, comps, rows), f"{label}.meta"), qhigh))
        return QuantWeight(t.dtype, sum(x.rows for x in ts), t.k, t.group_size, tuple(parts))

    async def _linear(self, names, x, x_stride, y, y_stride, epilogue: Epilogue = Epilogue(), *, n_offset=0,
                      gate_up_rows=None, label=None) -> DualLinear:
        w = await self._weight(names, gate_up_rows)
        io = LinearIO(x, y, x_stride, y_stride, self.bufs.step, n_offset=n_offset)
        return DualLinear(self.lib, w, io, params=self.arena, epilogue=epilogue, norm_x=self.bufs.r,
                          tiles=self.tiles, label=label or names[0], ksplit=self.ksplit)

    def _fusable(self, names: list[str], fuse: bool) -> bool:
        """Fuse only tensors of one format, group and K, each in one binding, whose fused components still fit
        one binding (a Q4_K_M file mixes q4k / q6k / q5_0 / q8 per tensor: those stay separate dispatches)."""
        ts = [self.package.tensors[n] for n in names]
        limit = self.device.caps.max_binding_bytes
        return (fuse and all(len(t.bindings) == 1 for t in ts) and len({(t.dtype, t.group_size, t.k) for t in ts}) == 1
                and all(sum(t.rows * t.row_bytes(c) for t in ts) <= limit for c in ts[0].components))

    async def _qkv(self, pre: str, fuse: bool, norm) -> list[DualLinear]:
        cfg, bf = self.cfg, self.bufs
        names = [pre + "q", pre + "k", pre + "v"]
        biases = [await self._get(n + "_bias", "data") for n in names] if cfg.attention_bias else [None] * 3
        if self._fusable(names, fuse):
            bias = await self._upload(b"".join(biases), f"{pre}qkv.bias") if cfg.attention_bias else None
            return [await self._linear(names, bf.xn, self.d_stride, bf.qkv, self.qkv_stride,
                                       Epilogue(bias=bias, norm=norm), label=f"{pre}qkv")]
        out, off = [], 0
        for n, b in zip(names, biases):
            bias = await self._upload(b, n + ".bias") if b is not None else None
            out.append(await self._linear([n], bf.xn, self.d_stride, bf.qkv, self.qkv_stride,
                                          Epilogue(bias=bias, norm=norm), n_offset=off))
            off += self.package.tensors[n].rows
        return out

    async def _gate_up(self, pre: str, fuse: bool, norm) -> tuple[list[DualLinear], SwiGLU | None]:
        f, bf = self.cfg.intermediate_size, self.bufs
        names = [pre + "gate", pre + "up"]
        if self._fusable(names, fuse) and f % 4 == 0 and self.cfg.activation == "silu":
            return [await self._linear(names, bf.xn, self.d_stride, bf.act, self.f_stride,
                                       Epilogue(swiglu=True, norm=norm), gate_up_rows=f,
                                       label=f"{pre}gate_up_swiglu")], None
        if bf.gu is None:
            bf.gu = self.device.create_buffer(4 * self.max_tokens * 2 * self.f_stride, STORAGE | COPY_DST,
                                              label="gate_up")
        lins = [await self._linear([n], bf.xn, self.d_stride, bf.gu, 2 * self.f_stride, Epilogue(norm=norm),
                                   n_offset=off) for n, off in zip(names, (0, self.f_stride))]
        act = SwiGLU(self.lib, self.f_stride, bf.gu, bf.act, 2 * self.f_stride, self.f_stride, bf.step, STEP_TOKENS,
                     self.arena, label=f"{pre}swiglu", gelu=self.cfg.activation == "gelu_tanh")
        return lins, act

    def _make_sampler(self):
        """The GPU sampler (webinfer/kernels/sampling.py): only S token ids come back per step."""
        return _StepSampler(self.lib, self.cfg.vocab_size, self.bufs.logits, self.max_seqs)

    # ------------------------------------------------------------------------------------------------ step
    def _prepare(self, batch: StepBatch):
        """Host-side step inputs. Token rows: all one-token (decode) chunks first, then multi-token chunks, so the
        decode rows [0, Td) go to GEMV and the prefill rows [Td, T) to GEMM; sampled rows keep chunk order."""
        bs = self.block_size
        for c in batch.chunks:
            n = len(c.token_ids)
            if n == 0:
                raise ValueError(f"sequence {c.seq_id}: empty chunk")
            end = c.start_pos + n
            if end > self.max_model_len:
                raise ContextOverflowError(end, self.max_model_len)
            if len(c.block_table) * bs < end:
                raise ValueError(f"sequence {c.seq_id}: block table of {len(c.block_table)} blocks does not cover "
                                 f"{end} positions (block size {bs})")
            for b in c.block_table[: -(-end // bs)]:
                if not 0 < b < self.num_blocks:
                    raise ValueError(f"sequence {c.seq_id}: block id {b} outside 1..{self.num_blocks - 1}")
            for tok in c.token_ids:
                if not 0 <= tok < self.cfg.vocab_size:
                    raise ValueError(f"sequence {c.seq_id}: token id {tok} outside the vocabulary of {self.cfg.vocab_size}")
        if len(batch.chunks) > self.max_seqs:
            raise ValueError(f"step of {len(batch.chunks)} sequences exceeds max_seqs={self.max_seqs}")
        if batch.num_tokens > self.max_tokens:
            raise ValueError(f"step of {batch.num_tokens} tokens exceeds max_batch_tokens={self.max_tokens}")
        order = [c for c in batch.chunks if len(c.token_ids) == 1] + [c for c in batch.chunks if len(c.token_ids) > 1]
        ids, pos, slots, seqs, last_row = [], [], [], [], {}
        for c in order:
            n = len(c.token_ids)
            end = c.start_pos + n
            seqs.append(SeqStep(ctx_len=end, block_table=list(c.block_table[: -(-end // bs)]), q_row=len(ids), n_q=n))
            for j, tok in enumerate(c.token_ids):
                p = c.start_pos + j
                ids.append(tok)
                pos.append(p)
                slots.append(c.block_table[p // bs] * bs + p % bs)
            last_row[id(c)] = len(ids) - 1
        sampled = [c for c in batch.chunks if c.sample]
        rows = [last_row[id(c)] for c in sampled]
        n_decode = sum(1 for c in batch.chunks if len(c.token_ids) == 1)
        return ids, pos, slots, rows, seqs, sampled, n_decode

    def encode_step(self, batch: StepBatch, timed: bool = False):
        """Write this step's inputs and record its commands (not submitted). Returns (commands, sampled chunks)."""
        ids, pos, slots, rows, seqs, sampled, n_dec = self._prepare(batch)
        T, S = len(ids), len(rows)
        dev, bf, smp = self.device, self.bufs, self.sampler
        info, tables, shape = pack_step(seqs)
        parts = [(struct.pack("<4I", T, S, n_dec, T - n_dec), bf.step), (struct.pack(f"<{T}I", *ids), bf.ids),
                 (struct.pack(f"<{T}I", *pos), bf.pos), (struct.pack(f"<{T}I", *slots), bf.slot),
                 (info, bf.seq_info), (tables, bf.tables)]
        if S:
            packed = smp.pack(sampled, smp.counts_slots.assign(sampled))
            parts += [(struct.pack(f"<{S}I", *rows), bf.rows), (packed.params, smp.params)]
            smp.write_aux(packed, sampled)
        cmds = dev.commands(timed=timed)
        # the step's inputs in one upload, copied into place by the step's own command buffer: a browser's
        # writeBuffer costs far more than a copy command (measured per token in the page: docs/performance.md)
        staging = self._staging(sum(len(b) for b, _ in parts))
        dev.write_buffer(staging, 0, b"".join(b for b, _ in parts))
        off = 0
        for blob, dst in parts:
            if blob:
                cmds.copy(staging, off, dst, 0, len(blob))
            off += len(blob)
        # several decode rows of one sequence (speculative verification): row j attends over the K/V of rows < j,
        # so the RoPE kernel writes every row's K/V first instead of the attention decode kernel
        dec_seqs = [c.seq_id for c in batch.chunks if len(c.token_ids) == 1]
        self._record(cmds, T, n_dec, S, shape, shared=len(set(dec_seqs)) < len(dec_seqs))
        if S:
            smp.kernel.encode(cmds, smp.binding, S)
        return cmds, sampled

    # how many step shapes keep their recorded commands (a decode step's shape changes only when its row count or
    # an attention grid does: every 128 positions, at most max_seqs rows)
    RECORDED_SHAPES = 256

    def _record(self, cmds, T: int, n_dec: int, S: int, shape, shared: bool = False) -> None:
        """The graph of one step over inputs already in place, up to the logits of its S sampled rows. shared:
        some sequence has several decode rows in the step (see encode_step).

        Every kernel's commands depend only on the row counts and the attention grids (the bind groups are made
        at load and read the step's counts from the step buffer), so a shape's commands are recorded once and
        reused: ~0.4 ms of Python a SmolLM2 step natively, more in Pyodide, which a real GPU's step of a
        millisecond would otherwise wait for (tests/gpu/test_recorded_steps.py)."""
        key = (T, n_dec, S, shared) + tuple(a.grid(shape) for a in self._attentions)
        ops = self._recorded.get(key)
        if ops is None:
            fresh = self.device.commands()
            self._record_graph(fresh, T, n_dec, S, shape, shared)
            ops = tuple(fresh.ops)
            if len(self._recorded) >= self.RECORDED_SHAPES:
                del self._recorded[next(iter(self._recorded))]  # the oldest shape
            self._recorded[key] = ops
        cmds.ops.extend(ops)

    def _record_graph(self, cmds, T: int, n_dec: int, S: int, shape, shared: bool) -> None:
        n_pre = T - n_dec
        self.embed.encode(cmds, T)
        for ly in self.layers:
            norms = n_pre > 0  # the GEMM reads normalised rows; the decode GEMV normalises r itself
            if norms:
                ly.attn_norm.encode(cmds, T)
            for lin in ly.qkv:
                lin.encode(cmds, n_dec, n_pre)
            if ly.qk_norm:
                ly.qk_norm.encode(cmds, T)
            if ly.rope_all is not None and shared:
                ly.rope_all.encode(cmds, T)
            else:
                ly.rope.encode(cmds, n_pre if ly.attention.rope else T)
            ly.attention.encode(cmds, ly.attn, shape, roped=ly.rope_all is not None and shared)
            ly.o.encode(cmds, n_dec, n_pre)
            if ly.post_attn_norm:
                ly.post_attn_norm.encode(cmds, T)
            if norms:
                ly.ffn_norm.encode(cmds, T)
            for lin in ly.gate_up:
                lin.encode(cmds, n_dec, n_pre)
            if ly.swiglu is not None:
                ly.swiglu.encode(cmds, T)
            ly.down.encode(cmds, n_dec, n_pre)
            if ly.post_ffn_norm:
                ly.post_ffn_norm.encode(cmds, T)
        if S:
            self.final_norm.encode(cmds, S)
            self.lm_head.encode(cmds, S)
            if self.logit_cap:
                self.logit_cap.encode(cmds, S)

    async def execute(self, batch: StepBatch) -> list[int]:
        if batch.steps > 1:
            return await self._execute_block(batch)
        t0 = time.perf_counter()
        batch.check_scores(self.cfg.vocab_size)
        cmds, sampled = self.encode_step(batch)
        srows = score_rows(batch)
        if srows:
            self._encode_scores(cmds, srows, len(sampled))
        self.device.submit(cmds)
        self.host_ms += (time.perf_counter() - t0) * 1e3  # Python encode + submit: the host's share of a step
        self.steps += 1
        if not srows:
            return await self.sampler.read(sampled) if sampled else []
        ids = await self.sampler.read(sampled, self.block_ids, self.block_logprobs) if sampled else []
        raw = await self.device.read_buffer(self._score_out, 0, LOGPROB_BYTES * len(srows))
        return Sampled(ids, getattr(ids, "logprobs", None), group_scores(batch, srows, unpack_logprobs(raw, len(srows))))

    def _encode_scores(self, cmds, srows: list, n_sampled: int) -> None:
        """Prompt logprobs after the step's own sampling (whose ids and logprobs are first copied aside, to the
        decode block's read-back buffers): the scored token rows in groups of up to max_seqs, each through the
        final norm, the LM head (its GEMV tiles: a row's bits do not depend on the group) and the sampler with the
        row's score id, whose logprob words go to one read-back buffer."""
        smp, bf, S = self.sampler, self.bufs, self.max_seqs
        if n_sampled:
            cmds.copy(smp.ids, 0, self.block_ids, 0, 4 * n_sampled)
            cmds.copy(smp.logprobs, 0, self.block_logprobs, 0, LOGPROB_BYTES * n_sampled)
        groups = [srows[g:g + S] for g in range(0, len(srows), S)]
        blobs = []
        for grp in groups:
            blobs += [struct.pack("<4I", 0, len(grp), 0, 0), struct.pack(f"<{len(grp)}I", *(r[1] for r in grp)),
                      pack_scores([(r[2], r[3]) for r in grp], self.cfg.vocab_size).params]
        data = b"".join(blobs)
        self._score_staging = self._grown(self._score_staging, len(data), COPY_SRC | COPY_DST, "score.staging")
        self._score_out = self._grown(self._score_out, LOGPROB_BYTES * len(srows), COPY_SRC | COPY_DST, "score.out")
        self.device.write_buffer(self._score_staging, 0, data)
        off = done = 0
        for k, grp in enumerate(groups):
            for blob, dst in zip(blobs[3 * k: 3 * k + 3], (bf.step, bf.rows, smp.params)):
                cmds.copy(self._score_staging, off, dst, 0, len(blob))
                off += len(blob)
            self.final_norm.encode(cmds, len(grp))
            self.lm_head.encode(cmds, len(grp))
            if self.logit_cap:
                self.logit_cap.encode(cmds, len(grp))
            smp.kernel.encode(cmds, smp.binding, len(grp))
            cmds.copy(smp.logprobs, 0, self._score_out, LOGPROB_BYTES * done, LOGPROB_BYTES * len(grp))
            done += len(grp)

    def _grown(self, buf, nbytes: int, usage: int, label: str):
        """buf, or (when it holds less than nbytes) a new buffer of the next power of two bytes."""
        if buf is not None and int(buf.size) >= nbytes:
            return buf
        if buf is not None:
            self.device.destroy_buffer(buf)
        return self.device.create_buffer(max(256, 1 << (nbytes - 1).bit_length()), usage, label=label)

    async def _execute_block(self, batch: StepBatch) -> list[int]:
        """A decode block (batch.py): K steps, one submit each and one read-back at the end.

        Every step's inputs (positions, cache slots, attention table, sampling rows) go up in one upload before the
        first step, and each step copies its own into the step buffers; step j + 1's embedding gathers the ids that
        step j's sampler wrote (a GPU copy), so the host never waits between steps, and the GPU starts step j while
        the host still records step j + 1. Each step records exactly the dispatches of a plain step of the same
        shape, so the ids equal K plain steps' (tests/test_decode_block.py)."""
        batch.check_block()
        K, n = batch.steps, len(batch.chunks)
        if K > self.max_steps:
            raise ValueError(f"a decode block of {K} steps exceeds max_steps={self.max_steps}")
        t0 = time.perf_counter()
        dev, bf, smp = self.device, self.bufs, self.sampler
        first = [c.token_ids[0] for c in batch.chunks]
        counts_slots = smp.counts_slots.assign(batch.chunks, steps=K)
        want_lp = any(c.logprobs is not None for c in batch.chunks)
        data, plan = bytearray(), []
        for j in range(K):
            _, pos, slots, rows, seqs, sampled, _ = self._prepare(batch.unrolled(j, first if j == 0 else [0] * n))
            info, tables, shape = pack_step(seqs)
            packed = smp.pack(sampled, counts_slots)
            if j == 0:
                aux = packed
            parts = []
            for blob, dst in ((struct.pack(f"<{n}I", *pos), bf.pos), (struct.pack(f"<{n}I", *slots), bf.slot),
                              (info, bf.seq_info), (tables, bf.tables), (packed.params, smp.params)):
                parts.append((len(data), len(blob), dst))
                data += blob
            plan.append((parts, shape))
        staging = self._staging(len(data))
        dev.write_buffer(staging, 0, bytes(data))
        dev.write_buffer(bf.step, 0, struct.pack("<4I", n, n, n, 0))
        dev.write_buffer(bf.ids, 0, struct.pack(f"<{n}I", *first))
        dev.write_buffer(bf.rows, 0, struct.pack(f"<{n}I", *rows))
        smp.write_aux(aux, batch.chunks)
        for j, (parts, shape) in enumerate(plan):
            cmds = dev.commands()
            if j:
                cmds.copy(smp.ids, 0, bf.ids, 0, 4 * n)
            for off, size, dst in parts:
                cmds.copy(staging, off, dst, 0, size)
            self._record(cmds, n, n, n, shape)
            smp.kernel.encode(cmds, smp.binding, n)
            cmds.copy(smp.ids, 0, self.block_ids, 4 * n * j, 4 * n)
            if want_lp:
                cmds.copy(smp.logprobs, 0, self.block_logprobs, LOGPROB_BYTES * n * j, LOGPROB_BYTES * n)
            dev.submit(cmds)
        self.host_ms += (time.perf_counter() - t0) * 1e3
        self.steps += K
        ids = list(struct.unpack(f"<{n * K}I", await dev.read_buffer(self.block_ids, 0, 4 * n * K)))
        if not want_lp:
            return ids
        lps = unpack_logprobs(await dev.read_buffer(self.block_logprobs, 0, LOGPROB_BYTES * n * K), n * K)
        return Sampled(ids, [lp if batch.chunks[i % n].logprobs is not None else None for i, lp in enumerate(lps)])

    def _staging(self, nbytes: int):
        """The upload buffer of a step's (or a decode block's) inputs, grown (to a power of two) when one needs more;
        queue order keeps a pending step's copies reading what was written before it."""
        if self._block_staging is None or self._block_staging_size < nbytes:
            if self._block_staging is not None:
                self.device.destroy_buffer(self._block_staging)
            self._block_staging_size = max(4096, 1 << (nbytes - 1).bit_length())
            self._block_staging = self.device.create_buffer(self._block_staging_size, COPY_SRC | COPY_DST,
                                                            label="block.staging")
        return self._block_staging

    async def logits(self, n_rows: int) -> list[list[float]]:
        """The logits rows of the last step's sampled chunks (tests and debugging; reads back S x V floats)."""
        v = self.cfg.vocab_size
        raw = await self.device.read_buffer(self.bufs.logits, 0, 4 * v * n_rows)
        flat = struct.unpack(f"<{v * n_rows}f", raw)
        return [list(flat[i * v : (i + 1) * v]) for i in range(n_rows)]

    def dispatch_count(self, batch: StepBatch) -> int:
        """Dispatches one step records (for reports); writes the step inputs as a side effect."""
        cmds, _ = self.encode_step(batch)
        return sum(1 for op in cmds.ops if op[0] == "dispatch")


class _StepSampler:
    """Binds the GPU sampler to the logits buffer once; per step writes the rows' parameters (and the aux words of
    structured-output masks and logit biases) and reads the ids (and the logprobs, when some row asked).
    Penalties read per-sequence token counts on the GPU (kernels/sampling.py CountsSlots); the counts buffer is
    allocated when a first row needs it."""

    def __init__(self, lib, vocab: int, logits_buf, max_rows: int):
        from ..kernels.sampling import CountsSlots, GpuSampler, aux_buffer, buffers, logprobs_buffer

        self.device, self.vocab, self.max_rows = lib.device, vocab, max_rows
        self.kernel = GpuSampler(lib, vocab)
        self.logits_buf = logits_buf
        self.params, self.ids = buffers(lib.device, max_rows)
        self.aux = aux_buffer(lib.device, max_rows, vocab)
        self.logprobs = logprobs_buffer(lib.device, max_rows)
        self.counts = None
        self.counts_slots = CountsSlots(max_rows, vocab, self._allocate_counts,
                                        lambda off, data: self.device.write_buffer(self.counts, off, data))
        self._bind()

    def _allocate_counts(self) -> None:
        from ..kernels.sampling import counts_buffer

        self.counts = counts_buffer(self.device, self.max_rows, self.vocab)
        self._bind()

    def _bind(self) -> None:
        self.binding = self.kernel.bind(self.logits_buf, self.params, self.ids, aux=self.aux, counts=self.counts,
                                        logprobs=self.logprobs)

    def pack(self, sampled, slots=None):
        from ..kernels.sampling import pack_chunks

        return pack_chunks(sampled, self.vocab, slots)

    def write_aux(self, packed, sampled) -> None:
        if any(c.mask is not None or c.logit_bias for c in sampled):
            self.device.write_buffer(self.aux, 0, packed.aux)

    async def read(self, sampled, ids_buf=None, logprobs_buf=None) -> list[int]:
        """The step's ids (and logprobs) from the sampler's buffers, or from where a step copied them."""
        n = len(sampled)
        ids = list(struct.unpack(f"<{n}I", await self.device.read_buffer(ids_buf or self.ids, 0, 4 * n)))
        if all(c.logprobs is None for c in sampled):
            return ids
        lps = unpack_logprobs(await self.device.read_buffer(logprobs_buf or self.logprobs, 0, LOGPROB_BYTES * n), n)
        return Sampled(ids, [lp if c.logprobs is not None else None for lp, c in zip(lps, sampled)])
