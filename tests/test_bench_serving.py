"""The serving benchmark (webinfer_packager.bench.serving).

Two kinds of checks:
- CPU: the measurement logic on the fake runner (tests/fake_model.py) with a step time we choose, so the expected
  numbers are known: a step that costs the same for 1 or 16 sequences must show a ~16x concurrency ratio, a step
  that costs per token must show ~1x; a prefix-cache hit must skip the cached tokens' cost.
- GPU: a quick run through the real native engine on a tiny synthetic package (keys, sane values, cache hit).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/test_bench_serving.py -q
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
import pytest

from tests.fake_model import FakeRunner
from webinfer.api import COMPILE_SWITCH_INTERVAL_S, LLM
from webinfer.engine.engine import AsyncEngine
from webinfer.prompt import Prompter
from webinfer.tokenizer import Tokenizer
from webinfer_packager.bench import serving as bs
from tests.synthetic import CHATML, tiny_tokenizer_json

SECTIONS = ["context", "step_scaling", "concurrency", "prefix_cache", "mixed", "compile", "engine"]


class TimedFakeRunner(FakeRunner):
    """The fake model with a chosen cost: step_s per step plus per_token_s per fed token."""

    def __init__(self, step_s: float, per_token_s: float, **kw):
        super().__init__(**kw)
        self.step_s, self.per_token_s = step_s, per_token_s

    async def execute(self, batch):
        await asyncio.sleep(self.step_s + self.per_token_s * batch.num_tokens)
        return self.execute_sync(batch)


def fake_llm(step_s: float, per_token_s: float, max_num_batched_tokens: int = 256) -> LLM:
    runner = TimedFakeRunner(step_s, per_token_s, num_blocks=256, block_size=16, max_model_len=1024, vocab=200)
    tok = Tokenizer.from_json(tiny_tokenizer_json(300))
    prompter = Prompter(tok, CHATML, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, None, [299], 300)
    engine = AsyncEngine(runner, eos_ids=[299], max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=16)
    return LLM(engine, tok, prompter, "fake")


def run(llm, coro_fn):
    async def go():
        try:
            return await coro_fn(llm)
        finally:
            await llm.close()

    return asyncio.run(go())


# ------------------------------------------------------------------------------------------------------ CPU


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        xs = rng.exponential(size=n).tolist()
        for q in (0, 50, 90, 99, 100):
            assert bs.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)
    assert bs.percentile([], 50) is None


def test_step_cost_fit_recovers_a_line():
    seqs = [1, 2, 4, 8, 16]
    fit = bs.step_cost_fit(seqs, [20.0 + 5.0 * b for b in seqs])
    assert fit["fixed_ms"] == pytest.approx(20.0) and fit["per_seq_ms"] == pytest.approx(5.0)
    assert fit["bound_16_to_1"] == pytest.approx(16 * 25 / 100, abs=0.01)  # 16 tokens in 100 ms vs 1 in 25 ms
    assert bs.step_cost_fit([4, 4], [1.0, 2.0]) is None


def test_mixed_plan_is_seeded_and_fits():
    a = bs.mixed_plan(10, bs.MIX_FULL, 0.5, max_len=300, seed=3)
    assert a == bs.mixed_plan(10, bs.MIX_FULL, 0.5, max_len=300, seed=3)
    assert a != bs.mixed_plan(10, bs.MIX_FULL, 0.5, max_len=300, seed=4)
    assert [p["kind"] for p in a].count("chat") == 6 and {p["kind"] for p in a} == {"chat", "summary", "long"}
    assert a[0]["at_s"] == 0 and all(x["at_s"] < y["at_s"] for x, y in zip(a, a[1:]))
    assert all(p["prompt_tokens"] + p["max_tokens"] <= 300 - 8 for p in a)  # "long" was clamped to the context


def test_concurrency_ratio_follows_the_step_cost():
    """Fixed cost per step: 16 sequences decode ~16x faster in aggregate. Cost per token: no gain at all."""
    # the fake's own host overhead is a few ms a step: the per-token cost must dwarf it
    flat = run(fake_llm(0.01, 0.0), lambda m: bs.concurrency(m.engine, bs.Prompts(m), bs.KVWatch(m.engine), max_tokens=6))
    per_tok = run(fake_llm(0.0, 0.01), lambda m: bs.concurrency(m.engine, bs.Prompts(m), bs.KVWatch(m.engine), max_tokens=6))
    for res in (flat, per_tok):
        assert [r["requests"] for r in res["levels"]] == [1, 4, 16]
        for r in res["levels"]:
            n = r["requests"]
            assert r["output_tokens"] == 6 * n  # ignore_eos: every request runs to max_tokens
            assert r["prompt_tokens"] == 16 * n
            # 16 prompts of 16 tokens fit one 256-token step: all first tokens come together, then n*(6-1) more
            assert r["decode_tokens"] == 5 * n
            assert r["engine_steps"] == 6
            assert r["kv_blocks_used"] == 2 * n  # 16 prompt + 5 fed output tokens: two blocks of 16 each
            assert r["ttft"]["p99_ms"] >= r["ttft"]["p50_ms"] > 0
    assert flat["ratio_16_to_1"] > 8, flat
    assert 0.5 < per_tok["ratio_16_to_1"] < 2.0, per_tok  # ~1.3 expected: the fake's overhead is per step


def test_prefix_cache_hit_skips_cached_tokens():
    llm = fake_llm(0.001, 0.0005, max_num_batched_tokens=64)
    res = run(llm, lambda m: bs.prefix_cache(m.engine, bs.Prompts(m), bs.KVWatch(m.engine), system_tokens=200, reps=2))
    for r in res["runs"]:
        assert r["cold_cached_tokens"] == 0
        # full blocks of the shared prefix (system turn) are reused; the partial block is recomputed
        assert r["hit_cached_tokens"] == r["shared_prefix_tokens"] // 16 * 16 > 0
        assert r["cold_ttft_s"] > r["hit_ttft_s"]
    assert res["system_prompt_tokens"] >= 200 and res["speedup"] > 1.5


def test_serving_bench_quick_on_fake_runner_is_json():
    res = run(fake_llm(0.001, 0.0001), lambda m: bs.serving_bench(m, quick=True))
    json.dumps(res)
    assert all(k in res for k in SECTIONS)
    assert "skipped" in res["step_scaling"]  # the probe needs the GPU model
    m = res["mixed"]
    assert m["requests"] == 4 and m["preemptions"] == 0
    assert m["output_tokens"] == sum(k["output_tokens"] for k in m["by_kind"].values())
    assert m["itl"]["n"] == m["output_tokens"] - m["requests"]
    c = res["compile"]  # the stream beside a compile: alone, lowered interval, Python's default; restored after
    assert c["alone"]["tokens"] > 0 and c["alone"]["tok_s"] > 0 and c["ratio_default"] is not None
    assert c["switch_interval_s"] == {"lowered": COMPILE_SWITCH_INTERVAL_S, "default": sys.getswitchinterval()}
    assert sys.getswitchinterval() > COMPILE_SWITCH_INTERVAL_S


# ------------------------------------------------------------------------------------------------------ GPU


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    tmp = tmp_path_factory.mktemp("bench_serving")
    write_hf(tmp / "hf", arch="llama", max_position_embeddings=512)
    return pack(tmp / "hf", tmp / "pkg", progress=False)


@pytest.mark.gpu
def test_quick_run_on_native_engine(tiny_package):
    pytest.importorskip("wgpu")
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm

    # a small token budget makes the cold 128-token system prompt take several steps, the cache hit one
    llm = open_llm(tiny_package, "native", options=EngineOptions(context_tokens=1024, max_batch_tokens=32))
    res = run(llm, lambda m: bs.serving_bench(m, quick=True))
    json.dumps(res)
    ctx = res["context"]
    assert ctx["runner"] == "GPUModel" and ctx["adapter"] and ctx["kv_blocks_total"] > 16

    sc = res["step_scaling"]
    assert [s["seqs"] for s in sc["steps"]] == [1, 4, 16]
    assert all(s["step_ms"] > 0 and s["dispatches"] > 10 for s in sc["steps"])
    assert sc["prefill_16_tokens_one_seq"]["step_ms"] > 0 and "per_seq_ms" in sc["fit"]

    conc = res["concurrency"]
    for r in conc["levels"]:
        assert r["output_tokens"] == 4 * r["requests"] and r["decode_tok_s"] > 0
        assert r["ttft"]["p99_ms"] >= r["ttft"]["p50_ms"] > 0
        # 8 prompt + 3 fed tokens: one block each. With a 32-token budget 16 prompts prefill over 4 steps and the
        # first requests finish before the last start, so only up to 4 requests are sure to hold blocks together
        assert r["kv_blocks_used"] <= r["requests"] and r["kv_blocks_used"] >= min(r["requests"], 4)
    assert conc["ratio_16_to_1"] > 0

    pc = res["prefix_cache"]
    assert pc["cached_tokens"] > 0 and pc["cached_tokens"] == pc["system_prompt_tokens"] // 16 * 16
    assert pc["hit_ttft_s"] < pc["cold_ttft_s"]

    m = res["mixed"]
    assert m["requests"] == 4 and m["output_tokens"] > 0 and m["output_tok_s"] > 0
    for key in ("ttft", "tpot"):
        assert m[key]["p99_ms"] >= m[key]["p50_ms"] > 0
    # tokens of one decode block arrive together: most gaps are 0, the block boundaries carry the time
    assert m["itl"]["p99_ms"] > 0 and m["itl"]["p99_ms"] >= m["itl"]["p50_ms"] >= 0
    assert m["kv_blocks_used"] > 0

    c = res["compile"]  # a real compile (the tiny model's 300-token vocabulary) beside a real decoding stream
    assert c["alone"]["tokens"] > 0 and c["alone"]["tok_s"] > 0
    assert c["lowered"]["window_s"] > 0 and c["default"]["window_s"] > 0
