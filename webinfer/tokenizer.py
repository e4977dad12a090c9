"""A pure-Python BPE tokenizer reading Hugging Face tokenizer.json, for CPython and Pyodide (no numpy, no regex).

Supported, with ids identical to the `tokenizers` library:
- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2): ByteLevel pre-tokenizer, alone or after Split(known pattern) or
  Digits; the split patterns run as hand-written scanners (webinfer/pretokenize.py), never as a regex from the file.
- SentencePiece-style BPE (Llama 2, TinyLlama): normalizer Prepend("▁") + Replace(" ", "▁") or a Metaspace
  pre-tokenizer, byte fallback to `<0xNN>` tokens, fuse_unk, and the matching decoders.
- added tokens (matched before normalization, leftmost-longest, with lstrip / rstrip / single_word / normalized),
  TemplateProcessing BOS/EOS when add_special_tokens=True, and a streaming decoder (IncrementalDecoder).

Anything else in the file is rejected with a FormatError naming tokenizer.json and the field.
"""

from __future__ import annotations

import codecs
import heapq
import re
import unicodedata
from typing import Callable

from webinfer import pretokenize
from webinfer.errors import FormatError

FILE = "tokenizer.json"
MAX_VOCAB = 1 << 22  # 4M tokens: far above any real vocabulary, low enough to refuse a hostile file early
MAX_MERGES = 1 << 23
_CACHE_LIMIT = 1 << 16  # words cached per tokenizer before the cache is cleared
_CACHE_MAX_WORD = 256  # longer words are not cached (they are rare and would pin memory)


def _err(field: str, problem: str, expected: str | None = None) -> FormatError:
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
_BYTE_PIECE = {b: "".join(BYTE_TO_CHAR[x] for x in bytes([b])) for b in range(256)}
_WS = pretokenize._SPACE


def _byte_token(tok: str) -> int:
    """The byte of a `<0xNN>` byte-fallback token, or -1."""
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        h = tok[3:5]
        if all(c in "0123456789abcdefABCDEF" for c in h):
            return int(h, 16)
    return -1


# ---------------------------------------------------------------------------------------------------------------
# normalizers: str -> str


def _pattern_string(obj, field: str) -> str:
    if not isinstance(obj, dict) or not isinstance(obj.get("String"), str):
        raise _err(field, f"unsupported pattern {obj!r}", 'a plain {"String": ...} pattern')
    return obj["String"]


def _build_normalizer(obj, field: str) -> Callable[[str], str] | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise _err(field, f"is a {type(obj).__name__}", "an object or null")
    kind = obj.get("type")
    if kind == "Sequence":
        steps = [_build_normalizer(n, f"{field}.normalizers[{i}]") for i, n in enumerate(obj.get("normalizers") or [])]
        steps = [s for s in steps if s is not None]

        def seq(s: str) -> str:
            for f in steps:
                s = f(s)
            return s

        return seq
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda s: unicodedata.normalize(kind, s)
    if kind == "Lowercase":
        return str.lower
    if kind == "Prepend":
        pre = obj.get("prepend")
        if not isinstance(pre, str):
            raise _err(field + ".prepend", "missing or not a string")
        return lambda s: pre + s if s else s  # HF prepends only to non-empty text
    if kind == "Replace":
        old, new = _pattern_string(obj.get("pattern"), field + ".pattern"), obj.get("content")
        if not isinstance(new, str) or not old:
            raise _err(field, "Replace needs a non-empty pattern and a string content")
        return lambda s: s.replace(old, new)
    raise _err(field + ".type", f"unsupported normalizer {kind!r}", "Sequence, NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace")


# ---------------------------------------------------------------------------------------------------------------
# pre-tokenizers: (pieces, segment starts the text) -> pieces


PreTok = Callable[[list[str], bool], list[str]]


def _build_pretokenizer(obj, field: str) -> tuple[list[PreTok], bool]:
    """The pre-tokenizer steps, and whether the model works on GPT-2 byte characters (ByteLevel)."""
    if obj is None:
        return [], False
    if not isinstance(obj, dict):
        raise _err(field, f"is a {type(obj).__name__}", "an object or null")
    kind = obj.get("type")
    if kind == "Sequence":
        steps, byte_level = [], False
        for i, p in enumerate(obj.get("pretokenizers") or []):
            s, b = _build_pretokenizer(p, f"{field}.pretokenizers[{i}]")
            steps += s
            byte_level |= b
        return steps, byte_level
    if kind == "ByteLevel":
        prefix, use_regex = bool(obj.get("add_prefix_space", False)), bool(obj.get("use_regex", True))

        def byte_level(pieces: list[str], _first: bool) -> list[str]:
            out = []
            for p in pieces:
                if prefix and not p.startswith(" "):
                    p = " " + p
                for q in pretokenize.split_gpt2(p) if use_regex else [p]:
                    out.append("".join(_BYTE_PIECE[b] for b in q.encode("utf-8")))
            return out

        return [byte_level], True
    if kind == "Split":
        pat = obj.get("pattern")
        scanner = pretokenize.KNOWN_PATTERNS.get(pat.get("Regex")) if isinstance(pat, dict) else None
        if scanner is None:
            raise _err(field + ".pattern", f"unknown split pattern {pat!r}", "the GPT-2, Llama 3 or Qwen2 pattern")
        if obj.get("behavior") != "Isolated" or obj.get("invert", False):
            raise _err(field + ".behavior", f"{obj.get('behavior')!r}, invert={obj.get('invert')!r}", '"Isolated", invert false')
        return [lambda pieces, _f: [q for p in pieces for q in scanner(p)]], False
    if kind == "Digits":
        if not obj.get("individual_digits", False):
            raise _err(field + ".individual_digits", "false is not supported", "true")
        return [lambda pieces, _f: [q for p in pieces for q in pretokenize.split_digits(p)]], False
    if kind == "Metaspace":
        rep = obj.get("replacement", "▁")
        scheme = obj.get("prepend_scheme") or ("always" if obj.get("add_prefix_space", True) else "never")
        if not isinstance(rep, str) or len(rep) != 1 or scheme not in ("always", "first", "never"):
            raise _err(field, f"replacement {rep!r}, prepend_scheme {scheme!r}", "one character; always/first/never")
        split = bool(obj.get("split", True))

        def metaspace(pieces: list[str], first: bool) -> list[str]:
            out = []
            for k, p in enumerate(pieces):
                p = p.replace(" ", rep)
                if not p.startswith(rep) and (scheme == "always" or (scheme == "first" and first and k == 0)):
                    p = rep + p
                if not split:
                    out.append(p)
                    continue
                start = 0  # split before every replacement character (HF "MergedWithNext")
                for i in range(1, len(p)):
                    if p[i] == rep:
                        out.append(p[start:i])
                        start = i
                if p:
                    out.append(p[start:])
            return out

        return [metaspace], False
    raise _err(field + ".type", f"unsupported pre-tokenizer {kind!r}", "Sequence, ByteLevel, Split, Digits, Metaspace")


# ---------------------------------------------------------------------------------------------------------------
# decoders: list of token strings -> list of strings (joined at the end), as in tokenizers' decode_chain


def _decode_byte_level(tokens: list[str]) -> list[str]:
    buf = bytearray()
    for t in tokens:
        try:
            buf += bytes(CHAR_TO_BYTE[c] for c in t)
        except KeyError:  # a token outside the byte alphabet (an added token): its own UTF-8
            buf += t.encode("utf-8")
    return [buf.decode("utf-8", errors="replace")]


def _decode_byte_fallback(tokens: list[str]) -> list[str]:
    out: list[str] = []
    run = bytearray()

    def flush():
        if run:
            try:
                out.append(run.decode("utf-8"))
            except UnicodeDecodeError:  # HF: one replacement character per byte token of an invalid run
                out.append("\ufffd" * len(run))
            run.clear()

    for t in tokens:
        b = _byte_token(t)
        if b >= 0:
            run.append(b)
        else:
            flush()
            out.append(t)
    flush()
    return out


def _build_decoder(obj, field: str) -> Callable[[list[str]], list[str]]:
    if obj is None:
        return lambda toks: [" ".join(toks)]
    if not isinstance(obj, dict):
        raise _err(field, f"is a {type(obj).__name__}", "an object or null")
    kind = obj.get("type")
    if kind == "Sequence":
        steps = [_build_decoder(d, f"{field}.decoders[{i}]") for i, d in enumerate(obj.get("decoders") or [])]

        def seq(toks: list[str]) -> list[str]:
            for f in steps:
                toks = f(toks)
            return toks

        return seq
    if kind == "ByteLevel":
        return _decode_byte_level
    if kind == "ByteFallback":
        return _decode_byte_fallback
    if kind == "Fuse":
        return lambda toks: ["".join(toks)]
    if kind == "Replace":
        old, new = _pattern_string(obj.get("pattern"), field + ".pattern"), obj.get("content", "")
        return lambda toks: [t.replace(old, new) for t in toks]
    if kind == "Strip":
        ch, start, stop = obj.get("content", " "), int(obj.get("start", 0)), int(obj.get("stop", 0))

        def strip(toks: list[str]) -> list[str]:
            out = []
            for t in toks:
                a, b = 0, len(t)
                while a < min(start, len(t)) and t[a] == ch:
                    a += 1
                while len(t) - b < stop and b > a and t[b - 1] == ch:
                    b -= 1
                out.append(t[a:b])
            return out

        return strip
    if kind == "Metaspace":
        rep = obj.get("replacement", "▁")
        scheme = obj.get("prepend_scheme") or ("always" if obj.get("add_prefix_space", True) else "never")
        # HF drops every replacement character of the first token (the prepended space) unless scheme is "never"
        return lambda toks: [
            t.replace(rep, "" if i == 0 and scheme != "never" else " ") for i, t in enumerate(toks)
        ]
    raise _err(field + ".type", f"unsupported decoder {kind!r}", "Sequence, ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace")


# ---------------------------------------------------------------------------------------------------------------
# the BPE model


class _BPE:
    def __init__(self, model: dict):
        if not isinstance(model, dict):
            raise _err("model", "missing or not an object", "a BPE model")
        if model.get("type", "BPE") != "BPE":
            raise _err("model.type", f"unsupported model {model.get('type')!r}", '"BPE"')
        vocab, merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not vocab:
            raise _err("model.vocab", "missing, empty or not an object", "a {token: id} object")
        if len(vocab) > MAX_VOCAB:
            raise _err("model.vocab", f"{len(vocab)} tokens", f"at most {MAX_VOCAB}")
        if not isinstance(merges, list) or len(merges) > MAX_MERGES:
            raise _err("model.merges", "missing, not a list or too long", f"a list of at most {MAX_MERGES} pairs")
        if model.get("dropout") not in (None, 0, 0.0):
            raise _err("model.dropout", f"{model.get('dropout')!r}", "null (dropout is for training only)")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key) not in (None, ""):
                raise _err(f"model.{key}", f"{model.get(key)!r} is not supported", "null or empty")
        self.vocab: dict[str, int] = {}
        self.id_to_token: dict[int, str] = {}
        for tok, i in vocab.items():
            if type(i) is not int or i < 0 or i >= MAX_VOCAB:
                raise _err(f"model.vocab[{tok!r}]", f"id {i!r}", f"an integer in [0, {MAX_VOCAB})")
            if i in self.id_to_token:
                raise _err(f"model.vocab[{tok!r}]", f"duplicate id {i} (also {self.id_to_token[i]!r})", "unique ids")
            self.vocab[tok] = i
            self.id_to_token[i] = tok
        # (left id, right id) -> (rank, merged id)
        self.merges: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, m in enumerate(merges):
            if isinstance(m, str):
                parts = m.split(" ")
            elif isinstance(m, list) and all(isinstance(x, str) for x in m):
                parts = m
            else:
                parts = []
            if len(parts) != 2:
                raise _err(f"model.merges[{rank}]", f"{m!r}", '"a b" or ["a", "b"]')
            a, b = parts
            ia, ib, ic = self.vocab.get(a), self.vocab.get(b), self.vocab.get(a + b)
            if ia is None or ib is None or ic is None:
                missing = [t for t, i in ((a, ia), (b, ib), (a + b, ic)) if i is None]
                raise _err(f"model.merges[{rank}]", f"{m!r} uses tokens not in the vocabulary: {missing!r}")
            self.merges.setdefault((ia, ib), (rank, ic))
        self.ignore_merges = bool(model.get("ignore_merges", False))
        self.fuse_unk = bool(model.get("fuse_unk", False))
        self.byte_fallback = bool(model.get("byte_fallback", False))
        unk = model.get("unk_token")
        if unk is not None and unk not in self.vocab:
            raise _err("model.unk_token", f"{unk!r} is not in the vocabulary")
        self.unk_id = self.vocab.get(unk) if unk is not None else None
        self.byte_ids: list[int] | None = None
        if self.byte_fallback:
            for tok in self.vocab:
                if tok.startswith("<0x") and tok.endswith(">") and _byte_token(tok) < 0:
                    raise _err(f"model.vocab[{tok!r}]", "malformed byte-fallback token", "<0xNN> with exactly two hex digits")
            ids = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]
            self.byte_ids = ids if all(i is not None for i in ids) else None
            if self.byte_ids is None:
                missing = [f"<0x{b:02X}>" for b in range(256) if ids[b] is None]
                raise _err("model.vocab", f"byte_fallback is set but {len(missing)} byte tokens are missing, e.g. {missing[0]}",
                           "all 256 tokens <0x00> .. <0xFF>")
        self._cache: dict[str, list[int]] = {}

    def _symbols(self, word: str) -> list[int]:
        """The word's characters as ids, with byte fallback / unknown-token handling as tokenizers does."""
        out: list[int] = []
        prev_unk = False
        for ch in word:
            i = self.vocab.get(ch)
            if i is not None:
                out.append(i)
                prev_unk = False
            elif self.byte_ids is not None:
                out.extend(self.byte_ids[b] for b in ch.encode("utf-8"))
                prev_unk = False
            elif self.unk_id is not None:
                if not (self.fuse_unk and prev_unk):
                    out.append(self.unk_id)
                prev_unk = True
            # else: no way to represent the character; tokenizers drops it too
        return out

    def tokenize(self, word: str) -> list[int]:
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if self.ignore_merges and word in self.vocab:
            ids = [self.vocab[word]]
        else:
            ids = self._merge(self._symbols(word))
        if len(word) <= _CACHE_MAX_WORD:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def _merge(self, ids: list[int]) -> list[int]:
        """Apply merges lowest rank first, leftmost first among equal ranks (a heap over a linked list, so a long
        word costs n log n, not n^2)."""
        n = len(ids)
        if n < 2:
            return ids
        merges = self.merges
        if n == 2:
            m = merges.get((ids[0], ids[1]))
            return [m[1]] if m else ids
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap = []
        for i in range(n - 1):
            m = merges.get((ids[i], ids[i + 1]))
            if m:
                heap.append((m[0], i))
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            if not alive[i]:
                continue
            j = nxt[i]
            if j < 0:
                continue
            m = merges.get((ids[i], ids[j]))
            if m is None or m[0] != rank:
                continue  # stale entry: a neighbour merged first
            ids[i] = m[1]
            alive[j] = False
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                m2 = merges.get((ids[i], ids[k]))
                if m2:
                    heapq.heappush(heap, (m2[0], i))
            p = prv[i]
            if p >= 0:
                m2 = merges.get((ids[p], ids[i]))
                if m2:
                    heapq.heappush(heap, (m2[0], p))
        return [ids[i] for i in range(n) if alive[i]]


# ---------------------------------------------------------------------------------------------------------------
# added tokens and the post-processor


class _AddedToken:
    __slots__ = ("id", "content", "special", "lstrip", "rstrip", "single_word", "normalized")

    def __init__(self, obj: dict, field: str):
        if not isinstance(obj, dict) or type(obj.get("id")) is not int or not isinstance(obj.get("content"), str) or not obj["content"]:
            raise _err(field, f"{obj!r}", 'an object with an integer "id" and a non-empty "content"')
        self.id, self.content = obj["id"], obj["content"]
        self.special = bool(obj.get("special", False))
        self.lstrip, self.rstrip = bool(obj.get("lstrip", False)), bool(obj.get("rstrip", False))
        self.single_word = bool(obj.get("single_word", False))
        self.normalized = bool(obj.get("normalized", not self.special))


def _matcher(tokens: list[_AddedToken]):
    """A compiled alternation of the literal token strings, longest first, so that re's leftmost-first search is
    leftmost-longest. Only escaped literals: no backtracking risk."""
    if not tokens:
        return None
    ordered = sorted(tokens, key=lambda t: -len(t.content))
    return re.compile("|".join(re.escape(t.content) for t in ordered)), {t.content: t for t in ordered}


def _split_added(text: str, matcher) -> list[tuple[str, _AddedToken | None]]:
    """Split text into (piece, None) and (token text, token) parts, following HF's lstrip/rstrip/single_word rules."""
    if matcher is None or not text:
        return [(text, None)] if text else []
    rx, by_content = matcher
    out, offset = [], 0
    for m in rx.finditer(text):
        start, stop = m.start(), m.end()
        if start < offset:
            continue  # inside white space an rstrip token already took
        tok = by_content[m.group()]
        if tok.single_word:
            before_word = start > 0 and text[start - 1].isalnum()
            after_word = stop < len(text) and text[stop].isalnum()
            if before_word or after_word:
                continue
        if tok.lstrip:
            while start > offset and text[start - 1] in _WS:
                start -= 1
        if tok.rstrip:
            while stop < len(text) and text[stop] in _WS:
                stop += 1
        if offset < start:
            out.append((text[offset:start], None))
        out.append((text[start:stop], tok))
        offset = stop
    if offset < len(text):
        out.append((text[offset:], None))
    return out


def _build_post(obj, field: str, token_id: Callable[[str], int | None]):
    """(prefix ids, suffix ids) added around a single sequence by add_special_tokens=True."""
    if obj is None:
        return [], []
    if not isinstance(obj, dict):
        raise _err(field, f"is a {type(obj).__name__}", "an object or null")
    kind = obj.get("type")
    if kind == "Sequence":
        pre, post = [], []
        for i, p in enumerate(obj.get("processors") or []):
            a, b = _build_post(p, f"{field}.processors[{i}]", token_id)
            pre, post = pre + a, post + b
        return pre, post
    if kind == "ByteLevel":
        return [], []  # only changes offsets
    if kind == "TemplateProcessing":
        specials = obj.get("special_tokens") or {}
        pre, post, seen = [], [], False
        for k, item in enumerate(obj.get("single") or []):
            if "Sequence" in item:
                if item["Sequence"].get("id") != "A" or seen:
                    raise _err(f"{field}.single[{k}]", f"{item!r}", "one sequence A")
                seen = True
            elif "SpecialToken" in item:
                name = item["SpecialToken"].get("id")
                spec = specials.get(name)
                ids = spec.get("ids") if isinstance(spec, dict) else None
                if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                    raise _err(f"{field}.special_tokens[{name!r}]", "missing or without integer ids")
                (post if seen else pre).extend(ids)
            else:
                raise _err(f"{field}.single[{k}]", f"{item!r}", "Sequence or SpecialToken")
        return pre, post
    raise _err(field + ".type", f"unsupported post-processor {kind!r}", "TemplateProcessing, ByteLevel, Sequence")


# ---------------------------------------------------------------------------------------------------------------


class Tokenizer:
    """Encode text to ids and back. Build with Tokenizer.from_json(parsed tokenizer.json)."""

    def __init__(self, obj: dict):
        if not isinstance(obj, dict):
            raise _err("(root)", f"is a {type(obj).__name__}", "a JSON object")
        if "model" not in obj:
            raise _err("model", "missing", "a BPE model")
        self.model = _BPE(obj["model"])
        self.normalizer = _build_normalizer(obj.get("normalizer"), "normalizer")
        self.pre_steps, self.byte_level = _build_pretokenizer(obj.get("pre_tokenizer"), "pre_tokenizer")
        self.decoder_json = obj.get("decoder")
        self._decoder = _build_decoder(self.decoder_json, "decoder")

        added = obj.get("added_tokens") or []
        if not isinstance(added, list):
            raise _err("added_tokens", f"is a {type(added).__name__}", "a list")
        self.added: list[_AddedToken] = [_AddedToken(a, f"added_tokens[{i}]") for i, a in enumerate(added)]
        self.added_by_id: dict[int, _AddedToken] = {}
        self.added_by_content: dict[str, _AddedToken] = {}
        for t in self.added:
            if self.added_by_id.get(t.id, t).content != t.content:
                raise _err(f"added_tokens[id={t.id}]", f"id used for both {self.added_by_id[t.id].content!r} and {t.content!r}")
            in_vocab = self.model.id_to_token.get(t.id)
            if in_vocab is not None and in_vocab != t.content:
                raise _err(f"added_tokens[id={t.id}]", f"{t.content!r} reuses the id of vocabulary token {in_vocab!r}")
            self.added_by_id[t.id] = t
            self.added_by_content[t.content] = t
        self._raw_matcher = _matcher([t for t in self.added if not t.normalized])
        self._norm_matcher = _matcher([t for t in self.added if t.normalized])
        self.special_ids = frozenset(t.id for t in self.added if t.special)
        self._pre_ids, self._post_ids = _build_post(obj.get("post_processor"), "post_processor", self.token_to_id)
        self.vocab_size = 1 + max(max(self.model.id_to_token), max(self.added_by_id, default=0))
        self._stream_bytes: dict[int, bytes] = {}

    @classmethod
    def from_json(cls, obj: dict) -> "Tokenizer":
        return cls(obj)

    # -- lookups --------------------------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        t = self.added_by_content.get(token)
        return t.id if t is not None else self.model.vocab.get(token)

    def id_to_token(self, i: int) -> str | None:
        t = self.added_by_id.get(i)
        return t.content if t is not None else self.model.id_to_token.get(i)

    # -- encode ---------------------------------------------------------------------------------------------
    def _encode_plain(self, text: str, first: bool, out: list[int]) -> None:
        """Encode a segment that holds no raw added token: normalize, split normalized added tokens, pre-tokenize, BPE."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        for k, (piece, tok) in enumerate(_split_added(text, self._norm_matcher)):
            if tok is not None:
                out.append(tok.id)
                continue
            pieces = [piece]
            for step in self.pre_steps:
                pieces = step(pieces, first and k == 0)
            for p in pieces:
                if p:
                    out.extend(self.model.tokenize(p))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        out: list[int] = list(self._pre_ids) if add_special_tokens else []
        pos = 0
        for piece, tok in _split_added(text, self._raw_matcher):
            if tok is not None:
                out.append(tok.id)
            else:
                self._encode_plain(piece, pos == 0, out)
            pos += len(piece)
        if add_special_tokens:
            out.extend(self._post_ids)
        return out

    # -- decode ---------------------------------------------------------------------------------------------
    def _tokens(self, ids, skip_special_tokens: bool) -> list[str]:
        toks = []
        for i in ids:
            if skip_special_tokens and i in self.special_ids:
                continue
            t = self.id_to_token(i)
            if t is not None:  # unknown ids are dropped, as tokenizers does
                toks.append(t)
        return toks

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self._decoder(self._tokens(ids, skip_special_tokens)))

    def decode_stream(self, skip_special_tokens: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens)

    def _is_plain_byte_level_decoder(self) -> bool:
        d = self.decoder_json
        while isinstance(d, dict) and d.get("type") == "Sequence" and len(d.get("decoders") or []) == 1:
            d = d["decoders"][0]
        return isinstance(d, dict) and d.get("type") == "ByteLevel"

    def _token_bytes(self, i: int) -> bytes:
        """The bytes a token contributes under the ByteLevel decoder (cached: the streaming hot path)."""
        b = self._stream_bytes.get(i)
        if b is None:
            t = self.id_to_token(i)
            if t is None:
                b = b""
            else:
                try:
                    b = bytes(CHAR_TO_BYTE[c] for c in t)
                except KeyError:
                    b = t.encode("utf-8")
            self._stream_bytes[i] = b
        return b


# ---------------------------------------------------------------------------------------------------------------
# streaming decoders: the decoder chain run as a pipeline of stages that each hold back only what a later token can
# still change, so every id costs O(1) amortised and the joined deltas equal decode(all ids) exactly.
#
# Until the first Fuse / ByteLevel step a chain works on a list of token strings ("item" stages, one output per
# input in order, so each stage counts its own position for Metaspace's first-token rule). Fuse, ByteLevel, or the
# final "".join turn the list into one string; the steps after that see that single token, i.e. the whole text
# ("text" stages, which stream character runs).


class _Unstreamable(Exception):
    """A chain step whose effect on the whole text is not local (IncrementalDecoder then re-decodes)."""


class _MapItems:
    """A per-token step: f(position in this stage's input, token)."""

    def __init__(self, f: Callable[[int, str], str]):
        self.f, self.n = f, 0

    def push(self, tok: str) -> list[str]:
        self.n += 1
        return [self.f(self.n - 1, tok)]

    def flush(self) -> list[str]:
        return []


class _ByteFallbackItems:
    """Runs of <0xNN> tokens become one item: their UTF-8 text, or one U+FFFD per byte when the run is invalid.
    A run is held until a non-byte token (or the end) closes it: one more byte can turn it all into U+FFFD."""

    def __init__(self):
        self.run = bytearray()

    def push(self, tok: str) -> list[str]:
        b = _byte_token(tok)
        if b >= 0:
            self.run.append(b)
            return []
        return self.flush() + [tok]

    def flush(self) -> list[str]:
        if not self.run:
            return []
        out = _decode_byte_fallback([f"<0x{b:02X}>" for b in self.run])
        self.run.clear()
        return out


class _ByteLevelFuse:
    """ByteLevel: the tokens' bytes joined and decoded as UTF-8; Python's incremental decoder replaces invalid
    sequences exactly as a one-shot decode(errors="replace") does."""

    def __init__(self, tok: "Tokenizer"):
        self.tok = tok
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, t: str) -> str:
        try:
            b = bytes(CHAR_TO_BYTE[c] for c in t)
        except KeyError:  # a token outside the byte alphabet: its own UTF-8, as _decode_byte_level
            b = t.encode("utf-8")
        return self.utf8.decode(b)

    def flush(self) -> str:
        return self.utf8.decode(b"", final=True)


class _ConcatFuse:
    """Fuse, or the final join: the tokens concatenated (with `sep` between them for a null decoder)."""

    def __init__(self, sep: str = ""):
        self.sep, self.first = sep, True

    def push(self, t: str) -> str:
        if self.first:
            self.first = False
            return t
        return self.sep + t

    def flush(self) -> str:
        return ""


class _ReplaceText:
    """str.replace over the whole text: matches are found left to right, so text before the last len(old)-1
    characters can never become part of a later match."""

    def __init__(self, old: str, new: str):
        if not old:
            raise _Unstreamable("Replace with an empty pattern")
        self.old, self.new, self.buf = old, new, ""

    def push(self, text: str) -> str:
        buf, old = self.buf + text, self.old
        out, pos = [], 0
        while (j := buf.find(old, pos)) >= 0:
            out += (buf[pos:j], self.new)
            pos = j + len(old)
        safe = max(pos, len(buf) - len(old) + 1)  # a match starting here or later may still need future text
        out.append(buf[pos:safe])
        self.buf = buf[safe:]
        return "".join(out)

    def flush(self) -> str:
        out, self.buf = self.buf, ""  # shorter than the pattern: no match left
        return out


class _StripText:
    """Strip on the whole text: up to `start` leading `ch` dropped, and up to `stop` trailing ones (never past the
    leading cut). Leading characters wait until `start` of them are seen or another character comes; a trailing
    run of `ch` (its last `stop` characters) waits until something else follows it."""

    def __init__(self, ch: str, start: int, stop: int):
        self.ch, self.start, self.stop = ch, start, stop
        self.leading = 0  # leading ch characters dropped so far; -1 once the leading part is done
        self.tail = ""  # held trailing ch characters

    def push(self, text: str) -> str:
        if self.leading >= 0:
            i = 0
            while i < len(text) and self.leading < self.start and text[i] == self.ch:
                i += 1
                self.leading += 1
            text = text[i:]
            if not text and self.leading < self.start:
                return ""
            self.leading = -1
        if self.stop <= 0:
            return text
        buf = self.tail + text
        k = len(buf)
        while k > 0 and len(buf) - k < self.stop and buf[k - 1] == self.ch:
            k -= 1
        self.tail = buf[k:]
        return buf[:k]

    def flush(self) -> str:
        self.tail = ""  # still trailing at the end: stripped
        return ""


class _MapText:
    """A step that maps each character on its own (Metaspace on the single fused token)."""

    def __init__(self, f: Callable[[str], str]):
        self.f = f

    def push(self, text: str) -> str:
        return self.f(text)

    def flush(self) -> str:
        return ""


def _stream_stages(tok: "Tokenizer", obj) -> tuple[list, object, list]:
    """(item stages, the fusing stage, text stages) for a decoder chain; raises _Unstreamable."""
    steps = []

    def flatten(d):
        if isinstance(d, dict) and d.get("type") == "Sequence":
            for x in d.get("decoders") or []:
                flatten(x)
        else:
            steps.append(d)

    if obj is None:
        return [], _ConcatFuse(" "), []
    flatten(obj)
    items, fuse, texts = [], None, []
    for d in steps:
        kind = d.get("type")
        if kind in ("Fuse", "ByteLevel"):
            if fuse is None:
                fuse = _ByteLevelFuse(tok) if kind == "ByteLevel" else _ConcatFuse()
            elif kind == "ByteLevel":
                raise _Unstreamable("ByteLevel after the tokens are fused")
            continue  # a second Fuse of one token changes nothing
        if kind == "Replace":
            old, new = d["pattern"]["String"], d.get("content", "")
            if fuse is None:
                items.append(_MapItems(lambda _i, t, old=old, new=new: t.replace(old, new)))
            else:
                texts.append(_ReplaceText(old, new))
        elif kind == "Strip":
            ch, start, stop = d.get("content", " "), int(d.get("start", 0)), int(d.get("stop", 0))
            if fuse is None:
                one = _build_decoder(d, "decoder")
                items.append(_MapItems(lambda _i, t, one=one: one([t])[0]))
            else:
                texts.append(_StripText(ch, start, stop))
        elif kind == "Metaspace":
            # as _build_decoder: the replacement character of token 0 is dropped unless the scheme is "never"
            rep = d.get("replacement", "▁")
            scheme = d.get("prepend_scheme") or ("always" if d.get("add_prefix_space", True) else "never")
            first = "" if scheme != "never" else " "
            if fuse is None:
                items.append(_MapItems(lambda i, t, rep=rep, first=first: t.replace(rep, first if i == 0 else " ")))
            else:
                texts.append(_MapText(lambda t, rep=rep, first=first: t.replace(rep, first)))  # the fused text is token 0
        elif kind == "ByteFallback" and fuse is None:
            items.append(_ByteFallbackItems())
        else:
            raise _Unstreamable(f"{kind} after the tokens are fused")
    return items, fuse or _ConcatFuse(), texts


class IncrementalDecoder:
    """Feed ids one at a time, get text deltas that never contain a broken UTF-8 sequence.

    "".join(all deltas) + finish() == tokenizer.decode(all ids). ByteLevel decoders stream through Python's
    incremental UTF-8 decoder (same replacement rules as a one-shot decode). SentencePiece chains (Replace,
    ByteFallback, Fuse, Strip, Metaspace) run as a pipeline of streaming stages (see _stream_stages): a run of
    <0xNN> tokens is held until it is closed, a leading/trailing stripped character until it is known whether it
    is stripped, the end of the text while it may still start a Replace pattern; every id costs O(1) amortised.
    A chain the stages cannot express exactly falls back to re-decoding all ids (O(n) per id).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.fast = tokenizer._is_plain_byte_level_decoder()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stages = None
        if not self.fast:
            try:
                self._stages = _stream_stages(tokenizer, tokenizer.decoder_json)
            except _Unstreamable:
                pass
        self.ids: list[int] = []  # only kept by the re-decoding fallback
        self._stable = 0  # ids[:_stable] end outside a byte-token run
        self._emitted = ""

    def add(self, token_id: int) -> str:
        if self.skip and token_id in self.tok.special_ids:
            return ""
        if self.fast:
            return self._utf8.decode(self.tok._token_bytes(token_id))
        if self._stages is not None:
            t = self.tok.id_to_token(token_id)
            return "" if t is None else self._run([t])  # unknown ids are dropped, as decode() does
        return self._add_redecode(token_id)

    def _run(self, toks: list[str] | None) -> str:
        """Push tokens through the stages (None: flush every stage in order) and return the text that came out."""
        items, fuse, texts = self._stages
        final = toks is None
        toks = toks or []
        for st in items:
            out = []
            for t in toks:
                out += st.push(t)
            if final:
                out += st.flush()
            toks = out
        text = "".join(fuse.push(t) for t in toks) + (fuse.flush() if final else "")
        for st in texts:
            text = st.push(text) + (st.flush() if final else "")
        return text

    def _add_redecode(self, token_id: int) -> str:
        self.ids.append(token_id)
        t = self.tok.id_to_token(token_id)
        if t is None or _byte_token(t) < 0:
            self._stable = len(self.ids)
        text = self.tok.decode(self.ids[: self._stable])
        return self._emit(text.rstrip("\ufffd"))

    def _emit(self, text: str) -> str:
        if not text.startswith(self._emitted) or len(text) <= len(self._emitted):
            return ""
        delta = text[len(self._emitted):]
        self._emitted = text
        return delta

    def finish(self) -> str:
        """The rest of the text once no more ids will come (an incomplete sequence becomes U+FFFD)."""
        if self.fast:
            return self._utf8.decode(b"", final=True)
        if self._stages is not None:
            return self._run(None)
        full = self.tok.decode(self.ids)
        delta = full[len(self._emitted):] if full.startswith(self._emitted) else ""
        self._emitted = full
        return delta
