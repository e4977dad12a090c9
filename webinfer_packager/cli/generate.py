"""`webinfer generate`: one prompt in, one completion out, streamed as it is generated. A thin front end over
LLM.completions / LLM.chat.completions (webinfer/api.py), the same path as the HTTP API and the page.

    webinfer generate --prompt "Once upon a time" --max-tokens 32 [--chat] [--backend auto|native|cpu|reference]
                      [--json]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from webinfer.errors import FormatError, WebinferError


def load_messages(path: str | Path) -> list[dict]:
    """A JSON file holding a list of {"role": str, "content": str}."""
    try:
        msgs = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise WebinferError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise FormatError(str(path), "(json)", f"is not valid JSON: {e}") from None
    if not isinstance(msgs, list) or not msgs:
        raise FormatError(str(path), "(top level)", f"is {type(msgs).__name__}", "a non-empty list of {role, content}")
    return msgs


def request_from_args(args) -> tuple[str, dict]:
    """(kind, OpenAI request body) for the command's arguments."""
    req = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
           "seed": args.seed, "stream": True}
    if args.messages:
        return "chat", {**req, "messages": load_messages(args.messages)}
    if args.chat:
        return "chat", {**req, "messages": [{"role": "user", "content": args.prompt}]}
    return "completion", {**req, "prompt": args.prompt}


async def run(llm, kind: str, req: dict, out=None, echo: bool = True) -> dict:
    """Stream one request, writing text deltas to `out` (default: sys.stdout) when echo; returns the ids, text and
    timings."""
    out = out or sys.stdout
    create = llm.chat.completions.create if kind == "chat" else llm.completions.create
    stream = await create(**req)
    prompt_ids, ids, text, last = [], [], [], None
    try:
        async for c in stream:
            prompt_ids = c.get("prompt_token_ids", prompt_ids)
            ch = c["choices"][0]
            piece = ch["delta"].get("content", "") if kind == "chat" else ch["text"]
            ids += ch["token_ids"]
            text.append(piece)
            if echo and piece:
                out.write(piece)
                out.flush()
            last = c
    finally:
        await stream.aclose()
    u = last["usage"]
    tpot = u["time_per_output_token_s"]
    return {"prompt_ids": prompt_ids, "output_ids": ids, "text": "".join(text),
            "finish_reason": last["choices"][0]["finish_reason"], "speculative": u.get("speculative"),
            "timings": {"ttft_s": round(u["ttft_s"], 4), "prefill_tok_s": round(len(prompt_ids) / u["ttft_s"], 2),
                        "decode_tok_s": round(1.0 / tpot, 2) if tpot else None}}


def cli_main(args) -> int:
    from webinfer_packager.cli.backend import backend_of, engine_options, open_llm
    from webinfer_packager.paths import resolve_package

    if args.max_tokens < 1:
        raise WebinferError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    kind, req = request_from_args(args)
    path = resolve_package(args.package)
    t0 = time.perf_counter()
    llm = open_llm(path, args.backend, options=engine_options(args, max_seqs=1))
    load_s = time.perf_counter() - t0

    async def main():
        try:
            return await run(llm, kind, req, echo=not args.json)
        finally:
            await llm.close()

    res = asyncio.run(main())
    res["timings"]["load_s"] = round(load_s, 4)
    if args.json:
        # the backend auto chose, when it was auto; the GPU engine's decode GEMV layout (None on the others)
        print(json.dumps({"backend": backend_of(llm), "gemv_ksplit": getattr(llm.engine.runner, "ksplit", None),
                          **res}))
    else:
        sys.stdout.write("\n")
    return 0
