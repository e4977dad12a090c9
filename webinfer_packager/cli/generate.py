"""`webinfer generate`: one prompt in, one completion out, on the native GPU engine or the numpy reference model.

    webinfer generate --prompt "Once upon a time" --max-tokens 32 --backend reference --json
"""

from __future__ import annotations

import json
import sys
import time

from webinfer.errors import WebinferError


def _native(package_path, ids, args, eos_ids, on_token):
    try:
        from webinfer_packager.native import generate_native
    except ImportError as e:
        raise WebinferError(f"native backend not available yet ({e}); use --backend reference") from None
    return generate_native(str(package_path), ids, args.max_tokens, args.temperature, args.top_p, args.top_k,
                           args.seed, eos_ids, on_token=on_token)


def _cpu(package_path, ids, args, eos_ids, on_token):
    from webinfer_packager.cpu import generate_cpu

    return generate_cpu(str(package_path), ids, args.max_tokens, args.temperature, args.top_p, args.top_k,
                        args.seed, eos_ids, on_token=on_token, mode=args.cpu_mode)


def _reference(package, ids, args, eos_ids, on_token):
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    t0 = time.perf_counter()
    model = ReferenceModel.from_package(package, max_seq_len=len(ids) + args.max_tokens)
    t_load = time.perf_counter() - t0
    sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    stamps: list[float] = []
    t0 = time.perf_counter()
    out = generate(model, ids, args.max_tokens, sampler, eos_ids,
                   on_token=lambda t: (stamps.append(time.perf_counter()), on_token and on_token(t)))
    t_end = time.perf_counter()
    prefill_s = (stamps[0] - t0) if stamps else t_end - t0
    decode_s = (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return out, {"load_s": round(t_load, 4), "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
                 "prefill_tok_s": round(len(ids) / prefill_s, 2) if prefill_s else None,
                 "decode_tok_s": round((len(stamps) - 1) / decode_s, 2) if decode_s else None}


def cli_main(args) -> int:
    import os

    from webinfer_packager.reference.model import limit_blas_threads

    if "OPENBLAS_NUM_THREADS" not in os.environ:
        limit_blas_threads(1)  # one thread decodes ~10x faster than spinning BLAS threads on a busy small machine
    from webinfer.package import Package
    from webinfer_packager.paths import resolve_package
    from webinfer_packager.cli.prompting import PromptTokenizer, load_messages, prompt_ids

    if args.max_tokens < 1:
        raise WebinferError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    path = resolve_package(args.package)
    package = Package.open(path)
    tok = PromptTokenizer(package.tokenizer_json())
    messages = load_messages(args.messages) if args.messages else None
    ids = prompt_ids(package, tok, prompt=args.prompt, messages=messages, chat=args.chat)
    if not ids:
        raise WebinferError("the prompt encodes to no tokens and the model adds no BOS: give a non-empty prompt")
    eos_ids = list(package.config.eos_token_ids)

    # stream text as it comes, unless printing JSON; decode the whole tail each time so multi-byte
    # characters split across tokens come out whole
    shown: list[int] = []
    printed = [""]

    def on_token(t: int) -> None:
        if args.json or t in eos_ids:
            return
        shown.append(t)
        text = tok.decode(shown)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed[0]):])
            sys.stdout.flush()
            printed[0] = text

    run = {"reference": _reference, "cpu": _cpu}.get(args.backend, _native)
    out, timings = run(package if args.backend == "reference" else path, ids, args, eos_ids, on_token)
    text = tok.decode([t for t in out if t not in eos_ids])
    if args.json:
        print(json.dumps({"backend": args.backend, "prompt_ids": ids, "output_ids": out, "text": text,
                          "stopped": "eos" if out and out[-1] in eos_ids else "max_tokens", "timings": timings}))
    else:
        sys.stdout.write(text[len(printed[0]):] + "\n")
    return 0
