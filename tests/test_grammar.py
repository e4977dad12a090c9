"""The grammar engine (webinfer/grammar/) against independent oracles.

- JSON Schema: hypothesis-generated schemas; documents produced by random walks through the matcher (random allowed
  bytes, then the shortest way to finish) must parse with json.loads and validate with the `jsonschema` library.
- Token masks: on a small vocabulary, every token the mask allows keeps the text a viable prefix and every token it
  forbids breaks it (brute force over the vocabulary, by reading the token's bytes one at a time).
- Regular expressions: accept exactly what Python's re.fullmatch accepts; integer ranges: exactly the integers inside.
- Greedy constrained decoding over a fake model equals unconstrained decoding when that output satisfies the schema.

Run: python -m pytest tests/test_grammar.py -q
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.synthetic import tiny_tokenizer_json
from webinfer.grammar import (GrammarCache, GrammarError, GrammarMatcher, TokenMasks, TokenVocab, cache_key,
                              ebnf_grammar, grammar_from_response_format, json_object_grammar, json_schema_grammar,
                              regex_grammar, tool_call_grammar)
from webinfer.grammar.json_schema import int_range
from webinfer.grammar.expr import alt, byte_range, codepoint_ranges, literal, rep, seq
from webinfer.grammar.grammar import Grammar
from webinfer.grammar.matcher import utf8_tail_start
from webinfer.tokenizer import Tokenizer


def random_document(g, rng: random.Random, budget: int = 80) -> bytes:
    """A random walk over allowed bytes: random choices for `budget` bytes (stopping at random where the document may
    end), then the bytes that finish it soonest."""
    sid, out = g.initial, bytearray()
    while True:
        allowed = [b for b in range(256) if g.step(sid, b) >= 0]
        if g.state_can_end[sid] and (not allowed or rng.random() < 0.15 or len(out) >= budget):
            return bytes(out)
        assert allowed, f"dead end after {bytes(out)!r}: every live state must be able to finish"
        if len(out) < budget:
            b = rng.choice(allowed)
        else:
            b = min(allowed, key=lambda x: (g.shortest_completion(g.step(sid, x)), x))
        sid = g.step(sid, b)
        out.append(b)


def accepts(g, data: bytes) -> bool:
    s = g.walk(g.initial, data)
    return s >= 0 and g.state_can_end[s]


# -- hypothesis schemas ----------------------------------------------------------------------------------------------

PATTERNS = ["^[a-z]{1,4}$", "^[A-Z][a-z]*-[0-9]{2}$", "ab+c", "^(red|green|blue)$", r"^\d{3}-\d{4}$", "^[^a-z]+$",
            'x"y', r"^[\w.]+@[a-z]+\.(com|org)$", "^é+ü?$"]
SCALAR_VALUES = st.one_of(st.integers(-1000, 1000), st.booleans(), st.none(), st.text(max_size=6),
                          st.floats(-100, 100, allow_nan=False).map(lambda x: round(x, 2)))


@st.composite
def int_schema(draw):
    s: dict = {"type": "integer"}
    lo = draw(st.one_of(st.none(), st.integers(-10**6, 10**6)))
    hi = draw(st.one_of(st.none(), st.integers(-10**6, 10**6)))
    if lo is not None and hi is not None and hi < lo:
        lo, hi = hi, lo
    if lo is not None:
        s["exclusiveMinimum" if draw(st.booleans()) and (hi is None or hi > lo + 1) else "minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


@st.composite
def number_schema(draw):
    s: dict = {"type": "number"}
    lo = draw(st.one_of(st.none(), st.floats(-1000, 1000).map(lambda x: round(x, 1))))
    if lo is not None:
        s["minimum"] = lo
        s["maximum"] = lo + draw(st.sampled_from([2.5, 10, 1000]))
    return s


@st.composite
def string_schema(draw):
    kind = draw(st.sampled_from(["plain", "len", "pattern", "format"]))
    if kind == "len":
        lo = draw(st.integers(0, 5))
        return {"type": "string", "minLength": lo, "maxLength": lo + draw(st.integers(0, 6))}
    if kind == "pattern":
        return {"type": "string", "pattern": draw(st.sampled_from(PATTERNS))}
    if kind == "format":
        return {"type": "string", "format": draw(st.sampled_from(["date", "uuid", "date-time"]))}
    return {"type": "string"}


leaf = st.one_of(int_schema(), number_schema(), string_schema(), st.just({"type": "boolean"}),
                 st.just({"type": "null"}), st.lists(SCALAR_VALUES, min_size=1, max_size=4, unique_by=json.dumps)
                 .map(lambda v: {"enum": v}), SCALAR_VALUES.map(lambda v: {"const": v}),
                 st.just({"type": ["string", "null"]}), st.just({}))

NAMES = st.text(alphabet="abcdefghijk_XYZé ", min_size=1, max_size=6)


def composite(children):
    obj = st.builds(
        lambda props, req, extra: {"type": "object", "properties": props,
                                   "required": [k for k, r in zip(props, req) if r], **extra},
        st.dictionaries(NAMES, children, min_size=0, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4),
        st.sampled_from([{}, {"additionalProperties": False}, {"additionalProperties": True},
                         {"additionalProperties": {"type": "integer"}}]))
    arr = st.builds(lambda items, lo, extra: {"type": "array", "items": items, "minItems": lo,
                                              **({"maxItems": lo + extra} if extra is not None else {})},
                    children, st.integers(0, 2), st.one_of(st.none(), st.integers(0, 3)))
    tup = st.builds(lambda items, more: {"type": "array", "prefixItems": items, "items": more},
                    st.lists(children, min_size=1, max_size=3), st.sampled_from([False, True, {"type": "boolean"}]))
    anyof = st.lists(children, min_size=2, max_size=3).map(lambda xs: {"anyOf": xs})
    return st.one_of(obj, arr, tup, anyof)


schemas = st.recursive(leaf, composite, max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas, st.integers(0, 2**32 - 1), st.booleans())
def test_random_documents_validate(schema, seed, via_defs):
    if via_defs:  # the same schema behind $defs / $ref
        schema = {"$defs": {"inner": schema}, "$ref": "#/$defs/inner"}
    g = json_schema_grammar(schema).compile()
    rng = random.Random(seed)
    for _ in range(3):
        doc = random_document(g, rng)
        value = json.loads(doc.decode("utf-8"))
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)


def test_recursive_ref_schema():
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
    g = json_schema_grammar(schema).compile()
    assert accepts(g, b'{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}, {"value": 4}]}')
    assert not accepts(g, b'{"value": 1, "children": [{"children": []}]}')
    rng = random.Random(3)
    for _ in range(20):
        jsonschema.validate(json.loads(random_document(g, rng, 200)), schema)


def test_object_rules():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                               "c": {"type": "boolean"}}, "required": ["b"]}
    g = json_schema_grammar(schema).compile()
    for ok in [b'{"b": ""}', b'{"a": 1, "b": "x"}', b'{"b": "x", "c": true}', b'{\n  "a": -3,\n  "b": "y",\n  "c": false\n}']:
        assert accepts(g, ok), ok
    for bad in [b'{}', b'{"a": 1}', b'{"b": "x", "a": 1}', b'{"b": "x", "d": 1}', b'{"b": "x",}', b'{"b": 1}']:
        assert not accepts(g, bad), bad
    extra = json_schema_grammar({**schema, "additionalProperties": {"type": "null"}}).compile()
    assert accepts(extra, b'{"b": "x", "zz": null, "bb": null}')
    assert not accepts(extra, b'{"b": "x", "b": null}')  # a listed name is never an extra key
    assert not accepts(extra, b'{"b": "x", "zz": 1}')


def test_json_object_any_value():
    g = json_object_grammar().compile()
    assert accepts(g, b'{"a": [1, -2.5e3, {"b": null}, "\\u00e9\\n"], "c": {}}')
    assert not accepts(g, b'[1]') and not accepts(g, b'{"a": 01}') and not accepts(g, b"{'a': 1}")
    rng = random.Random(0)
    for _ in range(30):
        assert isinstance(json.loads(random_document(g, rng, 120)), dict)


def test_whitespace_fits_any_indentation_but_no_blank_lines():
    """Between tokens: an optional line break, then up to WS_MAX spaces and tabs. Every indentation json.dumps
    writes fits; blank lines and trailing runs do not (Gemma 3 270M wrote "  \\n" eight times before its "{" when
    any mix was allowed)."""
    doc = {"a": [1, {"b": None, "c": [True, "x"]}], "d": {"e": {"f": {"g": 2.5}}}}
    for g in (json_object_grammar().compile(), json_schema_grammar({"type": "object", "additionalProperties": True}).compile()):
        for indent in (None, 0, 1, 2, 4, "\t", "\t\t"):
            text = json.dumps(doc, indent=indent)
            for t in (text, "\n" + text + "\n", text.replace("\n", "\r\n"), " " + text + "  "):
                assert accepts(g, t.encode()), (indent, t)
        for bad in (b'{\n\n"a": 1}', b'{"a": 1}\n\n', b'\n\n{}', b'{"a":\r\r1}', b'{"a": 1, \n"b": 2}',
                    b'{"a": 1' + b" " * 25 + b"}"):
            assert not accepts(g, bad), bad


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.integers(-20000, 20000)), st.one_of(st.none(), st.integers(-20000, 20000)),
       st.integers(-30000, 30000))
def test_int_range_exact(lo, hi, x):
    if lo is not None and hi is not None and hi < lo:
        lo, hi = hi, lo
    g = Grammar({"root": int_range(lo, hi)}).compile()
    inside = (lo is None or x >= lo) and (hi is None or x <= hi)
    assert accepts(g, str(x).encode()) == inside
    assert not accepts(g, b"-0") and not accepts(g, b"007")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["integer", "number"]), st.one_of(st.none(), st.integers(-50, 50), st.floats(-50, 50).map(lambda x: round(x, 1))),
       st.one_of(st.none(), st.integers(-50, 50), st.floats(-50, 50).map(lambda x: round(x, 1))),
       st.booleans(), st.booleans(), st.data())
def test_number_bounds_at_the_edges(kind, lo, hi, lo_x, hi_x, data):
    """Sound at the boundaries (what the grammar accepts validates); exact for integers."""
    s: dict = {"type": kind}
    if lo is not None:
        s["exclusiveMinimum" if lo_x else "minimum"] = lo
    if hi is not None:
        s["exclusiveMaximum" if hi_x else "maximum"] = hi
    try:
        g = json_schema_grammar(s).compile()
    except GrammarError:  # an empty range
        assert lo is not None and hi is not None and lo >= hi - 1
        return
    near = [v + d for v in (lo, hi, 0) if v is not None for d in (-1, -0.5, -0.1, 0, 0.1, 0.5, 1)]
    for x in near + [data.draw(st.integers(-60, 60))]:
        for text in {str(x), str(int(x)) if x == int(x) else str(x), f"{x:.1f}"}:
            try:
                jsonschema.validate(json.loads(text), s)
                valid = True
            except jsonschema.ValidationError:
                valid = False
            if accepts(g, text.encode()):
                assert valid, (s, text)
            elif kind == "integer" and re.fullmatch(r"-?(0|[1-9][0-9]*)", text) and text != "-0":
                assert not valid, (s, text)


REGEXES = [r"[a-c]+x\d{2}", r"(ab|a)*b?", r"[^abc]{2,3}", r"\w+@\w+\.(com|net)", r"a.c", r"(?:0|[1-9]\d*)(\.\d+)?",
           r"[\-+]?[0-9a-f]{1,4}", r"x{2,}y?", r"(é|ü)+\s?", r"\\\.\*", r"[\d\s]*"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REGEXES), st.text(alphabet="abcxy0129@.com né\\*+-é", max_size=8))
def test_regex_matches_python_re(pattern, text):
    g = regex_grammar(pattern).compile()
    assert accepts(g, text.encode()) == (re.fullmatch(pattern, text) is not None), (pattern, text)


def test_regex_random_walks_fullmatch():
    rng = random.Random(1)
    for p in REGEXES:
        g = regex_grammar(p).compile()
        for _ in range(10):
            s = random_document(g, rng, 12).decode("utf-8")
            assert re.fullmatch(p, s), (p, s)


def test_gbnf_grammar():
    text = r'''
        # a tiny key/value language
        root ::= "{" ws pair ("," ws pair)* "}"
        pair ::= [a-z]+ ":" ws ( num | "null" | str )
        num  ::= "-"? [0-9]+ ("." [0-9]+)?
        str  ::= /'[^']*'/
        ws   ::= [ \t\n]{0,4}
    '''
    g = ebnf_grammar(text).compile()
    for ok in [b"{a:1,b: null}", b"{x:-2.5,\n  y:'hi there'}"]:
        assert accepts(g, ok), ok
    for bad in [b"{a:}", b"{A:1}", b"{a:1,}", b"{a:'x}"]:
        assert not accepts(g, bad), bad
    # nullable rules and recursion that reads a byte first are fine
    nested = ebnf_grammar('root ::= item*\nitem ::= "(" root ")" | "x"').compile()
    assert accepts(nested, b"x(x(x))()") and not accepts(nested, b"(x")


@pytest.mark.parametrize("build, field", [
    (lambda: json_schema_grammar({"type": "array", "uniqueItems": True}), "schema.uniqueItems"),
    (lambda: json_schema_grammar({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}),
     "properties.a.multipleOf"),
    (lambda: json_schema_grammar({"type": "string", "minLength": 3, "maxLength": 2}), "maxLength"),
    (lambda: json_schema_grammar({"type": "integer", "minimum": 5, "maximum": 4}), "schema"),
    (lambda: json_schema_grammar({"$ref": "#/$defs/nope"}), "$ref"),
    (lambda: json_schema_grammar({"type": "object", "required": ["x"]}), "required"),
    (lambda: regex_grammar("a(?=b)"), "regex"),
    (lambda: regex_grammar("(a"), "regex"),
    (lambda: ebnf_grammar("root ::= x").compile(), "grammar"),
    (lambda: ebnf_grammar('root ::= root "a" | "a"').compile().check(), "grammar"),
    (lambda: grammar_from_response_format({"type": "xml"}), "response_format.type"),
])
def test_bad_input_raises_grammar_error_naming_the_field(build, field):
    with pytest.raises(GrammarError) as e:
        build()
    assert field in e.value.param or field in str(e.value), str(e.value)


# -- token masks -------------------------------------------------------------------------------------------------


def small_vocab() -> TokenVocab:
    """Every single byte, plus multi-byte pieces that cross grammar boundaries (quote + comma, '}' + ',', ...)."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [s.encode() for s in ['{"', '":', '": "', '", "', '"}', '},', '}]', '[{', '"]', ', ', 'name', 'age',
                                    '": 1', '12', '3.5', 'true', 'false', 'null', '"a', 'a"', '\\"', '\\n', '  ',
                                    '\n ', ' "', '"name": "', 'é', '},{"', 'tr', 'ue', '-1', 'e+', '0.', '1e']]
    # deep subtrees of plain characters (the matcher takes such a subtree whole when its bytes loop in a string)
    pieces += [s.encode() for s in ['th', 'the', 'then', 'there', 'these', ' the', ' then', ' there"', 'ab', 'abc',
                                    'abcd', 'é1', '123', '12345', '1234"', 'the\\', 'thé']]
    pieces += ["é".encode()[:1], "€".encode()[:2]]
    return TokenVocab(pieces + [None, b""])  # a special token and an empty one: never allowed


def check_masks_brute_force(masks: TokenMasks, rng: random.Random, steps: int = 30) -> int:
    """Random token walks; at each step the mask equals the brute-force set of viable tokens. Returns tokens seen."""
    g, vocab = masks.g, masks.vocab
    m = GrammarMatcher(masks, stop_ids=[len(vocab.token_bytes) - 2])
    seen = 0
    for _ in range(steps):
        mask = m.mask()
        for t, data in enumerate(vocab.token_bytes):
            if t in m.stop_ids:
                assert bool(mask >> t & 1) == g.state_can_end[m.sid]
                continue
            viable = bool(data) and g.walk(m.sid, data) >= 0
            assert bool(mask >> t & 1) == viable, (t, data, m.sid)
        allowed = [t for t in range(vocab.size) if mask >> t & 1]
        assert allowed, "a live state always allows something"
        t = rng.choice(allowed)
        assert m.accept(t)
        seen += 1
        if m.is_terminated():
            break
    return seen


@pytest.mark.parametrize("make", [
    lambda: json_schema_grammar({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                                                  "age": {"type": "integer", "minimum": 0}},
                                 "required": ["name"]}),
    lambda: json_object_grammar(),
    lambda: json_schema_grammar({"type": "array", "items": {"anyOf": [{"type": "number"}, {"enum": ["a", True]}]}}),
    lambda: regex_grammar(r"(ab|a\d)+[^x]é?"),
])
def test_mask_equals_brute_force(make):
    masks = TokenMasks(make().compile(), small_vocab())
    rng = random.Random(7)
    for _ in range(4):
        check_masks_brute_force(masks, rng)


def utf8_vocab(seed: int = 0) -> TokenVocab:
    """Every single byte plus multi-byte tokens in deep shared-prefix subtrees, as Gemma's and Qwen's vocabularies
    have: whole characters of 2-4 bytes, characters cut short, lone continuation bytes, overlong forms, surrogates,
    code points past U+10FFFF, and quotes, backslashes and newlines among them."""
    rng = random.Random(seed)
    chars = ["a", "b", " ", "é", "ü", "ß", "中", "文", "€", "😀", "𐍈", "\U0010FFFF", '"', "\\", "\n", "x", "1"]
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
           b"\xf5\x80", b"\xff", b"\xe0\x9f", b"\xf0\x8f"]
    pieces = {bytes([b]) for b in range(256)}
    stems = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 3))).encode() for _ in range(12)]
    for _ in range(500):
        data = rng.choice(stems) + "".join(rng.choice(chars) for _ in range(rng.randint(0, 5))).encode()
        r = rng.random()
        if r < 0.2:
            data = data[:rng.randint(1, len(data))]  # a character cut short, or a lone continuation after a cut
        elif r < 0.3:
            data = data[rng.randint(0, len(data) - 1):]
        elif r < 0.4:
            k = rng.randint(0, len(data))
            data = data[:k] + rng.choice(bad) + data[k:]
        pieces.add(data)
    # prefixes no random token has, for the grammars below that start with k or q
    pieces |= {"q", "qx", "qxa", "qa中", "qé", "kü", "kéa", "k中ü", "kaü", "kba", "kbüba"}
    pieces |= {b"kb\x80", b"k\xc3\xa9\x80", b"k\xc3a", b"ka\xc3a", b"kb!\x80", b"kb!\xc3\xa9!\x80"}
    return TokenVocab(sorted(p.encode() if isinstance(p, str) else p for p in pieces) + [None, b""])


def test_utf8_tail_start_is_the_first_boundary_of_a_valid_tail():
    import codecs

    def valid(tail: bytes) -> bool:  # valid UTF-8, up to an unfinished last character (CPython's strict decoder)
        try:
            codecs.getincrementaldecoder("utf-8")().decode(tail, final=False)
            return True
        except UnicodeDecodeError:
            return False

    for data in utf8_vocab(3).token_bytes[:-2] + [b"", b"\xe0\xa0", b"\xf0\x90\x80", b"a\xc3", b"\xc3\xa9\xa9"]:
        want = next(k for k in range(len(data) + 1)
                    if (k == len(data) or not 0x80 <= data[k] < 0xC0) and valid(data[k:]))
        assert utf8_tail_start(data) == want, data


@pytest.mark.parametrize("make", [
    lambda: json_object_grammar(),
    lambda: json_schema_grammar({"type": "object", "properties": {"s": {"type": "string"}, "e": {"enum": ["é中", "x"]},
                                                                  "p": {"type": "string", "pattern": "^é+ü?$"}},
                                 "required": ["s", "e"]}),
    lambda: json_schema_grammar({"type": "array", "items": {"type": "string", "pattern": "^.*x$"}}),
    lambda: regex_grammar("[^a\"]*b"),
    lambda: regex_grammar("(.|中)*?文"),
    lambda: regex_grammar("k[a-z中é]*!"),  # some characters loop, the others die
    lambda: regex_grammar('q[^x][^"]*"'),  # x is read in the loop, not before it
    # rules that may end inside the loop, where the caller reads on with a byte the rule cannot read there:
    lambda: Grammar({"root": seq(("ref", "cut"), literal("a")),  # ... after a lead byte
                     "cut": seq(literal("k"), rep(alt(byte_range(0x61, 0x7A), codepoint_ranges([(0x80, 0x10FFFF)])),
                                                  0, None), byte_range(0xC2, 0xDF))}),
    lambda: Grammar({"root": seq(("ref", "cut"), byte_range(0x80, 0x80)),  # ... after any character
                     "cut": seq(literal("k"), rep(alt(byte_range(0x61, 0x7A), codepoint_ranges([(0x80, 0x10FFFF)])),
                                                  1, None))}),

    # bounded repetitions (shift chains): a token's level counts the characters it starts
    lambda: json_schema_grammar({"type": "array", "items": {"type": "string", "maxLength": 4}}),
    lambda: json_schema_grammar({"type": "object", "properties": {"a": {"type": "string", "minLength": 2,
                                                                        "maxLength": 7}}, "required": ["a"]}),
    lambda: regex_grammar("k.{2,5}!"),
    lambda: regex_grammar("k[a-z中é]{0,5}!"),
    lambda: regex_grammar("k.{3}a"),  # the bound's node reads on with a byte the characters used
    lambda: json_schema_grammar({"type": "string", "maxLength": 300}),  # levels past a chain segment (255)
    lambda: Grammar({"root": seq(("ref", "cut"), byte_range(0x80, 0x80)),  # a chain that may end anywhere
                     "cut": seq(literal("k"), rep(codepoint_ranges([(0x20, 0x10FFFF)]), 0, 4))}),
    # a callee whose loop may be skipped: where it may end, its caller reads on (here a byte UTF-8 does not allow)
    lambda: Grammar({"root": seq(literal("k"), ("ref", "inner"), byte_range(0x80, 0x80)),
                     "inner": rep(seq(rep(alt(byte_range(0x61, 0x7A), codepoint_ranges([(0x80, 0x10FFFF)])), 1, None),
                                      literal("!")), 0, None)}),
    # a loop that also reads a byte UTF-8 does not allow there (no shortcut: the filter would drop its tokens)
    lambda: Grammar({"root": seq(literal("k"), rep(alt(byte_range(0x61, 0x7A), codepoint_ranges([(0x80, 0x10FFFF)]),
                                                       byte_range(0x80, 0x80)), 0, None), literal("!"))}),
])
def test_masks_over_multibyte_tokens_equal_brute_force(make):
    """The walk's UTF-8 shortcut (a state reading characters in a loop takes a subtree whole, filtered by its tokens'
    UTF-8 validity) against reading every token byte by byte, on a vocabulary full of multi-byte and broken tokens."""
    for seed in range(3):
        masks = TokenMasks(make().compile(), utf8_vocab(seed))
        rng = random.Random(seed)
        for _ in range(3):
            check_masks_brute_force(masks, rng, 12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas, st.integers(0, 1000))
def test_mask_equals_brute_force_hypothesis(schema, seed):
    check_masks_brute_force(TokenMasks(json_schema_grammar(schema).compile(), small_vocab()), random.Random(seed), 20)


def test_concurrent_requests_compile_a_schema_once():
    """The server compiles in threads: two requests that bring the same new schema at once get one compile (the
    second waits for the first's, then finds it cached), and its masks equal reading each token."""
    import threading

    cache = GrammarCache(utf8_vocab(0))
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "array", "items": {
        "type": "string", "minLength": 30, "maxLength": 60}}}}
    start, got = threading.Barrier(2), []

    def get():
        start.wait()
        got.append(cache.get(rf))

    threads = [threading.Thread(target=get) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] is got[1]
    check_masks_brute_force(got[0], random.Random(0), 8)


def test_a_slow_compile_does_not_hold_up_other_grammars():
    """While one grammar compiles (here: held in its build), another compiles and returns; a compile that fails
    lets the request waiting for it compile (and fail) on its own."""
    import threading

    cache = GrammarCache(utf8_vocab(0))
    release, started = threading.Event(), threading.Event()

    def slow():
        started.set()
        assert release.wait(10)
        return json_object_grammar()

    t = threading.Thread(target=lambda: cache.get_grammar("slow", slow))
    t.start()
    assert started.wait(10)
    other = cache.get({"type": "regex", "regex": "ab+"})  # before the slow one ends
    assert t.is_alive() and other.mask(GrammarMatcher(other).sid)
    release.set()
    t.join()
    assert cache.get_grammar("slow", slow) is cache.get_grammar("slow", slow)

    def bad():
        raise GrammarError("grammar", "expected something else")

    with pytest.raises(GrammarError):
        cache.get_grammar("bad", bad)
    failed = []  # nothing left behind: the next request tries again (in a thread: a leftover would hang it)
    t = threading.Thread(target=lambda: failed.append(pytest.raises(GrammarError, cache.get_grammar, "bad", bad)),
                         daemon=True)
    t.start()
    t.join(10)
    assert len(failed) == 1


def test_a_compile_past_its_timeout_is_refused_and_leaves_valid_caches():
    """A compile checks its deadline between nodes: past it, the request gets a GrammarError naming the field, the
    cache keeps only the refusal (the same grammar is refused without a second compile, a request that waited for
    the compile gets the refusal too), the refusal expires after FAILED_TTL_S, and what the stopped compile left
    in the vocabulary's shared caches is valid: the grammar then compiles to masks equal to reading each token."""
    import threading

    from webinfer.grammar import FAILED_TTL_S

    now = [0.0]
    cache = GrammarCache(utf8_vocab(2), timeout_s=5.0, clock=lambda: now[0])
    schema = {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 8}}
    builds, release, started = [], threading.Event(), threading.Event()

    def slow():  # the build "takes" 6 s of the fake clock, held until a second request waits for it
        builds.append(1)
        started.set()
        assert release.wait(10)
        now[0] += 6.0
        return json_schema_grammar(schema)

    errors = []
    first = threading.Thread(target=lambda: errors.append(pytest.raises(GrammarError, cache.get_grammar, "k", slow,
                                                                        "tools")))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: errors.append(pytest.raises(GrammarError, cache.get_grammar, "k", slow,
                                                                         "tools")))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert len(errors) == 2 and len(builds) == 1
    for e in errors:
        assert e.value.param == "tools" and "took more than 5 s to compile" in e.value.problem
    with pytest.raises(GrammarError, match="took more than"):
        cache.peek(cache_key("k"))  # refused without compiling
    assert len(builds) == 1

    ticks = iter(range(10**6))  # now a clock that moves one second per reading: the warm-up is cut after 4 nodes
    cache.clock = lambda: float(next(ticks))
    rf = {"type": "json_schema", "json_schema": {"schema": schema}}
    with pytest.raises(GrammarError, match="took more than") as e:
        cache.get(rf)
    assert e.value.param == "response_format"
    masks = TokenMasks(json_schema_grammar(schema).compile(), cache.vocab)  # warm() stops between nodes
    ticks2 = iter(range(10**6))
    with pytest.raises(TimeoutError):
        masks.warm(3.0, lambda: float(next(ticks2)))
    assert not masks.warmed and 0 < len(masks._node) < masks.g.n_nodes

    frozen = next(ticks) + FAILED_TTL_S + 1  # past the refusal's expiry, and the clock stands still
    cache.clock = lambda: frozen
    got = cache.get(rf)
    assert got is cache.get(rf)
    check_masks_brute_force(got, random.Random(3), 12)
    fresh = TokenMasks(json_schema_grammar(schema).compile(), utf8_vocab(2))
    fresh.warm()
    for n in range(got.g.n_nodes):
        assert got.node_info(n) == fresh.node_info(n), n


@pytest.mark.parametrize("vocab", [small_vocab, utf8_vocab], ids=["small", "utf8"])
def test_nodes_that_read_alike_for_a_token_length_share_masks(vocab, monkeypatch):
    """Nodes of a big rule without calls that read the same bytes for as long as the longest token share one
    mask computation (TokenMasks._rep): every node's node_info equals the one computed without sharing, the masks
    equal reading each token, and the sharing does happen (far fewer distinct nodes than nodes)."""
    import webinfer.grammar.matcher as matcher

    v = vocab()
    sources = [
        json_schema_grammar({"type": "string", "minLength": 60}),
        json_schema_grammar({"type": "object", "properties": {"s": {"type": "string", "minLength": 45,
                                                                     "maxLength": 90}}, "required": ["s"]}),
        regex_grammar("(ab|c){150}x[0-9]{0,120}"),
        regex_grammar("[0-9]{3,400}"),  # nodes that differ only in whether the rule may end there
    ]
    for gr in sources:
        v.clear_rule_cache()
        monkeypatch.setattr(matcher, "MERGE_MIN_NODES", 10**9)
        alone = TokenMasks(gr.compile(), v)
        want = [alone.node_info(n) for n in range(alone.g.n_nodes)]
        monkeypatch.setattr(matcher, "MERGE_MIN_NODES", 256)
        v.clear_rule_cache()
        shared = TokenMasks(gr.compile(), v)
        assert [shared.node_info(n) for n in range(shared.g.n_nodes)] == want
        reps = [r for rule, r in shared._reps.items() if r]
        assert reps and sum(len(set(r)) for r in reps) * 2 < sum(map(len, reps)), [len(set(r)) for r in reps]
        check_masks_brute_force(shared, random.Random(5), 60)


def test_a_big_grammar_with_few_distinct_nodes_is_warmed_at_compile(monkeypatch):
    """A grammar over WARM_MAX_NODES whose nodes share masks down to fewer than that (a long minLength) is warmed at
    compile after TokenMasks.prepare, so decoding computes no node mask; one with more distinct nodes is left to
    decoding; prepare checks the deadline between rounds."""
    import webinfer.grammar as grammar

    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "minLength": 200}}}
    v = small_vocab()
    n_nodes = json_schema_grammar({"type": "string", "minLength": 200}).compile().n_nodes
    left = TokenMasks(json_schema_grammar({"type": "string", "minLength": 200}).compile(), v).prepare()
    assert left * 4 < n_nodes
    monkeypatch.setattr(grammar, "WARM_MAX_NODES", left)
    masks = GrammarCache(v).get(rf)
    assert masks.warmed and len(masks._node) + len(masks._chains) >= left
    check_masks_brute_force(masks, random.Random(7), 40)
    monkeypatch.setattr(grammar, "WARM_MAX_NODES", left - 1)
    assert not GrammarCache(v).get(rf).warmed
    ticks = iter(range(10**6))
    with pytest.raises(TimeoutError):
        v.clear_rule_cache()
        TokenMasks(json_schema_grammar({"type": "string", "minLength": 200}).compile(), v).prepare(
            3.0, lambda: float(next(ticks)))


def test_a_run_through_new_states_skips_the_loop_search():
    """A minLength string's positions read characters into new states: they are no loop, and _utf8_bytes says so
    from _char_run instead of searching 64 states each (~16 ms a state on Gemma 3); a plain string's loop state
    still gets its loop bytes. The masks equal reading each token."""
    v = utf8_vocab(0)
    masks = TokenMasks(json_schema_grammar({"type": "string", "minLength": 20}).compile(), v)
    searched = []
    search = masks._check_utf8
    masks._check_utf8 = lambda sid, max_states=64: searched.append(sid) or search(sid, max_states)
    masks.warm()
    assert len(searched) <= 3, searched  # one per position (20+) before
    check_masks_brute_force(masks, random.Random(11), 30)
    plain = TokenMasks(json_schema_grammar({"type": "string"}).compile(), v)
    m = GrammarMatcher(plain)
    assert m.accept_bytes(b'"ab')
    assert plain._utf8_bytes(m.sid) & (1 << ord("a"))


def test_masks_are_computed_under_the_vocabulary_lock():
    """A node's mask and a state's mask are computed, and a grammar's rule stores taken, holding the vocabulary's
    lock (its caches are shared with a compile in another thread); a cached mask is read without it."""
    import threading

    vocab = utf8_vocab(1)
    masks = TokenMasks(json_object_grammar().compile(), vocab)
    sid = GrammarMatcher(masks).sid
    node = next(iter(masks.g.states[sid]))[-1]

    def blocked(f) -> list:
        out = []
        with vocab.lock:
            t = threading.Thread(target=lambda: out.append(f()))
            t.start()
            t.join(0.5)
            assert t.is_alive() and not out  # waits for the lock
        t.join()
        return out

    info = blocked(lambda: masks.node_info(node))
    built = blocked(lambda: TokenMasks(masks.g, vocab))  # its rules' stores come from the vocabulary's LRU
    assert built[0]._stores.keys() == masks._stores.keys() and masks._stores
    masks.warm()  # every node's mask now: a state's mask needs only its own walks
    mask = blocked(lambda: masks.mask(sid))
    assert info == [masks.node_info(node)] and mask == [masks.mask(sid)]
    with vocab.lock:  # (held by this thread) cached now, read from another thread without it
        t = threading.Thread(target=lambda: mask.append(masks.mask(sid)))
        t.start()
        t.join(5)
        assert not t.is_alive() and mask[0] == mask[1]
    assert all(bool(mask[0] >> i & 1) == (bool(b) and masks.g.walk(sid, b) >= 0) for i, b in enumerate(vocab.token_bytes))


def test_accept_rollback_terminate_and_words():
    vocab = small_vocab()
    stop = len(vocab.token_bytes) - 2
    m = GrammarMatcher(TokenMasks(json_schema_grammar({"type": "boolean"}).compile(), vocab), stop_ids=[stop])
    tr, ue = vocab.token_bytes.index(b"tr"), vocab.token_bytes.index(b"ue")
    assert not m.accept(ord("x")) and not m.accept(stop)
    assert m.accept(tr) and m.accept(ue) and m.can_end()
    assert m.accept(stop) and m.is_terminated() and m.mask() == 0 and not m.accept(ord(" "))
    m.rollback(2)
    assert not m.is_terminated() and not m.can_end() and m.mask() >> ue & 1
    words = m.mask_words()
    assert len(words) == 4 * ((vocab.size + 31) // 32)
    ints = [int.from_bytes(words[i : i + 4], "little") for i in range(0, len(words), 4)]
    assert all(bool(ints[t // 32] >> (t % 32) & 1) == bool(m.mask() >> t & 1) for t in range(vocab.size))
    with pytest.raises(ValueError):
        m.rollback(5)


# -- greedy decoding with a fake model ---------------------------------------------------------------------------


class FakeModel:
    """Logits that prefer the tokens of `target` in order (then the stop token), with a deterministic pseudo-random
    background, so greedy decoding reproduces the target exactly."""

    def __init__(self, tok: Tokenizer, target: str, stop: int, vocab_size: int):
        self.ids = tok.encode(target) + [stop]
        self.v = vocab_size

    def logits(self, step: int) -> list[float]:
        rng = random.Random(step)
        out = [rng.random() for _ in range(self.v)]
        if step < len(self.ids):
            out[self.ids[step]] = 5.0
        return out


def greedy(model: FakeModel, matcher: GrammarMatcher | None, stop: int, limit: int = 80) -> list[int]:
    out = []
    for step in range(limit):
        lg = model.logits(step)
        if matcher is not None:
            mask = matcher.mask()
            lg = [x if mask >> i & 1 else float("-inf") for i, x in enumerate(lg)]
        t = max(range(len(lg)), key=lambda i: (lg[i], -i))
        out.append(t)
        if matcher is not None:
            assert matcher.accept(t)
        if t == stop:
            break
    return out


@pytest.fixture(scope="module")
def tiny_tok():
    return Tokenizer.from_json(tiny_tokenizer_json(300))


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("doc", ['{"name": "the cat", "age": 3}', '{\n  "name": "x",\n  "age": 10,\n  "pets": ["dog"]\n}',
                                 '{"name":"a b c","age":0,"pets":[]}'])
def test_greedy_constrained_equals_unconstrained_when_valid(tiny_tok, doc):
    jsonschema.validate(json.loads(doc), SCHEMA)
    vocab = TokenVocab.from_tokenizer(tiny_tok)
    stop = tiny_tok.token_to_id("<|endoftext|>") if tiny_tok.token_to_id("<|endoftext|>") is not None else vocab.size - 1
    model = FakeModel(tiny_tok, doc, stop, vocab.size)
    masks = GrammarCache(vocab).get({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    free = greedy(model, None, stop)
    assert free == model.ids
    assert greedy(model, GrammarMatcher(masks, [stop]), stop) == free


def test_greedy_constrained_repairs_invalid_output(tiny_tok):
    vocab = TokenVocab.from_tokenizer(tiny_tok)
    stop = vocab.size - 1
    model = FakeModel(tiny_tok, '{"name": "x", "age": "old"}', stop, vocab.size)
    m = GrammarMatcher(GrammarCache(vocab).get({"type": "json_schema", "json_schema": {"schema": SCHEMA}}), [stop])
    out = greedy(model, m, stop, limit=200)
    assert out[-1] == stop and m.is_terminated()
    jsonschema.validate(json.loads(tiny_tok.decode(out[:-1])), SCHEMA)


def test_grammar_cache_shares_masks(tiny_tok):
    cache = GrammarCache(TokenVocab.from_tokenizer(tiny_tok), capacity=2)
    rf = {"type": "json_object"}
    assert cache.get(rf) is cache.get(dict(rf)) and cache.get({"type": "text"}) is None
    cache.get({"type": "regex", "regex": "a+"})
    cache.get({"type": "regex", "regex": "b+"})
    assert cache.get(rf) is not None and len(cache._lru) == 2


def test_tool_call_grammar():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"], "additionalProperties": False}}},
             {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    g = tool_call_grammar(tools).compile()
    call = b'<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    assert accepts(g, call) and accepts(g, call + b"\n" + call.replace(b'"get_weather", "arguments": {"city": "Paris", "days": 2}', b'"now", "arguments": {}'))
    assert not accepts(g, call.replace(b'"days": 2', b'"days": 0'))
    assert not accepts(g, call.replace(b"get_weather", b"get_time"))
    assert not accepts(tool_call_grammar(tools, parallel=False).compile(), call + b"\n" + call)
    forced = tool_call_grammar(tools[1:]).compile()
    assert not accepts(forced, call)
    rng = random.Random(2)
    for _ in range(10):
        text = random_document(g, rng, 150).decode()
        for body in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S):
            obj = json.loads(body)
            schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == obj["name"])
            jsonschema.validate(obj["arguments"], schema)


def test_a_forced_tool_call_can_open_with_the_models_own_tag_token():
    """Qwen's `<tool_call>` and `</tool_call>` are added tokens that are not special (text, as transformers decodes
    them): a forced call may start with that one token, as the model was trained to write it, instead of spelling
    the tag from pieces. Special tokens stay out of every grammar."""
    tj = tiny_tokenizer_json(300)
    n = 1 + max(t["id"] for t in tj["added_tokens"])
    tj["added_tokens"] += [{"id": n + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": False} for i, c in enumerate(["<tool_call>", "</tool_call>"])]
    tok = Tokenizer.from_json(tj)
    vocab = TokenVocab.from_tokenizer(tok)
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    stop = tj["added_tokens"][0]["id"]
    m = GrammarMatcher(TokenMasks(tool_call_grammar(tools, parallel=False).compile(), vocab), stop_ids=[stop])
    assert m.mask() >> n & 1 and not m.mask() >> stop & 1
    ids = tok.encode('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')
    assert ids[0] == n and ids[-1] == n + 1
    assert all(m.accept(t) for t in ids + [stop]) and m.is_terminated()
    assert not any(m.mask() >> t["id"] & 1 for t in tj["added_tokens"] if t["special"])


def test_grammar_bench_smoke(tiny_tok):
    """webinfer bench --grammar runs end to end (tiny vocabulary; the numbers themselves are not asserted)."""
    from webinfer_packager.bench.grammar import bench_vocab

    res = bench_vocab(tiny_tok, quick=True)
    assert set(res["workloads"]) == {"json_schema", "json_object", "patterns", "loops", "lengths", "regex", "gbnf"}
    assert res["all"]["cold"]["steps"] > 50 and res["all"]["warm"]["p99_ms"] >= 0


# -- shift chains: bounded repetitions share one trie walk --------------------------------------------------------

# plain characters mostly (deep subtrees the walk takes whole), and the bytes that end, escape or split characters
CHAIN_PIECES = [b"a", b"b", b"7", b" "] * 4 + [b'"', b"\\", b"u", b"0", b"n", "é".encode(), "€".encode(), b"\xc3", b"\xa9",
                b"\x82", b"x", b"-", b"\n", b"}", b","]


@st.composite
def chain_case(draw):
    """A grammar with a bounded repetition (a string's minLength / maxLength, a counted regex, a GBNF {m,n}) and a
    random vocabulary built from the pieces those grammars care about."""
    lo = draw(st.integers(0, 4))
    hi = draw(st.integers(lo + 3, 12))
    kind = draw(st.sampled_from(["string", "regex", "gbnf", "object"]))
    if kind == "string":
        g = json_schema_grammar({"type": "string", "minLength": lo, "maxLength": hi})
    elif kind == "object":
        g = json_schema_grammar({"type": "object", "properties": {"k": {"type": "string", "maxLength": hi},
                                                                  "n": {"type": "integer"}}, "required": ["k"]})
    elif kind == "regex":
        g = regex_grammar(f"x([a-b7]|é|\\\\u[0-9]{{2}}){{{lo},{hi}}}-?")
    else:
        g = ebnf_grammar(f'root ::= "[" body "]" ws\nbody ::= ( [^"\\\\] | "\\\\" [nu] ){{{lo},{hi}}}\nws ::= " "?')
    tokens = draw(st.lists(st.lists(st.sampled_from(CHAIN_PIECES), min_size=1, max_size=hi + 3).map(b"".join),
                           min_size=1, max_size=60))
    return g, tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_case())
def test_shift_chain_masks_equal_per_node_walks(case):
    """Every chain member's node_info (one shared walk) equals a walk of the trie from that node alone."""
    g, tokens = case
    masks = TokenMasks(g.compile(), TokenVocab(tokens + [None]))
    assert masks.g.chain_of  # the grammars above always have one
    masks.warm()
    for node in range(masks.g.n_nodes):
        assert masks.node_info(node) == masks.walk_node(node), node


def test_shift_chain_on_long_strings_and_segments():
    """maxLength 600: chains longer than MAX_CHAIN split into segments; masks still equal the per-node walks and the
    brute force."""
    vocab = small_vocab()
    masks = TokenMasks(json_schema_grammar({"type": "string", "maxLength": 600}).compile(), vocab)
    assert max(i for _, i in masks.g.chain_of.values()) == 254
    for node in range(0, masks.g.n_nodes, 7):
        assert masks.node_info(node) == masks.walk_node(node), node
    check_masks_brute_force(masks, random.Random(3), 40)


def test_masks_where_a_rule_ends_after_any_character(monkeypatch):
    """Identifiers end after any character: the caller's walk starts only at trie nodes with a child by a byte the
    caller reads (TokenVocab.with_child). Forced on for every node here; masks still equal the brute force."""
    from webinfer.grammar import matcher

    monkeypatch.setattr(matcher, "FILTER_UNC", 0)
    g = ebnf_grammar('root ::= call ("\\n" call)*\ncall ::= name "(" name? ")"\nname ::= [a-z_] [a-z0-9_]*')
    vocab = TokenVocab([s.encode() for s in ["a", "ab", "abc", "ab(", "a(", "(", ")", "()", "b)", "_x", "x1(", "\n",
                                             ")\n", "c)\nd", "abc(", "ab(c", "(a)", "z", "zz", "zz("]] + [None, b""])
    masks = TokenMasks(g.compile(), vocab)
    rng = random.Random(5)
    for _ in range(6):
        check_masks_brute_force(masks, rng, 25)


def test_rules_without_calls_share_masks_across_grammars():
    """A rule without calls (a JSON string, a bounded string) has the same node masks in every grammar: the vocabulary
    keeps them, and a second grammar's masks (taken from there) still equal the brute force."""
    vocab = small_vocab()
    first = TokenMasks(json_schema_grammar({"type": "object", "properties": {"a": {"type": "string", "maxLength": 6},
                                                                            "b": {"type": "string"}}}).compile(), vocab)
    first.warm()
    second = TokenMasks(json_schema_grammar({"type": "array", "items": {"anyOf": [
        {"type": "string", "maxLength": 6}, {"type": "string"}, {"type": "integer"}]}}).compile(), vocab)
    shared = [n for n in range(second.g.n_nodes) if second.g.rule_of[n] in second.g.plain_rules]
    fresh = TokenMasks(second.g, TokenVocab(vocab.token_bytes))
    assert shared and all(second.node_info(n) == fresh.node_info(n) for n in range(second.g.n_nodes))
    assert any(second.node_info(n) is first.node_info(m) for n in shared for m in range(first.g.n_nodes))
    check_masks_brute_force(second, random.Random(11), 30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas)
def test_node_masks_equal_per_node_walks(schema):
    """Every node's node_info (shift chains, callees' masks composed, shared rule masks) equals a walk of the trie
    from that node alone."""
    masks = TokenMasks(json_schema_grammar(schema).compile(), small_vocab())
    masks.warm()
    for node in range(masks.g.n_nodes):
        assert masks.node_info(node) == masks.walk_node(node), node


@pytest.mark.parametrize("make", [
    lambda: json_object_grammar(),
    lambda: ebnf_grammar('root ::= call ("\\n" call)*\ncall ::= name "(" args? ")"\nname ::= [a-z_] [a-z0-9_]*\n'
                         'args ::= name ("," " "? name)*'),
    lambda: ebnf_grammar('root ::= ws item ws\nitem ::= opt "x" | "[" root "]"\nopt ::= "a"?\nws ::= " "*'),
])
@pytest.mark.parametrize("filter_unc", [0, 64])
def test_node_masks_equal_per_node_walks_with_calls(make, filter_unc, monkeypatch):
    """Also with every callee's end points filtered by what the caller reads next (FILTER_UNC 0)."""
    from webinfer.grammar import matcher

    monkeypatch.setattr(matcher, "FILTER_UNC", filter_unc)
    masks = TokenMasks(make().compile(), small_vocab())
    for node in range(masks.g.n_nodes):
        assert masks.node_info(node) == masks.walk_node(node), node
    check_masks_brute_force(masks, random.Random(2), 30)


def check_states_brute_force(masks: TokenMasks, limit: int = 200) -> None:
    """Every state a byte at a time reaches (up to `limit`) and random token walks: each mask equals reading every
    token byte by byte."""
    g, vocab = masks.g, masks.vocab
    seen, todo = set(), [GrammarMatcher(masks).sid]
    while todo and len(seen) < limit:
        sid = todo.pop(0)
        if sid in seen:
            continue
        seen.add(sid)
        mask = masks.mask(sid)
        for t, data in enumerate(vocab.token_bytes):
            viable = bool(data) and g.walk(sid, data) >= 0
            assert bool(mask >> t & 1) == viable, (t, data, sid)
            if viable and len(data) == 1:
                todo.append(g.walk(sid, data))
    for seed in range(4):
        check_masks_brute_force(masks, random.Random(seed), 20)


def class_vocab() -> TokenVocab:
    """Every byte, and tokens of letter runs that end in the middle of a pattern's exact repetition, at it, and past
    it (with the dash after, with a digit, with a quote), the kinds a real vocabulary's word pieces are."""
    words = ["ab", "abc", "abcd", "abcde", "abcdef", "the", "then", "there", "these", "zz", "zzz", "zzzz"]
    pieces = {bytes([b]) for b in range(256)} | {w.encode() for w in words}
    for w in words:
        pieces |= {(w + tail).encode() for tail in ["-", "-1", "-12", "-1\"", "1", "\"", "A", "-a"]}
    pieces |= {b"-1", b"-12", b"12", b"12\"", b"\"ab", b"\"abc-", b"\"zzzz-9\""}
    return TokenVocab(sorted(pieces) + [None, b""])


@pytest.mark.parametrize("make", [
    lambda: regex_grammar("k[a-z]{3}-[0-9]+"),
    lambda: regex_grammar("[a-z]{4}-[0-9]+!"),
    lambda: regex_grammar("[a-z]{2}[a-c]{3}-"),  # a run of one class, then another class
    lambda: regex_grammar("[a-z]{3}"),  # the run's end may end the rule: no shortcut
    lambda: regex_grammar("x[0-9]{3}[0-9]*y"),  # into a loop of the same class
    lambda: regex_grammar("[a-z]{5}(-|[0-9])"),  # the state after reads two bytes
    # a callee that may end after its run (or read an x): its caller reads on from the run's end (no shortcut)
    lambda: Grammar({"root": seq(("ref", "cut"), literal("-1")),
                     "cut": seq(literal("t"), rep(byte_range(0x61, 0x7A), 3, 3), rep(literal("x"), 0, 1))}),
    lambda: json_schema_grammar({"type": "object", "properties": {
        f"p{j}": {"type": "string", "pattern": f"^[a-z]{{{j}}}-[0-9]+$"} for j in range(1, 6)},
        "required": ["p1", "p2", "p3", "p4", "p5"]}),
])
def test_exact_class_repetitions_equal_brute_force(make):
    """walk_node's class runs (a node that reads exactly r bytes of one class: TokenMasks._class_run, the
    vocabulary's class masks) against reading every token byte by byte, in every state a byte at a time reaches
    (up to 200 states), and on random token walks."""
    check_states_brute_force(TokenMasks(make().compile(), class_vocab()))


def loop_vocab() -> TokenVocab:
    """class_vocab's pieces and more that leave a letter run by an exit: a dash, an at sign, a dot, a digit, a
    quote (the kinds of word pieces a real vocabulary has), and letter runs that start with an underscore or a
    capital or a digit."""
    words = ["ab", "abc", "the", "then", "zz", "_ab", "_x1", "Ab", "Zz", "com", "e", "9ab", "12"]
    pieces = set(class_vocab().token_bytes[:-2])
    for w in words:
        pieces |= {(w + tail).encode() for tail in ["-", "-a", "@", "@b.", ".", ".c", ".co\"", "9", "\"", "\",",
                                                  "\"}", " x", "@x.yz\""]}
    return TokenVocab(sorted(pieces) + [None, b""])


@pytest.mark.parametrize("make, shortcut", [
    (lambda: regex_grammar("[a-z]+-[0-9]+"), "walk"),
    (lambda: regex_grammar("x[a-z]*y"), "walk"),
    (lambda: regex_grammar("[a-z_][a-z0-9_]*!"), "walk"),  # s0 reads part of the class, the loop all of it
    (lambda: regex_grammar("[a-z]{2,}-"), "walk"),  # two states before the loop
    (lambda: regex_grammar("[a-z]+"), None),  # the loop may end the rule: no shortcut
    (lambda: regex_grammar("[a-z]+(-[a-z0-9]+)*\\."), "walk"),  # a loop into a loop by an exit
    # a callee whose loop is followed by an optional suffix: the caller reads on where it may end
    (lambda: Grammar({"root": seq(("ref", "word"), literal("-1")),
                      "word": seq(rep(byte_range(0x61, 0x7A), 1, None), literal("@"), rep(literal("x"), 0, 1))}),
     "walk"),
    (lambda: json_schema_grammar({"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]+$"},
        "slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
        "email": {"type": "string", "pattern": "^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$"},
        "id": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"}},
        "required": ["name", "slug", "email", "id"]}), "walk"),
    # a node whose first bytes enter a loop and that may also start by a call (_compose's lead bytes); the call
    # must not be nullable, or the walk on after it would read the same tokens again
    (lambda: ebnf_grammar('root ::= arg ("," arg)*\narg ::= [a-z_]+ ws "=" ws [0-9]+ "."\nws ::= " "?'), "compose"),
    (lambda: ebnf_grammar('root ::= item+ "."\nitem ::= "-" (tag | [a-z] [a-z]*) "@"\ntag ::= "#" [0-9]'), "compose"),
    # ... into a state before the loop, by part of the class (a token of one letter dies, one of a digit first too)
    (lambda: ebnf_grammar('root ::= item+ "."\nitem ::= "-" (tag | [a-z] [a-z0-9] [a-z0-9]*) "@"\ntag ::= "#" [0-9]'),
     "compose"),
    # ... into a state before the loop that has an exit of its own ("e." goes on after the e)
    (lambda: ebnf_grammar('root ::= item+ "."\nitem ::= "-" (tag | [a-z] ("." | [a-z] [a-z]*) "@")\ntag ::= "#" [0-9]'),
     "compose"),
    # ... into a state that reads only part of the class (no shortcut there: "e9" dies after the e)
    (lambda: ebnf_grammar('root ::= item+ "."\nitem ::= "-" (tag | [a-z] [a-z_] [a-z0-9_]*) "@"\ntag ::= "#" [0-9]'),
     "walk"),
    # ... by bytes outside the loop's class as well (no shortcut there)
    (lambda: ebnf_grammar('root ::= item+ "."\nitem ::= "-" (tag | [a-z_] [a-z]*) "@"\ntag ::= "#" [0-9]'), "walk"),
    # a name's loop at the end of its rule: no shortcut in its own nodes (its callers read on after every letter);
    # a walk from a caller's node (the call inlined in its states) takes it
    (lambda: ebnf_grammar('root ::= name "(" name ")"\nname ::= [a-z_] [a-z0-9_]*'), "walk"),
])
def test_class_loops_equal_walks_and_brute_force(make, shortcut, monkeypatch):
    """walk_node's and _compose's class loops (TokenMasks._class_loop / _loop_tokens, the vocabulary's class split)
    give every node what the byte-by-byte trie walks give (mask and the trie nodes where the rule may end), and
    every mask equals reading every token byte by byte, in every state a byte at a time reaches (up to 200) and on
    random walks. The vocabulary is tiny, so the shortcut's size threshold is lifted."""
    from webinfer.grammar import matcher

    monkeypatch.setattr(matcher, "LOOP_MIN_PAIRS", 0)
    masks = TokenMasks(make().compile(), loop_vocab())
    masks._stores = {}
    g, vocab = masks.g, masks.vocab
    walked = TokenMasks(masks.g, vocab)
    walked._stores, walked._class_loop = {}, lambda sid: None
    used = []
    loop_tokens = masks._loop_tokens
    masks._loop_tokens = lambda *a, **kw: used.append("compose" if kw.get("lead") else "walk") or loop_tokens(*a, **kw)
    for node in range(g.n_nodes):
        assert masks.walk_node(node) == walked.walk_node(node), node
        assert masks.node_info(node) == walked.node_info(node), node
    assert (shortcut in used) if shortcut else not used, used
    check_states_brute_force(masks)


def _string(**kw) -> Grammar:
    return json_schema_grammar({"type": "object", "properties": {"s": {"type": "string", **kw}}, "required": ["s"]})


@pytest.mark.parametrize("make, shortcut", [
    (lambda: _string(minLength=2, maxLength=7), {"node", "subtree"}),  # characters that must come, then a chain
    (lambda: _string(minLength=3), {"node", "loop"}),  # characters that must come, then a loop
    (lambda: _string(minLength=4, maxLength=4), {"node", "subtree"}),
    (lambda: _string(), {"node", "loop"}),  # a loop: its subtrees take _walk's UTF-8 loop shortcut
    (lambda: json_object_grammar(), {"node", "loop"}),
    (lambda: regex_grammar("k.{2,5}!"), {"node", "subtree"}),
    (lambda: regex_grammar("k[^!]{3}!"), {"node", "subtree"}),
    (lambda: regex_grammar("k.{3}a"), set()),  # the bound reads a byte the characters read: no run
    (lambda: regex_grammar("k[a-z中é]{2,5}!"), set()),  # not every character: no run
    (lambda: regex_grammar("k[^\"]{2}[^x]{2}!"), set()),  # a later state reads x elsewhere than the first
    (lambda: regex_grammar("k[^\"!]{2}[^x!]{2}!"), {"node", "subtree"}),  # ... runs only from the third
    (lambda: regex_grammar("k([^中!\"]|中x){2,3}!"), set()),  # characters that lead to different states
    # a callee that may end after two characters: no run in its nodes, nor in the caller's walks through them
    (lambda: Grammar({"root": seq(("ref", "cut"), literal("a")),
                      "cut": seq(literal("k"), rep(codepoint_ranges([(0x20, 0x10FFFF)]), 2, 4))}), set()),
    # a rule with calls (runs on its stack-set states, not on its nodes), one of them inside the run: the quote
    # that starts it is an exit
    (lambda: Grammar({"root": seq(literal("k"), rep(alt(codepoint_ranges([(0x20, 0x20), (0x23, 0x10FFFF)]),
                                                        ("ref", "q")), 2, 4), literal("!")),
                      "q": literal('"q')}), {"node", "subtree"}),
    # ... that may end after two characters (as the callee above, on stack-set states)
    (lambda: Grammar({"root": seq(literal("k"), rep(codepoint_ranges([(0x20, 0x10FFFF)]), 2, 4), rep(("ref", "q"), 0, 1)),
                      "q": literal('"q')}), set()),
    (lambda: Grammar({"root": seq(literal("k"), rep(seq(codepoint_ranges([(0x20, 0x20), (0x23, 0x10FFFF)]), literal("!")),
                                                    0, 1), rep(("ref", "q"), 0, 1)),
                      "q": literal('"q')}), set()),  # ... that may end where a run of one character would start
])
def test_character_runs_equal_walks_and_brute_force(make, shortcut):
    """walk_node's character runs (TokenMasks._char_run / _run_tokens: the tokens of valid UTF-8 and the run's ASCII
    bytes, of at most k characters, from the vocabulary's masks; those that leave them by a quote or a backslash
    read byte by byte) and _walk's bounded-run subtrees (filtered by validity and character count) give every node
    what the byte-by-byte walk gives, mask and the trie nodes where the rule may end, and every state's mask equals
    reading each token, on vocabularies full of multi-byte, cut and invalid tokens."""
    for seed in range(2):
        masks = TokenMasks(make().compile(), utf8_vocab(seed))
        g = masks.g
        walked = TokenMasks(g, utf8_vocab(seed))
        masks._stores = walked._stores = {}
        walked._char_run = lambda sid: None
        used = set()
        run_tokens, mask_from = masks._run_tokens, masks.vocab.mask_from
        masks._run_tokens = lambda *a: used.add("node") or run_tokens(*a)
        masks.vocab.mask_from = lambda spans: (used.update("subtree" if len(sp) > 3 else "loop" for sp in spans
                                                           if len(sp) > 2), mask_from(spans))[1]
        for node in range(g.n_nodes):
            assert masks.walk_node(node) == walked.walk_node(node), node
        assert used == shortcut, used
        check_states_brute_force(masks, 120)


def test_character_runs_longer_than_the_counts():
    """A string of at least 258 characters: its first node's run is longer than the vocabulary's character counts
    go (255), so tokens of 255 characters or more are read byte by byte; masks equal reading each token."""
    vocab = TokenVocab(utf8_vocab(0).token_bytes[:-2] + [b"a" * 257, b"a" * 258, b"a" * 300, "é".encode() * 256,
                                                         b"a" * 254 + b'"', None, b""])
    masks = TokenMasks(_string(minLength=258, maxLength=260).compile(), vocab)
    g = masks.g
    sid = g.walk(g.initial, b'{"s":"')
    for prefix in (b"", b"a", "中".encode(), b"a" * 200):
        q = g.walk(sid, prefix)
        mask = masks.mask(q)
        for t, data in enumerate(vocab.token_bytes):
            assert bool(mask >> t & 1) == (bool(data) and g.walk(q, data) >= 0), (prefix, t, data and data[:8])
    allowed = [bool(masks.mask(sid) >> t & 1) for t in range(vocab.size - 7, vocab.size - 2)]
    assert allowed == [True, True, False, True, False]  # 257, 258 characters; not 300; 256; not 254 and the quote
