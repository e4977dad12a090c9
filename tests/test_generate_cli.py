"""`webinfer generate --backend reference` end to end through the CLI entry point, on the packed SmolLM2.

Run: python -m pytest tests/test_generate_cli.py -v
"""

from __future__ import annotations

import json

import pytest

from webinfer_packager.cli.main import main

pytestmark = [pytest.mark.model, pytest.mark.slow]


def run_json(capsys, *argv) -> dict:
    assert main(["generate", *argv, "--backend", "reference", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plain_prompt_greedy(smollm2_package, capsys):
    from tokenizers import Tokenizer
    from webinfer.package import Package

    r = run_json(capsys, str(smollm2_package), "--prompt", "Once upon a time", "--max-tokens", "24")
    # prompt ids from the independent `tokenizers` library on the package's own tokenizer.json
    hf_tok = Tokenizer.from_str(json.dumps(Package.open(smollm2_package).tokenizer_json()))
    assert r["prompt_ids"] == hf_tok.encode("Once upon a time", add_special_tokens=False).ids
    assert len(r["output_ids"]) == 24 and r["finish_reason"] == "length"
    assert r["text"] == hf_tok.decode(r["output_ids"])
    assert r["text"].startswith(", the city of Nova Haven was a thriving metropolis, with towering skyscrapers and "
                                "bustling streets. But as")
    assert r["timings"]["decode_tok_s"] > 0


def test_messages_file_stops_at_eos(smollm2_package, capsys, tmp_path):
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "What is the capital of France?"}]))
    r = run_json(capsys, str(smollm2_package), "--messages", str(msgs), "--max-tokens", "40")
    assert r["finish_reason"] == "stop" and r["output_ids"][-1] == 2 and len(r["output_ids"]) < 40
    assert "Paris" in r["text"] and "<|im_end|>" not in r["text"]
    # --chat --prompt builds the same prompt as a one-message --messages file
    r2 = run_json(capsys, str(smollm2_package), "--chat", "--prompt", "What is the capital of France?", "--max-tokens", "1")
    assert r2["prompt_ids"] == r["prompt_ids"] and r2["output_ids"] == r["output_ids"][:1]


def test_seeded_sampling_is_reproducible(smollm2_package, capsys):
    args = [str(smollm2_package), "--prompt", "My favourite animal is", "--max-tokens", "8", "--temperature", "1.0",
            "--top-k", "40", "--top-p", "0.95"]
    a, b = run_json(capsys, *args, "--seed", "3"), run_json(capsys, *args, "--seed", "3")
    c = run_json(capsys, *args, "--seed", "4")
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]


def test_streams_plain_text(smollm2_package, capsys):
    assert main(["generate", str(smollm2_package), "--prompt", "Once upon a time", "--max-tokens", "6",
                 "--backend", "reference"]) == 0
    assert capsys.readouterr().out == ", the city of Nova Haven\n"


def test_errors_are_reported(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--prompt", "x", "--backend", "reference"]) == 2
    assert "not a webinfer package" in capsys.readouterr().err
