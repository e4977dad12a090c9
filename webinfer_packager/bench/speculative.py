"""Speculative decoding (prompt lookup) against plain decoding, batch 1, in one run on the same device: acceptance
rate and decode tokens/s on a prompt whose answer quotes its input, a code edit, and open chat (where proposals
rarely match and the adaptive length should keep the cost small). The outputs must be identical; the bench says
so for each prompt.

    python -m webinfer_packager.bench.speculative [PACKAGE] [--max-tokens 96] [--tokens 4] [--draft DRAFT_PACKAGE]
        [--backend native|cpu] [--cpu-mode exact|fast] [--cpu-threads 1|2]

--draft: proposals from a draft model (a smaller package with the same tokenizer) instead of prompt lookup.
--backend cpu: both sides on the WebAssembly CPU engine (webinfer/cpu; prompt lookup only), whose GEMM tile rows
are bit for bit its GEMV's.
The plain side runs with the engine's defaults (decode blocks on), the speculative side verifies every step.

`replay` (prompt lookup only): the same proposer and ProposalBudget replayed over the plain run's greedy output
with a table of step costs by row count, no model: with the row costs this device measured (a check on the
replay: it should land near the measured speedup) and with flat row costs (a GPU whose decode step reads the
weights once for any few rows: the speedup this output would get there).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace

PASSAGE = ("The lighthouse on the northern cape was built in 1884 from granite cut in the quarry behind the village. "
           "Its lamp burned paraffin until 1951, when the keepers installed an electric light visible for twenty "
           "miles. The last keeper left in 1989, and the light has been automatic ever since.")
CODE = ("def total(items):\n    s = 0\n    for x in items:\n        s = s + x.price * x.count\n    return s\n\n"
        "def average(items):\n    return total(items) / len(items)\n")
PROMPTS = {
    "quote": [{"role": "user", "content": f"Copy this text exactly, word for word:\n\n{PASSAGE}"}],
    "code_edit": [{"role": "user", "content": f"Rename the variable s to result in this code and show the full "
                                              f"code:\n\n{CODE}"}],
    "open_chat": [{"role": "user", "content": "Tell me a short story about a dragon who learns to cook."}],
}


class _Replayed:
    def __init__(self, prompt: list[int]):
        self.request_id, self.all_token_ids, self.num_proposed, self.num_accepted = 0, list(prompt), 0, 0


def replay(prompt: list[int], output: list[int], k_max: int, row_cost: dict[int, float]) -> dict:
    """Speculative decoding of `output` (the plain greedy answer to `prompt`) with prompt lookup and the engine's
    ProposalBudget, stepping a clock by row_cost[rows] (a row count not in the table costs what the largest count
    below it costs): steps, proposals, and the speedup over plain decoding (one row a step) at these costs."""
    from webinfer.engine.speculative import PromptLookup, ProposalBudget

    def cost(rows: int) -> float:
        return row_cost[max(r for r in row_cost if r <= rows)]

    prop, budget, req = PromptLookup(), ProposalBudget(), _Replayed(prompt)
    budget.observe_step(1, cost(1))
    t, i, steps = 0.0, 0, 0
    while i < len(output):
        k = budget.lengths([(req, k_max)], 1)[0]
        p = prop.propose(req, k) if k else []
        budget.observe_step(1 + len(p), cost(1 + len(p)))
        t += cost(1 + len(p))
        steps += 1
        a = 0
        while a < len(p) and i + a < len(output) and p[a] == output[i + a]:
            a += 1
        req.num_proposed += len(p)
        req.num_accepted += a
        take = min(a + 1, len(output) - i)
        req.all_token_ids += output[i:i + take]
        i += take
    return {"steps": steps, "proposed": req.num_proposed, "accepted": req.num_accepted,
            "speedup": round(len(output) * cost(1) / t, 3) if t else None}


async def _one(llm, messages, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    r = await llm.chat.completions.create(messages=messages, max_tokens=max_tokens, temperature=0)
    wall = time.perf_counter() - t0
    u = r["usage"]
    spec = u.get("speculative") or {}
    return {"ids": r["choices"][0]["token_ids"], "tokens": u["completion_tokens"], "wall_s": wall,
            "decode_tok_s": (1.0 / u["time_per_output_token_s"]) if u["time_per_output_token_s"] else None,
            "proposed": spec.get("proposed_tokens", 0), "accepted": spec.get("accepted_tokens", 0),
            "steps": None}


def bench_speculative(package, device=None, max_tokens: int = 96, tokens: int = 4, reps: int = 2,
                      method: str = "prompt-lookup", adaptive: bool = True, backend: str = "native",
                      cpu_mode: str = "exact", cpu_threads: int = 1) -> dict:
    """{prompt: {plain, speculative, speedup, acceptance, identical}} measured alternately in one process.
    method: "prompt-lookup" or a draft package's path. adaptive: the engine verifies only the proposals that pay
    for their rows on this device (the default); False: every proposal. backend: "native" (GPU) or "cpu"."""
    from webinfer.factory import EngineOptions, load

    base = EngineOptions(context_tokens=2048, max_seqs=1, cpu_mode=cpu_mode, cpu_threads=cpu_threads)
    plain = asyncio.run(load(package, backend=backend, device=device, options=base))
    spec = asyncio.run(load(package, backend=backend, device=getattr(plain.engine.runner, "device", None),
                            options=replace(base, speculative=str(method), speculative_tokens=tokens,
                                            adaptive_proposals=adaptive)))
    from webinfer.errors import ContextOverflowError

    out = {}
    for name, msgs in PROMPTS.items():
        try:
            plain.prepare("chat", {"messages": msgs, "max_tokens": max_tokens})
        except ContextOverflowError as e:  # a small model's context (tests' tiny packages)
            out[name] = {"skipped": str(e)}
            continue
        runs = {"plain": [], "speculative": []}
        for _ in range(reps):  # alternate, so both sides see the same machine load
            for label, llm in (("plain", plain), ("speculative", spec)):
                steps0 = llm.engine.steps
                r = asyncio.run(_one(llm, msgs, max_tokens))
                r["steps"] = llm.engine.steps - steps0
                runs[label].append(r)
        best = {k: max(v, key=lambda r: r["decode_tok_s"] or 0) for k, v in runs.items()}
        p, s = best["plain"], best["speculative"]
        out[name] = {
            "identical": all(r["ids"] == runs["plain"][0]["ids"] for r in runs["plain"] + runs["speculative"]),
            "tokens": p["tokens"], "plain_decode_tok_s": round(p["decode_tok_s"] or 0, 2),
            "spec_decode_tok_s": round(s["decode_tok_s"] or 0, 2),
            "speedup": round((s["decode_tok_s"] or 0) / (p["decode_tok_s"] or 1), 3),
            "plain_wall_s": round(p["wall_s"], 3), "spec_wall_s": round(s["wall_s"], 3),
            "plain_steps": p["steps"], "spec_steps": s["steps"],
            "proposed": s["proposed"], "accepted": s["accepted"],
            "acceptance": round(s["accepted"] / s["proposed"], 3) if s["proposed"] else None,
        }
        if method == "prompt-lookup" and spec.engine.budget is not None:
            prompt_ids, out_ids = plain.prepare("chat", {"messages": msgs})[1], runs["plain"][0]["ids"]
            measured = dict(spec.engine.budget.row_s)
            out[name]["replay"] = {
                "measured_row_costs": replay(prompt_ids, out_ids, tokens, measured),
                "flat_row_costs": replay(prompt_ids, out_ids, tokens, {1: 1.0})}
    row_s = spec.engine.budget.row_s if spec.engine.budget is not None else {}
    for llm in (plain, spec):
        asyncio.run(llm.close())
    return {"method": str(method), "backend": backend, **({"cpu_mode": cpu_mode, "cpu_threads": cpu_threads}
                                                          if backend == "cpu" else {}),
            "speculative_tokens": tokens, "adaptive_proposals": adaptive,
            "max_tokens": max_tokens, "reps": reps, "prompts": out,
            "step_ms_by_rows": {r: round(v * 1e3, 2) for r, v in sorted(row_s.items())}}


if __name__ == "__main__":
    import argparse

    from webinfer_packager.paths import resolve_package

    ap = argparse.ArgumentParser()
    ap.add_argument("package", nargs="?")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--draft", default=None, help="a draft package (same tokenizer) instead of prompt lookup")
    ap.add_argument("--verify-all", action="store_true",
                    help="verify every proposal (default: only those that pay for their rows on this device)")
    ap.add_argument("--backend", choices=["native", "cpu"], default="native")
    ap.add_argument("--cpu-mode", choices=["exact", "fast"], default="exact")
    ap.add_argument("--cpu-threads", type=int, choices=[1, 2], default=1)
    a = ap.parse_args()
    json.dump(bench_speculative(resolve_package(a.package), max_tokens=a.max_tokens, tokens=a.tokens,
                                method=a.draft or "prompt-lookup", adaptive=not a.verify_all, backend=a.backend,
                                cpu_mode=a.cpu_mode, cpu_threads=a.cpu_threads), sys.stdout, indent=1)
    print()
