"""Serving numbers for `webinfer bench`: the engine under load, measured through AsyncEngine.generate().

    result = run_serving_bench("path/to/package", quick=True)      # builds the native engine, returns a dict
    result = await serving_bench(engine, quick=False)              # any AsyncEngine (bench.py calls this)

Sections of the result (every one carries its own context: requests, tokens, KV blocks, adapter):
    step_scaling   wall ms of one decode step for 1..16 sequences driven straight through the runner, with GPU ms
                   per kernel kind at 1 and 16 sequences and, for contrast, 16 tokens of ONE sequence (prefill:
                   the GEMM kernels instead of GEMV). This is what bounds `concurrency` below.
    concurrency    N requests (N = 1, 4, 16) of equal prompt length started together, greedy, ignore_eos and a
                   fixed max_tokens: aggregate decode tokens/s while all N are decoding, and the 16/1 ratio.
    prefix_cache   TTFT of a request behind a 400+ token system prompt seen for the first time (cold) and of a
                   second request with the same system prompt and another question (hit), and the cached tokens.
    mixed          chat turns, summaries and long-context requests arriving at seeded random (exponential) gaps:
                   TTFT, TPOT and ITL at p50/p99 and total throughput.
    compile        one greedy stream's decode tokens/s alone and while a new JSON schema compiles in the LLM's
                   compile thread, with the GIL switch interval the LLM sets during compiles and with Python's
                   default (what a compile cost other streams before): the same stream, the same run.

Times are wall-clock on the host (`time.perf_counter`), taken where a consumer of generate() receives a token,
except TTFT, which the engine itself stamps (RequestOutput.ttft_s); inter-token gaps are the consumer's stamps (the
tokens of one decode block arrive together, so with blocks most gaps are 0 and the block boundaries carry the time).
Outputs use ignore_eos so every request produces exactly max_tokens tokens: lengths, not the model's whims,
decide the work. Prompts are slices of a fixed English text, each behind a distinct tag so no two requests
share a prefix block unless a section wants them to.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from webinfer.engine.batch import SeqChunk, StepBatch
from webinfer.engine.stopping import SamplingParams

CORPUS = (
    "The harbour town woke slowly. Fishing boats came in with the tide, gulls circled the market, and the baker "
    "on the corner opened his shutters to a queue that had formed before dawn. Nobody in the town could remember "
    "when the lighthouse had last been painted, but everyone agreed that it should be done before the autumn "
    "storms. The council met on Tuesday evenings in the old school hall, where the radiators knocked and the "
    "chairs were too small for adults. This week the agenda listed the lighthouse, a complaint about parking near "
    "the ferry terminal, the budget for the summer festival, and a proposal to plant fruit trees along the river "
    "path. The treasurer explained that the festival had made a small profit last year, mostly from the food "
    "stalls, and suggested that part of it could pay for paint and scaffolding. A retired engineer offered to "
    "inspect the lighthouse stairs for free. Two teenagers presented a survey they had run at the ferry terminal: "
    "most drivers waited less than ten minutes, but on market days the queue reached the bridge and blocked the "
    "buses. They proposed a simple booking system and a second lane painted on the road. The discussion of fruit "
    "trees went on longer than anyone expected, because the river path floods every few winters and apple trees "
    "do not like wet feet. In the end the council voted to plant pears and plums on the higher ground, to ask the "
    "engineer for a written report, and to try the booking system for one month. Outside, rain had started, and "
    "the lighthouse turned its beam across the dark water as it had every night for a hundred and forty years. "
)
QUESTIONS = [
    "What did the council decide about the trees?", "Who offered to inspect the lighthouse stairs?",
    "Why were apple trees a bad idea?", "What did the teenagers propose?", "How old is the lighthouse?",
    "Where does the council meet?", "What made a profit last year?", "When does the queue reach the bridge?",
]


# ----------------------------------------------------------------------------------------------------- prompts
class Prompts:
    """Token ids of exact or approximate lengths, built with the model's own tokenizer and prompt builder."""

    def __init__(self, llm):
        self.tok, self.prompter = llm.tokenizer, llm.prompter
        self.corpus = self.encode(CORPUS)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def filler(self, n: int, offset: int = 0) -> list[int]:
        """n ids of the corpus starting at `offset` (wrapping around)."""
        c = self.corpus
        return [c[(offset + i) % len(c)] for i in range(n)]

    def raw(self, n: int, tag: str, offset: int = 0) -> list[int]:
        """Exactly n ids: a distinct tag, then corpus text. No chat template (exact lengths for concurrency)."""
        head = self.encode(f"{tag}: ")
        return (head + self.filler(n, offset))[:n]

    def chat(self, user: str, system: str | None = None) -> list[int]:
        """A chat turn as a server would build it (the package's template), or plain text without one."""
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]
        if self.prompter.chat_template:
            return self.prompter.chat_ids(msgs)
        return self.encode("\n".join(m["content"] for m in msgs) + "\n")

    def text(self, n: int, offset: int = 0) -> str:
        """About n tokens of corpus text."""
        return self.tok.decode(self.filler(n, offset))


# ----------------------------------------------------------------------------------------------------- running
@dataclass
class Trace:
    """What one request looked like from the outside."""
    kind: str
    prompt_tokens: int
    t_submit: float
    stamps: list[float] = field(default_factory=list)  # receive time of each output token
    ttft_s: float | None = None
    gaps: list[float] = field(default_factory=list)    # gaps between consecutive received tokens
    cached_tokens: int = 0
    finish_reason: str | None = None

    @property
    def n_out(self) -> int:
        return len(self.stamps)

    @property
    def tpot_s(self) -> float | None:
        return sum(self.gaps) / len(self.gaps) if self.gaps else None


class KVWatch:
    """Peak KV blocks held by running requests (sampled at every received token)."""

    def __init__(self, engine):
        self.pool = engine.scheduler.kv.pool
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, self.pool.num_usable - self.pool.num_free)

    def reset(self) -> int:
        peak, self.peak = self.peak, 0
        return peak


async def run_request(engine, ids: list[int], params: SamplingParams, kv: KVWatch, kind: str = "") -> Trace:
    tr = Trace(kind, len(ids), time.perf_counter())
    async for out in engine.generate(ids, params):
        now = time.perf_counter()
        tr.stamps.extend([now] * len(out.token_ids))
        tr.ttft_s = out.ttft_s
        tr.cached_tokens, tr.finish_reason = out.num_cached_tokens, out.finish_reason
        kv.sample()
    tr.gaps = [b - a for a, b in zip(tr.stamps, tr.stamps[1:])]
    return tr


def percentile(xs: list[float], q: float) -> float | None:
    """q-th percentile with linear interpolation between order statistics (numpy's default method)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _r(x, nd: int = 4):
    return None if x is None else round(x, nd)


def _dist(xs: list[float], scale: float = 1e3) -> dict:
    """p50/p99/mean of seconds, reported in ms."""
    return {"p50_ms": _r(percentile(xs, 50) * scale if xs else None, 2),
            "p99_ms": _r(percentile(xs, 99) * scale if xs else None, 2),
            "mean_ms": _r(statistics.fmean(xs) * scale if xs else None, 2), "n": len(xs)}


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


# ------------------------------------------------------------------------------------------------ step scaling
def _kind(label: str) -> str:
    """'layers.3.qkv' -> 'qkv': group a step's kernel timings across layers."""
    return ".".join(p for p in label.split(".") if not p.isdigit() and p != "layers") or label or "?"


def _free_blocks(engine, n: int) -> list[int] | None:
    """n free blocks that hold no cached prefix: the probe may scribble on them (nobody reads them before the
    scheduler hands them out and a prefill rewrites them)."""
    pool = engine.scheduler.kv.pool
    ids = [b for b in pool.free if pool.blocks[b].hash is None][:n]
    return ids if len(ids) == n else None


async def _timed_kernels(runner, batch: StepBatch) -> dict:
    cmds, _ = runner.encode_step(batch, timed=True)
    runner.device.submit(cmds)
    per: dict[str, float] = {}
    for label, ms in await runner.device.read_timings(cmds):
        per[_kind(label)] = per.get(_kind(label), 0.0) + ms
    out = dict(sorted(((k, round(v, 3)) for k, v in per.items()), key=lambda kv: -kv[1]))
    out["total"] = round(sum(per.values()), 3)
    return out


def step_cost_fit(seqs: list[int], step_ms: list[float]) -> dict | None:
    """Least-squares step_ms = fixed + per_seq * seqs. Batching can only amortise `fixed` (dispatch wake-ups,
    host work, weight-independent kernels), so aggregate decode at b sequences gains at most
    b * (fixed + per_seq) / (fixed + b * per_seq) over one: `bound_16_to_1`."""
    n = len(seqs)
    if n < 2 or len(set(seqs)) < 2:
        return None
    mx, my = sum(seqs) / n, sum(step_ms) / n
    b = sum((x - mx) * (y - my) for x, y in zip(seqs, step_ms)) / sum((x - mx) ** 2 for x in seqs)
    a = my - b * mx
    bound = 16 * (a + b) / (a + 16 * b) if b > 0 and a + 16 * b > 0 else None
    return {"fixed_ms": round(a, 2), "per_seq_ms": round(b, 2), "bound_16_to_1": _r(bound, 2)}


async def step_scaling(engine, sizes=(1, 2, 4, 8, 16), ctx: int = 32, reps: int = 5) -> dict:
    """Decode steps of b sequences (each at position ctx) straight through the runner, engine idle."""
    runner = engine.runner
    if not hasattr(runner, "encode_step"):
        return {"skipped": f"runner {type(runner).__name__} is not the GPU model"}
    if engine.scheduler.has_work():
        return {"skipped": "the engine is busy: the probe needs it idle"}
    bs = runner.block_size
    per_seq = -(-(ctx + 1) // bs)
    sizes = [b for b in sizes if b <= runner.max_seqs]
    blocks = _free_blocks(engine, per_seq * max(sizes))
    if blocks is None:
        return {"skipped": f"fewer than {per_seq * max(sizes)} free uncached KV blocks"}
    tok = 0 if not engine.eos_ids else min(engine.eos_ids)

    def decode_batch(b: int) -> StepBatch:
        return StepBatch([SeqChunk(i, [tok], ctx, blocks[i * per_seq:(i + 1) * per_seq], True) for i in range(b)])

    async def wall_ms(batch: StepBatch) -> float:
        walls = []
        for _ in range(reps + 1):
            t = time.perf_counter()
            await runner.execute(batch)
            walls.append((time.perf_counter() - t) * 1e3)
        return statistics.median(walls[1:])  # the first run may compile / warm caches

    rows = []
    for b in sizes:
        batch = decode_batch(b)
        ms = await wall_ms(batch)
        rows.append({"seqs": b, "step_ms": round(ms, 2), "ms_per_token": round(ms / b, 2),
                     "tokens_per_s": round(b * 1e3 / ms, 1), "dispatches": runner.dispatch_count(batch)})
    b = max(sizes)
    # the same b token rows as ONE sequence's prefill chunk: GEMM kernels and prefill attention instead of GEMV
    prefill = StepBatch([SeqChunk(0, [tok] * b, 0, blocks[:-(-b // bs)], True)])
    pre_ms = await wall_ms(prefill)
    res = {"ctx_tokens": ctx, "reps": reps, "steps": rows,
           "speedup_max_vs_1": round(rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"], 2),
           "fit": step_cost_fit([r["seqs"] for r in rows], [r["step_ms"] for r in rows]),
           f"prefill_{b}_tokens_one_seq": {"step_ms": round(pre_ms, 2), "ms_per_token": round(pre_ms / b, 2),
                                           "dispatches": runner.dispatch_count(prefill)}}
    if getattr(runner.device.caps, "timestamps", False):
        res["gpu_ms"] = {"decode_1": await _timed_kernels(runner, decode_batch(1)),
                         f"decode_{b}": await _timed_kernels(runner, decode_batch(b)),
                         f"prefill_{b}_tokens_one_seq": await _timed_kernels(runner, prefill)}
    return res


# ------------------------------------------------------------------------------------------------- concurrency
async def concurrency(engine, prompts: Prompts, kv: KVWatch, levels=(1, 4, 16), prompt_len: int = 16,
                      max_tokens: int = 32) -> dict:
    levels = [n for n in levels if n <= engine.scheduler.max_num_seqs]
    rows = []
    for n in levels:
        ids = [prompts.raw(prompt_len, f"c{n}-{i}", offset=37 * i) for i in range(n)]
        steps0 = engine.steps
        kv.reset()
        t0 = time.perf_counter()
        traces = await asyncio.gather(*(run_request(engine, p, _greedy(max_tokens), kv, "c") for p in ids))
        t_end = time.perf_counter()
        # steady state: from the moment all n requests have their first token until the last token
        t_all = max(tr.stamps[0] for tr in traces)
        t_last = max(tr.stamps[-1] for tr in traces)
        window = sum(1 for tr in traces for s in tr.stamps if s > t_all)
        span = t_last - t_all
        rows.append({
            "requests": n, "prompt_tokens": sum(len(p) for p in ids), "output_tokens": sum(tr.n_out for tr in traces),
            "decode_tokens": window, "decode_s": _r(span),
            "decode_tok_s": _r(window / span, 2) if span > 0 else None,
            "per_request_tok_s": _r(window / span / n, 2) if span > 0 else None,
            "ttft": _dist([tr.ttft_s for tr in traces]),
            "e2e_s": _r(t_end - t0), "e2e_tok_s": _r(sum(tr.n_out for tr in traces) / (t_end - t0), 2),
            "engine_steps": engine.steps - steps0, "kv_blocks_used": kv.reset(),
        })
    by_n = {r["requests"]: r for r in rows}
    lo, hi = min(by_n), max(by_n)
    ratio = (by_n[hi]["decode_tok_s"] / by_n[lo]["decode_tok_s"]
             if by_n[hi]["decode_tok_s"] and by_n[lo]["decode_tok_s"] else None)
    return {"prompt_len": prompt_len, "max_tokens": max_tokens, "levels": rows,
            f"ratio_{hi}_to_{lo}": _r(ratio, 2), "target_ratio": 4.0}


# ------------------------------------------------------------------------------------------------ prefix cache
async def prefix_cache(engine, prompts: Prompts, kv: KVWatch, system_tokens: int = 420, max_tokens: int = 4,
                       reps: int = 3) -> dict:
    """Per rep a new system prompt (a distinct leading tag, so nothing earlier matches): cold request, then a hit."""
    system_tokens = min(system_tokens, engine.max_model_len - 64 - max_tokens)
    runs = []
    kv.reset()
    for r in range(reps):
        # a tag no earlier run can have cached (the engine may be reused across calls)
        system = f"Session {r}-{time.time_ns() % 10**9}. " + prompts.text(system_tokens, offset=11 * r)
        a = prompts.chat(QUESTIONS[(2 * r) % len(QUESTIONS)], system)
        b = prompts.chat(QUESTIONS[(2 * r + 1) % len(QUESTIONS)], system)
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        cold = await run_request(engine, a, _greedy(max_tokens), kv, "cold")
        hit = await run_request(engine, b, _greedy(max_tokens), kv, "hit")
        runs.append({"cold_prompt_tokens": len(a), "hit_prompt_tokens": len(b), "shared_prefix_tokens": shared,
                     "cold_ttft_s": _r(cold.ttft_s), "hit_ttft_s": _r(hit.ttft_s),
                     "cold_cached_tokens": cold.cached_tokens, "hit_cached_tokens": hit.cached_tokens})
    cold = statistics.median(x["cold_ttft_s"] for x in runs)
    hit = statistics.median(x["hit_ttft_s"] for x in runs)
    return {"requests": 2 * reps, "system_prompt_tokens": runs[0]["shared_prefix_tokens"],
            "cold_ttft_s": _r(cold), "hit_ttft_s": _r(hit), "speedup": _r(cold / hit, 2) if hit > 0 else None,
            "cached_tokens": statistics.median(x["hit_cached_tokens"] for x in runs),
            "kv_blocks_used": kv.reset(), "block_size": engine.scheduler.kv.block_size, "runs": runs}


# ------------------------------------------------------------------------------------------------------ mixed
# kind: (share of requests, prompt tokens range, output tokens range). Sized for lavapipe on a shared 2-core box,
# where a 256-token prefill step alone takes seconds: "long" here means a few hundred tokens, not thousands.
MIX_FULL = {"chat": (0.6, (24, 64), (16, 32)), "summary": (0.25, (128, 192), (24, 32)),
            "long": (0.15, (400, 500), (8, 12))}
MIX_QUICK = {"chat": (0.5, (12, 20), (3, 4)), "summary": (0.25, (48, 64), (4, 6)), "long": (0.25, (128, 160), (3, 4))}

# per-section sizes: full run (a few minutes on lavapipe) and quick (well under a minute on the tiny test model)
SIZES = {
    False: dict(scaling_sizes=(1, 2, 4, 8, 16), scaling_reps=3, conc_prompt=16, conc_tokens=16,
                system_tokens=420, prefix_reps=2, mixed_n=10, mixed_gap_s=0.5, compile_min_length=300),
    True: dict(scaling_sizes=(1, 4, 16), scaling_reps=1, conc_prompt=8, conc_tokens=4,
               system_tokens=128, prefix_reps=1, mixed_n=4, mixed_gap_s=0.2, compile_min_length=30),
}


def mixed_plan(n: int, mix: dict, mean_gap_s: float, max_len: int, seed: int = 0) -> list[dict]:
    """Deterministic request list: kind, arrival offset (s), prompt and output lengths (fit in max_len)."""
    rng = random.Random(seed)
    kinds = []
    for k, (share, _, _) in mix.items():
        kinds += [k] * max(1, round(share * n))
    kinds = kinds[:n]
    rng.shuffle(kinds)
    plan, t = [], 0.0
    for i, k in enumerate(kinds):
        _, (p0, p1), (o0, o1) = mix[k]
        out = rng.randint(o0, o1)
        plen = min(rng.randint(p0, p1), max_len - out - 8)
        plan.append({"i": i, "kind": k, "at_s": round(t, 4), "prompt_tokens": plen, "max_tokens": out})
        t += rng.expovariate(1.0 / mean_gap_s)
    return plan


async def mixed(engine, prompts: Prompts, kv: KVWatch, n: int = 16, mean_gap_s: float = 0.4, quick: bool = False,
                seed: int = 0) -> dict:
    plan = mixed_plan(n, MIX_QUICK if quick else MIX_FULL, mean_gap_s, engine.max_model_len, seed)
    ids = []
    overhead = len(prompts.chat(""))  # template tokens around the user text (SmolLM2: a default system prompt)
    for p in plan:
        # a chat turn through the template, about the planned length (re-encoding decoded text shifts it a little)
        body = prompts.text(max(1, p["prompt_tokens"] - overhead), offset=53 * p["i"])
        ids.append(prompts.chat(f"Request {p['i']} ({p['kind']}). {body}")[:engine.max_model_len - p["max_tokens"]])
    kv.reset()
    steps0, pre0 = engine.steps, engine.scheduler.num_preemptions
    t0 = time.perf_counter()

    async def arrive(p, x):
        await asyncio.sleep(max(0.0, t0 + p["at_s"] - time.perf_counter()))
        return await run_request(engine, x, _greedy(p["max_tokens"]), kv, p["kind"])

    traces = await asyncio.gather(*(arrive(p, x) for p, x in zip(plan, ids)))
    t_end = time.perf_counter()
    span = t_end - t0
    out_tok = sum(tr.n_out for tr in traces)
    by_kind = {}
    for k in sorted({tr.kind for tr in traces}):
        ts = [tr for tr in traces if tr.kind == k]
        by_kind[k] = {"requests": len(ts), "prompt_tokens": sum(t.prompt_tokens for t in ts),
                      "output_tokens": sum(t.n_out for t in ts), "ttft": _dist([t.ttft_s for t in ts])}
    return {
        "requests": len(traces), "seed": seed, "mean_gap_s": mean_gap_s,
        "prompt_tokens": sum(tr.prompt_tokens for tr in traces), "output_tokens": out_tok,
        "cached_tokens": sum(tr.cached_tokens for tr in traces),
        "ttft": _dist([tr.ttft_s for tr in traces]),
        "tpot": _dist([tr.tpot_s for tr in traces if tr.tpot_s is not None]),
        "itl": _dist([g for tr in traces for g in tr.gaps]),
        "duration_s": _r(span), "output_tok_s": _r(out_tok / span, 2),
        "total_tok_s": _r((out_tok + sum(tr.prompt_tokens for tr in traces)) / span, 2),
        "engine_steps": engine.steps - steps0, "preemptions": engine.scheduler.num_preemptions - pre0,
        "kv_blocks_used": kv.reset(), "by_kind": by_kind,
    }


# ------------------------------------------------------------------------------------- a compile beside decoding
async def compile_while_decoding(llm, prompts: Prompts, min_length: int, alone_s: float = 2.0) -> dict:
    """Decode tokens/s of one greedy stream alone (alone_s after its first token) and while the LLM compiles a new
    schema, a string of at least `min_length` characters (seconds of pure-Python work on a 49k vocabulary), with the
    switch interval webinfer.api sets during compiles ("lowered") and with Python's default ("default"). Rates
    are tokens received over the window (blocks of decode steps arrive together: gaps alone would mislead)."""
    import webinfer.api as api

    engine = llm.engine
    max_tokens = max(8, engine.max_model_len - 64)

    async def window(n: int | None, tag: str) -> dict:
        stamps: list[float] = []
        first = asyncio.Event()

        async def stream():
            async for out in engine.generate(prompts.raw(16, tag), _greedy(max_tokens)):
                stamps.extend([time.perf_counter()] * len(out.token_ids))
                first.set()
                if done.is_set():
                    return

        done = asyncio.Event()
        task = asyncio.ensure_future(stream())
        await first.wait()
        t0 = time.perf_counter()
        if n is None:
            await asyncio.sleep(alone_s)
        else:
            rf = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "minLength": n}}}
            await llm.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                              response_format=rf)
        t1 = time.perf_counter()
        done.set()
        await task
        finished = len(stamps) >= max_tokens
        if finished:  # the stream ended inside the window: rate over the part where it ran
            t1 = min(t1, stamps[-1])
        got = sum(t0 < t <= t1 for t in stamps)
        return {"window_s": _r(t1 - t0, 3), "tokens": got, "tok_s": _r(got / (t1 - t0), 2) if t1 > t0 else None,
                "stream_finished": finished}

    saved = api.COMPILE_SWITCH_INTERVAL_S
    alone = await window(None, "alone")
    lowered = await window(min_length, "lowered")
    try:
        api.COMPILE_SWITCH_INTERVAL_S = sys.getswitchinterval()  # the peer: no lowering
        default = await window(min_length + 1, "default")  # +1: a schema not in the cache
    finally:
        api.COMPILE_SWITCH_INTERVAL_S = saved
    ratio = (lambda w: _r(w["tok_s"] / alone["tok_s"], 3) if alone["tok_s"] and w["tok_s"] is not None else None)
    return {"schema": f"a JSON string of minLength {min_length} (then {min_length + 1})",
            "switch_interval_s": {"lowered": saved, "default": sys.getswitchinterval()},
            "alone": alone, "lowered": lowered, "default": default,
            "ratio_lowered": ratio(lowered), "ratio_default": ratio(default)}


# ------------------------------------------------------------------------------------------------------ entry
def context(engine, model_name: str) -> dict:
    runner, sch = engine.runner, engine.scheduler
    dev = getattr(runner, "device", None)
    info = getattr(dev, "info", None)
    return {"model": model_name, "runner": type(runner).__name__,
            "adapter": getattr(info, "name", None), "backend": getattr(info, "backend", None),
            "kv_blocks_total": sch.kv.pool.num_usable, "block_size": sch.kv.block_size,
            "max_num_seqs": sch.max_num_seqs, "max_num_batched_tokens": sch.max_num_batched_tokens,
            "max_model_len": engine.max_model_len}


async def serving_bench(llm, *, quick: bool = False) -> dict:
    """All four sections on `llm`'s engine (webinfer.api.LLM); JSON-able. quick: small sizes (under ~60 s on lavapipe)."""
    t_start = time.perf_counter()
    engine = llm.engine
    prompts = Prompts(llm)
    kv = KVWatch(engine)
    res = {"context": context(engine, llm.model_name), "quick": quick}
    z = SIZES[quick]
    res["step_scaling"] = await step_scaling(engine, sizes=z["scaling_sizes"], reps=z["scaling_reps"])
    # warm-up through the engine (the probe skips it when the runner is not the GPU model)
    await run_request(engine, prompts.raw(8, "warm"), _greedy(2), kv)
    res["concurrency"] = await concurrency(engine, prompts, kv, prompt_len=z["conc_prompt"], max_tokens=z["conc_tokens"])
    res["prefix_cache"] = await prefix_cache(engine, prompts, kv, system_tokens=z["system_tokens"],
                                             reps=z["prefix_reps"])
    res["mixed"] = await mixed(engine, prompts, kv, n=z["mixed_n"], mean_gap_s=z["mixed_gap_s"], quick=quick)
    res["compile"] = await compile_while_decoding(llm, prompts, min_length=z["compile_min_length"])
    res["engine"] = engine.stats()
    res["total_s"] = _r(time.perf_counter() - t_start, 2)
    return res


def run_serving_bench(package_path, quick: bool = False, kv_budget_mb: float = 256.0, device=None) -> dict:
    """Build the native engine for package_path (on `device`, e.g. one with timestamps) and run serving_bench."""
    from webinfer.factory import EngineOptions
    from webinfer.package import Package
    from webinfer_packager.cli.backend import context_for_budget, open_llm

    pkg = package_path if isinstance(package_path, Package) else Package.open(package_path)
    llm = open_llm(pkg, "native", device=device,
                   options=EngineOptions(context_tokens=context_for_budget(pkg, kv_budget_mb)))

    async def go():
        try:
            return await serving_bench(llm, quick=quick)
        finally:
            await llm.close()

    return asyncio.run(go())


if __name__ == "__main__":  # python -m webinfer_packager.bench.serving PACKAGE [--quick]
    import json
    import sys

    args = [a for a in sys.argv[1:] if a != "--quick"]
    print(json.dumps(run_serving_bench(args[0], quick="--quick" in sys.argv), indent=1))
