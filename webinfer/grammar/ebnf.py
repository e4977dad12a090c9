"""EBNF / GBNF grammar text -> Grammar (pure Python).

The llama.cpp GBNF syntax, with a few EBNF spellings accepted too:

    root   ::= "{" ws pair ("," ws pair)* "}"      # comments run to the end of the line
    pair   ::= [a-z]+ ":" ws ( num | "null" )
    num    ::= "-"? [0-9]+ ("." [0-9]+)?
    ws     ::= [ \\t\\n]{0,4}

- a rule is `name ::= ...` (also `name : ...` or `name = ...`), optionally ended by `;`; rules may span lines;
- terms: "text" or 'text' (escapes \\n \\r \\t \\\\ \\" \\' \\xHH \\uHHHH \\UHHHHHHHH), character classes [a-z] / [^...],
  `.` (any character), /regex/ (see RegexParser), rule names, ( ... ) groups;
- operators: `|`, juxtaposition, postfix `*` `+` `?` `{m}` `{m,}` `{m,n}`;
- the start rule is `root` when there is one, else the first rule.
"""

from __future__ import annotations

import re

from .errors import GrammarError
from .expr import RegexParser, alt, codepoint_ranges, negate, rep, seq
from .grammar import Grammar

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_DEF = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)\s*(::=|:(?!:)|=)")


class _Parser:
    def __init__(self, text: str, where: str):
        self.t, self.i, self.where = text, 0, where

    def error(self, problem: str) -> GrammarError:
        line = self.t.count("\n", 0, self.i) + 1
        col = self.i - (self.t.rfind("\n", 0, self.i) + 1) + 1
        return GrammarError(self.where, f"{problem} at line {line}, column {col}")

    def skip(self) -> None:
        while self.i < len(self.t):
            c = self.t[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "#":
                j = self.t.find("\n", self.i)
                self.i = len(self.t) if j < 0 else j + 1
            else:
                return

    def at_rule_start(self) -> bool:
        return _DEF.match(self.t, self.i) is not None

    def grammar(self) -> Grammar:
        rules: dict[str, tuple] = {}
        first = None
        self.skip()
        while self.i < len(self.t):
            m = _DEF.match(self.t, self.i)
            if not m:
                raise self.error("expected a rule `name ::= ...`")
            name = m.group(1)
            if name in rules:
                raise self.error(f"rule {name!r} is defined twice")
            self.i = m.end()
            rules[name] = self.alternatives()
            first = first or name
            self.skip()
            if self.i < len(self.t) and self.t[self.i] == ";":
                self.i += 1
                self.skip()
        if not rules:
            raise GrammarError(self.where, "the grammar has no rules")
        return Grammar(rules, "root" if "root" in rules else first, self.where)

    def alternatives(self) -> tuple:
        items = [self.sequence()]
        while True:
            self.skip()
            if self.i < len(self.t) and self.t[self.i] == "|":
                self.i += 1
                items.append(self.sequence())
            else:
                return alt(*items)

    def sequence(self) -> tuple:
        items = []
        while True:
            self.skip()
            if self.i >= len(self.t) or self.t[self.i] in "|);" or self.at_rule_start():
                return seq(*items)
            items.append(self.postfix(self.term()))

    def postfix(self, e) -> tuple:
        while self.i < len(self.t):
            c = self.t[self.i]
            if c == "*":
                e = rep(e, 0, None)
            elif c == "+":
                e = rep(e, 1, None)
            elif c == "?":
                e = rep(e, 0, 1)
            elif c == "{":
                m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.t, self.i)
                if not m:
                    raise self.error("bad repetition {m,n}")
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    raise self.error(f"repetition {{{lo},{hi}}} has max < min")
                self.i = m.end()
                e = rep(e, lo, hi)
                continue
            else:
                return e
            self.i += 1
        return e

    def term(self) -> tuple:
        c = self.t[self.i]
        if c in "\"'":
            return seq(*(codepoint_ranges([(cp, cp)]) for cp in self.string(c)))
        if c == "[":
            j = self._class_end()
            r = RegexParser(self.t[self.i : j + 1], self.where).char_class()
            self.i = j + 1
            return codepoint_ranges(r)
        if c == "/":
            j = self.i + 1
            while j < len(self.t) and self.t[j] != "/":
                j += 2 if self.t[j] == "\\" else 1
            if j >= len(self.t):
                raise self.error("unterminated /regex/")
            e = RegexParser(self.t[self.i + 1 : j], self.where, dot_excludes_newline=False).parse()
            self.i = j + 1
            return e
        if c == ".":
            self.i += 1
            return codepoint_ranges(negate([]))
        if c == "(":
            self.i += 1
            e = self.alternatives()
            self.skip()
            if self.i >= len(self.t) or self.t[self.i] != ")":
                raise self.error("missing )")
            self.i += 1
            return e
        m = _NAME.match(self.t, self.i)
        if m:
            self.i = m.end()
            return ("ref", m.group(0))
        raise self.error(f"unexpected {c!r}")

    def _class_end(self) -> int:
        j = self.i + 1
        if j < len(self.t) and self.t[j] == "^":
            j += 1
        if j < len(self.t) and self.t[j] == "]":
            j += 1
        while j < len(self.t) and self.t[j] != "]":
            j += 2 if self.t[j] == "\\" else 1
        if j >= len(self.t):
            raise self.error("unterminated [")
        return j

    def string(self, quote: str) -> list[int]:
        out = []
        self.i += 1
        while True:
            if self.i >= len(self.t):
                raise self.error("unterminated string")
            c = self.t[self.i]
            if c == quote:
                self.i += 1
                return out
            if c == "\\":
                p = RegexParser(self.t, self.where)
                p.i = self.i
                kind, val = p.escape(in_class=True)
                if kind != "char":
                    raise self.error("character-class escapes (\\d, \\w, \\s) do not belong in a string")
                self.i = p.i
                out.append(val)
            else:
                out.append(ord(c))
                self.i += 1


def ebnf_grammar(text: str, where: str = "response_format.grammar") -> Grammar:
    """Parse GBNF / EBNF text (see the module doc) into a Grammar."""
    if not isinstance(text, str):
        raise GrammarError(where, f"is {type(text).__name__}, expected grammar text")
    return _Parser(text, where).grammar()
