"""Ids -> text: the decoder chain of tokenizer.json run as a streaming pipeline. This is the only decoder:
`Tokenizer.decode(ids)` pushes all ids through a fresh stream and finishes it, so streamed and one-shot text are
the same by construction (tests compare both with the `tokenizers` library).

Until the first Fuse / ByteLevel step a chain works on a list of token strings ("item" stages, one output per input
in order, so each stage counts its own position for Metaspace's first-token rule). Fuse, ByteLevel, or the final
join turn the list into one string; the steps after that see that single token, i.e. the whole text ("text"
stages, which stream character runs). Every stage holds back only what a later token can still change (an open
run of <0xNN> bytes, an incomplete UTF-8 sequence, a possible start of a Replace pattern, characters Strip may
drop), so every id costs O(1) amortised.
"""

from __future__ import annotations

import codecs
from typing import Callable

from webinfer.tokenizer.common import CHAR_TO_BYTE, byte_token, err, pattern_string

_KINDS = "Sequence, ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace"


def _metaspace_params(d: dict, field: str) -> tuple[str, str]:
    rep = d.get("replacement", "▁")
    scheme = d.get("prepend_scheme") or ("always" if d.get("add_prefix_space", True) else "never")
    if not isinstance(rep, str) or len(rep) != 1 or scheme not in ("always", "first", "never"):
        raise err(field, f"replacement {rep!r}, prepend_scheme {scheme!r}", "one character; always/first/never")
    return rep, scheme


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
    """Runs of <0xNN> tokens become one item: their UTF-8 text, or (as tokenizers does) one U+FFFD per byte when
    the run is not valid UTF-8. A run is held until a non-byte token (or the end) closes it: one more byte can turn
    it all into U+FFFD."""

    def __init__(self):
        self.run = bytearray()

    def push(self, tok: str) -> list[str]:
        b = byte_token(tok)
        if b >= 0:
            self.run.append(b)
            return []
        return self.flush() + [tok]

    def flush(self) -> list[str]:
        if not self.run:
            return []
        try:
            out = self.run.decode("utf-8")
        except UnicodeDecodeError:
            out = "\ufffd" * len(self.run)
        self.run.clear()
        return [out]


class _ByteLevelFuse:
    """ByteLevel: the tokens' bytes joined and decoded as UTF-8; Python's incremental decoder replaces invalid
    sequences exactly as a one-shot decode(errors="replace") does, which is what tokenizers does."""

    def __init__(self, cache: dict[str, bytes]):
        self.cache = cache
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, t: str) -> str:
        b = self.cache.get(t)
        if b is None:
            try:
                b = bytes(CHAR_TO_BYTE[c] for c in t)
            except KeyError:  # a token outside the byte alphabet (an added token): its own UTF-8
                b = t.encode("utf-8")
            if len(self.cache) < 1 << 18:
                self.cache[t] = b
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


def _strip_one(t: str, ch: str, start: int, stop: int) -> str:
    """tokenizers' Strip on one token: up to `start` leading and `stop` trailing `ch` removed."""
    a, b = 0, len(t)
    while a < min(start, len(t)) and t[a] == ch:
        a += 1
    while len(t) - b < stop and b > a and t[b - 1] == ch:
        b -= 1
    return t[a:b]


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


class DecoderChain:
    """A tokenizer.json `decoder`, validated once; `stages()` builds a fresh pipeline for one stream.

    A chain whose effect is not local once the tokens are fused (ByteLevel or ByteFallback after Fuse: no
    tokenizer.json we know of has one) is a FormatError, so there is never a re-decoding fallback."""

    def __init__(self, obj, field: str = "decoder"):
        self.steps: list[tuple] = []  # ("items" | "texts" | "fuse", factory)
        self._byte_cache: dict[str, bytes] = {}
        if obj is None:  # tokenizers joins the tokens with spaces
            self.steps.append(("fuse", lambda: _ConcatFuse(" ")))
            return
        fused = False
        for d, f in self._flatten(obj, field):
            kind = d.get("type")
            if kind in ("Fuse", "ByteLevel"):
                if fused:
                    if kind == "ByteLevel":
                        raise err(f + ".type", "ByteLevel after the tokens are fused", "ByteLevel before any Fuse")
                    continue  # a second Fuse of one token changes nothing
                fused = True
                make = (lambda cache=self._byte_cache: _ByteLevelFuse(cache)) if kind == "ByteLevel" else _ConcatFuse
                self.steps.append(("fuse", make))
            elif kind == "Replace":
                old, new = pattern_string(d.get("pattern"), f + ".pattern"), d.get("content", "")
                if not old or not isinstance(new, str):
                    raise err(f, "Replace needs a non-empty pattern and a string content")
                if fused:
                    self.steps.append(("texts", lambda old=old, new=new: _ReplaceText(old, new)))
                else:
                    self.steps.append(("items", lambda old=old, new=new: _MapItems(lambda _i, t: t.replace(old, new))))
            elif kind == "Strip":
                ch, start, stop = d.get("content", " "), d.get("start", 0), d.get("stop", 0)
                if not isinstance(ch, str) or len(ch) != 1 or type(start) is not int or type(stop) is not int:
                    raise err(f, f"content {ch!r}, start {start!r}, stop {stop!r}", "one character and two integers")
                if fused:
                    self.steps.append(("texts", lambda ch=ch, a=start, b=stop: _StripText(ch, a, b)))
                else:
                    self.steps.append(("items", lambda ch=ch, a=start, b=stop:
                                       _MapItems(lambda _i, t: _strip_one(t, ch, a, b))))
            elif kind == "Metaspace":
                # tokenizers drops the replacement characters of token 0 (the prepended space) unless the scheme
                # is "never"; after a Fuse the whole text is token 0
                rep, scheme = _metaspace_params(d, f)
                first = "" if scheme != "never" else " "
                if fused:
                    self.steps.append(("texts", lambda rep=rep, first=first: _MapText(lambda t: t.replace(rep, first))))
                else:
                    self.steps.append(("items", lambda rep=rep, first=first:
                                       _MapItems(lambda i, t: t.replace(rep, first if i == 0 else " "))))
            elif kind == "ByteFallback":
                if fused:
                    raise err(f + ".type", "ByteFallback after the tokens are fused", "ByteFallback before any Fuse")
                self.steps.append(("items", _ByteFallbackItems))
            else:
                raise err(f + ".type", f"unsupported decoder {kind!r}", _KINDS)
        if not fused:
            self.steps.append(("fuse", _ConcatFuse))

    @staticmethod
    def _flatten(obj, field: str) -> list[tuple[dict, str]]:
        if not isinstance(obj, dict):
            raise err(field, f"is a {type(obj).__name__}", "an object or null")
        if obj.get("type") != "Sequence":
            return [(obj, field)]
        decs = obj.get("decoders")
        if not isinstance(decs, list):
            raise err(field + ".decoders", "missing or not a list")
        out = []
        for i, d in enumerate(decs):
            out += DecoderChain._flatten(d, f"{field}.decoders[{i}]")
        return out

    def stages(self) -> tuple[list, object, list]:
        items, fuse, texts = [], None, []
        for where, make in self.steps:
            if where == "fuse":
                fuse = make()
            else:
                (texts if fuse is not None else items).append(make())
        return items, fuse, texts


class StreamDecoder:
    """Feed ids, get text deltas that never end inside a UTF-8 sequence or a byte-token run.

    "".join(deltas) + finish() == the text of all ids. add(id) takes one id, push(ids) many; unknown ids are
    dropped (as tokenizers does), special ids too when skip_special_tokens. Build with Tokenizer.decode_stream().
    """

    def __init__(self, chain: DecoderChain, id_to_token: Callable[[int], str | None], special_ids: frozenset[int],
                 skip_special_tokens: bool = False):
        self._items, self._fuse, self._texts = chain.stages()
        self._id_to_token = id_to_token
        self._skip = special_ids if skip_special_tokens else frozenset()
        self._done = False

    def add(self, token_id: int) -> str:
        return self.push((token_id,))

    def push(self, ids) -> str:
        if self._done:
            raise RuntimeError("StreamDecoder: push after finish()")
        toks = []
        for i in ids:
            if i in self._skip:
                continue
            t = self._id_to_token(i)
            if t is not None:
                toks.append(t)
        return self._run(toks, final=False) if toks else ""

    def finish(self) -> str:
        """The rest of the text once no more ids will come (an incomplete sequence becomes U+FFFD)."""
        if self._done:
            return ""
        self._done = True
        return self._run([], final=True)

    def _run(self, toks: list[str], final: bool) -> str:
        for st in self._items:
            out = []
            for t in toks:
                out += st.push(t)
            if final:
                out += st.flush()
            toks = out
        fuse = self._fuse
        text = "".join([fuse.push(t) for t in toks]) + (fuse.flush() if final else "")
        for st in self._texts:
            text = st.push(text) + (st.flush() if final else "")
        return text
