"""What encoding and decoding share: the error helper and GPT-2's byte <-> character tables."""

from __future__ import annotations

from webinfer.errors import FormatError

FILE = "tokenizer.json"


def err(field: str, problem: str, expected: str | None = None) -> FormatError:
    return FormatError(FILE, field, problem, expected)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to themselves, the other 68
    bytes to U+0100.. in byte order, so no token contains white space or control characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def byte_token(tok: str) -> int:
    """The byte of a `<0xNN>` byte-fallback token, or -1."""
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        h = tok[3:5]
        if all(c in "0123456789abcdefABCDEF" for c in h):
            return int(h, 16)
    return -1


def pattern_string(obj, field: str) -> str:
    if not isinstance(obj, dict) or not isinstance(obj.get("String"), str):
        raise err(field, f"unsupported pattern {obj!r}", 'a plain {"String": ...} pattern')
    return obj["String"]
