"""Pre-tokenizer scanners for the known byte-level BPE split patterns, written by hand.

Hugging Face tokenizer.json files carry their split pattern as an Oniguruma regex using `\\p{L}`, `\\p{N}` and
lookahead, which Python's `re` cannot express (and `regex` is not in Pyodide). Running a pattern from a file would
also be a ReDoS risk (tokenizers #2060). So we recognise the pattern by exact string and run a small scanner that
follows the regex alternation order at each position, using `unicodedata` categories. An unknown pattern is a
FormatError, never a guess.

Each scanner returns the list of pieces whose concatenation is the input (the regex's matches, "Isolated").
"""

from __future__ import annotations

import unicodedata

# Oniguruma's Unicode `\s`: the White_Space property. Python's str.isspace() differs (it also counts U+001C..U+001F).
_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B))))
_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")

# The exact pattern strings as they appear in tokenizer.json files.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _cls(c: str) -> str:
    """'L' letter, 'N' number, 'S' white space, 'P' anything else (the classes the patterns distinguish)."""
    if c in _SPACE:
        return "S"
    cat = unicodedata.category(c)[0]
    return cat if cat in "LN" else "P"


def _run(classes: str, i: int, cls: str) -> int:
    """End of the run of `cls` starting at i."""
    n = len(classes)
    while i < n and classes[i] == cls:
        i += 1
    return i


def _contraction(text: str, i: int, ignore_case: bool) -> int:
    """End of `'s|'t|'re|...` at i, or -1. Case-insensitive matching compares simple case folds per character."""
    if text[i] != "'":
        return -1
    for c in _CONTRACTIONS:
        part = text[i + 1 : i + 1 + len(c)]
        if len(part) == len(c) and (part == c or (ignore_case and all(a.casefold() == b for a, b in zip(part, c)))):
            return i + 1 + len(c)
    return -1


def _space_tail(text: str, classes: str, i: int) -> int:
    """`\\s+(?!\\S)|\\s+` at i (i is white space): the whole run when it ends the text or is a single character,
    else all but its last character (which then prefixes the next word)."""
    k = _run(classes, i, "S")
    if k == len(text) or k - i == 1:
        return k
    return k - 1


def split_gpt2(text: str) -> list[str]:
    """GPT2_PATTERN."""
    classes = "".join(map(_cls, text))
    n, i, out = len(text), 0, []
    while i < n:
        j = _contraction(text, i, False)
        if j < 0:
            s = i + 1 if text[i] == " " and i + 1 < n and classes[i + 1] != "S" else i
            c = classes[s]
            if c != "S":  # ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
                j = _run(classes, s, c)
            else:
                j = _space_tail(text, classes, i)
        out.append(text[i:j])
        i = j
    return out


def _split_llama3_family(text: str, max_digits: int) -> list[str]:
    classes = "".join(map(_cls, text))
    n, i, out = len(text), 0, []
    while i < n:
        c = classes[i]
        j = _contraction(text, i, True)
        if j >= 0:
            pass
        elif c == "L":  # `[^\r\n\p{L}\p{N}]?\p{L}+` without the optional character
            j = _run(classes, i, "L")
        elif c != "N" and text[i] not in "\r\n" and i + 1 < n and classes[i + 1] == "L":  # ... with it
            j = _run(classes, i + 1, "L")
        elif c == "N":  # `\p{N}{1,3}` (Llama 3) or `\p{N}` (Qwen2)
            j = min(_run(classes, i, "N"), i + max_digits)
        elif c == "P" or (text[i] == " " and i + 1 < n and classes[i + 1] == "P"):  # ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            j = _run(classes, i + 1 if c == "S" else i, "P")
            while j < n and text[j] in "\r\n":
                j += 1
        else:  # white space: `\s*[\r\n]+`, then `\s+(?!\S)`, then `\s+`
            k = _run(classes, i, "S")
            last_nl = max(text.rfind("\r", i, k), text.rfind("\n", i, k))
            j = last_nl + 1 if last_nl >= 0 else _space_tail(text, classes, i)
        out.append(text[i:j])
        i = j
    return out


def split_llama3(text: str) -> list[str]:
    """LLAMA3_PATTERN."""
    return _split_llama3_family(text, 3)


def split_qwen2(text: str) -> list[str]:
    """QWEN2_PATTERN."""
    return _split_llama3_family(text, 1)


def split_digits(text: str) -> list[str]:
    """HF `Digits(individual_digits=true)`: every numeric character (Unicode N*) becomes its own piece."""
    out, start = [], 0
    for i, ch in enumerate(text):
        if unicodedata.category(ch)[0] == "N":
            if start < i:
                out.append(text[start:i])
            out.append(ch)
            start = i + 1
    if start < len(text):
        out.append(text[start:])
    return out


KNOWN_PATTERNS = {GPT2_PATTERN: split_gpt2, LLAMA3_PATTERN: split_llama3, QWEN2_PATTERN: split_qwen2}
