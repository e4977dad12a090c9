"""What exactness costs a chat's next turn: its first token when the previous answer's decoded KV is reused from the
prefix cache (the scheduler as if the runner's one-token rows matched its chunk rows) against computed as a prompt
(what the scheduler does on the GPU model: webinfer/engine/scheduler.py, module docstring).

    XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.next_turn PACKAGE [--chats 8] [--answer 64] [--json]

Each chat asks a question (greedy answer of up to --answer tokens), then "Say that again, shorter."; the second
turn's time to its first token is measured. Chats alternate between the two rules on one engine, each with a new
question, so both see the same device and the same warm pipelines and neither finds the other's turn in the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

# (SmolLM2 answers the first six at length, greedily: a short answer would leave few blocks to compare)
QUESTIONS = ["Why is the sky blue?", "What is a prime number?", "How do birds fly?", "What is water made of?",
             "Who wrote Hamlet?", "What is gravity?", "What is the capital of France?", "Name three fruits.",
             "What is a noun?", "How far away is the Moon?", "What do bees make?", "Why do leaves fall?"]


async def measure(llm, chats: int = 8, answer: int = 64) -> dict:
    """{reuse, compute}: per chat the second turn's first-token ms, prompt tokens and prefix-cache hit tokens.
    On a runner whose rows match its chunks (rows_match_chunks: the CPU engine) both rules reuse the answer."""
    if chats > len(QUESTIONS):
        raise ValueError(f"chats={chats}: at most {len(QUESTIONS)} (each asks a question of its own)")
    sched = llm.engine.scheduler
    paths_match = sched.rows_match_chunks
    out: dict = {"rows_match_chunks": paths_match, "reuse": [], "compute": []}
    try:
        for i in range(chats):
            reuse = i % 2 == 0
            sched.rows_match_chunks = reuse or paths_match
            msgs = [{"role": "user", "content": QUESTIONS[i]}]
            a = await llm.chat.completions.create(messages=msgs, max_tokens=answer, temperature=0)
            msgs += [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Say that again, shorter."}]
            hits = sched.kv.hit_tokens
            t = time.perf_counter()
            r = await llm.chat.completions.create(messages=msgs, max_tokens=1, temperature=0)
            ms = (time.perf_counter() - t) * 1000
            out["reuse" if reuse else "compute"].append(
                {"ttft_ms": round(ms, 1), "prompt_tokens": r["usage"]["prompt_tokens"],
                 "cached_tokens": sched.kv.hit_tokens - hits, "answer_tokens": a["usage"]["completion_tokens"]})
    finally:
        sched.rows_match_chunks = paths_match
    for k in ("reuse", "compute"):
        out[f"{k}_median_ms"] = round(statistics.median(c["ttft_ms"] for c in out[k]), 1) if out[k] else None
    return out


def bench_next_turn(package, device=None, chats: int = 6, answer: int = 64, backend: str = "native") -> dict:
    """measure() on a fresh engine over `package` (webinfer bench's next_turn section)."""
    import webinfer
    from webinfer.factory import EngineOptions

    async def run():
        llm = await webinfer.load(package, backend=backend, device=device, options=EngineOptions(decode_block=1))
        try:
            return await measure(llm, chats, answer)
        finally:
            await llm.close()

    return asyncio.run(run())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m webinfer_packager.bench.next_turn", description=__doc__.split("\n")[0])
    ap.add_argument("package")
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--answer", type=int, default=64, help="max tokens of each first answer")
    ap.add_argument("--backend", default="native", help="native (the GPU model on wgpu) or cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not 2 <= a.chats <= len(QUESTIONS):
        ap.error(f"--chats {a.chats}: from 2 (one chat of each rule) to {len(QUESTIONS)} (a question of its own each)")

    res = bench_next_turn(a.package, chats=a.chats, answer=a.answer, backend=a.backend)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    for k, label in (("reuse", "reusing the decoded answer"), ("compute", "computing the answer as a prompt")):
        for c in res[k]:
            print(f"{label:34s} prompt {c['prompt_tokens']:4d}  cached {c['cached_tokens']:4d}  "
                  f"first token {c['ttft_ms']:8.1f} ms")
    print(f"median first token: reuse {res['reuse_median_ms']} ms, compute {res['compute_median_ms']} ms")
    if res["rows_match_chunks"]:
        print("(this runner's one-token rows match its chunk rows: both rules reuse the answer)")


if __name__ == "__main__":
    main()
