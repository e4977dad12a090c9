"""`webinfer tokenize SOURCE --file F`: one JSON string per input line in, one JSON list of ids per line out.

SOURCE is a package folder, a tokenizer.json, or a GGUF file (its vocabulary is converted to tokenizer.json form by
webinfer_packager.pack.tokenizer_convert, so the GGUF path tests exactly what a packed model will use). No special
tokens are added: the ids are those of the text alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from webinfer.errors import FormatError, InvalidRequestError, WebinferError
from webinfer.tokenizer import Tokenizer


def _gguf_tokenizer_json(path: Path) -> dict:
    """tokenizer.json form of a GGUF's vocabulary. Reads only the metadata, so a vocab-only GGUF works too."""
    from webinfer_packager.pack.gguf_source import read_gguf_fields
    from webinfer_packager.pack.tokenizer_convert import tokenizer_from_gguf

    fields = read_gguf_fields(path)  # validated, decoded lazily (GGUFReader's fields cost ~200x the file)
    return tokenizer_from_gguf(fields, str(path))[0]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise FormatError(path, "(file)", f"not valid JSON: {e}", "a Hugging Face tokenizer.json") from e


def load_tokenizer(source: str | Path) -> Tokenizer:
    path = Path(source)
    if path.is_dir():
        from webinfer.package import Package

        return Tokenizer.from_json(Package.open(path).tokenizer_json())
    if not path.is_file():
        raise WebinferError(f"{path}: no such file or folder (expected a package folder, a tokenizer.json or a GGUF file)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return Tokenizer.from_json(_gguf_tokenizer_json(path))
    return Tokenizer.from_json(_read_json(path))


def cli_main(args) -> int:
    tok = load_tokenizer(args.source)
    stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
    out = sys.stdout
    lineno = 0
    try:
        for lineno, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)
            except ValueError as e:
                raise FormatError(args.file, f"line {lineno}", f"not JSON: {e}", "one JSON string per line") from e
            if not isinstance(text, str):
                raise FormatError(args.file, f"line {lineno}", f"a JSON {type(text).__name__}", "a JSON string")
            try:
                ids = tok.encode(text, add_special_tokens=False)
            except InvalidRequestError as e:  # a lone surrogate: JSON can spell it, Unicode text cannot hold it
                raise FormatError(args.file, f"line {lineno}", str(e), "a JSON string of Unicode text") from None
            out.write(json.dumps(ids) + "\n")
    except UnicodeDecodeError as e:
        raise FormatError(args.file, f"line {lineno + 1}", f"is not UTF-8: {e.reason}", "UTF-8 text") from None
    finally:
        if stream is not sys.stdin:
            stream.close()
    return 0
