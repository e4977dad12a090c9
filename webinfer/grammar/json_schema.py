"""JSON Schema -> Grammar (pure Python). Every document the grammar accepts parses with json.loads and validates.

Supported: type (one or a list), properties / required / additionalProperties (false, true or a schema), items /
prefixItems (and the draft-7 tuple form with additionalItems) / minItems / maxItems, enum, const, $ref (any JSON
pointer into the root document: "#", "#/$defs/x", "#/definitions/x"; recursion is fine), $defs / definitions,
anyOf, oneOf (as anyOf: exact when the branches exclude each other, e.g. different types or const tags), allOf
(merged when its members do not conflict), minimum / maximum / exclusiveMinimum / exclusiveMaximum (integers exact;
for non-integers the grammar keeps to a subset of the range: no exponents, and fractions only between whole numbers
inside it), string minLength / maxLength / pattern (see RegexParser; unanchored patterns match anywhere, as in JSON
Schema) / format (date, time, date-time, uuid, ipv4; other formats are annotations and not enforced), nullable
(OpenAPI). Annotations (title, description, default, examples, $comment, ...) are ignored.

Choices the grammar makes (a model that writes otherwise is steered back):
  - properties come in the order the schema lists them; optional ones may be left out; keys are never escaped;
  - without additionalProperties, no other properties (as OpenAI's strict mode requires);
  - whitespace between tokens: an optional line break ("\n" or "\r\n") and then up to WS_MAX spaces and tabs (so
    any indentation style fits, and no run of blank lines);
  - a string matching a pattern holds no escape sequences except for the characters JSON must escape.
Keywords that would change what validates but cannot be enforced (uniqueItems, multipleOf, not, if/then/else,
patternProperties, propertyNames, min/maxProperties, dependentRequired, contains, ...) raise GrammarError naming the
field: the output is never silently unchecked.
"""

from __future__ import annotations

import json
import math

from .errors import GrammarError
from .expr import (EMPTY, NOTHING, RegexParser, alt, byte_range, codepoint_ranges, literal, negate, opt, rep, seq)
from .grammar import Grammar

WS_MAX = 24
MAX_REPEAT = 2000  # minItems / maxItems / maxLength beyond this are not expanded into states

_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor", "deprecated",
                "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "$defs", "definitions", "strict",
                "discriminator", "example", "$vocabulary", "$dynamicAnchor"}
_TYPE_KEYS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "additionalItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "boolean": set(), "null": set(),
}
_GENERIC = {"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "nullable"}

# JSON text pieces
_CTRL = [(0, 0x1F)]
_SAFE = negate([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])  # characters a JSON string holds unescaped
_HEX = alt(byte_range(0x30, 0x39), byte_range(0x41, 0x46), byte_range(0x61, 0x66))
_ESCAPE = seq(literal("\\"), alt(literal('"'), literal("\\"), literal("/"), literal("b"), literal("f"), literal("n"),
                                 literal("r"), literal("t"), seq(literal("u"), rep(_HEX, 4, 4))))
_CHAR = alt(codepoint_ranges(_SAFE), _ESCAPE)
_DIGIT = byte_range(0x30, 0x39)
_DIGIT19 = byte_range(0x31, 0x39)
_SHORT_ESC = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_FORMATS = {
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "time": r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "date-time": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?"
                 r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
}


def _json_char(cp: int) -> tuple:
    """A code point as it appears inside a JSON string (escaped when JSON requires it)."""
    if cp in _SHORT_ESC:
        return literal(_SHORT_ESC[cp])
    if cp < 0x20:
        return literal(f"\\u{cp:04x}")
    return codepoint_ranges([(cp, cp)])


def _json_class(ranges) -> tuple:
    """A character class inside a JSON string: unescaped safe characters, escaped quote / backslash / controls."""
    specials = []
    for a, b in ranges:
        for cp in (0x22, 0x5C):
            if a <= cp <= b:
                specials.append(_json_char(cp))
        for cp in range(max(a, 0), min(b, 0x1F) + 1):
            specials.append(_json_char(cp))
    safe = [(max(a, s), min(b, e)) for a, b in ranges for s, e in _SAFE if max(a, s) <= min(b, e)]
    return alt(codepoint_ranges(safe), *specials)


def _same_len(a: str, b: str) -> tuple:
    """Digit strings of a's length between a and b (inclusive)."""
    if not a:
        return EMPTY
    if a[0] == b[0]:
        return seq(literal(a[0]), _same_len(a[1:], b[1:]))
    n = len(a) - 1
    if a[1:] == "0" * n and b[1:] == "9" * n:
        return seq(byte_range(ord(a[0]), ord(b[0])), rep(_DIGIT, n, n))
    parts = [seq(literal(a[0]), _same_len(a[1:], "9" * n))]
    if ord(b[0]) - ord(a[0]) > 1:
        parts.append(seq(byte_range(ord(a[0]) + 1, ord(b[0]) - 1), rep(_DIGIT, n, n)))
    parts.append(seq(literal(b[0]), _same_len("0" * n, b[1:])))
    return alt(*parts)


def _nonneg(a: int, b: int | None) -> tuple:
    """Decimal integers a..b (b None: unbounded), no leading zeros."""
    if b is not None and b < a:
        return NOTHING
    parts = []
    la = len(str(a))
    lb = len(str(b)) if b is not None else la
    for n in range(la, lb + 1):
        lo = max(a, 10 ** (n - 1) if n > 1 else 0)
        hi = 10**n - 1 if b is None else min(b, 10**n - 1)
        if lo <= hi:
            parts.append(_same_len(str(lo), str(hi)))
    if b is None:
        parts.append(seq(_DIGIT19, rep(_DIGIT, la, None)))
    return alt(*parts)


def int_range(lo: int | None, hi: int | None) -> tuple:
    """JSON integers x with lo <= x <= hi (None: unbounded), canonical form (no "-0", no leading zeros)."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        nhi = None if lo is None else -lo
        nlo = 1 if hi is None or hi >= 0 else -hi
        if nhi is None or nhi >= nlo:
            parts.append(seq(literal("-"), _nonneg(nlo, nhi)))
    return alt(*parts)


def _number(s: dict, where: str, integer: bool) -> tuple:
    lo, hi, lo_x, hi_x = s.get("minimum"), s.get("maximum"), False, False
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        v = s.get(key)
        if isinstance(v, bool):  # draft 4: a flag on minimum / maximum
            if key == "exclusiveMinimum":
                lo_x = v
            else:
                hi_x = v
        elif v is not None:
            if not isinstance(v, (int, float)):
                raise GrammarError(f"{where}.{key}", f"is {v!r}, expected a number")
            if key == "exclusiveMinimum" and (lo is None or v >= lo):
                lo, lo_x = v, True
            elif key == "exclusiveMaximum" and (hi is None or v <= hi):
                hi, hi_x = v, True
    for name, v in (("minimum", lo), ("maximum", hi)):
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
            raise GrammarError(f"{where}.{name}", f"is {v!r}, expected a finite number")
    # whole numbers inside the range
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
    ints = int_range(ilo, ihi)
    if integer:
        out = ints
    elif lo is None and hi is None:
        frac = seq(literal("."), rep(_DIGIT, 1, None))
        expo = seq(alt(literal("e"), literal("E")), opt(alt(literal("+"), literal("-"))), rep(_DIGIT, 1, None))
        out = seq(alt(ints, seq(literal("-"), literal("0"))), opt(frac), opt(expo))
    else:
        frac = seq(literal("."), rep(_DIGIT, 1, None))
        # I.F lies in [I, I+1): keep I with lo <= I (lo < I when exclusive) and I + 1 <= hi
        plo = 0 if lo is None else max(0, math.floor(lo) + 1 if lo_x else math.ceil(lo))
        phi = None if hi is None else math.floor(hi) - 1
        pos = seq(_nonneg(plo, phi), frac) if phi is None or phi >= plo else NOTHING
        # -I.F lies in (-(I+1), -I]: keep I with -(I+1) >= lo and -I <= hi (< when exclusive)
        nlo = 0 if hi is None else max(0, math.floor(-hi) + 1 if hi_x else math.ceil(-hi))
        nhi = None if lo is None else math.floor(-lo) - 1
        neg = seq(literal("-"), _nonneg(nlo, nhi), frac) if nhi is None or nhi >= nlo else NOTHING
        out = alt(ints, pos, neg)
    if out == NOTHING:
        raise GrammarError(where, f"no {'integer' if integer else 'number'} lies in the range of {s}")
    return out


class _Compiler:
    def __init__(self, root: dict, where: str):
        self.root, self.where = root, where
        self.rules: dict[str, tuple] = {}
        self.by_key: dict[str, str] = {}
        # one line break at most, then indentation: a model that may write newline after newline fills its
        # output with blank lines (Gemma 3 270M wrote "  \n" eight times before its "{")
        ws = seq(opt(seq(opt(literal("\r")), literal("\n"))), rep(alt(literal(" "), literal("\t")), 0, WS_MAX))
        self.rules["ws"] = ws
        self.ws = ("ref", "ws")
        self.rules["string"] = seq(literal('"'), rep(_CHAR, 0, None), literal('"'))
        self._any_rules()

    def _any_rules(self):
        ws = self.ws
        kv = seq(("ref", "string"), ws, literal(":"), ws, ("ref", "value"))
        self.rules["value"] = alt(("ref", "object"), ("ref", "array"), ("ref", "string"), ("ref", "number"),
                                  literal("true"), literal("false"), literal("null"))
        self.rules["object"] = seq(literal("{"), ws, opt(seq(kv, rep(seq(ws, literal(","), ws, kv), 0, None))), ws,
                                   literal("}"))
        self.rules["array"] = seq(literal("["), ws, opt(seq(("ref", "value"),
                                                            rep(seq(ws, literal(","), ws, ("ref", "value")), 0, None))),
                                  ws, literal("]"))
        self.rules["number"] = _number({}, self.where, False)

    # -- schema -> rule ---------------------------------------------------------------------------------------------
    def rule(self, s, where: str) -> tuple:
        """A reference to the rule for schema s (rules are shared between equal sub-schemas)."""
        if s is True or s == {}:
            return ("ref", "value")
        if s is False:
            raise GrammarError(where, "is the schema `false`: no value is valid")
        if not isinstance(s, dict):
            raise GrammarError(where, f"is {type(s).__name__}, expected a schema (an object or a boolean)")
        if set(s) == {"$ref"}:
            return self.ref(s["$ref"], where)
        key = json.dumps(s, sort_keys=True)
        name = self.by_key.get(key)
        if name is None:
            name = self.by_key[key] = f"s{len(self.by_key)}"
            self.rules[name] = NOTHING  # placeholder: recursion through $ref finds the name
            self.rules[name] = self.schema(s, where)
        return ("ref", name)

    def ref(self, ref, where: str) -> tuple:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"{where}.$ref", f"{ref!r} is not supported: only references into this schema ('#...')")
        name = "ref:" + ref
        if name not in self.rules:
            target = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    raise GrammarError(f"{where}.$ref", f"{ref!r} points to nothing in the schema")
            self.rules[name] = NOTHING
            self.rules[name] = self.rule(target, f"{self.where}{ref[1:].replace('/', '.')}")
        return ("ref", name)

    def schema(self, s: dict, where: str) -> tuple:
        for k in s:
            if k not in _ANNOTATIONS and k not in _GENERIC and not any(k in v for v in _TYPE_KEYS.values()):
                raise GrammarError(f"{where}.{k}", "this keyword is not supported in structured output "
                                                   "(the output could not be guaranteed to satisfy it)")
        if "allOf" in s:
            return self.schema(self._merge_all_of(s, where), where)
        branches = []
        if "$ref" in s:
            branches.append(self.ref(s["$ref"], where))
        if "const" in s:
            branches.append(self.const(s["const"], f"{where}.const"))
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise GrammarError(f"{where}.enum", "expected a non-empty list")
            branches.append(alt(*(self.const(v, f"{where}.enum[{i}]") for i, v in enumerate(s["enum"]))))
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                subs = s[kw]
                if not isinstance(subs, list) or not subs:
                    raise GrammarError(f"{where}.{kw}", "expected a non-empty list of schemas")
                base = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf") and k not in _ANNOTATIONS}
                parts = []
                for i, sub in enumerate(subs):
                    if base and isinstance(sub, dict):
                        sub = self._merge_all_of({"allOf": [base, sub]}, f"{where}.{kw}[{i}]")
                    parts.append(self.rule(sub, f"{where}.{kw}[{i}]"))
                branches.append(alt(*parts))
        if len(branches) > 1:
            raise GrammarError(where, "combine $ref / const / enum / anyOf / oneOf in one schema only through allOf")
        if branches:
            out = branches[0]
        else:
            out = self.typed(s, where)
        if s.get("nullable") is True:
            out = alt(out, literal("null"))
        return out

    def _merge_all_of(self, s: dict, where: str) -> dict:
        merged = {k: v for k, v in s.items() if k != "allOf"}
        subs = s["allOf"]
        if not isinstance(subs, list):
            raise GrammarError(f"{where}.allOf", "expected a list of schemas")
        for i, sub in enumerate(subs):
            if isinstance(sub, dict) and set(sub) == {"$ref"}:
                sub = self._resolve(sub["$ref"], f"{where}.allOf[{i}]")
            if not isinstance(sub, dict):
                raise GrammarError(f"{where}.allOf[{i}]", "expected a schema object")
            for k, v in sub.items():
                if k in _ANNOTATIONS:
                    continue
                if k == "properties" and isinstance(merged.get(k), dict):
                    both = set(merged[k]) & set(v)
                    if any(merged[k][p] != v[p] for p in both):
                        raise GrammarError(f"{where}.allOf[{i}].properties", "conflicts with another allOf member")
                    merged[k] = {**merged[k], **v}
                elif k == "required" and k in merged:
                    merged[k] = list(dict.fromkeys(list(merged[k]) + list(v)))
                elif k in merged and merged[k] != v:
                    raise GrammarError(f"{where}.allOf[{i}].{k}", "differs between allOf members: not supported")
                else:
                    merged[k] = v
        return merged

    def _resolve(self, ref: str, where: str):
        target = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise GrammarError(f"{where}.$ref", f"{ref!r} points to nothing in the schema")
            target = target[part]
        return target

    def typed(self, s: dict, where: str) -> tuple:
        t = s.get("type")
        if t is None:
            implied = [name for name, keys in _TYPE_KEYS.items() if keys & set(s) and name != "integer"]
            if not implied:
                return ("ref", "value")
            types = implied
        elif isinstance(t, str):
            types = [t]
        elif isinstance(t, list) and t and all(isinstance(x, str) for x in t):
            types = t
        else:
            raise GrammarError(f"{where}.type", f"is {t!r}, expected a type name or a list of them")
        parts = []
        for t in types:
            if t not in _TYPE_KEYS:
                raise GrammarError(f"{where}.type", f"unknown type {t!r}")
            if t == "object":
                parts.append(self.object(s, where))
            elif t == "array":
                parts.append(self.array(s, where))
            elif t == "string":
                parts.append(self.string(s, where))
            elif t in ("number", "integer"):
                if "number" in types and t == "integer":
                    continue  # numbers include integers
                parts.append(_number(s, where, t == "integer"))
            elif t == "boolean":
                parts.append(alt(literal("true"), literal("false")))
            else:
                parts.append(literal("null"))
        return alt(*parts)

    def const(self, v, where: str) -> tuple:
        ws = self.ws
        if isinstance(v, dict):
            items = [seq(literal(json.dumps(k, ensure_ascii=False)), ws, literal(":"), ws, self.const(x, where))
                     for k, x in v.items()]
            body = seq(*[seq(ws, literal(","), ws, x) if i else x for i, x in enumerate(items)])
            return seq(literal("{"), ws, body, ws, literal("}"))
        if isinstance(v, list):
            items = [self.const(x, where) for x in v]
            body = seq(*[seq(ws, literal(","), ws, x) if i else x for i, x in enumerate(items)])
            return seq(literal("["), ws, body, ws, literal("]"))
        if isinstance(v, float) and not math.isfinite(v):
            raise GrammarError(where, f"{v!r} is not a JSON value")
        if isinstance(v, float) and v == int(v) and abs(v) < 1e16:
            return alt(literal(json.dumps(v)), literal(str(int(v))))
        return literal(json.dumps(v, ensure_ascii=False))

    def _int(self, s: dict, key: str, where: str, default):
        v = s.get(key, default)
        if v is default:
            return v
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise GrammarError(f"{where}.{key}", f"is {v!r}, expected a non-negative integer")
        if v > MAX_REPEAT:
            raise GrammarError(f"{where}.{key}", f"is {v}: at most {MAX_REPEAT} is supported")
        return v

    def string(self, s: dict, where: str) -> tuple:
        lo = self._int(s, "minLength", where, 0)
        hi = self._int(s, "maxLength", where, None)
        if hi is not None and hi < lo:
            raise GrammarError(f"{where}.maxLength", f"{hi} < minLength {lo}: no string is valid")
        pattern, fmt = s.get("pattern"), s.get("format")
        body = None
        if pattern is not None:
            if not isinstance(pattern, str):
                raise GrammarError(f"{where}.pattern", "expected a string")
            body = self.pattern(pattern, f"{where}.pattern")
        elif fmt in _FORMATS:
            body = RegexParser(_FORMATS[fmt], f"{where}.format").parse()
        if body is not None:
            if lo or hi is not None:
                raise GrammarError(where, "pattern / format together with minLength / maxLength is not supported")
            return seq(literal('"'), body, literal('"'))
        if lo == 0 and hi is None:
            return ("ref", "string")
        return seq(literal('"'), rep(_CHAR, lo, hi), literal('"'))

    def pattern(self, p: str, where: str) -> tuple:
        anchored_start = p.startswith("^")
        anchored_end = p.endswith("$") and not p.endswith("\\$")
        body = RegexParser(p, where, char_map=_json_char, class_map=_json_class).parse()
        anything = rep(_json_class([(0, 0x10FFFF)]), 0, None)
        return seq(EMPTY if anchored_start else anything, body, EMPTY if anchored_end else anything)

    def object(self, s: dict, where: str) -> tuple:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise GrammarError(f"{where}.properties", "expected an object of schemas")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise GrammarError(f"{where}.required", "expected a list of property names")
        extra = s.get("additionalProperties", False)
        missing = [r for r in required if r not in props]
        if missing and extra is False:
            raise GrammarError(f"{where}.required", f"lists {missing} which are not in properties and "
                                                    "additionalProperties is false: no object is valid")
        if missing:
            raise GrammarError(f"{where}.required", f"required properties {missing} must be listed in properties")
        ws = self.ws
        items = []
        for name, sub in props.items():
            kv = seq(literal(json.dumps(name, ensure_ascii=False)), ws, literal(":"), ws,
                     self.rule(sub, f"{where}.properties.{name}"))
            items.append((kv, name in required))
        extra_item = None
        if extra is not False:
            sub = self.rule(extra, f"{where}.additionalProperties")
            extra_item = seq(self._key_not_in(list(props)), ws, literal(":"), ws, sub)
        comma = seq(ws, literal(","), ws)
        # after[i]: the rest from property i on when something was written already; first[i]: when nothing was
        tail = rep(seq(comma, extra_item), 0, None) if extra_item is not None else EMPTY
        # (each its own rule: inlined, an optional property would double the expression's size)
        after, first = tail, opt(seq(extra_item, tail)) if extra_item is not None else EMPTY
        for kv, req in reversed(items):
            after_r, first_r = self.fresh(after), self.fresh(first)
            a = seq(comma, kv, after_r)
            after, first = (a, seq(kv, after_r)) if req else (alt(a, after_r), alt(seq(kv, after_r), first_r))
        return seq(literal("{"), ws, first, ws, literal("}"))

    def fresh(self, e) -> tuple:
        """A reference to a new rule for expression e (small expressions stay inline)."""
        if e[0] in ("ref", "bytes") or e == EMPTY:
            return e
        name = f"r{len(self.rules)}"
        self.rules[name] = e
        return ("ref", name)

    def _key_not_in(self, names: list[str]) -> tuple:
        """A quoted key that is none of `names` (unescaped characters only, so it cannot spell one by escaping)."""
        trie: dict = {}
        for n in names:
            node = trie
            for ch in n:
                node = node.setdefault(ord(ch), {})
            node[None] = {}
        safe = _SAFE
        any_rest = seq(rep(codepoint_ranges(safe), 0, None), literal('"'))

        def build(node) -> tuple:
            kids = [cp for cp in node if cp is not None]
            parts = [] if None in node else [literal('"')]
            other = negate([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)] + [(cp, cp) for cp in kids])
            parts.append(seq(codepoint_ranges(other), any_rest))
            for cp in kids:
                parts.append(seq(codepoint_ranges([(cp, cp)]), build(node[cp])))
            return alt(*parts)

        return seq(literal('"'), build(trie))

    def array(self, s: dict, where: str) -> tuple:
        items = s.get("items", True)
        prefix = s.get("prefixItems", [])
        rest = items
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, rest = items, s.get("additionalItems", True)
        if not isinstance(prefix, list):
            raise GrammarError(f"{where}.prefixItems", "expected a list of schemas")
        lo = self._int(s, "minItems", where, 0)
        hi = self._int(s, "maxItems", where, None)
        if hi is not None and hi < lo:
            raise GrammarError(f"{where}.maxItems", f"{hi} < minItems {lo}: no array is valid")
        ws = self.ws
        comma = seq(ws, literal(","), ws)
        elems = [self.rule(p, f"{where}.prefixItems[{i}]") for i, p in enumerate(prefix)]
        if hi is not None:
            elems = elems[:hi]
        n_fixed = len(elems)
        # after the prefix: items of `rest`, bounded by lo / hi
        more_lo = max(0, lo - n_fixed)
        more_hi = None if hi is None else max(0, hi - n_fixed)
        if rest is False:
            if lo > n_fixed:
                raise GrammarError(where, f"minItems {lo} needs more items than the {n_fixed} allowed")
            more = NOTHING
            more_hi = 0
        else:
            more = self.rule(rest, f"{where}.items")
        if n_fixed == 0:
            if more_hi == 0:
                body = EMPTY
            else:
                k_lo = max(more_lo - 1, 0)
                k_hi = None if more_hi is None else more_hi - 1
                body = seq(more, rep(seq(comma, more), k_lo, k_hi))
                if more_lo == 0:
                    body = opt(body)
        else:
            # prefix items are optional from minItems on (an array may stop early)
            tail = rep(seq(comma, more), more_lo, more_hi) if more_hi != 0 else EMPTY
            body = tail
            for i in range(n_fixed - 1, -1, -1):
                step = seq(comma, elems[i], body) if i else seq(elems[i], body)
                body = step if i < lo else opt(step)
        return seq(literal("["), ws, body, ws, literal("]"))


def json_schema_grammar(schema, where: str = "response_format.json_schema.schema") -> Grammar:
    """The grammar of JSON documents that validate against `schema` (a parsed JSON Schema)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise GrammarError(where, f"is not valid JSON: {e}") from None
    c = _Compiler(schema if isinstance(schema, dict) else {}, where)
    top = c.rule(schema, where)
    c.rules["root"] = seq(c.ws, top, c.ws)
    return Grammar(c.rules, "root", where)


def tool_call_grammar(tools: list, begin: str = "<tool_call>\n", end: str = "\n</tool_call>", parallel: bool = True,
                      where: str = "tools", args_key: str = "arguments", sep: str = "") -> Grammar:
    """Tool calls as the chat template expects them: begin {"name": ..., "<args_key>": {...}} end, one or (parallel)
    several separated by `sep` and whitespace, each call's arguments valid for that tool's parameters schema. `tools`
    is the OpenAI list ([{"type": "function", "function": {"name", "parameters"}}]); pass one tool to force it
    (tool_choice naming a function), all of them for tool_choice "required". begin / end / args_key / sep: the
    template's format (the defaults: Qwen2.5 / Hermes; Llama 3.1's JSON calls: "", "", "parameters", ";")."""
    if not isinstance(tools, list) or not tools:
        raise GrammarError(where, "expected a non-empty list of tools")
    calls = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise GrammarError(f"{where}[{i}].function", "expected an object with a string 'name'")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        calls.append({"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
                      "required": ["name", args_key], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    c = _Compiler(schema, where)
    one = seq(literal(begin), c.ws, c.rule(schema, where), c.ws, literal(end)) if begin or end else c.rule(schema, where)
    more = rep(seq(c.ws, literal(sep), c.ws, one) if sep else seq(c.ws, one), 0, None) if parallel else EMPTY
    # nothing after the last call: the model's next token is its end of turn (trailing white space would let a
    # model that wants another call, but may not make one, pad with blanks up to max_tokens)
    c.rules["root"] = seq(c.ws, one, more)
    return Grammar(c.rules, "root", where)


def json_object_grammar(where: str = "response_format") -> Grammar:
    """Any JSON object (response_format {"type": "json_object"})."""
    c = _Compiler({}, where)
    c.rules["root"] = seq(c.ws, ("ref", "object"), c.ws)
    return Grammar(c.rules, "root", where)
