"""Token sampling on the GPU (shaders/sample.wgsl): logits rows in, one u32 token id per row out.

What it computes (exactly `webinfer_packager.reference.model.Sampler`'s distribution, in f32):
  greedy when temperature <= 0 or top_k == 1: argmax, lowest id on ties;
  else temperature -> top-k (ties at the k-th value: lowest ids first) -> top-p (shortest prefix, in logit-descending /
  id-ascending order, whose mass reaches top_p) -> inverse CDF in id order at u * mass, u = `uniform(seed, index)`.
The draw is a pure function of (logits, parameters, seed, index): a request that resamples index i gets the same
token, and a row's result never depends on the other rows in the dispatch.

Per-row controls (SampleRow fields; rows that use none of them cost nothing extra), applied before the above in
this order: repetition_penalty (on tokens of the prompt or the output), frequency_penalty / presence_penalty (on
output counts), logit_bias (sparse), the token mask (structured output: `GrammarMatcher.mask_words()`); then
min_p after temperature. logprobs=k also returns the sampled token's log-softmax and the top k (<= 20) ids and
values of the processed logits (no temperature), computed in the same dispatch from the same logits.

Built once at load (`GpuSampler(lib, vocab)`, `bind(...)`); per step the host writes `pack(rows, vocab)` (params and
aux: the masks and bias entries) and records `encode(cmds, binding, n_rows)`. The kernel uses a scratch buffer of
12 bytes x vocab per row (candidates for top-k / top-p, processed logits) that `bind` allocates for as many rows as
out_ids holds. Token counts (penalties) live in a GPU buffer with one vocab-sized u32 slice per sequence slot:
the host fills a slot once per request (`counts_slot_init`: the prompt marked), the kernel adds each sampled id.
Pure Python (it runs in Pyodide).

Per step, for a batch with controls:
    packed = pack(rows, vocab)                            # rows: one SampleRow per sampled sequence
    device.write_buffer(params, 0, packed.params); device.write_buffer(aux, 0, packed.aux)
    sampler.encode(cmds, binding, len(rows)); submit; read out_ids (4 bytes per row)
    if any row asked for logprobs: read LOGPROB_BYTES per row of the logprobs buffer -> unpack_logprobs(...)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..gpu.device import COPY_DST, COPY_SRC, STORAGE, BufferBinding

ROW_BYTES = 64  # RowParams in sample.wgsl
SCRATCH_BYTES_PER_TOKEN = 12  # per row: 8 (candidate id + logit) + 4 (processed logit)
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024  # entries per row (aux_buffer sizes for this many)
LOGPROB_WORDS = 43  # per row: sampled logprob, n, 20 x (id, logprob), the sampled (or score) id's rank
LOGPROB_BYTES = 4 * LOGPROB_WORDS
_ROW = "<4I2f4I4f2I"
_MASK = 0xFFFFFFFF
NONE = 0xFFFFFFFF
PROMPT_BIT = 0x80000000  # in a counts slot: the token occurs in the prompt (repetition_penalty)
# The scan (sample.wgsl SCAN): for a vocabulary of SCAN_MIN_VOCAB tokens or more, one workgroup per SCAN_CHUNK
# logits takes the argmax of its chunk in a dispatch before the sampler, which then reduces the chunks' results
# instead of walking the whole row in one workgroup (on a GPU, a 64-lane workgroup reading 262k logits is latency-
# bound: the first pass of every row, and the only one of a greedy row). Same ids (an argmax does not depend on the
# grouping); one more dispatch a step, so small vocabularies (the test models) keep the one dispatch. For a row
# sampled with a temperature alone the scan also sums each chunk's masses, and the sampler draws from those sums
# (sample.wgsl sample_chunks).
SCAN_CHUNK = 4096
SCAN_MIN_VOCAB = 4 * SCAN_CHUNK


@dataclass(frozen=True)
class SampleRow:
    logit_row: int  # which row of the logits buffer
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    index: int = 0  # how many tokens the request sampled before this one
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple = ()  # ((token id, bias), ...) or a dict; later entries for the same id win
    counts_slot: int | None = None  # the sequence's slice of the counts buffer (needed by the three penalties)
    mask: bytes | None = None  # allowed tokens: ceil(vocab/32) little-endian u32 words (GrammarMatcher.mask_words)
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's logprob and the top k (0..20)
    score_id: int | None = None  # with logprobs: report this id's logprob instead of the sampled one's (prompt
                                 # logprobs: the row's next prompt token; the row's sampled id is then unused)


@dataclass(frozen=True)
class Packed:
    """What one step writes: `params` (ROW_BYTES per row) and `aux` (masks, then bias entries; u32 words)."""

    params: bytes
    aux: bytes


def _check(r: SampleRow, vocab: int | None) -> None:
    if r.temperature < 0 or r.top_k < 0 or not (0.0 < r.top_p <= 1.0):
        raise ValueError(f"sampling: need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {r}")
    if not 0.0 <= r.min_p <= 1.0 or r.repetition_penalty <= 0:
        raise ValueError(f"sampling: need 0 <= min_p <= 1 and repetition_penalty > 0; got {r}")
    if r.logprobs is not None and not 0 <= r.logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"sampling: logprobs must be 0..{MAX_TOP_LOGPROBS}, got {r.logprobs}")
    if r.score_id is not None and (r.logprobs is None or r.score_id < 0 or (vocab is not None and r.score_id >= vocab)):
        raise ValueError(f"sampling: a score_id needs logprobs and an id in the vocabulary, got {r.score_id}")
    penalized = r.frequency_penalty != 0 or r.presence_penalty != 0 or r.repetition_penalty != 1
    if penalized and r.counts_slot is None:
        raise ValueError("sampling: frequency / presence / repetition penalties need a counts_slot")
    if vocab is not None and r.mask is not None and len(r.mask) != 4 * ((vocab + 31) // 32):
        raise ValueError(f"sampling: a mask has {len(r.mask)} bytes, expected {4 * ((vocab + 31) // 32)} "
                         f"(one bit per token of the vocabulary of {vocab}, in u32 words)")


def _bias_items(r: SampleRow, vocab: int | None) -> list[tuple[int, float]]:
    items = dict(r.logit_bias.items() if isinstance(r.logit_bias, dict) else r.logit_bias)
    if len(items) > MAX_LOGIT_BIAS:
        raise ValueError(f"sampling: {len(items)} logit_bias entries, at most {MAX_LOGIT_BIAS}")
    for t in items:
        if not isinstance(t, int) or t < 0 or (vocab is not None and t >= vocab):
            raise ValueError(f"sampling: logit_bias token id {t!r} is outside the vocabulary")
    return sorted(items.items())


def pack(rows: list[SampleRow], vocab: int | None = None) -> Packed:
    """params and aux contents for `rows` (validated like the reference Sampler; vocab checks masks and bias ids)."""
    params, aux = bytearray(), bytearray()
    for r in rows:
        _check(r, vocab)
        mask_off = NONE
        if r.mask is not None:
            mask_off = len(aux) // 4
            aux += r.mask
        bias = _bias_items(r, vocab)
        bias_off = len(aux) // 4
        for t, b in bias:
            aux += struct.pack("<If", t, b)
        params += struct.pack(_ROW, r.logit_row, r.top_k, r.seed & _MASK, r.index & _MASK, r.temperature, r.top_p,
                              mask_off, bias_off, len(bias), NONE if r.counts_slot is None else r.counts_slot,
                              r.frequency_penalty, r.presence_penalty, r.repetition_penalty, r.min_p,
                              NONE if r.logprobs is None else r.logprobs,
                              NONE if r.score_id is None else r.score_id)
    return Packed(bytes(params), bytes(aux or b"\0\0\0\0"))


def pack_rows(rows: list[SampleRow]) -> bytes:
    """The params buffer contents for rows that need no aux data (no mask, no logit_bias)."""
    if any(r.mask is not None or r.logit_bias for r in rows):
        raise ValueError("sampling: rows with a mask or logit_bias need pack() (params and aux)")
    return pack(rows).params


def counts_slot_init(vocab: int, prompt_ids=(), output_ids=()) -> bytes:
    """A counts slot's contents (write it at offset slot * vocab * 4): the prompt's tokens marked, and the output
    so far counted (a request that resumes after preemption continues with the same penalties)."""
    words = [0] * vocab
    for t in prompt_ids:
        if 0 <= t < vocab:
            words[t] = PROMPT_BIT
    for t in output_ids:
        if 0 <= t < vocab:
            words[t] += 1
    return struct.pack(f"<{vocab}I", *words)


class CountsSlots:
    """Which counts slot each penalized sequence uses (the penalties' per-sequence token counts: one vocab-sized u32
    slot per sequence, max_rows slots), for any sampler that keeps the counts beside its logits (the GPU's buffer,
    the wasm module's memory).

    A slot is taken on a sequence's first penalized row and filled from its history (prompt marked, output
    counted); the sampler then counts each id it samples, so later steps (and a decode block's steps) upload
    nothing. A slot goes on being used while the sequence's sample_index follows on; any gap (eviction, a restart)
    refills it from the history, so the counts are always those of the tokens before the row. Slots are reused
    least recently used first, never one of the current step's rows. `allocate()` places the counts storage when
    a first row needs it; `write(offset, data)` writes into it."""

    def __init__(self, max_rows: int, vocab: int, allocate, write):
        self.max_rows, self.vocab, self._allocate, self._write = max_rows, vocab, allocate, write
        self.allocated = False
        self.slots: dict[int, list[int]] = {}  # seq_id -> [slot, next sample_index], least recently used first

    def assign(self, sampled, steps: int = 1) -> list[int | None]:
        """The counts slot of each row (None: not penalized), filling new or stale slots from the history; `steps`
        rows of each sequence follow (a decode block)."""
        if not any(c.penalized for c in sampled):
            return [None] * len(sampled)
        if not self.allocated:
            self._allocate()
            self.allocated = True
        step_ids = {c.seq_id for c in sampled}
        out = []
        for c in sampled:
            if not c.penalized:
                out.append(None)
                continue
            entry = self.slots.pop(c.seq_id, None)
            if entry is None or entry[1] != c.sample_index:
                if entry is None:
                    used = {e[0] for e in self.slots.values()}
                    free = [i for i in range(self.max_rows) if i not in used]
                    if free:
                        entry = [free[0], 0]
                    else:  # evict the least recently used sequence that is not in this step
                        victim = next(sid for sid in self.slots if sid not in step_ids)
                        entry = [self.slots.pop(victim)[0], 0]
                hist, n_p = c.history or [], c.num_prompt
                self._write(4 * self.vocab * entry[0],
                            counts_slot_init(self.vocab, hist[:n_p], hist[n_p:n_p + c.sample_index]))
            entry[1] = c.sample_index + steps
            self.slots[c.seq_id] = entry  # most recently used last
            out.append(entry[0])
        return out


def pack_chunks(sampled, vocab: int, slots=None) -> Packed:
    """The sampling rows of a step's sampled chunks (engine/batch.py SeqChunk), row j = chunk j, with their
    counts slots (CountsSlots.assign)."""
    slots = slots or [None] * len(sampled)
    return pack([SampleRow(j, c.temperature, c.top_k, c.top_p, c.seed, c.sample_index, min_p=c.min_p,
                           frequency_penalty=c.frequency_penalty, presence_penalty=c.presence_penalty,
                           repetition_penalty=c.repetition_penalty, logit_bias=c.logit_bias,
                           counts_slot=slots[j], mask=c.mask, logprobs=c.logprobs)
                 for j, c in enumerate(sampled)], vocab)


def pack_scores(rows: list[tuple], vocab: int) -> Packed:
    """The sampling rows of prompt-logprob rows (engine/batch.py SeqChunk.score_ids): (score id, top k) per row,
    logits row j = row j; no controls, so the logprobs are the raw logits' log-softmax."""
    return pack([SampleRow(j, logprobs=top, score_id=sid) for j, (sid, top) in enumerate(rows)], vocab)


def unpack_logprobs(raw: bytes, n_rows: int) -> list[tuple[float, list[tuple[int, float]], int]]:
    """Per row: (logprob of the sampled token (or the row's score id), [(id, logprob)] of the top n, best first,
    that token's 1-based rank in the whole vocabulary: logit descending, id ascending, the top list's order)."""
    out = []
    for r in range(n_rows):
        w = raw[r * LOGPROB_BYTES : (r + 1) * LOGPROB_BYTES]
        lp, n = struct.unpack_from("<fI", w, 0)
        top = [struct.unpack_from("<If", w, 8 + 8 * k) for k in range(min(n, MAX_TOP_LOGPROBS))]
        (rank,) = struct.unpack_from("<I", w, 4 * (LOGPROB_WORDS - 1))
        out.append((lp, [(int(i), float(v)) for i, v in top], int(rank)))
    return out


def _pcg(v: int) -> int:
    s = (v * 747796405 + 2891336453) & _MASK
    w = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & _MASK
    return ((w >> 22) ^ w) & _MASK


def uniform(seed: int, index: int) -> float:
    """The shader's uniform draw in [0, 1) for (seed, index): (pcg(pcg(seed) + index) >> 8) / 2^24."""
    return (_pcg((_pcg(seed & _MASK) + index) & _MASK) >> 8) / 16777216.0


@dataclass(frozen=True)
class SamplerBinding:
    """What `bind` returns: the bind group and how many rows it can sample (out_ids slots, candidate space)."""

    group: Any
    rows: int
    candidates: Any  # the scratch buffer
    scan: Any = None  # the scan's bind group (vocabularies of SCAN_MIN_VOCAB or more)


def _bound_bytes(b) -> int:
    if isinstance(b, BufferBinding):
        return b.size if b.size is not None else int(b.buffer.size) - b.offset
    return int(b.size)


class GpuSampler:
    def __init__(self, lib, vocab: int, label: str = "sample", scan: bool = True):
        """scan=False: no argmax scan whatever the vocabulary (bench.sampling's A/B)."""
        self.lib, self.vocab, self.label = lib, vocab, label
        self.chunks = -(-vocab // SCAN_CHUNK) if scan and vocab >= SCAN_MIN_VOCAB else 0
        # MASS_SHIFT: fraction bits of the fixed-point bucket masses (vocab tokens of mass <= 1 fit in a u32)
        self.defines = {"VOCAB": f"{vocab}u", "ID_BITS": f"{vocab.bit_length()}i",
                        "MASS_SHIFT": f"{32 - vocab.bit_length()}u"}
        self.scan_defines = None
        if self.chunks:
            self.defines.update(CHUNKS=f"{self.chunks}u", CHUNK=f"{SCAN_CHUNK}u")
            self.scan_defines = {"VOCAB": f"{vocab}u", "SCAN": 1, "CHUNK": f"{SCAN_CHUNK}u", "CHUNKS": f"{self.chunks}u"}
        self.scan = lib.pipeline("sample", defines=self.scan_defines, use_f16=False) if self.chunks else None
        self.pipeline = lib.pipeline("sample", defines=self.defines, use_f16=False)

    def bind(self, logits, params, out_ids, aux=None, counts=None, logprobs=None) -> SamplerBinding:
        """logits: f32 [rows, vocab]; params: ROW_BYTES per row; out_ids: u32 per row; aux: the packed masks and
        bias entries (`aux_buffer`); counts: `counts_buffer`; logprobs: `logprobs_buffer` (buffers or
        BufferBindings; the last three may be None when no row uses them). Allocates the scratch (12 bytes x vocab
        per out_ids slot)."""
        rows = max(_bound_bytes(out_ids) // 4, 1)
        nbytes = rows * (self.vocab + (self.vocab + 1) // 2) * 8
        dev = self.lib.device
        limit = dev.caps.max_binding_bytes
        if nbytes > limit:
            raise ValueError(f"sampling: candidate space for {rows} rows x vocab {self.vocab} is "
                             f"{nbytes} bytes (> {limit} per binding on this device); sample fewer rows "
                             f"per dispatch (out_ids holds {rows})")
        cand = dev.create_buffer(nbytes, STORAGE, label=f"{self.label}.candidates")
        spare = [dev.create_buffer(16, STORAGE, label=f"{self.label}.unused") if b is None else b
                 for b in (aux, counts, logprobs)]
        scan = dev.create_bind_group(self.scan, [logits, params, cand]) if self.scan is not None else None
        return SamplerBinding(dev.create_bind_group(self.pipeline, [logits, params, out_ids, cand, *spare]), rows,
                              cand, scan)

    def encode(self, cmds, binding: SamplerBinding, n_rows: int) -> None:
        if n_rows > binding.rows:
            raise ValueError(f"sampling: {n_rows} rows, but out_ids holds {binding.rows}")
        if n_rows > 0:
            if self.scan is not None:
                cmds.dispatch(self.scan, binding.scan, self.chunks, n_rows, 1, f"{self.label}.scan")
            cmds.dispatch(self.pipeline, binding.group, n_rows, 1, 1, self.label)


def buffers(device, max_rows: int) -> tuple[Any, Any]:
    """(params, out_ids) buffers for up to max_rows rows; out_ids can be copied to a staging buffer and read."""
    params = device.create_buffer(ROW_BYTES * max_rows, STORAGE | COPY_DST, label="sample.params")
    ids = device.create_buffer(4 * max_rows, STORAGE | COPY_SRC, label="sample.ids")
    return params, ids


def aux_buffer(device, max_rows: int, vocab: int, max_bias: int = MAX_LOGIT_BIAS) -> Any:
    """Room for a mask and max_bias logit_bias entries per row."""
    words = max_rows * ((vocab + 31) // 32 + 2 * max_bias)
    return device.create_buffer(4 * words, STORAGE | COPY_DST, label="sample.aux")


def counts_buffer(device, n_slots: int, vocab: int) -> Any:
    """Token counts of n_slots sequences (vocab u32 each); fill a slot with counts_slot_init when it is assigned."""
    return device.create_buffer(4 * vocab * n_slots, STORAGE | COPY_DST | COPY_SRC, label="sample.counts")


def logprobs_buffer(device, max_rows: int) -> Any:
    """LOGPROB_BYTES per row; read back only for steps where some row asked for logprobs."""
    return device.create_buffer(LOGPROB_BYTES * max_rows, STORAGE | COPY_SRC, label="sample.logprobs")
