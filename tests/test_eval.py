"""`webinfer eval`: the sliding-window scheme, and perplexity of packed SmolLM2 and Gemma 3 270M vs transformers on
the same GGUF.

Run: python -m pytest tests/test_eval.py -v -s
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from webinfer_packager.cli.eval import windows
from webinfer_packager.cli.main import main

EVAL_TEXT = "examples/data/eval.txt"


@pytest.mark.parametrize("n,window,stride", [(2, 4, 2), (10, 4, 2), (11, 4, 3), (12, 4, 1), (100, 32, 8),
                                              (33, 32, 16), (5, 64, 32)])
def test_windows_score_every_token_once_with_context(n, window, stride):
    scored = []
    for begin, end, first in windows(n, window, stride):
        assert 0 <= begin < first <= end <= n and end - begin <= window
        scored += range(first, end)
        # every scored token sees at least window - stride tokens before it, or the whole text so far
        assert first - begin >= min(window - stride, first)
    assert scored == list(range(1, n))      # token 0 has no predictor; every other token exactly once, in order


def test_windows_need_overlap():
    with pytest.raises(ValueError, match="stride < window"):
        windows(20, 4, 4)


def run_eval(capsys, *argv) -> dict:
    assert main(["eval", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.model
@pytest.mark.oracle
@pytest.mark.slow
def test_eval_smollm2_against_transformers(smollm2_package, smollm2_gguf, capsys):
    import torch

    torch.set_num_threads(1)
    r = run_eval(capsys, str(smollm2_package), "--text", EVAL_TEXT, "--max-tokens", "160", "--window", "96",
                 "--stride", "48", "--reference-model", str(smollm2_gguf))
    print(f"\npackage ppl {r['ppl']:.4f}, transformers ppl {r['reference']['ppl']:.4f}, "
          f"top-1 agreement {r['reference']['top1_agreement']:.4f} over {r['tokens_scored']} tokens")
    assert r["tokens"] == 160 and r["tokens_scored"] == 159 and r["windows"] == 3
    # a working model on plain English prose: far below the vocabulary size a broken one tends to (measured: 62)
    assert math.isfinite(r["ppl"]) and 5.0 < r["ppl"] < 200.0
    # the repack is lossless: same numbers as transformers on the dequantized GGUF up to float order
    assert abs(r["nll"] - r["reference"]["nll"]) < 1e-4
    assert r["reference"]["top1_agreement"] == 1.0


@pytest.mark.model
def test_eval_through_the_cpu_engine_equals_the_numpy_model(smollm2_package, capsys):
    """--backend cpu: the windows as requests whose prompt logprobs score them (the path `echo` serves). Exact mode:
    the numpy model's perplexity to float order; fast mode (int8 activations) within 1 % (measured +0.6 %)."""
    argv = [str(smollm2_package), "--text", EVAL_TEXT, "--max-tokens", "160", "--window", "96", "--stride", "48"]
    want = run_eval(capsys, *argv)
    exact = run_eval(capsys, *argv, "--backend", "cpu")
    fast = run_eval(capsys, *argv, "--backend", "cpu", "--cpu-mode", "fast")
    assert exact["backend"] == "cpu" and exact["cpu_mode"] == "exact" and fast["cpu_mode"] == "fast"
    assert exact["tokens_scored"] == fast["tokens_scored"] == want["tokens_scored"] == 159
    assert abs(exact["nll"] - want["nll"]) < 1e-5 and exact["top1_accuracy"] == want["top1_accuracy"]
    assert fast["nll"] != exact["nll"] and abs(fast["ppl"] / exact["ppl"] - 1) < 0.01


@pytest.mark.model
@pytest.mark.slow
def test_eval_rejects_bad_options(smollm2_package, tmp_path, capsys):
    assert main(["eval", str(smollm2_package), "--text", EVAL_TEXT, "--window", "8", "--stride", "8"]) == 2
    assert "--stride" in capsys.readouterr().err
    (tmp_path / "one.txt").write_text("a")
    assert main(["eval", str(smollm2_package), "--text", str(tmp_path / "one.txt")]) == 2
    assert "at least 2" in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.oracle
@pytest.mark.slow
def test_eval_gemma3_270m_against_transformers(gemma_package, gemma_gguf, capsys):
    """Gemma 3 270M (Q4_K/Q6_K/Q5_0/Q8_0, 262k vocabulary): the scored ids start with the BOS its tokenizer config
    asks for (the same ids transformers' tokenizer gives), and the perplexity equals transformers' on the GGUF."""
    import torch
    from transformers import AutoTokenizer

    from webinfer.package import Package
    from webinfer.prompt import Prompter
    from webinfer.tokenizer import Tokenizer

    torch.set_num_threads(1)
    text = Path(EVAL_TEXT).read_text(encoding="utf-8")
    pkg = Package.open(gemma_package)
    ids = Prompter.for_package(pkg, Tokenizer.from_json(pkg.tokenizer_json())).text_ids(text)  # what eval scores
    hf_tok = AutoTokenizer.from_pretrained(str(gemma_gguf.parent), gguf_file=gemma_gguf.name)
    assert ids[0] == pkg.config.bos_token_id == 2 and ids == hf_tok(text)["input_ids"]
    r = run_eval(capsys, str(gemma_package), "--text", EVAL_TEXT, "--max-tokens", "256", "--window", "128",
                 "--stride", "64", "--reference-model", str(gemma_gguf))
    print(f"\ngemma package ppl {r['ppl']:.4f}, transformers ppl {r['reference']['ppl']:.4f}, "
          f"top-1 agreement {r['reference']['top1_agreement']:.4f} over {r['tokens_scored']} tokens")
    assert r["tokens"] == 256 and r["tokens_scored"] == 255 and r["windows"] == 3
    assert math.isfinite(r["ppl"]) and 5.0 < r["ppl"] < 1000.0   # far below a broken model's ~262k (measured: 92.1)
    assert abs(r["ppl"] / r["reference"]["ppl"] - 1) < 0.01     # the bar: within 1 %
    assert abs(r["nll"] - r["reference"]["nll"]) < 1e-4          # and in fact equal up to float order (lossless)
    assert r["reference"]["top1_agreement"] == 1.0
