"""Text -> ids: normalizer, added tokens, pre-tokenizer and BPE model of a Hugging Face tokenizer.json, with ids
identical to the `tokenizers` library (see webinfer/tokenizer/__init__.py for what is supported).

Trust: `Encoder.encode_segments` takes (text, trusted) pieces. Special added tokens (`"special": true`, e.g.
`<|im_start|>`, `<bos>`) are recognised only inside trusted text; untrusted text that spells one is tokenized as
the plain characters it is. Non-special added tokens are matched everywhere, as tokenizers does. The BPE model
never produces a special token's id from plain text either (merges that would build one are dropped at load), so
the only way to a control token is trusted text.
"""

from __future__ import annotations

import bisect
import heapq
import re
import unicodedata
from typing import Callable

from webinfer import pretokenize
from webinfer.errors import InvalidRequestError
from webinfer.tokenizer.common import BYTE_TO_CHAR, byte_token, err, pattern_string

MAX_VOCAB = 1 << 22  # 4M tokens: far above any real vocabulary, low enough to refuse a hostile file early
MAX_MERGES = 1 << 23
_CACHE_LIMIT = 1 << 16  # words cached per tokenizer before the cache is cleared
_CACHE_MAX_WORD = 256  # longer words are not cached (they are rare and would pin memory)
_BYTE_PIECE = {b: BYTE_TO_CHAR[b] for b in range(256)}
_WS = pretokenize._SPACE
_SURROGATE = re.compile("[\ud800-\udfff]")

# ---------------------------------------------------------------------------------------------------------------
# normalizers: str -> str



def _build_normalizer(obj, field: str) -> Callable[[str], str] | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise err(field, f"is a {type(obj).__name__}", "an object or null")
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
            raise err(field + ".prepend", "missing or not a string")
        return lambda s: pre + s if s else s  # HF prepends only to non-empty text
    if kind == "Replace":
        old, new = pattern_string(obj.get("pattern"), field + ".pattern"), obj.get("content")
        if not isinstance(new, str) or not old:
            raise err(field, "Replace needs a non-empty pattern and a string content")
        return lambda s: s.replace(old, new)
    raise err(field + ".type", f"unsupported normalizer {kind!r}", "Sequence, NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace")


# ---------------------------------------------------------------------------------------------------------------
# pre-tokenizers: (pieces, segment starts the text) -> pieces


PreTok = Callable[[list[str], bool], list[str]]


def _build_pretokenizer(obj, field: str) -> list[PreTok]:
    """The pre-tokenizer steps."""
    if obj is None:
        return []
    if not isinstance(obj, dict):
        raise err(field, f"is a {type(obj).__name__}", "an object or null")
    kind = obj.get("type")
    if kind == "Sequence":
        steps = []
        for i, p in enumerate(obj.get("pretokenizers") or []):
            steps += _build_pretokenizer(p, f"{field}.pretokenizers[{i}]")
        return steps
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

        return [byte_level]
    if kind == "Split":
        pat, behavior = obj.get("pattern"), obj.get("behavior")
        if obj.get("invert", False):
            raise err(field + ".invert", "true is not supported", "false")
        if isinstance(pat, dict) and isinstance(pat.get("String"), str) and pat["String"]:
            if behavior not in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext"):
                raise err(field + ".behavior", f"{behavior!r}", "Isolated, Removed, MergedWithPrevious or MergedWithNext")
            lit = pat["String"]
            return [lambda pieces, _f: [q for p in pieces for q in pretokenize.split_string(p, lit, behavior) if q]]
        scanner = pretokenize.KNOWN_PATTERNS.get(pat.get("Regex")) if isinstance(pat, dict) else None
        if scanner is None:
            raise err(field + ".pattern", f"unknown split pattern {pat!r}",
                      "a non-empty String, or one of the Regex patterns in webinfer.pretokenize.KNOWN_PATTERNS")
        if behavior != "Isolated":
            raise err(field + ".behavior", f"{behavior!r}", '"Isolated" for a Regex pattern')
        return [lambda pieces, _f: [q for p in pieces for q in scanner(p)]]
    if kind == "Digits":
        if obj.get("individual_digits", False):
            return [lambda pieces, _f: [q for p in pieces for q in pretokenize.split_digits(p)]]
        return [lambda pieces, _f: [q for p in pieces for q in pretokenize.split_digit_runs(p)]]
    if kind == "Metaspace":
        rep = obj.get("replacement", "▁")
        scheme = obj.get("prepend_scheme") or ("always" if obj.get("add_prefix_space", True) else "never")
        if not isinstance(rep, str) or len(rep) != 1 or scheme not in ("always", "first", "never"):
            raise err(field, f"replacement {rep!r}, prepend_scheme {scheme!r}", "one character; always/first/never")
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

        return [metaspace]
    raise err(field + ".type", f"unsupported pre-tokenizer {kind!r}", "Sequence, ByteLevel, Split, Digits, Metaspace")


# ---------------------------------------------------------------------------------------------------------------
# the BPE model


class _BPE:
    def __init__(self, model: dict):
        if not isinstance(model, dict):
            raise err("model", "missing or not an object", "a BPE model")
        if model.get("type", "BPE") != "BPE":
            raise err("model.type", f"unsupported model {model.get('type')!r}", '"BPE"')
        vocab, merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not vocab:
            raise err("model.vocab", "missing, empty or not an object", "a {token: id} object")
        if len(vocab) > MAX_VOCAB:
            raise err("model.vocab", f"{len(vocab)} tokens", f"at most {MAX_VOCAB}")
        if not isinstance(merges, list) or len(merges) > MAX_MERGES:
            raise err("model.merges", "missing, not a list or too long", f"a list of at most {MAX_MERGES} pairs")
        if model.get("dropout") not in (None, 0, 0.0):
            raise err("model.dropout", f"{model.get('dropout')!r}", "null (dropout is for training only)")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key) not in (None, ""):
                raise err(f"model.{key}", f"{model.get(key)!r} is not supported", "null or empty")
        self.vocab: dict[str, int] = dict(vocab)
        self.id_to_token: dict[int, str] = {i: tok for tok, i in vocab.items()}
        ids = vocab.values()
        # checked in bulk (the page builds this at every load); the loop below only names the first bad entry
        if not (all(type(i) is int for i in ids) and 0 <= min(ids) and max(ids) < MAX_VOCAB
                and len(self.id_to_token) == len(vocab)):
            seen: dict[int, str] = {}
            for tok, i in vocab.items():
                if type(i) is not int or i < 0 or i >= MAX_VOCAB:
                    raise err(f"model.vocab[{tok!r}]", f"id {i!r}", f"an integer in [0, {MAX_VOCAB})")
                if i in seen:
                    raise err(f"model.vocab[{tok!r}]", f"duplicate id {i} (also {seen[i]!r})", "unique ids")
                seen[i] = tok
        # (left id, right id) -> (rank, merged id)
        self.merges: dict[tuple[int, int], tuple[int, int]] = {}
        get, setdefault = self.vocab.get, self.merges.setdefault
        for rank, m in enumerate(merges):
            if type(m) is str:
                parts = m.split(" ")
            elif type(m) is list and len(m) == 2 and type(m[0]) is str and type(m[1]) is str:  # the common case
                parts = m
            elif isinstance(m, list) and all(isinstance(x, str) for x in m):
                parts = m
            else:
                parts = []
            if len(parts) != 2:
                raise err(f"model.merges[{rank}]", f"{m!r}", '"a b" or ["a", "b"]')
            a, b = parts
            ia, ib, ic = get(a), get(b), get(a + b)
            if ia is None or ib is None or ic is None:
                missing = [t for t, i in ((a, ia), (b, ib), (a + b, ic)) if i is None]
                raise err(f"model.merges[{rank}]", f"{m!r} uses tokens not in the vocabulary: {missing!r}")
            setdefault((ia, ib), (rank, ic))
        self.ignore_merges = bool(model.get("ignore_merges", False))
        self.fuse_unk = bool(model.get("fuse_unk", False))
        self.byte_fallback = bool(model.get("byte_fallback", False))
        unk = model.get("unk_token")
        if unk is not None and unk not in self.vocab:
            raise err("model.unk_token", f"{unk!r} is not in the vocabulary")
        self.unk_id = self.vocab.get(unk) if unk is not None else None
        self.byte_ids: list[int] | None = None
        if self.byte_fallback:
            for tok in self.vocab:
                if tok.startswith("<0x") and tok.endswith(">") and byte_token(tok) < 0:
                    raise err(f"model.vocab[{tok!r}]", "malformed byte-fallback token", "<0xNN> with exactly two hex digits")
            ids = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]
            self.byte_ids = ids if all(i is not None for i in ids) else None
            if self.byte_ids is None:
                missing = [f"<0x{b:02X}>" for b in range(256) if ids[b] is None]
                raise err("model.vocab", f"byte_fallback is set but {len(missing)} byte tokens are missing, e.g. {missing[0]}",
                           "all 256 tokens <0x00> .. <0xFF>")
        self._cache: dict[str, list[int]] = {}
        self.forbidden: frozenset[int] = frozenset()

    def forbid(self, ids: frozenset[int]) -> None:
        """Never produce these ids from text (the special added tokens): drop the merges that build them, and
        spell a character that is one of them with byte fallback / unk. Plain text containing a special token's
        content only reaches the model when the caller said it is untrusted, so HF-equal ids are unaffected."""
        self.forbidden = frozenset(ids)
        self.merges = {k: v for k, v in self.merges.items() if v[1] not in self.forbidden}
        self._cache.clear()

    def _symbols(self, word: str) -> list[int]:
        """The word's characters as ids, with byte fallback / unknown-token handling as tokenizers does."""
        out: list[int] = []
        prev_unk = False
        for ch in word:
            i = self.vocab.get(ch)
            if i is not None and i not in self.forbidden:
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
        if self.ignore_merges and self.vocab.get(word, -1) >= 0 and self.vocab[word] not in self.forbidden:
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
            raise err(field, f"{obj!r}", 'an object with an integer "id" and a non-empty "content"')
        self.id, self.content = obj["id"], obj["content"]
        self.special = bool(obj.get("special", False))
        self.lstrip, self.rstrip = bool(obj.get("lstrip", False)), bool(obj.get("rstrip", False))
        self.single_word = bool(obj.get("single_word", False))
        self.normalized = bool(obj.get("normalized", not self.special))


class _Matcher:
    """Finds added tokens in text: a compiled alternation of the literal token strings, longest first, so that re's
    leftmost-first search is leftmost-longest (only escaped literals: no backtracking risk). `plain` is the same
    over the non-special tokens, for a position where a special token may not be taken."""

    def __init__(self, tokens: list[_AddedToken]):
        def compile_(toks):
            ordered = sorted(toks, key=lambda t: -len(t.content))
            return re.compile("|".join(re.escape(t.content) for t in ordered)) if ordered else None

        self.rx = compile_(tokens)
        self.plain = compile_([t for t in tokens if not t.special])
        self.by_content = {t.content: t for t in tokens}


def _matcher(tokens: list[_AddedToken]) -> _Matcher | None:
    return _Matcher(tokens) if tokens else None


class _Trust:
    """Which character ranges of the joined text came from trusted segments."""

    def __init__(self, bounds: list[int], trusted: list[bool]):
        self.bounds, self.trusted = bounds, trusted  # segment k is [bounds[k], bounds[k + 1])

    def covers(self, start: int, stop: int) -> bool:
        """[start, stop) lies inside one trusted segment."""
        k = bisect.bisect_right(self.bounds, start) - 1
        return self.trusted[k] and stop <= self.bounds[k + 1]


def _split_added(text: str, matcher: _Matcher | None, trust: _Trust | None = None, base: int = 0
                 ) -> list[tuple[str, _AddedToken | None]]:
    """Split text into (piece, None) and (token text, token) parts, following HF's lstrip/rstrip/single_word rules.
    A special token is taken only where `trust` (None: all text is trusted) covers it; text[i] is at base + i of
    the text `trust` describes."""
    if matcher is None or matcher.rx is None or not text:
        return [(text, None)] if text else []
    rx, by_content = matcher.rx, matcher.by_content
    out, offset, pos = [], 0, 0
    while (m := rx.search(text, pos)) is not None:
        start, stop = m.span()
        tok = by_content[m.group()]
        if tok.special and trust is not None and not trust.covers(base + start, base + stop):
            m2 = matcher.plain.match(text, start) if matcher.plain is not None else None
            if m2 is None:
                pos = start + 1  # the special token's text stays plain; a token may still start inside it
                continue
            stop, tok = m2.end(), by_content[m2.group()]
        pos = stop
        if start < offset:
            continue  # inside white space an rstrip token already took
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


def build_post(obj, field: str = "post_processor") -> tuple[list[int], list[int]]:
    """(prefix ids, suffix ids) added around a single sequence by add_special_tokens=True."""
    if obj is None:
        return [], []
    if not isinstance(obj, dict):
        raise err(field, f"is a {type(obj).__name__}", "an object or null")
    kind = obj.get("type")
    if kind == "Sequence":
        pre, post = [], []
        for i, p in enumerate(obj.get("processors") or []):
            a, b = build_post(p, f"{field}.processors[{i}]")
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
                    raise err(f"{field}.single[{k}]", f"{item!r}", "one sequence A")
                seen = True
            elif "SpecialToken" in item:
                name = item["SpecialToken"].get("id")
                spec = specials.get(name)
                ids = spec.get("ids") if isinstance(spec, dict) else None
                if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                    raise err(f"{field}.special_tokens[{name!r}]", "missing or without integer ids")
                (post if seen else pre).extend(ids)
            else:
                raise err(f"{field}.single[{k}]", f"{item!r}", "Sequence or SpecialToken")
        return pre, post
    raise err(field + ".type", f"unsupported post-processor {kind!r}", "TemplateProcessing, ByteLevel, Sequence")




# ---------------------------------------------------------------------------------------------------------------


class Encoder:
    """The encoding half of a tokenizer.json (everything but the decoder)."""

    def __init__(self, obj: dict):
        if "model" not in obj:
            raise err("model", "missing", "a BPE model")
        self.model = _BPE(obj["model"])
        self.normalizer = _build_normalizer(obj.get("normalizer"), "normalizer")
        self.pre_steps = _build_pretokenizer(obj.get("pre_tokenizer"), "pre_tokenizer")

        added = obj.get("added_tokens") or []
        if not isinstance(added, list):
            raise err("added_tokens", f"is a {type(added).__name__}", "a list")
        self.added: list[_AddedToken] = [_AddedToken(a, f"added_tokens[{i}]") for i, a in enumerate(added)]
        self.added_by_id: dict[int, _AddedToken] = {}
        self.added_by_content: dict[str, _AddedToken] = {}
        for t in self.added:
            if self.added_by_id.get(t.id, t).content != t.content:
                raise err(f"added_tokens[id={t.id}]", f"id used for both {self.added_by_id[t.id].content!r} and {t.content!r}")
            in_vocab = self.model.id_to_token.get(t.id)
            if in_vocab is not None and in_vocab != t.content:
                raise err(f"added_tokens[id={t.id}]", f"{t.content!r} reuses the id of vocabulary token {in_vocab!r}")
            self.added_by_id[t.id] = t
            self.added_by_content[t.content] = t
        self._raw_matcher = _matcher([t for t in self.added if not t.normalized])
        self._norm_matcher = _matcher([t for t in self.added if t.normalized])
        self.special_ids = frozenset(t.id for t in self.added if t.special)
        self.model.forbid(self.special_ids)
        self.pre_ids, self.post_ids = build_post(obj.get("post_processor"))

    def token_to_id(self, token: str) -> int | None:
        t = self.added_by_content.get(token)
        return t.id if t is not None else self.model.vocab.get(token)

    def _encode_plain(self, text: str, first: bool, trust: _Trust | None, base: int, out: list[int]) -> None:
        """Encode text holding no raw added token: normalize, split normalized added tokens, pre-tokenize, BPE.
        Normalized special tokens are taken only when all of this text is trusted (offsets move in normalizing)."""
        if self.normalizer is not None:
            text_trusted = trust is None or trust.covers(base, base + len(text))
            text = self.normalizer(text)
        else:
            text_trusted = True
        norm_trust = None if text_trusted else _Trust([0, len(text) + 1], [False])
        for k, (piece, tok) in enumerate(_split_added(text, self._norm_matcher, norm_trust if self.normalizer
                                                      else trust, 0 if self.normalizer else base)):
            if tok is not None:
                out.append(tok.id)
                continue
            pieces = [piece]
            for step in self.pre_steps:
                pieces = step(pieces, first and k == 0)
            for p in pieces:
                if p:
                    out.extend(self.model.tokenize(p))

    def encode_segments(self, segments, add_special_tokens: bool) -> list[int]:
        texts, bounds, trusted = [], [0], []
        for k, seg in enumerate(segments):
            if not (isinstance(seg, tuple) and len(seg) == 2 and isinstance(seg[0], str)):
                raise TypeError(f"segment {k}: expected a (str, bool) pair, got {seg!r}")
            if not seg[0]:
                continue
            if trusted and trusted[-1] == bool(seg[1]):  # neighbours of equal trust are one segment
                texts[-1] += seg[0]
                bounds[-1] += len(seg[0])
                continue
            texts.append(seg[0])
            bounds.append(bounds[-1] + len(seg[0]))
            trusted.append(bool(seg[1]))
        text = "".join(texts)
        if (bad := _SURROGATE.search(text)) is not None:
            raise InvalidRequestError("text", f"holds a lone surrogate U+{ord(bad.group()):04X} at character "
                                      f"{bad.start()} (expected Unicode text, which UTF-8 can encode)")
        trust = None if all(trusted) else _Trust(bounds, trusted)
        out: list[int] = list(self.pre_ids) if add_special_tokens else []
        pos = 0
        for piece, tok in _split_added(text, self._raw_matcher, trust):
            if tok is not None:
                out.append(tok.id)
            else:
                self._encode_plain(piece, pos == 0, trust, pos, out)
            pos += len(piece)
        if add_special_tokens:
            out.extend(self.post_ids)
        return out
