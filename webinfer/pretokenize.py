"""Pre-tokenizer scanners for the known split patterns, written by hand.

Hugging Face tokenizer.json files carry their split pattern as an Oniguruma regex using `\\p{L}`, `\\p{N}` and
lookahead, which Python's `re` cannot express (and `regex` is not in Pyodide). Running a pattern from a file would
also be a ReDoS risk (tokenizers #2060). So we recognise the pattern by exact string and run a small scanner that
follows the regex alternation order at each position, using `unicodedata` categories. An unknown pattern is a
FormatError, never a guess.

Each scanner returns the list of pieces whose concatenation is the input (the regex's matches, "Isolated").

`LLAMA_CPP_PRE` maps every `tokenizer.ggml.pre` name llama.cpp gives a byte-level BPE vocabulary of the supported
families to the pre-tokenizer that splits text as llama.cpp does (`webinfer_packager.pack.tokenizer_convert` writes it
into the package's tokenizer.json); the patterns are the ones llama.cpp's llama-vocab.cpp runs, one Split per regex.
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


def _last_of(text: str, chars: str, i: int, k: int) -> int:
    """Last position in [i, k) holding one of chars, or -1. A loop over the run, not str.rfind(sub, i, k), whose cost
    grows with the whole text on CPython (quadratic over many short runs)."""
    while k > i:
        k -= 1
        if text[k] in chars:
            return k
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
        elif c == "N":  # `\p{N}{1,3}` (Llama 3) or `\p{N}` (Qwen2); bounded scan, so a digit run stays linear
            j, stop = i + 1, min(n, i + max_digits)
            while j < stop and classes[j] == "N":
                j += 1
        elif c == "P" or (text[i] == " " and i + 1 < n and classes[i + 1] == "P"):  # ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            j = _run(classes, i + 1 if c == "S" else i, "P")
            while j < n and text[j] in "\r\n":
                j += 1
        else:  # white space: `\s*[\r\n]+`, then `\s+(?!\S)`, then `\s+`
            k = _run(classes, i, "S")
            last_nl = _last_of(text, "\r\n", i, k)
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



# -- single-regex scanners for the patterns llama.cpp chains for DeepSeek and Falcon ------------------------------


def _isolate(text: str, match_at) -> list[str]:
    """Split Isolated on a pattern given as match_at(text, i) -> end of the match starting at i, or -1. Every
    match_at below fails in O(1) and succeeds in O(match length), so a scan is linear."""
    out, gap, i, n = [], 0, 0, len(text)
    while i < n:
        j = match_at(text, i)
        if j > i:
            if gap < i:
                out.append(text[gap:i])
            out.append(text[i:j])
            gap = i = j
        else:
            i += 1
    if gap < n:
        out.append(text[gap:])
    return out


def _opt_space_run(member):
    """`\\s?C+` for the character class `member`: Oniguruma first tries the optional space, then backtracks."""

    def match_at(text: str, i: int) -> int:
        n = len(text)
        if text[i] in _SPACE and i + 1 < n and member(text[i + 1]):
            j = i + 1
        elif member(text[i]):
            j = i
        else:
            return -1
        while j < n and member(text[j]):
            j += 1
        return j

    return match_at


def _run_of(member):
    def match_at(text: str, i: int) -> int:
        j, n = i, len(text)
        while j < n and member(text[j]):
            j += 1
        return j if j > i else -1

    return match_at


def _one_of(member):
    return lambda text, i: i + 1 if member(text[i]) else -1


def _ranges(spec: str) -> list[tuple[int, int]]:
    """The code point ranges of a regex character class body made of literal characters and `a-b` ranges."""
    out, i = [], 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            out.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            out.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return out


def _in_ranges(ranges: list[tuple[int, int]]):
    table = frozenset(o for lo, hi in ranges for o in range(lo, hi + 1))
    return lambda c: ord(c) in table


# llama.cpp's DeepSeek LLM letter class (the cased letters), escaped: several of its characters are canonical
# singletons (U+1F7D, U+1FBE, U+212A, ...) that an editor's NFC would silently turn into other code points
_DS_LETTERS = ("A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
               "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
               "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
               "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
               "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
               "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
               "\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
               "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
               "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
               "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
               "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
               "\U0001e900-\U0001e943")
_DS_PUNCT = "!-/:-~！-／：-～‘-‟　-。"
_CJK = "一-龥ࠀ-一가-퟿"
_is_letter = lambda c: unicodedata.category(c)[0] == "L"  # noqa: E731
_is_number = lambda c: unicodedata.category(c)[0] == "N"  # noqa: E731
_is_punct = lambda c: unicodedata.category(c)[0] == "P"  # noqa: E731
_is_falcon_punct = lambda c: c in "$+<=>^~|`" or unicodedata.category(c)[0] == "P"  # noqa: E731
_is_cjk = _in_ranges(_ranges(_CJK))


def _ascii_digits3(text: str, i: int) -> int:
    return i + 3 if all("0" <= c <= "9" for c in text[i:i + 3]) and i + 3 <= len(text) else -1


def _space_to_line_end(text: str, i: int) -> int:
    """`\\s+$`, `$` being Oniguruma's end of line (end of text or before a \\n): the white space run at i when it ends
    the text, else up to its last \\n after i; -1 otherwise (and -1 inside a run, whose start already decided)."""
    if text[i] not in _SPACE or (i > 0 and text[i - 1] in _SPACE):
        return -1
    k = i
    while k < len(text) and text[k] in _SPACE:
        k += 1
    if k == len(text):
        return k
    nl = _last_of(text, "\n", i + 1, k)
    return nl if nl > i else -1


def _isolated(match_at):
    return lambda text: _isolate(text, match_at)


DEEPSEEK_LLM_PATTERNS = ("[\r\n]", "\\s?[" + _DS_LETTERS + "]+", "\\s?[" + _DS_PUNCT + "]+", "\\s+$", "[" + _CJK + "]+",
                         "\\p{N}+")
DEEPSEEK_CODER_PATTERNS = ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[" + _CJK + "]+", "\\p{N}")
FALCON_PATTERNS = ("[\\p{P}\\$\\+<=>\\^~\\|`]+",
                   "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", "[0-9][0-9][0-9]")

_SCANNERS = {
    "[\r\n]": _isolated(_one_of(lambda c: c in "\r\n")),
    DEEPSEEK_LLM_PATTERNS[1]: _isolated(_opt_space_run(_in_ranges(_ranges(_DS_LETTERS)))),
    DEEPSEEK_LLM_PATTERNS[2]: _isolated(_opt_space_run(_in_ranges(_ranges(_DS_PUNCT)))),
    "\\s+$": _isolated(_space_to_line_end),
    "[" + _CJK + "]+": _isolated(_run_of(_is_cjk)),
    "\\p{N}+": _isolated(_run_of(_is_number)),
    "\\p{N}": _isolated(_one_of(_is_number)),
    "\\s?\\p{L}+": _isolated(_opt_space_run(_is_letter)),
    "\\s?\\p{P}+": _isolated(_opt_space_run(_is_punct)),
    FALCON_PATTERNS[0]: _isolated(_run_of(_is_falcon_punct)),
    # llama.cpp's GPT-2 pattern lacks the final `|\s+`; the only text `\s+` would take is a single white space
    # character before a non-space, which Isolated splitting leaves as a piece of its own anyway
    FALCON_PATTERNS[1]: split_gpt2,
    FALCON_PATTERNS[2]: _isolated(_ascii_digits3),
}


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _seq(*steps: dict) -> dict:
    return {"type": "Sequence", "pretokenizers": list(steps)}


_GPT2 = _byte_level(True)  # ByteLevel's own regex is GPT2_PATTERN
_STARCODER = _seq({"type": "Digits", "individual_digits": True}, _byte_level(True))  # llama.cpp: `\p{N}`, then GPT-2
_LLAMA3 = _seq(_split(LLAMA3_PATTERN), _byte_level(False))
_QWEN2 = _seq(_split(QWEN2_PATTERN), _byte_level(False))

LLAMA_CPP_PRE: dict[str, tuple[dict | None, dict]] = {
    # tokenizer.ggml.pre -> (normalizer, pre_tokenizer) in tokenizer.json form, as llama-vocab.cpp groups them
    **dict.fromkeys(["default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "phi-2"], (None, _GPT2)),
    **dict.fromkeys(["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"], (None, _STARCODER)),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"], (None, _LLAMA3)),
    # HF's Qwen2 tokenizer.json normalizes to NFC first
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez"], ({"type": "NFC"}, _QWEN2)),
    "deepseek-llm": (None, _seq(*map(_split, DEEPSEEK_LLM_PATTERNS), _byte_level(False))),
    "deepseek-coder": (None, _seq(*map(_split, DEEPSEEK_CODER_PATTERNS), _byte_level(False))),
    "falcon": (None, _seq(*map(_split, FALCON_PATTERNS), _byte_level(False))),
}


def split_string(text: str, pattern: str, behavior: str) -> list[str]:
    """HF's Split on a literal string: Isolated, Removed, MergedWithPrevious or MergedWithNext (a match joins the
    neighbouring non-match, as tokenizers' SplitDelimiterBehavior does)."""
    parts, pos = [], 0  # (piece, is_match)
    while (j := text.find(pattern, pos)) >= 0:
        if pos < j:
            parts.append((text[pos:j], False))
        parts.append((pattern, True))
        pos = j + len(pattern)
    if pos < len(text):
        parts.append((text[pos:], False))
    if behavior == "Isolated":
        return [p for p, _ in parts]
    if behavior == "Removed":
        return [p for p, m in parts if not m]
    if behavior == "MergedWithNext":
        parts.reverse()
    out, prev_match = [], False
    for p, m in parts:
        if m and not prev_match and out:
            out[-1] = out[-1] + p if behavior == "MergedWithPrevious" else p + out[-1]
        else:
            out.append(p)
        prev_match = m
    if behavior == "MergedWithNext":
        out.reverse()
    return out


KNOWN_PATTERNS = {GPT2_PATTERN: split_gpt2, LLAMA3_PATTERN: split_llama3, QWEN2_PATTERN: split_qwen2, **_SCANNERS}
"""Regex string -> its scanner: the only split patterns a tokenizer.json may use."""


def split_digit_runs(text: str) -> list[str]:
    """HF `Digits(individual_digits=false)`: every run of numeric characters becomes its own piece."""
    return _isolate(text, _run_of(_is_number))
