"""Grammar expressions over bytes, and a regular-expression parser that produces them (pure Python).

An expression is a tuple:
    ("bytes", mask)          one byte whose value b has bit b set in the 256-bit int `mask`
    ("seq", (e1, e2, ...))   concatenation ("seq", ()) is the empty string
    ("alt", (e1, e2, ...))   alternation; ("alt", ()) matches nothing
    ("rep", e, lo, hi)       e repeated lo..hi times (hi None: unbounded)
    ("ref", name)            another rule of the grammar

Text is matched as UTF-8: a character class becomes the alternation of the UTF-8 byte sequences of its code points
(only valid UTF-8: no surrogates, no overlong forms), so a grammar over bytes accepts exactly the encodings of the
strings the class describes.
"""

from __future__ import annotations

from .errors import GrammarError

EMPTY = ("seq", ())
NOTHING = ("alt", ())
MAX_CODEPOINT = 0x10FFFF


def byte_range(lo: int, hi: int) -> tuple:
    return ("bytes", ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1))


def seq(*items) -> tuple:
    flat = []
    for e in items:
        if e[0] == "seq":
            flat.extend(e[1])
        elif e == NOTHING:
            return NOTHING
        else:
            flat.append(e)
    return flat[0] if len(flat) == 1 else ("seq", tuple(flat))


def alt(*items) -> tuple:
    flat = []
    for e in items:
        if e[0] == "alt":
            flat.extend(x for x in e[1] if x not in flat)
        elif e not in flat:
            flat.append(e)
    return flat[0] if len(flat) == 1 else ("alt", tuple(flat))


def rep(e, lo: int = 0, hi: int | None = None) -> tuple:
    if hi is not None and hi < lo:
        return NOTHING
    if hi == 0:
        return EMPTY
    if lo == hi == 1:
        return e
    return ("rep", e, lo, hi)


def opt(e) -> tuple:
    return rep(e, 0, 1)


def literal(data: bytes | str) -> tuple:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return seq(*(("bytes", 1 << b) for b in data))


# -- UTF-8 ---------------------------------------------------------------------------------------------------------

_UTF8_BOUNDS = ((0, 0x7F, 1), (0x80, 0x7FF, 2), (0x800, 0xFFFF, 3), (0x10000, MAX_CODEPOINT, 4))


def _encode(cp: int, n: int) -> list[int]:
    if n == 1:
        return [cp]
    out = []
    for _ in range(n - 1):
        out.append(0x80 | (cp & 0x3F))
        cp >>= 6
    out.append(((0xF00 >> n) & 0xFF) | cp)
    return out[::-1]


def _same_len_ranges(lo: int, hi: int, n: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences for the code points lo..hi, all of UTF-8 length n (the regex-automata split)."""
    if n == 1:
        return [[(lo, hi)]]
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m != 0:
                return _same_len_ranges(lo, lo | m, n) + _same_len_ranges((lo | m) + 1, hi, n)
            if hi & m != m:
                return _same_len_ranges(lo, (hi & ~m) - 1, n) + _same_len_ranges(hi & ~m, hi, n)
    a, b = _encode(lo, n), _encode(hi, n)
    return [list(zip(a, b))]


def codepoint_ranges(ranges: list[tuple[int, int]]) -> tuple:
    """Expression matching the UTF-8 encoding of one code point in any of `ranges` (surrogates excluded)."""
    out = []
    for lo, hi in _normalize(ranges):
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):
            if a > b:
                continue
            for blo, bhi, n in _UTF8_BOUNDS:
                s, e = max(a, blo), min(b, bhi)
                if s <= e:
                    for r in _same_len_ranges(s, e, n):
                        out.append(seq(*(byte_range(x, y) for x, y in r)))
    return alt(*out) if out else NOTHING


def _normalize(ranges):
    rs = sorted((max(0, a), min(MAX_CODEPOINT, b)) for a, b in ranges if a <= b)
    out: list[list[int]] = []
    for a, b in rs:
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def negate(ranges) -> list[tuple[int, int]]:
    out, prev = [], 0
    for a, b in _normalize(ranges):
        if a > prev:
            out.append((prev, a - 1))
        prev = b + 1
    if prev <= MAX_CODEPOINT:
        out.append((prev, MAX_CODEPOINT))
    return out


ANY_CHAR = [(0, MAX_CODEPOINT)]
DIGIT = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE = [(0x09, 0x0D), (0x20, 0x20)]
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_SIMPLE_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B, "0": 0x00, "a": 0x07, "e": 0x1B}


# -- regular expressions ---------------------------------------------------------------------------------------------


class RegexParser:
    """A Python-`re`-like subset: literals, `.`, classes `[...]` / `[^...]` with ranges and \\d \\w \\s (and negations),
    escapes (\\n \\t \\xHH \\uHHHH ...), groups `(...)` / `(?:...)` / `(?P<name>...)`, alternation, quantifiers
    `* + ? {m} {m,} {m,n}` (lazy / possessive suffixes accepted: they change nothing for matching), and `^` / `$`
    at the very start / end only. The whole text must match (as re.fullmatch).

    `char_map(cp) -> expression` turns a code point into bytes (default: its UTF-8 encoding); `class_map(ranges)` a
    class (JSON string patterns use them to escape quotes and control characters); `where` names the input in errors.
    """

    def __init__(self, pattern: str, where: str = "regex", char_map=None, class_map=None, dot_excludes_newline=True):
        self.p, self.i, self.where = pattern, 0, where
        self.char_map = char_map or (lambda cp: codepoint_ranges([(cp, cp)]))
        self.class_map = class_map or codepoint_ranges
        self.dot = negate([(0x0A, 0x0A)]) if dot_excludes_newline else ANY_CHAR

    def error(self, problem: str) -> GrammarError:
        return GrammarError(self.where, f"{problem} at offset {self.i} of {self.p!r}")

    def parse(self) -> tuple:
        if self.p.startswith("^"):
            self.i = 1
        e = self.alternation()
        if self.i < len(self.p):
            raise self.error(f"unexpected {self.p[self.i]!r}")
        return e

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def alternation(self) -> tuple:
        items = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            items.append(self.sequence())
        return alt(*items)

    def sequence(self) -> tuple:
        items = []
        while self.i < len(self.p) and self.peek() not in "|)":
            if self.peek() == "$" and self.i == len(self.p) - 1:
                self.i += 1
                break
            items.append(self.quantified())
        return seq(*items)

    def quantified(self) -> tuple:
        e = self.atom()
        while True:
            c = self.peek()
            if c == "*":
                self.i += 1
                e = rep(e, 0, None)
            elif c == "+":
                self.i += 1
                e = rep(e, 1, None)
            elif c == "?":
                self.i += 1
                e = rep(e, 0, 1)
            elif c == "{" and (counted := self._counted()):
                e = rep(e, *counted)
            else:
                return e
            if self.peek() in ("?", "+"):  # lazy / possessive: same language
                self.i += 1

    def _counted(self):
        """Parse {m}, {m,}, {m,n} at self.i (advancing) or return None (then `{` is a literal)."""
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1 : j]
        parts = body.split(",")
        if len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
            return None
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if hi is not None and hi < lo:
            raise self.error(f"repetition {{{body}}} has max < min")
        self.i = j + 1
        return lo, hi

    def atom(self) -> tuple:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?P<", self.i) or self.p.startswith("?<", self.i):
                j = self.p.find(">", self.i)
                if j < 0:
                    raise self.error("unterminated group name")
                self.i = j + 1
            elif self.peek() == "?":
                raise self.error("unsupported group kind (lookaround, flags or backreference)")
            e = self.alternation()
            if self.peek() != ")":
                raise self.error("missing )")
            self.i += 1
            return e
        if c == "[":
            return self.class_map(self.char_class())
        if c == ".":
            self.i += 1
            return self.class_map(self.dot)
        if c == "\\":
            kind, val = self.escape(in_class=False)
            return self.class_map(val) if kind == "class" else self.char_map(val)
        if c in "*+?":
            raise self.error(f"nothing to repeat before {c!r}")
        if c in "^$":
            raise self.error(f"anchor {c!r} is only supported at the start / end of the pattern")
        self.i += 1
        return self.char_map(ord(c))

    def escape(self, in_class: bool):
        """After a backslash: ("char", code point) or ("class", ranges)."""
        self.i += 1
        if self.i >= len(self.p):
            raise self.error("trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c.lower() in _CLASS_ESCAPES:
            r = _CLASS_ESCAPES[c.lower()]
            return "class", (negate(r) if c.isupper() else r)
        if c in _SIMPLE_ESCAPES and not (c == "0" and self.peek().isdigit()):
            return "char", _SIMPLE_ESCAPES[c]
        if c == "b" and in_class:
            return "char", 0x08
        if c in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[c]
            h = self.p[self.i : self.i + n]
            if len(h) != n or any(ch not in "0123456789abcdefABCDEF" for ch in h):
                raise self.error(f"\\{c} needs {n} hex digits")
            self.i += n
            return "char", int(h, 16)
        if c.isalnum():
            raise self.error(f"unsupported escape \\{c} (backreferences, \\b, \\A ... are not supported)")
        return "char", ord(c)

    def char_class(self) -> list[tuple[int, int]]:
        self.i += 1
        neg = self.peek() == "^"
        if neg:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.i >= len(self.p):
                raise self.error("unterminated [")
            c = self.peek()
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self._class_item()
            if isinstance(lo, list):
                ranges.extend(lo)
                continue
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self._class_item()
                if isinstance(hi, list) or hi < lo:
                    raise self.error("bad range in character class")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return negate(ranges) if neg else _normalize(ranges)

    def _class_item(self):
        if self.peek() == "\\":
            kind, val = self.escape(in_class=True)
            return val
        c = self.p[self.i]
        self.i += 1
        return ord(c)


def regex(pattern: str, where: str = "regex") -> tuple:
    """The expression of a whole-text match of `pattern` (see RegexParser for the syntax)."""
    return RegexParser(pattern, where).parse()
