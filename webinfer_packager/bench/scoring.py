"""What scoring a prompt costs (echo's prompt logprobs: every position's logprob, as lm-eval and perplexity ask)
against prefilling it, wall clock, on any backend and thread count:

    XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.scoring PACKAGE [--backend cpu] [--threads 2]
        [--tokens 511] [--reps 3] [--json]

Each rep runs the prompt twice, alternating: `max_tokens: 1` (its prefill and one token) and `max_tokens: 0, echo,
logprobs: 1` (prefill and every position scored), prefix cache off. Best of reps each. Wall clock, not CPU time: the CPU engine's threads share the scoring head (kernels.c wi_head),
which a process's CPU time would not show. `webinfer bench`'s `prompt_scoring` is the same figure, one thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time


def measure(llm, prompt: list[int], reps: int, pick=statistics.median) -> dict:
    """The prompt's prefill to a first token (`max_tokens: 1`) and its scoring (`max_tokens: 0, echo, logprobs: 1`),
    alternating `reps` times, wall seconds of each through `pick` (median for `webinfer bench`, min for best of).
    The engine must not cache prefixes (each run prefills the prompt afresh)."""
    walls: dict[str, list[float]] = {"prefill": [], "scored": []}
    for _ in range(reps):
        for k, how in (("prefill", {"max_tokens": 1}), ("scored", {"max_tokens": 0, "echo": True, "logprobs": 1})):
            t = time.perf_counter()
            asyncio.run(llm.completions.create(prompt=prompt, temperature=0, **how))
            walls[k].append(time.perf_counter() - t)
    prefill, scored = pick(walls["prefill"]), pick(walls["scored"])
    return {"prompt_tokens": len(prompt), "prefill_s": round(prefill, 4), "scored_s": round(scored, 4),
            "vs_prefill": round(scored / prefill, 3)}


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
    vocab = llm.engine.runner.vocab_size
    measure(llm, [(7 * i + 3) % vocab for i in range(40)], 1)  # warm-up: every kernel and pipeline of both paths
    prompt = [(7 * i + 11) % vocab for i in range(a.tokens)]
    r = {"backend": a.backend, "threads": a.threads if a.backend == "cpu" else None, **measure(llm, prompt, a.reps, min)}
    asyncio.run(llm.close())
    print(json.dumps(r) if a.json else
          f"{a.backend} ({r['threads']} threads): {r['prompt_tokens']}-token prompt prefilled in {r['prefill_s']} s, "
          f"scored in {r['scored_s']} s: x{r['vs_prefill']}")


if __name__ == "__main__":
    main()
