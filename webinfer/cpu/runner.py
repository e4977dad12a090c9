"""The CPU model runner: a package's transformer in the WebAssembly module of wasm/kernels.c (ModelRunner, batch.py).

Everything lives in the module's linear memory, placed once at load by a bump allocator here:
    weights       every component of every tensor, in its package encoding (webinfer/formats.py), copied one
                  binding at a time (no transient copy of the whole model); every quantized matrix but q4/q4a at
                  groups over 32 is then rewritten by the module into its packed GEMV layout (kernels.c wi_repack:
                  4 rows interleaved, f32 scales, the same weight values), its package bytes held only until then,
                  one matrix at a time (a model too big so: the package layouts, CpuRunner.load)
    descriptors   a 12-word Weight per matrix (o and down under split_k: two, one per part matrix of input
                  columns, wi_repack_part), a 16-word Layer per layer, one Model (see kernels.c)
    KV cache      per layer K and V [num_blocks, block_size, n_kv_heads, head_dim] f32 (block 0 = the null block)
    RoPE tables   cos / sin [max_model_len, head_dim / 2] f32, computed here in double precision
    scratch       activations for max_batch_tokens rows (under split_k also the o/down parts' outputs),
                  logits for max_seqs rows, the kernels' work area
    step area     the per-step inputs (token ids, positions, cache slots, sequences, block tables, sampling)
    team          with N threads (host.threads = N > 1): kernels.c's Team (barrier words), each worker thread's own
                  scratch (and residual, under split_k) and stack; the host starts workers 1..N-1 on it
                  (host.start_worker) and every step runs on all N, or (choose_threads: the page, and natively past
                  two threads) a decode block on the count of them that its timings show fastest
A step is one write of the step area, one call (`wi_step`) and one read of the sampled ids: no Python buffer per
kernel, no per-layer round trips.

Modes: "exact" (f32 activations; greedy ids follow the numpy reference) and "fast" (int8 activations per block of
32 with an f32 scale, as llama.cpp; see docs/performance.md for its perplexity change). `set_mode` switches
between them without reloading.

Sampling runs in the module with the GPU sampler's rule (webinfer/kernels/sampling.py), from the same packed rows
(sampling.pack): repetition / frequency / presence penalties (token counts in the module's memory, kept as the GPU
sampler keeps them), structured-output mask and logit_bias first; greedy = argmax with the lowest id on ties;
otherwise temperature -> min_p -> top-k -> top-p -> inverse CDF at uniform(seed, sample_index); logprobs (the
sampled token's and the top k) of the processed logits.
Pure Python (runs in Pyodide): struct and array only.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import struct
import time
from array import array

from ..engine.batch import Sampled, StepBatch
from ..engine.gpu_model import GPUModel, group_scores, score_rows
from ..kernels.rope import attention_factor, inv_freq
from ..kernels.sampling import (LOGPROB_BYTES, MAX_LOGIT_BIAS, CountsSlots, SampleRow, pack, pack_chunks,
                                pack_scores, unpack_logprobs)
from .wasm import _NTH_WORD, WasmMemoryError, bufs_words, spins_for, team_words

# kernels.c's format enum (F_*), one code per webinfer/formats.py format (tests/cpu/test_kernels.py checks both)
DTYPE_CODES = {"f32": 0, "q4": 1, "q4a": 2, "q8": 3, "q5_0": 4, "q5_1": 5, "q4k": 6, "q5k": 7, "q6k": 8, "q3k": 9,
               "q2k": 10, "iq4nl": 11, "iq4xs": 12}
WEIGHT_WORDS, LAYER_WORDS, MODEL_WORDS, STEP_WORDS = 12, 16, 42, 13
WORKER_STACK = 65536  # a worker thread's wasm stack (it runs the GEMVs only: a few hundred bytes deep)
PARAM_BYTES = 64  # sampling.py's RowParams, as kernels.c's SampleParams reads it
# the Model's FAST_* bits (kernels.c): fast = int8 activations everywhere but the down projection, which takes int16
# (measured: all-int8 cost +1.7 % perplexity on SmolLM2, the down projection's share the largest)
MODES = {"exact": 0, "fast": 1 | 2 | 4 | 16 | 32}
FAST_GATE_UP16 = 64  # GeGLU models (Gemma) in fast mode: gate and up take int16 activations too
# every logit exact: kernels.c's two-pass LM head (exact mode, 1-16 rows, greedy, or sampled with min_p or top-k alone)
# otherwise computes exactly only the logits the sampler reads and leaves bounds elsewhere in the logits row
# (docs/cpu-backend.md "The greedy LM head", "Sampled rows through the two-pass head")
FULL_LOGITS = 128
_FAST_WORD = 9  # index of `fast` in the Model struct
# kernels.c HEAD_LB_BYTES: every work buffer's room past the linear scratch (also the attention scores: max()) for
# the two-pass LM head's lower bounds and top-k floors, which the other threads read
HEAD_LB_BYTES = 128
_TEAM_WORD = 30  # index of `team` in the Model struct (0: a step runs on thread 0 alone, the workers stay parked)
_HEAD_WIDE_WORD = 41  # index of `head_wide` in the Model struct
# kernels.c two_pass_head: a sampled row whose last step let more than this fraction of the vocabulary into the
# second pass takes the one-pass head next; the default until calibrate_head measures this machine's break-even
HEAD_WIDE = 0.25
# a measured break-even below this turns the two passes off for sampled rows (0): they could gain at most this share
# of the head, and a step whose band turns out wide (the band is the last step's) costs up to a second head
HEAD_WIDE_MIN = 0.15


def mode_bits(mode: str, cfg) -> int:
    """The Model's FAST_* bits for `mode` on a model of config `cfg`. GeGLU models' (Gemma's) gate/up inputs have
    the outliers: int8 there cost Gemma 3 270M +2.0 % perplexity (+0.11 % with gate/up exact, +0.70 % as int16:
    2047 tokens of this repository's docs; int16 costs ~12 % of fast decode), so they take int16 there."""
    if mode not in MODES:
        raise ValueError(f"cpu mode {mode!r}: expected 'exact' or 'fast'")
    return MODES[mode] | (FAST_GATE_UP16 if mode == "fast" and cfg.activation == "gelu_tanh" else 0)


class Arena:
    """Bump allocator over the module's linear memory, from __heap_base up; grows memory as it goes."""

    LIMIT = 1 << 32  # the wasm32 address space (tests lower it)

    def __init__(self, host):
        self.host, self.top = host, host.heap_base

    def alloc(self, nbytes: int, what: str, align: int = 64) -> int:
        off = -(-self.top // align) * align
        end = off + max(nbytes, 4)
        if end > self.LIMIT:
            raise WasmMemoryError(f"wasm memory: {what} needs {nbytes} bytes at offset {off}; the model does not fit "
                                  f"the 4 GiB wasm32 address space (lower num_blocks / max_model_len, or use a "
                                  f"smaller quantization)")
        self.host.ensure(end)
        self.top = end
        return off

    def put(self, data: bytes, what: str, align: int = 64) -> int:
        off = self.alloc(len(data), what, align)
        self.host.write(off, data)
        return off


def weight_desc(dtype: str, n: int, k: int, group_size: int | None, comps: dict[str, int], bias: int = 0) -> bytes:
    """The Weight struct of kernels.c for a matrix whose components lie at `comps` offsets."""
    kp = k if dtype == "f32" else -(-k // group_size) * group_size
    c = (lambda name: comps.get(name, 0))
    first = comps["data"] if dtype == "f32" else comps["qweight"]
    return struct.pack(f"<{WEIGHT_WORDS}I", DTYPE_CODES[dtype], n, k, kp, group_size or 0, first, c("qhigh"),
                       c("scales"), c("mins"), c("super"), bias, 0)


def repack(host, arena, desc: int, what: str) -> int:
    """Rewrite the matrix at `desc` into the module's packed GEMV layout (kernels.c wi_repack: every quantized
    format but q4/q4a at groups over 32), placed by `arena`, as the runner loads it; returns the packed bytes (0:
    the format keeps its package layout). The package components stay where they are (the runner's own loading
    reuses their space)."""
    nbytes = host.call("wi_repack_bytes", desc)
    if nbytes:
        host.call("wi_repack", desc, arena.alloc(nbytes, f"{what} (packed)"))
    return nbytes


def rope_tables(head_dim: int, theta: float, scaling: dict | None, positions: int) -> tuple[bytes, bytes]:
    """cos and sin of angle = f32(pos) * f32(inv_freq[i]) rounded to f32, as the reference computes them; times
    LongRoPE's attention factor (rounded to f32 again, as the reference's f32 product) where the scaling has one."""
    freqs = array("f", inv_freq(head_dim, theta, scaling))
    cos_t, sin_t = array("f"), array("f")
    for p in range(positions):  # (map over C callables: this loop is part of the page's load)
        angles = array("f", map(float(p).__mul__, freqs))  # the f32 product: exact in double, then rounded once
        cos_t.extend(map(math.cos, angles))
        sin_t.extend(map(math.sin, angles))
    m = array("f", [attention_factor(scaling)])[0]
    if m != 1.0:
        cos_t, sin_t = array("f", map(m.__mul__, cos_t)), array("f", map(m.__mul__, sin_t))
    return cos_t.tobytes(), sin_t.tobytes()


def _check_f32_fields(cfg) -> None:
    """The config's floats the module reads as f32 must be finite there (a manifest is untrusted input: 1e300
    would fail struct.pack at load, or run as inf)."""
    from ..errors import FormatError  # noqa: PLC0415

    fields = {"rms_norm_eps": cfg.rms_norm_eps, "embedding_multiplier": cfg.embedding_multiplier,
              "attn_logit_softcapping": cfg.attn_logit_softcapping,
              "final_logit_softcapping": cfg.final_logit_softcapping,
              "query_pre_attn_scalar": cfg.attn_scale if cfg.query_pre_attn_scalar is not None else None}
    for name, v in fields.items():
        if v is not None and not (math.isfinite(v) and abs(v) < 3.4e38):
            raise FormatError("manifest.json", f"config.{name}", f"gives {v!r} to the CPU engine",
                              "a finite value within float32's range")


class CpuRunner:
    """ModelRunner over a wasm host (webinfer/cpu/wasm.py). Build with `await CpuRunner.load(host, package, ...)`."""

    kind = "cpu"
    max_steps = 16  # the longest decode block execute() takes (batch.py)
    # every row's arithmetic is its own whatever the chunk (tests/cpu/test_runner.py
    # test_one_token_rows_give_the_bits_of_a_chunk): recomputes and prefix hits need no path bookkeeping
    rows_match_chunks = True

    def __init__(self):  # use load()
        self.block_size = self.num_blocks = self.max_model_len = 0
        self.step_ms = 0.0  # wall time inside execute(), summed (the page's per-step CPU figure)
        self.module_ms = 0.0  # of which inside the module's step calls (the rest: this runner's host work)
        self.head_calibration = None  # calibrate_head's last figures

    @classmethod
    async def load(cls, host, package, **kw) -> "CpuRunner":
        """Copy `package` (webinfer.package.Package) into the module's memory and lay out the model (_load's
        arguments). The matrices take the packed GEMV layout (~1.35x a Q4_K_M package's bytes, for 2-4x faster
        GEMVs); a model that does not fit the module's memory so is laid out again in the package layouts,
        which hold less (slower GEMVs; runner.packed_weights says which): a ~4B Q4_K_M model then still loads."""
        try:
            return await cls._load(host, package, pack=True, **kw)
        except WasmMemoryError as e:
            runner = await cls._load(host, package, pack=False, **kw)  # (reuses the memory the first try grew)
            runner.pack_reason = f"package layouts: the packed layouts did not fit ({e})"
            return runner

    @classmethod
    async def _load(cls, host, package, *, pack: bool, mode: str = "exact", num_blocks: int, block_size: int = 16,
                    max_batch_tokens: int = 256, max_seqs: int = 16, max_model_len: int | None = None,
                    read=None) -> "CpuRunner":
        """read(tensor_name, component, binding) -> bytes or an awaitable of bytes (the page fetches
        asynchronously); default package.read_component. num_blocks includes the null block 0. pack: rewrite the
        matrices the module can pack into its packed GEMV layout."""
        if mode not in MODES:
            raise ValueError(f"cpu mode {mode!r}: expected 'exact' or 'fast'")
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks}: need the null block plus at least one")
        self = cls()
        cfg = package.config
        _check_f32_fields(cfg)
        self.cfg, self.host, self.package, self.mode = cfg, host, package, mode
        self._full_logits = False
        self.packed_weights, self.pack_reason = pack, "packed GEMV layouts" if pack else "package layouts (asked)"
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.vocab_size = cfg.vocab_size
        self.max_tokens, self.max_seqs = max_batch_tokens, max_seqs
        reader = read or (lambda n, c, b: package.read_component(n, c, b))
        self.arena = arena = Arena(host)

        async def get(name: str, comp: str, binding: int = 0) -> bytes:
            data = reader(name, comp, binding)
            return await data if inspect.isawaitable(data) else data

        async def tensor(name: str) -> dict[str, int]:
            """Every component of a tensor, all bindings' rows contiguous: {component: offset}."""
            t = package.tensors[name]
            comps = {}
            for c in t.components:
                rb = t.row_bytes(c)
                off = arena.alloc(t.rows * rb, f"{name}.{c}")
                for bi, b in enumerate(t.bindings):
                    host.write(off + b.rows[0] * rb, await get(name, c, bi))
                comps[c] = off
            return comps

        resident: dict[str, int] = {}  # the bytes of each matrix as the module reads them (packed or not)

        async def matrix(name: str, bias: str | None = None, split: int = 0) -> int:
            """The matrix's Weight descriptor, packed where the format allows (and pack); split > 0 (split_k's o
            and down, always packable): two part matrices, units [0, split) and [split, kp / 32), each packed on
            its own, their descriptors side by side at the returned offset."""
            t = package.tensors[name]
            b = (await tensor(bias))["data"] if bias else 0
            desc = arena.alloc(4 * WEIGHT_WORDS * (2 if split else 1), f"{name}.desc")
            host.write(desc, weight_desc(t.dtype, t.rows, t.k, t.group_size, {"qweight": 0}, b))
            packed = host.call("wi_repack_bytes", desc) if pack else 0
            resident[name] = packed or sum(t.rows * t.row_bytes(c) for c in t.components)
            if not packed:
                host.write(desc, weight_desc(t.dtype, t.rows, t.k, t.group_size, await tensor(name), b))
                return desc
            # the package's components go to a transient area above the packed matrix, which the next
            # allocations reuse: one matrix's package bytes at a time on top of the model
            nu = -(-t.k // t.group_size) * t.group_size // 32  # 32-element units a row (kp / 32)
            if split:
                dst = [arena.alloc(packed // nu * split, f"{name} (packed part 0)"),
                       arena.alloc(packed // nu * (nu - split), f"{name} (packed part 1)")]
            else:
                dst = arena.alloc(packed, f"{name} (packed)")
            mark = arena.top
            src = arena.alloc(4 * WEIGHT_WORDS, f"{name}.desc (package)") if split else desc
            host.write(src, weight_desc(t.dtype, t.rows, t.k, t.group_size, await tensor(name), b))
            if split:
                host.call("wi_repack_part", src, dst[0], 0, split, desc)
                host.call("wi_repack_part", src, dst[1], split, nu, desc + 4 * WEIGHT_WORDS)
            else:
                host.call("wi_repack", desc, dst)
            arena.top = mark
            return desc

        def packable(name: str) -> bool:
            t, probe = package.tensors[name], arena.top
            desc = arena.alloc(4 * WEIGHT_WORDS, "probe")
            host.write(desc, weight_desc(t.dtype, t.rows, t.k, t.group_size, {"qweight": 0}))
            ok = host.call("wi_repack_bytes", desc) > 0
            arena.top = probe
            return ok

        # kernels.c step_body's split_k: o and down as two part matrices by input columns (o's by halves of the
        # query heads, down's by halves of f's units), where every o and down packs and o's halves are whole units
        o_split, down_split = self._split_k(pack, packable)
        self.split_in_parts = o_split > 0
        d, f, L, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.head_dim
        qd, kvd, V = cfg.q_dim, cfg.kv_dim, cfg.vocab_size
        embed = await matrix("embed")
        lm_head = embed if cfg.tie_word_embeddings else await matrix("lm_head")
        cache_bytes = num_blocks * block_size * kvd * 4
        layers = bytearray()
        for i in range(L):
            p = f"layers.{i}."
            attn_norm = (await tensor(p + "attn_norm"))["data"]
            bias = cfg.attention_bias
            q = await matrix(p + "q", p + "q_bias" if bias else None)
            k = await matrix(p + "k", p + "k_bias" if bias else None)
            v = await matrix(p + "v", p + "v_bias" if bias else None)
            o = await matrix(p + "o", split=o_split)
            ffn_norm = (await tensor(p + "ffn_norm"))["data"]
            gate, up = await matrix(p + "gate"), await matrix(p + "up")
            down = await matrix(p + "down", split=down_split)
            kc = arena.alloc(cache_bytes, f"{p}k_cache")
            vc = arena.alloc(cache_bytes, f"{p}v_cache")
            qn, kn = ((await tensor(p + "q_norm"))["data"], (await tensor(p + "k_norm"))["data"]) if cfg.qk_norm else (0, 0)
            pa, pf = ((await tensor(p + "post_attn_norm"))["data"], (await tensor(p + "post_ffn_norm"))["data"]) \
                if cfg.post_norms else (0, 0)
            layers += struct.pack(f"<{LAYER_WORDS}I", attn_norm, ffn_norm, kc, vc, q, k, v, o, gate, up, down, qn, kn,
                                  pa, pf, int(cfg.is_sliding(i)))
        norm = (await tensor("norm"))["data"]
        # what one decode step reads of the weights: every matrix once, but only a row of an embedding that is
        # not also the LM head (the bench's bandwidth bound on decode speed)
        self.step_weight_bytes = sum(v for n, v in resident.items() if n != "embed" or cfg.tie_word_embeddings)
        layers_off = arena.put(bytes(layers), "layers")
        cos_b, sin_b = rope_tables(hd, cfg.rope_theta, cfg.rope_scaling, self.max_model_len)
        cos_t, sin_t = arena.put(cos_b, "rope.cos"), arena.put(sin_b, "rope.sin")
        sliding = [i for i in range(L) if cfg.is_sliding(i)]
        cos_l, sin_l = cos_t, sin_t
        if sliding and cfg.layer_rope(sliding[0]) != (cfg.rope_theta, cfg.rope_scaling):  # Gemma 3's local base
            cos_b, sin_b = rope_tables(hd, *cfg.layer_rope(sliding[0]), self.max_model_len)
            cos_l, sin_l = arena.put(cos_b, "rope.cos_local"), arena.put(sin_b, "rope.sin_local")

        T, S = max_batch_tokens, max_seqs
        kmax = max((t.k_padded or t.k) for t in package.tensors.values() if len(t.shape) == 2)
        linear_work = host.call("wi_linear_scratch_bytes", max(T, S), kmax)
        scores = 2 * (self.max_model_len + 4)  # kernels.c attend_row: the scores, then the positions' offsets
        work = max(linear_work + HEAD_LB_BYTES, 21 * V + 64)  # sample_row: 21 x vocab (thread 0 alone samples)
        a = lambda n, what: arena.alloc(4 * n, what)  # noqa: E731
        scratch = [a(T * d, "r"), a(T * d, "xn"), a(T * qd, "q"), a(T * kvd, "k"), a(T * kvd, "v"), a(T * qd, "attn"),
                   a(T * f, "g"), a(T * f, "u"), a(S * V, "logits"), a(S * d, "xs"), a(scores, "scores"),
                   arena.alloc(work, "work")]
        self.logits_off = scratch[8]
        self.threads = getattr(host, "threads", 1)
        team, stacks = 0, []
        if self.threads > 1:  # each worker's scratch and stack, and the team that joins them
            bufs = b""
            for tid in range(1, self.threads):
                bufs += bufs_words(arena.alloc(max(linear_work + HEAD_LB_BYTES, 4 * scores), f"thread {tid} work"),
                                   a(max(T, S) * d, f"thread {tid} xn"),  # (its normed rows: the layers', the sampled)
                                   a(T * kvd, f"thread {tid} k"), a(T * kvd, f"thread {tid} v"),
                                   a(T * d, f"thread {tid} r") if self.split_in_parts else 0)  # (split_k: a residual)
                stacks.append(arena.alloc(WORKER_STACK, f"thread {tid} stack") + WORKER_STACK)
            team = arena.put(team_words(self.threads, arena.put(bufs, "thread buffers"),
                                        spins_for(self.threads, getattr(host, "cores", None))), "team")
        head = struct.pack("<8If3I", d, f, L, cfg.num_attention_heads, cfg.num_key_value_heads, hd, V, block_size,
                           cfg.rms_norm_eps, mode_bits(mode, cfg), self.max_model_len, self.max_model_len)
        po = a(T * d, "po") if cfg.post_norms else 0
        parts = a(4 * T * d, "parts") if self.split_in_parts else 0  # (split_k: the parts' outputs)
        # the family features (kernels.c Model): f32 fields rounded as the reference rounds them; a window past
        # max_model_len never bites (clamped: a manifest's huge window must not overflow the u32)
        family = struct.pack("<I4fI4I", int(cfg.activation == "gelu_tanh"), cfg.embedding_multiplier,
                             cfg.attn_scale if cfg.query_pre_attn_scalar is not None else 0.0,
                             cfg.attn_logit_softcapping or 0.0, cfg.final_logit_softcapping or 0.0,
                             min(cfg.sliding_window, self.max_model_len) if sliding else 0, cos_l, sin_l, po,
                             parts) + struct.pack("<f", HEAD_WIDE)
        self.head_wide = HEAD_WIDE
        self.model_off = arena.put(head + struct.pack("<19I", embed, lm_head, norm, cos_t, sin_t, layers_off, *scratch,
                                                      team) + family, "model")
        self.team_off, self.chooser, self.threads_used = team, None, self.threads
        self.max_blocks_per_seq = -(-self.max_model_len // block_size)
        aux_words = S * ((V + 31) // 32 + 2 * MAX_LOGIT_BIAS)  # a mask and the bias entries per sampled row
        step_bytes = (4 * (STEP_WORDS + 3 * T + 4 * S + S * self.max_blocks_per_seq + S + S + aux_words)
                      + PARAM_BYTES * S)
        self.step_off = arena.alloc(step_bytes, "step")
        self.logprobs_off = arena.alloc(LOGPROB_BYTES * S, "logprobs")
        # a decode block's ids and logprob rows, every step's (wi_steps)
        self.block_ids_off = arena.alloc(4 * S * self.max_steps, "block ids")
        self.block_logprobs_off = arena.alloc(LOGPROB_BYTES * S * self.max_steps, "block logprobs")
        # the penalties' token counts (kernels/sampling.py CountsSlots), placed in the module's memory when a first
        # penalized row comes; the module counts each id it samples
        self.counts_off = 0

        def allocate() -> None:
            self.counts_off = arena.alloc(4 * S * V, "penalty counts")
        self.counts_slots = CountsSlots(S, V, allocate, lambda off, data: host.write(self.counts_off + off, data))
        # last: every allocation that may fail (load's retry in the package layouts) comes before; the page's host
        # returns awaitables (a Worker each to load and start): they start together
        started = [host.start_worker(team, tid, stack_top) for tid, stack_top in enumerate(stacks, 1)]
        if pending := [s for s in started if inspect.isawaitable(s)]:
            await asyncio.gather(*pending)
        return self

    def _split_k(self, pack: bool, packable) -> tuple[int, int]:
        """Where kernels.c step_body's split_k cuts o and down (the unit part 1 starts at), or (0, 0): no split_k.
        o's part 0 holds the first half of the query heads (thread 0's attention heads on two threads), which must
        be whole 32-element units; down's holds the first half of f's units; every o and down must pack (the
        packed layout is the only one a part is made in)."""
        cfg, hd, h = self.cfg, self.cfg.head_dim, self.cfg.num_attention_heads
        o_cols, nd = h // 2 * hd, -(-cfg.intermediate_size // 32)
        mats = [f"layers.{i}.{m}" for i in range(cfg.num_hidden_layers) for m in ("o", "down")]
        if not (pack and hd % 4 == 0 and h >= 2 and o_cols % 32 == 0 and nd >= 2 and all(map(packable, mats))):
            return 0, 0
        return o_cols // 32, nd // 2

    def close(self) -> None:
        """Stop the host's second thread, if any (also done at garbage collection and at exit)."""
        close = getattr(self.host, "close", None)
        if close is not None:
            close()

    @property
    def memory_bytes(self) -> int:
        """The module's memory in use (the penalties' token counts join when a first penalized request comes)."""
        return self.arena.top

    def set_mode(self, mode: str) -> None:
        """Switch between "exact" and "fast" activations (the weights stay as they are)."""
        self.mode = mode
        self._write_fast_bits()

    @property
    def full_logits(self) -> bool:
        """Whether every step computes every logit exactly (needed by logits()); off, an exact-mode step whose sampled
        rows (1-16) are all greedy or sampled with min_p or top-k alone computes exactly only the logits each row's
        draw reads (the same ids, a faster head)."""
        return self._full_logits

    @full_logits.setter
    def full_logits(self, on: bool) -> None:
        self._full_logits = bool(on)
        self._write_fast_bits()

    def _write_fast_bits(self) -> None:
        bits = mode_bits(self.mode, self.cfg) | (FULL_LOGITS if self._full_logits else 0)
        self.host.write(self.model_off + 4 * _FAST_WORD, struct.pack("<I", bits))

    # ------------------------------------------------------------------------------------------------ step
    def _write_step(self, ids, pos, slots, seqs, rows, sampling) -> int:
        """Lay out the step area (kernels.c Step) in one write; returns the offset of out_ids.
        sampling: sampling.pack() of the sampled rows (params and the aux words of masks and biases)."""
        T, S, N = len(ids), len(rows), len(seqs)
        base = self.step_off
        o_ids = base + 4 * STEP_WORDS
        o_pos, o_slot = o_ids + 4 * T, o_ids + 8 * T
        o_seqs = o_ids + 12 * T
        o_tables = o_seqs + 16 * N
        tables, seq_words = [], []
        for s in seqs:
            seq_words += [s.q_row, s.n_q, s.ctx_len - s.n_q, o_tables + 4 * len(tables)]
            tables += s.block_table
        o_rows = o_tables + 4 * len(tables)
        o_params = o_rows + 4 * S
        o_out = o_params + len(sampling.params)
        o_aux = o_out + 4 * S
        head = struct.pack(f"<{STEP_WORDS}I", T, N, S, o_ids, o_pos, o_slot, o_seqs, o_rows, o_params, o_out, o_aux,
                           self.counts_off, self.logprobs_off)
        body = struct.pack(f"<{3 * T + len(seq_words) + len(tables) + S}I", *ids, *pos, *slots, *seq_words, *tables,
                           *rows)
        self.host.write(base, head + body + sampling.params + bytes(4 * S) + sampling.aux)
        return o_out

    def choose_threads(self) -> None:
        """From now on run each decode block on the thread count that its own timings show fastest (threads.py
        ThreadChooser over candidate_counts(threads); the page turns this on for its Workers, natively past two
        threads), and a single decode step on what its blocks chose; prompt chunks keep every thread. The ids are
        the same either way."""
        if self.team_off:
            from .threads import ThreadChooser, candidate_counts  # noqa: PLC0415

            self.chooser = ThreadChooser(candidate_counts(self.threads))

    def _use_threads(self, n: int) -> None:
        if self.team_off and n != self.threads_used:
            if n > 1:  # (between steps: the workers read a step's count from its go word, kernels.c wi_worker)
                self.host.write(self.team_off + 4 * _NTH_WORD,  # nth and spins, the Team's first two words
                                struct.pack("<2I", n, spins_for(n, getattr(self.host, "cores", None))))
            self.host.write(self.model_off + 4 * _TEAM_WORD, struct.pack("<I", self.team_off if n > 1 else 0))
            self.threads_used = n

    def _run(self, ids, pos, slots, seqs, rows, sampling) -> list[int]:
        o_out = self._write_step(ids, pos, slots, seqs, rows, sampling)
        decode = self.chooser is not None and len(ids) == len(seqs)  # one token a sequence: as its blocks run best
        self._use_threads(self.chooser.best((self.mode, len(seqs))) if decode else self.threads)
        t0 = time.perf_counter()
        self.host.call("wi_step", self.model_off, self.step_off)
        self.module_ms += (time.perf_counter() - t0) * 1e3
        n = len(rows)
        return list(struct.unpack(f"<{n}I", self.host.read(o_out, 4 * n))) if n else []

    async def execute(self, batch: StepBatch) -> list[int]:
        t0 = time.perf_counter()
        try:
            if batch.steps == 1:
                return self._execute_step(batch)
            return self._execute_block(batch)
        finally:
            self.step_ms += (time.perf_counter() - t0) * 1e3

    def _execute_step(self, batch: StepBatch) -> list[int]:
        # the GPU model's validation and row layout (pure host code): same errors, same token rows; the sampling
        # rows and their packing are the GPU sampler's too (masks, logit_bias, min_p)
        batch.check_scores(self.vocab_size)
        ids, pos, slots, rows, seqs, sampled, _ = GPUModel._prepare(self, batch)
        out = self._run(ids, pos, slots, seqs, rows,
                        pack_chunks(sampled, self.vocab_size, self.counts_slots.assign(sampled)))
        lps = None
        if any(c.logprobs is not None for c in sampled):
            lps = unpack_logprobs(self.host.read(self.logprobs_off, LOGPROB_BYTES * len(out)), len(out))
            lps = [lp if c.logprobs is not None else None for lp, c in zip(lps, sampled)]
        srows = score_rows(batch)
        if not srows:
            return out if lps is None else Sampled(out, lps)
        return Sampled(out, lps, group_scores(batch, srows, self._scores(ids, pos, slots, seqs, srows)))

    def _scores(self, ids, pos, slots, seqs, srows) -> list:
        """Prompt logprobs of the step just run (batch.py SeqChunk.score_ids): its scored token rows in groups of up
        to max_seqs (the logits scratch's rows), each through kernels.c wi_head (final norm, one-pass LM head, the
        sampler's logprobs at the row's score id), the head's columns split among the threads as a step's are."""
        out = []
        for g in range(0, len(srows), self.max_seqs):
            grp = srows[g:g + self.max_seqs]
            self._write_step(ids, pos, slots, seqs, [r[1] for r in grp],
                             pack_scores([(r[2], r[3]) for r in grp], self.vocab_size))
            t0 = time.perf_counter()
            self.host.call("wi_head", self.model_off, self.step_off)
            self.module_ms += (time.perf_counter() - t0) * 1e3
            out += unpack_logprobs(self.host.read(self.logprobs_off, LOGPROB_BYTES * len(grp)), len(grp))
        return out

    def _execute_block(self, batch: StepBatch) -> list[int]:
        """A decode block (batch.py) in one call: the host writes step 0 and the module runs the K steps, feeding
        each the ids the one before sampled (kernels.c wi_steps), so the ids are K single steps'. What it saves
        is the host between steps: the engine's scheduling and this runner's step writes and reads (in the page,
        Python in Pyodide while a second Worker waits). With the thread choice on, the block runs in the segments
        the chooser plans (each a wi_steps call from the steps run so far), each on its own thread count."""
        from dataclasses import replace  # noqa: PLC0415

        batch.check_block()
        K, n = batch.steps, len(batch.chunks)
        if K > self.max_steps:
            raise ValueError(f"a decode block of {K} steps exceeds max_steps={self.max_steps}")
        first = [c.token_ids[0] for c in batch.chunks]
        # the last step's inputs validate the whole block (positions, tables); its tables reach K positions on
        last = GPUModel._prepare(self, batch.unrolled(K - 1, first))[4]
        ids, pos, slots, rows, seqs, sampled, _ = GPUModel._prepare(self, batch.unrolled(0, first))
        seqs = [replace(s0, block_table=sk.block_table) for s0, sk in zip(seqs, last)]
        self._write_step(ids, pos, slots, seqs, rows,
                         pack_chunks(sampled, self.vocab_size, self.counts_slots.assign(sampled, steps=K)))
        want_lp = any(c.logprobs is not None for c in sampled)
        key = (self.mode, n)
        done = 0
        for threads, k in self.chooser.plan(key, K) if self.chooser else [(self.threads, K)]:
            self._use_threads(threads)
            t0 = time.perf_counter()
            self.host.call("wi_steps", self.model_off, self.step_off, done + k, self.block_ids_off,
                           self.block_logprobs_off if want_lp else 0, done)
            dt = time.perf_counter() - t0
            self.module_ms += dt * 1e3
            if self.chooser:
                self.chooser.observe(key, threads, dt / k)
            done += k
        out = list(struct.unpack(f"<{n * K}I", self.host.read(self.block_ids_off, 4 * n * K)))
        if not want_lp:
            return out
        lps = unpack_logprobs(self.host.read(self.block_logprobs_off, LOGPROB_BYTES * n * K), n * K)
        return Sampled(out, [lp if sampled[i % n].logprobs is not None else None for i, lp in enumerate(lps)])

    def calibrate_head(self, reps: int = 5) -> dict | None:
        """Measure, on this machine, where the exact-mode LM head's two passes stop paying for a sampled row and
        set the Model's head_wide to it (kernels.c two_pass_head), or to 0 (sampled rows take one pass) where that
        break-even is below HEAD_WIDE_MIN. A sampled row's two passes cost the first pass (about what a greedy
        row's two passes cost) plus its band's rows recomputed at the one-pass head's cost per row, so they pay
        while band < 1 - two / one. That break-even was ~0.35 on Gemma 3 270M where the exact
        head is bound by its multiplies and ~0.05 where neither head is (both read ~11 GB/s of a 27 GB/s machine; both
        measured on this project's VM, on different days). The fastest of `reps` alternating batches of each (a
        transient slowdown on a shared machine gave one side 1.5x). Runs a warm-up step on the null block first (the
        activation row the heads are timed on: a real one); the engine must be idle. None where the LM head never
        takes two passes (not packed, or a final soft-cap); else {one_ms, two_ms, break_even, head_wide}. The ids
        never depend on it: both heads give the same ids."""
        m = struct.unpack(f"<{MODEL_WORDS}I", self.host.read(self.model_off, 4 * MODEL_WORDS))
        head = struct.unpack(f"<{WEIGHT_WORDS}I", self.host.read(m[13], 4 * WEIGHT_WORDS))
        if head[11] != 1 or self.cfg.final_logit_softcapping:
            return None
        self.warm_up(1)
        d, V, logits, xs, work = self.cfg.hidden_size, self.vocab_size, m[26], m[27], m[29]
        calls = {"one": ("wi_linear_reps", m[13], xs, d, logits, V, 1, 0, work, 1),
                 "two": ("wi_head_two_pass", m[13], xs, logits, work, 0)}

        def batch(args, n: int) -> float:  # seconds a call, over n calls
            t0 = time.perf_counter()
            for _ in range(n):
                self.host.call(*args)
            return (time.perf_counter() - t0) / n

        # batches of >= ~10 ms each (a page's clock may tick in 0.1 ms steps), at most 256 calls
        n = max(1, min(256, math.ceil(0.01 / max(batch(calls["one"], 1), 1e-6))))
        times = {k: [] for k in calls}
        for _ in range(reps):
            for k, args in calls.items():
                times[k].append(batch(args, n))
        one, two = min(times["one"]), min(times["two"])  # (the least disturbed batch of each)
        even = round(min(0.5, max(0.0, 1.0 - two / one)), 3) if one > 0 else HEAD_WIDE
        self.set_head_wide(even if even >= HEAD_WIDE_MIN else 0.0)
        self.head_calibration = {"one_ms": round(one * 1e3, 4), "two_ms": round(two * 1e3, 4),
                                 "break_even": even, "head_wide": self.head_wide}
        return self.head_calibration

    def set_head_wide(self, fraction: float) -> None:
        """kernels.c two_pass_head's band limit for sampled rows (calibrate_head measures it; tests pin it)."""
        self.head_wide = fraction
        self.host.write(self.model_off + 4 * _HEAD_WIDE_WORD, struct.pack("<f", fraction))

    def warm_up(self, steps: int = 1) -> None:
        """Run the module's hot code on the null block: a short prefill (the GEMM path), then `steps` decode steps
        (the GEMV path, attention, sampling). A browser compiles a module with its baseline compiler first and
        optimizes each function only once it has run hot, in a background thread (V8's dynamic tiering): the page
        runs this after ready, while the user reads, so that the first chat finds optimized code and no compile
        shares the cores with it (webinfer/browser_worker.py: slices of steps for up to WARM_UP_S). Natively the
        module is compiled once, fully, at load. Writes only the null block 0 (never in a request's block table),
        the scratch and the step area, and leaves the step counters alone; the engine must be idle."""
        from ..kernels.attention import SeqStep

        module_ms = self.module_ms

        n = max(1, min(4, self.max_seqs, self.max_tokens, self.block_size - 1))
        ids = [(7 + 31 * i) % self.vocab_size for i in range(n + 1)]
        for start, chunk in ((0, ids[:n]),) + ((n, ids[n:]),) * steps:  # slot = position: block 0's
            pos = list(range(start, start + len(chunk)))
            seq = SeqStep(ctx_len=start + len(chunk), block_table=[0], q_row=0, n_q=len(chunk))
            self._run(chunk, pos, pos, [seq], list(range(len(chunk))), pack([SampleRow(j) for j in range(len(chunk))]))
        self.module_ms = module_ms

    def logits(self, n_rows: int) -> list[array]:
        """The logits rows of the last step's sampled chunks (f32 arrays; tests, evaluation). Needs full_logits on
        for that step."""
        if not self._full_logits:
            raise ValueError("CpuRunner.logits: set runner.full_logits = True before the step (without it the "
                             "two-pass LM head leaves bounds, not logits, outside what the sampler reads)")
        v = self.vocab_size
        raw = self.host.read(self.logits_off, 4 * v * n_rows)
        return [array("f", raw[4 * v * i: 4 * v * (i + 1)]) for i in range(n_rows)]
