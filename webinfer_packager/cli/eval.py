"""`webinfer eval`: perplexity of a package on a text, computed with the numpy reference model or, with --backend,
by an engine (the GPU model, the CPU engine in either mode) through the one path: each window is a request whose
prompt logprobs (SamplingParams.prompt_logprobs, what `echo` serves) give the scores.

    webinfer eval --text examples/data/eval.txt --max-tokens 1024 --json
    webinfer eval PKG --text t.txt --reference-model HF_FOLDER_OR_GGUF   # + the unquantized model's ppl, top-1 agreement
    webinfer eval PKG --text t.txt --backend cpu --cpu-mode fast          # the page's CPU engine, int8 activations

Sliding windows as in Hugging Face's perplexity guide: each window holds up to `window` tokens, consecutive windows
start `stride` tokens apart, and only the tokens a window adds beyond the previous one are scored, so each token is
scored once with up to window - stride tokens of context. The first token of the text is never scored (nothing
predicts it).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import numpy as np

from webinfer.errors import WebinferError


def windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) per window: tokens [begin, end) go in, tokens [first_scored, end) are scored.

    stride < window, so that each window also holds the token before its first scored one (with stride == window,
    as in the HF guide's non-overlapping case, the first token of every window would silently go unscored)."""
    if not 1 <= stride < window:
        raise ValueError(f"need 1 <= stride < window, got stride={stride}, window={window}")
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens:
            break
    return out


def log_softmax(z: np.ndarray) -> np.ndarray:
    """z [T, V] -> log probabilities [T, V], in float64 so that summing thousands of NLLs stays exact enough."""
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def score(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """logits [T, V] predicting targets [T] -> (summed NLL, argmax ids [T])."""
    lp = log_softmax(logits)
    return float(-lp[np.arange(len(targets)), targets].sum()), logits.argmax(axis=-1)


def _load_hf(path: str):
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    kw = dict(dtype=torch.float32, local_files_only=True)
    if p.is_file() and p.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, **kw)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(p), **kw)
    return model.eval()


def evaluate(package, ids: list[int], window: int, stride: int, hf_model=None) -> dict:
    """Perplexity of the package's reference model over ids (and of hf_model on the same windows)."""
    from webinfer_packager.reference.model import ReferenceModel

    model = ReferenceModel.from_package(package, max_seq_len=window)
    nll = hf_nll = 0.0
    n_scored = n_agree = n_correct = 0
    for begin, end, first in windows(len(ids), window, stride):
        chunk = ids[begin:end]
        targets = np.asarray(ids[first:end])                              # [n]
        model.reset()
        h = model.hidden(chunk, 0)[first - 1 - begin: end - 1 - begin]    # [n, D]: position j-1 predicts token j
        s, top1 = score(model.logits(h), targets)
        nll += s
        n_scored += len(targets)
        n_correct += int((top1 == targets).sum())
        if hf_model is not None:
            import torch

            with torch.no_grad():
                hl = hf_model(torch.tensor([chunk])).logits[0, first - 1 - begin: end - 1 - begin].float().numpy()
            s, hf_top1 = score(hl, targets)
            hf_nll += s
            n_agree += int((hf_top1 == top1).sum())
    out = {"tokens": len(ids), "tokens_scored": n_scored, "windows": len(windows(len(ids), window, stride)),
           "nll": nll / n_scored, "ppl": math.exp(nll / n_scored), "top1_accuracy": n_correct / n_scored}
    if hf_model is not None:
        out["reference"] = {"nll": hf_nll / n_scored, "ppl": math.exp(hf_nll / n_scored),
                            "top1_agreement": n_agree / n_scored}
    return out


def evaluate_engine(llm, ids: list[int], window: int, stride: int) -> dict:
    """evaluate() through an engine: the same windows and sums, each window's scores from its prompt logprobs."""
    from webinfer.engine.stopping import SamplingParams

    async def main():
        nll, n_scored, n_correct = 0.0, 0, 0
        try:
            for begin, end, first in windows(len(ids), window, stride):
                chunk = ids[begin:end]
                scores = None
                async for o in llm.engine.generate(chunk, SamplingParams(max_tokens=1, prompt_logprobs=0)):
                    scores = o.prompt_logprobs if scores is None else scores
                for j in range(first - begin, end - begin):  # chunk[j], scored by position j - 1
                    lp, _, rank = scores[j - 1]
                    nll -= lp
                    n_correct += rank == 1
                n_scored += end - first
        finally:
            await llm.close()
        return nll, n_scored, n_correct

    nll, n_scored, n_correct = asyncio.run(main())
    return {"tokens": len(ids), "tokens_scored": n_scored, "windows": len(windows(len(ids), window, stride)),
            "nll": nll / n_scored, "ppl": math.exp(nll / n_scored), "top1_accuracy": n_correct / n_scored}


def cli_main(args) -> int:
    import os

    from webinfer_packager.reference.model import limit_blas_threads

    if "OPENBLAS_NUM_THREADS" not in os.environ:
        limit_blas_threads(1)  # one thread decodes ~10x faster than spinning BLAS threads on a busy small machine
    from webinfer.package import Package
    from webinfer_packager.paths import resolve_package
    from webinfer.prompt import Prompter
    from webinfer.tokenizer import Tokenizer

    if args.window < 2 or not (1 <= args.stride < args.window) or args.max_tokens < 2:
        raise WebinferError(f"need --window >= 2, 1 <= --stride < --window, --max-tokens >= 2; got "
                            f"{args.window}, {args.stride}, {args.max_tokens}")
    path = resolve_package(args.package)
    package = Package.open(path)
    if args.window > package.config.max_position_embeddings:
        raise WebinferError(f"--window {args.window} is longer than the model's context "
                            f"({package.config.max_position_embeddings} tokens)")
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WebinferError(f"{args.text}: cannot read as UTF-8 text: {e}") from None
    ids = Prompter.for_package(package, Tokenizer.from_json(package.tokenizer_json())).text_ids(text)[: args.max_tokens]
    if len(ids) < 2:
        raise WebinferError(f"{args.text}: {len(ids)} token(s); perplexity needs at least 2")
    hf = _load_hf(args.reference_model) if args.reference_model else None
    if hf is not None and args.backend != "numpy":
        raise WebinferError("--reference-model compares with the numpy model: use it without --backend")
    t0 = time.perf_counter()
    if args.backend == "numpy":
        res = evaluate(package, ids, args.window, args.stride, hf)
    else:
        from webinfer.factory import EngineOptions
        from webinfer_packager.cli.backend import backend_of, open_llm

        if args.window + 1 > package.config.max_position_embeddings:
            raise WebinferError(f"--window {args.window}: an engine needs window + 1 <= the model's context "
                                f"({package.config.max_position_embeddings} tokens)")
        opts = EngineOptions(context_tokens=args.window + 32, max_seqs=1, cpu_mode=args.cpu_mode)
        llm = open_llm(package, args.backend, options=opts)
        backend = backend_of(llm)
        t0 = time.perf_counter()
        res = {"backend": backend, **({"cpu_mode": args.cpu_mode} if backend == "cpu" else {}),
               **evaluate_engine(llm, ids, args.window, args.stride)}
    res = {"package": str(path), "text": str(args.text), "window": args.window, "stride": args.stride, **res,
           "seconds": round(time.perf_counter() - t0, 2)}
    if args.reference_model:
        res["reference"] = {"model": str(args.reference_model), **res["reference"]}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{path.name}: ppl {res['ppl']:.3f}  nll {res['nll']:.4f}  over {res['tokens_scored']} tokens "
              f"({res['windows']} windows of {args.window}, stride {args.stride}); top-1 accuracy {res['top1_accuracy']:.3f}")
        if hf is not None:
            r = res["reference"]
            print(f"{r['model']}: ppl {r['ppl']:.3f}  nll {r['nll']:.4f}; top-1 agreement with the package "
                  f"{r['top1_agreement']:.4f}")
    return 0
