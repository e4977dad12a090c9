"""What scoring a prompt costs (echo's prompt logprobs: every position's logprob, as lm-eval and perplexity ask)
against prefilling it, wall clock, on any backend and thread count:

    XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.scoring PACKAGE [--backend cpu] [--threads 2]
        [--tokens 511] [--reps 3] [--json]

Each rep runs the same-length prompt twice, alternating: `max_tokens: 1` (its prefill and one token) and
`max_tokens: 0, echo, logprobs: 1` (prefill and every position scored); every prompt is new (no prefix-cache hit).
Best of reps each. Wall clock, not CPU time: the CPU engine's threads share the scoring head (kernels.c wi_head),
which a process's CPU time would not show. `webinfer bench`'s `prompt_scoring` is the same figure, one thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def measure(llm, tokens: int = 511, reps: int = 3) -> dict:
    vocab = llm.engine.runner.vocab_size
    seeds = iter(range(1, 1 << 20))

    def run(n: int, score: bool) -> float:
        s = next(seeds)
        prompt = [(7 * i + 11 * s) % vocab for i in range(n)]
        how = {"max_tokens": 0, "echo": True, "logprobs": 1} if score else {"max_tokens": 1}
        t0 = time.perf_counter()
        asyncio.run(llm.completions.create(prompt=prompt, temperature=0, **how))
        return time.perf_counter() - t0

    run(40, False), run(40, True)  # warm-up: every kernel and pipeline of both paths
    prefill, scored = [], []
    for _ in range(reps):
        prefill.append(run(tokens, False))
        scored.append(run(tokens, True))
    return {"prompt_tokens": tokens, "prefill_s": round(min(prefill), 4), "scored_s": round(min(scored), 4),
            "vs_prefill": round(min(scored) / min(prefill), 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "native", "reference"])
    ap.add_argument("--threads", type=int, default=1, help="--backend cpu: wasm threads")
    ap.add_argument("--cpu-mode", default="exact", choices=["exact", "fast"])
    ap.add_argument("--tokens", type=int, default=511)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from webinfer.factory import EngineOptions, load

    opts = EngineOptions(context_tokens=max(1024, a.tokens + 16), max_seqs=16, cpu_mode=a.cpu_mode,
                         cpu_threads=a.threads, enable_prefix_caching=False)
    llm = asyncio.run(load(a.package, backend=a.backend, options=opts))
    r = {"backend": a.backend, "threads": a.threads if a.backend == "cpu" else None, **measure(llm, a.tokens, a.reps)}
    asyncio.run(llm.close())
    print(json.dumps(r) if a.json else
          f"{a.backend} ({r['threads']} threads): {r['prompt_tokens']}-token prompt prefilled in {r['prefill_s']} s, "
          f"scored in {r['scored_s']} s: x{r['vs_prefill']}")


if __name__ == "__main__":
    main()
