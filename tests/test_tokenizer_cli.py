"""`webinfer tokenize`: JSON Lines in, one JSON id list per line out, for a tokenizer.json and a GGUF (converted by the
packager); ids checked against the `tokenizers` library."""

from __future__ import annotations

import io
import json
import sys

import pytest

pytest.importorskip("tokenizers")
from tests.test_tokenizer import CORPUS, train_byte_level  # noqa: E402
from webinfer.errors import FormatError  # noqa: E402
from webinfer_packager.cli.main import main  # noqa: E402


def _run(capsys, monkeypatch, argv, stdin=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


def test_tokenizer_json_and_stdin(tmp_path, capsys, monkeypatch):
    hf = train_byte_level()
    tj = tmp_path / "tokenizer.json"
    tj.write_text(hf.to_str(), encoding="utf-8")
    texts = [t for t in CORPUS]
    lines = "\n".join(json.dumps(t) for t in texts) + "\n"
    f = tmp_path / "in.jsonl"
    f.write_text(lines, encoding="utf-8")
    want = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    assert _run(capsys, monkeypatch, ["tokenize", str(tj), "--file", str(f)])[:2] == (0, want)
    assert _run(capsys, monkeypatch, ["tokenize", str(tj), "--file", "-"], stdin=lines)[:2] == (0, want)


def test_bad_input_line(tmp_path, capsys, monkeypatch):
    tj = tmp_path / "tokenizer.json"
    tj.write_text(train_byte_level().to_str(), encoding="utf-8")
    f = tmp_path / "in.jsonl"
    f.write_text('"ok"\n[1, 2]\n', encoding="utf-8")
    rc, out, err = _run(capsys, monkeypatch, ["tokenize", str(tj), "--file", str(f)])
    assert rc == 2 and len(out) == 1 and "line 2" in err and "JSON string" in err


def test_lone_surrogate_line(tmp_path, capsys, monkeypatch):
    tj = tmp_path / "tokenizer.json"
    tj.write_text(train_byte_level().to_str(), encoding="utf-8")
    f = tmp_path / "in.jsonl"
    f.write_text('"ok"\n"a\\ud800b"\n', encoding="utf-8")
    rc, out, err = _run(capsys, monkeypatch, ["tokenize", str(tj), "--file", str(f)])
    assert rc == 2 and len(out) == 1 and "line 2" in err and "U+D800" in err and "Traceback" not in err


def test_not_a_tokenizer(tmp_path):
    from webinfer_packager.cli.tokenize import load_tokenizer

    bad = tmp_path / "t.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(FormatError):
        load_tokenizer(bad)


@pytest.mark.model
def test_gguf(smollm2_gguf, tmp_path, capsys, monkeypatch):
    """The GGUF path: the vocabulary is converted at load by webinfer_packager.pack.tokenizer_convert."""
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps("<|im_start|>user\nHello 12 world<|im_end|>") + "\n", encoding="utf-8")
    rc, out, _ = _run(capsys, monkeypatch, ["tokenize", str(smollm2_gguf), "--file", str(f)])
    # ids checked once with `tokenizers` on SmolLM2's tokenizer.json (transformers' conversion + Digits):
    # specials 1/2, "user", "\n", "Hello", " ", "1", "2", " world"
    assert rc == 0 and out == [[1, 4093, 198, 19556, 216, 33, 34, 905, 2]]
