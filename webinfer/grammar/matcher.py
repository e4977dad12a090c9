"""Per-step token masks for a compiled grammar (pure Python: it runs inside Pyodide).

TokenVocab   the vocabulary's byte strings in a trie, built once per tokenizer.
TokenMasks   one compiled grammar bound to one vocabulary: the mask caches, shared by every request that uses the
             same grammar (e.g. the same JSON schema).
GrammarMatcher  one sequence's position: accept(token), rollback(n), is_terminated(), mask() / mask_words().

How a mask is computed (the xgrammar / llguidance idea, written for Python): a token is allowed when its bytes can be
read from the current stack set. Whether it can depends on the top node (the DFA state of the innermost rule) for
every byte the innermost rule reads itself; only where that rule may end inside the token does the rest depend on
the callers. So per node, once, a walk of the token trie from that node alone gives
  - the tokens it accepts without leaving its rule: "context-independent", a bitmask cached per node;
  - the trie nodes below which the rule may end: there the rest of the token is read by the caller's state.
Per state, the mask is the union over its stacks of the node's cached bitmask and a walk of just those sub-tries from
the caller's stack (usually a few hundred trie edges: the tokens that close a string, a number, an object), and it is
cached per state as well, so a state seen again (every token inside one string field) costs a dict lookup.
Masks are Python ints (bit i = token i allowed), so unions are single big-int operations and `mask_words` turns one
into the little-endian u32 words the GPU sampler reads.

Two things keep the per-node walks few: the nodes of a bounded repetition (a string's maxLength) form shift chains
(CompiledGrammar._shift_chains) that share one walk, and rules without calls keep their node masks in the TokenVocab,
shared by every grammar on that tokenizer (docs/structured-output.md).
"""

from __future__ import annotations

import bisect
import operator
import re
import threading
import time
from collections import OrderedDict

from .grammar import MAX_CHAIN, CompiledGrammar

_BITS = bytes.maketrans(b"\x00\x01", b"01")
_DEAD: dict[int, dict[int, int]] = {}  # a set of allowed bytes -> {every other byte: -1}
# _AT_LEAST[i]: byte v -> "1" when v > i: a chain walk's bytes (1 + level) -> the digits of member i's mask
_AT_LEAST = [bytes(49 if v > i else 48 for v in range(256)) for i in range(256)]


def _utf8_table() -> list[list[int]]:
    """Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF) as a DFA over bytes: state 0 is a character boundary,
    1-7 are inside a character; -1 is invalid. Rows list the next state per byte."""
    t = [[-1] * 256 for _ in range(8)]
    for b in range(0x80):
        t[0][b] = 0
    for lo, hi, to in ((0xC2, 0xDF, 1), (0xE0, 0xE0, 2), (0xE1, 0xEC, 3), (0xED, 0xED, 4), (0xEE, 0xEF, 3),
                       (0xF0, 0xF0, 5), (0xF1, 0xF3, 6), (0xF4, 0xF4, 7)):
        for b in range(lo, hi + 1):
            t[0][b] = to
    for state, lo, hi, to in ((1, 0x80, 0xBF, 0), (2, 0xA0, 0xBF, 1), (3, 0x80, 0xBF, 1), (4, 0x80, 0x9F, 1),
                              (5, 0x90, 0xBF, 3), (6, 0x80, 0xBF, 3), (7, 0x80, 0x8F, 3)):
        for b in range(lo, hi + 1):
            t[state][b] = to
    return t


_UTF8 = _utf8_table()
_CONT = bytes(range(0x80, 0xC0))
_VALID_BYTES = [[b for b in (range(0x80, 0x100) if u == 0 else range(256)) if _UTF8[u][b] >= 0] for u in range(8)]
_VALID = [sum(1 << b for b in range(256) if _UTF8[u][b] >= 0) for u in range(8)]  # what each state may read
_NON_ASCII = ((1 << 256) - 1) ^ ((1 << 128) - 1)
_ASCII = (1 << 128) - 1
INF = 1 << 30  # TokenMasks._char_run: the characters a loop reads
# _AT_MOST[d]: byte v -> 1 when v <= d (a token whose valid UTF-8 tail starts by offset d)
_AT_MOST = [bytes(1 if v <= d else 0 for v in range(256)) for d in range(256)]
_ONE_TO = [bytes(1 if 1 <= v <= d else 0 for v in range(256)) for d in range(256)]
CLASS_CACHE = 256  # TokenVocab.class_prefix_mask: (class, length) masks kept per vocabulary (<= 32 KB each at 262k)


def utf8_tail_start(data: bytes) -> int:
    """The smallest offset k at a character boundary (k == len(data), or data[k] is not a continuation byte) from
    which data[k:] is valid UTF-8 up to, possibly, an unfinished last character: what a state that reads any
    character can read of this token from a boundary inside it."""
    try:
        data.decode("utf-8")
        return 0
    except UnicodeDecodeError:
        pass
    best, state = 0, 0  # the offset where the current run of valid bytes began
    for k, b in enumerate(data):
        nxt = _UTF8[state][b]
        if nxt < 0:  # invalid here: the tail can only start at a later boundary (this byte, if it is a lead byte)
            state = _UTF8[0][b]
            best = k if state >= 0 else k + 1
            state = max(state, 0)
        else:
            state = nxt
    return best


def _one_character(read, stops, q: int) -> tuple[list[int], set] | None:
    """Where whole characters lead from q, at a character boundary: (the state after each valid UTF-8 character, the
    (state, UTF-8 state) pairs inside characters), when q reads exactly the non-ASCII bytes that start a character,
    every state inside one reads exactly the bytes UTF-8 allows there, and none of them may end the rule
    (stops(state)); None otherwise. read(state): {byte: next state}. The UTF-8 DFA x the grammar's."""
    ends, inside, todo = [], set(), [(q, 0)]
    while todo:
        y, u = todo.pop()
        r = read(y)
        got = 0
        for b in r:
            if u or b >= 0x80:
                got |= 1 << b
        if got != (_VALID[u] if u else _VALID[0] & _NON_ASCII):
            return None
        for b in _VALID_BYTES[u]:
            t, u2 = r[b], _UTF8[u][b]
            if stops(t):
                return None
            if u2 == 0:
                ends.append(t)
            elif (t, u2) not in inside:
                inside.add((t, u2))
                todo.append((t, u2))
    return ends, inside


def _positions(data: bytes, bs: int) -> list[int]:
    """The offsets in data of the bytes of the 256-bit mask bs (ASCII bytes only), by one regular-expression scan."""
    if not bs:
        return []
    pattern = re.compile(b"[" + b"".join(b"\\x%02x" % b for b in range(128) if bs >> b & 1) + b"]")
    return [m.start() for m in pattern.finditer(data)]


def _run_step(moves, chars) -> tuple[int, int, int] | None:
    """TokenMasks._run_step from a state's (byte, next) moves and _one_character's result (None when the state
    reads no non-ASCII byte)."""
    if chars is None:
        return None if any(b >= 0x80 for b, _ in moves) else (0, sum(1 << b for b, _ in moves), -1)
    if len(set(chars[0])) != 1:
        return None
    nxt, asc, other = chars[0][0], 0, 0
    for b, t in moves:
        if b < 0x80:
            if t == nxt:
                asc |= 1 << b
            else:
                other |= 1 << b
    return asc, other, nxt


FILTER_UNC = 64  # a node whose rule may end at more trie nodes than this: keep only those the caller can go on from
RULE_CACHE = 32  # rules without calls whose node masks a vocabulary keeps (TokenVocab.rule_store): a maxLength-40
# string rule holds up to ~20 MB at 152k tokens (a byte per token per chain, a mask per member used), as a grammar did
LOOP_MIN_PAIRS = 256  # TokenMasks._class_loop: a class loop spelling fewer trie nodes of two bytes is walked
MERGE_MIN_NODES = 256  # rules without calls at least this big look for nodes with equal masks (TokenMasks._rep)
MASK_CACHE_STATES = 4096  # masks kept per grammar (each up to vocab/8 bytes); the cache restarts when full


class TokenVocab:
    """Byte strings of a vocabulary (None for tokens that never appear inside structured output: special / control
    tokens) in a trie: children[node] maps byte -> child node; order[first[node]:below[node]] are the token ids
    spelled by its path. The trie is dicts of ints and flat lists of ints, objects the cyclic garbage collector does not
    track: at 152k tokens (750k trie nodes) a list per node made each full collection a pause of ~0.5 s.

    `lock` guards the shared caches (rule stores, class tries, masks and splits, LRUs): TokenMasks computes a node's
    or a state's mask under it, because the server compiles a grammar in a thread while the engine's loop computes
    another's masks on the same vocabulary. One node at a time, so a mask waits at most for one node of a compile."""

    def __init__(self, token_bytes: list[bytes | None]):
        self.token_bytes = token_bytes
        self.lock = threading.RLock()
        self.size = len(token_bytes)
        self.max_len = max((len(b) for b in token_bytes if b), default=0)  # bytes of the longest token
        self.n_words = (self.size + 31) // 32
        self._gather = None
        self._tail: bytes | None = None
        self._chars: tuple | None = None
        self._parents: list[set] | None = None
        self._rules: OrderedDict = OrderedDict()
        self._class_tries: OrderedDict = OrderedDict()
        self._class_masks: OrderedDict = OrderedDict()
        self._class_splits: OrderedDict = OrderedDict()
        self._with_bytes: int | None = None
        self._heads: bytes | None = None
        self._whole: int | None = None
        self._id_chars: bytes | None = None
        self.children: list[dict[int, int]] = [{}]
        children = self.children
        ends: dict[int, list[int]] = {}  # trie node -> the token ids its path spells (only while building)
        for tid, data in enumerate(token_bytes):
            if not data:
                continue
            node = 0
            for b in data:
                nxt = children[node].get(b)
                if nxt is None:
                    nxt = len(children)
                    children[node][b] = nxt
                    children.append({})
                node = nxt
            ends.setdefault(node, []).append(tid)
        # Tokens in depth-first order, so that every subtree's tokens are one slice: order[below[n]:end[n]] are the
        # tokens strictly below trie node n; sub_bytes[n] has bit b set when byte b labels an edge below n;
        # depth[n] is the longest path below n.
        n_nodes = len(children)
        self.order: list[int] = []
        self.first = [0] * n_nodes
        self.below = [0] * n_nodes
        self.end = [0] * n_nodes
        self.sub_bytes = [0] * n_nodes
        self.depth = [0] * n_nodes
        self.height = [0] * n_nodes  # the path length from the root
        stack = [(0, False)]
        while stack:
            node, done = stack.pop()
            if done:
                self.end[node] = len(self.order)
                acc, d = 0, 0
                for b, c in children[node].items():
                    acc |= (1 << b) | self.sub_bytes[c]
                    d = max(d, 1 + self.depth[c])
                self.sub_bytes[node], self.depth[node] = acc, d
                continue
            self.first[node] = len(self.order)  # order[first[n]:below[n]]: the tokens that end at node n
            self.order.extend(ends.get(node, ()))
            self.below[node] = len(self.order)
            stack.append((node, True))
            for c in children[node].values():
                self.height[c] = self.height[node] + 1
                stack.append((c, False))
        # byte length of each token in DFS order (capped at 255; the extra zero is the "not in the trie" slot)
        self.dfs_len = bytes([min(255, len(token_bytes[t])) for t in self.order] + [0])

    @classmethod
    def from_tokenizer(cls, tok, vocab_size: int | None = None) -> "TokenVocab":
        """From a webinfer Tokenizer: ByteLevel vocabularies map characters back to bytes; SentencePiece-style ones
        read "▁" as a space and "<0xNN>" as byte NN. Special tokens get no bytes (an added token that is not special
        is text: Gemma's "\\n", Qwen's "<tool_call>")."""
        n = max(vocab_size or 0, tok.vocab_size)
        return cls([tok.token_bytes(i) for i in range(n)])

    def dfs_tail(self) -> bytes:
        """utf8_tail_start of each token in DFS order (capped at 255; the extra last byte 255), once per vocabulary,
        on first use: the filter of TokenMasks' UTF-8 shortcut."""
        if self._tail is None:
            tb = self.token_bytes
            self._tail = bytes([0 if (d := tb[t]).isascii() else min(255, utf8_tail_start(d)) for t in self.order]
                               + [255])
        return self._tail

    def dfs_chars(self) -> tuple[bytes, list[int]]:
        """(each token's count of bytes that start a character (not 0x80-0xBF) in DFS order, capped at 255; the DFS
        indices of the tokens whose utf8_tail_start is not 0, ascending), once per vocabulary on first use: a chain
        walk's levels count characters."""
        if self._chars is None:
            tb = self.token_bytes
            counts = bytes([min(255, len(d) if (d := tb[t]).isascii() else len(d.translate(None, _CONT)))
                            for t in self.order] + [0])
            tail = self.dfs_tail()
            self._chars = (counts, [k for k in range(len(self.order)) if tail[k]])
        return self._chars

    def ids_to_mask(self, ids) -> int:
        ba = bytearray((self.size + 7) // 8)
        for t in ids:
            ba[t >> 3] |= 1 << (t & 7)
        return int.from_bytes(ba, "little")

    def mask_from(self, spans: list[tuple]) -> int:
        """The mask of the tokens of DFS-order slices: (lo, hi) is order[lo:hi]; (lo, hi, d) only those whose
        utf8_tail_start is <= d; (lo, hi, d, k) of those only the ones that start at most k characters. Large sets go
        order; the gather costs ~0.08 us a vocabulary token (CPython), a token read one by one ~0.2 us, ~0.5 us
        filtered: below a quarter of the vocabulary (an eighth filtered) the tokens are read one by one."""
        n = sum((sp[1] - sp[0]) * (1 if len(sp) == 2 else 2) for sp in spans)
        if n * 4 < self.size:
            ids: list[int] = []
            for sp in spans:
                if len(sp) == 2:
                    ids.extend(self.order[sp[0]:sp[1]])
                else:
                    lo, hi, d = sp[:3]
                    tail = self.dfs_tail()
                    if len(sp) > 3:
                        k, chars = sp[3], self.dfs_chars()[0]
                        ids.extend(self.order[j] for j in range(lo, hi) if tail[j] <= d and chars[j] <= k)
                    else:
                        ids.extend(self.order[j] for j in range(lo, hi) if tail[j] <= d)
            return self.ids_to_mask(ids)
        buf = bytearray(len(self.order) + 1)
        one = memoryview(b"\x01" * len(buf))
        filtered = []
        for sp in spans:
            if len(sp) == 2:
                buf[sp[0]:sp[1]] = one[: sp[1] - sp[0]]
            else:
                filtered.append(sp)
        for sp in filtered:  # OR, not overwrite: slices may overlap (walks from nested trie nodes)
            lo, hi, d = sp[:3]
            got = int.from_bytes(self.dfs_tail()[lo:hi].translate(_AT_MOST[d]), "big")
            if len(sp) > 3:
                got &= int.from_bytes(self.dfs_chars()[0][lo:hi].translate(_AT_MOST[sp[3]]), "big")
            buf[lo:hi] = (int.from_bytes(buf[lo:hi], "big") | got).to_bytes(hi - lo, "big")
        bits = self.to_id_order(buf)[::-1].translate(_BITS)
        return int(bits, 2)

    def rule_store(self, expr) -> dict:
        """The node masks of a rule without calls (by its expression), shared by every grammar on this vocabulary:
        {local node: node_info, ("chain", local node): chain walk}. LRU over RULE_CACHE rules."""
        store = self._rules.get(expr)
        if store is None:
            store = self._rules[expr] = {}
            if len(self._rules) > RULE_CACHE:
                self._rules.popitem(last=False)
        else:
            self._rules.move_to_end(expr)
        return store

    def clear_rule_cache(self) -> None:
        """Forget the shared rule and class masks (benchmarks measure a grammar whose rules the vocabulary has not
        seen)."""
        self._rules.clear()
        self._class_tries.clear()
        self._class_masks.clear()
        self._class_splits.clear()

    def _class_trie(self, cls: int, depth: int) -> "_ClassTrie":
        """The trie nodes spelled by the 256-bit byte class cls (_ClassTrie), found down to `depth` at least, by a
        walk of the trie restricted to the class and extended on demand: its cost is the class's share of the trie
        to that depth (a handful of nodes for digits; ~57k for [a-z] and ~280k for [A-Za-z0-9 ] at all depths on
        Gemma 3). Kept per vocabulary, LRU of 8 classes."""
        ct = self._class_tries.get(cls)
        if ct is None:
            ct = self._class_tries[cls] = _ClassTrie()
            if len(self._class_tries) > 8:
                self._class_tries.popitem(last=False)
        else:
            self._class_tries.move_to_end(cls)
        children, first, below, levels = self.children, self.first, self.below, ct.levels
        while len(levels) <= depth and not ct.done:
            nxt = [c for n in (levels[-1] if len(levels) > 1 else (0,)) for b, c in children[n].items() if cls >> b & 1]
            if not nxt:
                ct.done = True
                break
            levels.append(set(nxt))
            ct.counts.append(ct.counts[-1] + sum(below[n] - first[n] for n in nxt))
        return ct

    def class_prefix_mask(self, cls: int, r: int) -> int:
        """The tokens of 1..r bytes that are all in the byte class cls, as a mask (kept per vocabulary, LRU): few
        tokens from their DFS slices, many through the class's byte per token (its length, filled level by level as
        deeper levels are asked for) and one translate, at C speed."""
        key = (cls, r)
        m = self._class_masks.get(key)
        if m is not None:
            self._class_masks.move_to_end(key)
            return m
        ct = self._class_trie(cls, r)
        levels, top = ct.levels, min(r, len(ct.levels) - 1)
        if ct.counts[top] * 16 < self.size:
            m = self.mask_from([(self.first[n], self.below[n]) for h in range(1, top + 1) for n in levels[h]])
        else:
            if ct.full is None:
                ct.full = bytearray(len(self.order) + 1)
            for h in range(ct.covered + 1, top + 1):
                for n in levels[h]:
                    ct.full[self.first[n]:self.below[n]] = bytes([h]) * (self.below[n] - self.first[n])
            ct.covered = max(ct.covered, top)
            m = int(self.to_id_order(ct.full.translate(_ONE_TO[top]))[::-1].translate(_BITS), 2)
        self._class_masks[key] = m
        if len(self._class_masks) > CLASS_CACHE:
            self._class_masks.popitem(last=False)
        return m

    def class_split(self, cls: int) -> tuple[int, bytes]:
        """(the tokens whose bytes are all in the 256-bit byte class cls (>= 2 bytes), as a mask; per token id, the
        first byte outside cls of a token that starts in cls, else cls's lowest byte (all in cls) or its second
        lowest (no bytes, or the first byte outside cls)), per vocabulary, LRU of 8 classes. bytes.lstrip does the
        per-token work at C speed: ~20-40 ms for Gemma 3's 262k tokens, where a walk of the trie that [A-Za-z ]
        spells (280k nodes) takes ~0.7 s in Python."""
        got = self._class_splits.get(cls)
        if got is not None:
            self._class_splits.move_to_end(cls)
            return got
        cb = bytes(b for b in range(256) if cls >> b & 1)
        c0, c1 = cb[0], cb[1]
        firsts = bytes([(r[0] if len(r) < len(t) else c1) if (r := t.lstrip(cb)) else (c0 if t else c1)
                        for t in (t or b"" for t in self.token_bytes)])
        is_c0 = bytearray(b"0" * 256)
        is_c0[c0] = 49  # "1"
        only = int(firsts[::-1].translate(is_c0), 2)
        got = self._class_splits[cls] = (only, firsts)
        if len(self._class_splits) > 8:
            self._class_splits.popitem(last=False)
        return got

    def utf8_whole(self) -> int:
        """The tokens whose bytes are valid UTF-8 from the first, up to an unfinished last character (what a state
        that reads any character reads whole), as a mask, once per vocabulary."""
        if self._whole is None:
            self._whole = int(self.to_id_order(self.dfs_tail().translate(_AT_MOST[0]))[::-1].translate(_BITS), 2)
        return self._whole

    def id_chars(self) -> bytes:
        """Each token's count of bytes that start a character (dfs_chars), by id, once per vocabulary."""
        if self._id_chars is None:
            self._id_chars = self.to_id_order(self.dfs_chars()[0])
        return self._id_chars

    def char_count_mask(self, k: int) -> int:
        """The tokens that start at most k <= 254 characters (bytes that are not 0x80-0xBF), as a mask (kept per
        vocabulary with the class masks); tokens without bytes count none."""
        key = ("chars", k)
        m = self._class_masks.get(key)
        if m is None:
            m = self._class_masks[key] = int(self.id_chars()[::-1].translate(_AT_MOST[k]).translate(_BITS), 2)
            if len(self._class_masks) > CLASS_CACHE:
                self._class_masks.popitem(last=False)
        return m

    def token_heads(self) -> bytes:
        """Each token's first byte, by id (0 for a token without bytes), once per vocabulary."""
        if self._heads is None:
            self._heads = bytes([t[0] if t else 0 for t in self.token_bytes])
        return self._heads

    def first_byte_mask(self, bs: int) -> int:
        """The tokens whose first byte is in the 256-bit mask bs."""
        if self._with_bytes is None:
            self._with_bytes = int(bytes(49 if t else 48 for t in reversed(self.token_bytes)), 2)
        table = bytes(49 if bs >> b & 1 else 48 for b in range(256))
        return int(self.token_heads()[::-1].translate(table), 2) & self._with_bytes

    def class_nodes(self, cls: int, r: int, allowed: int) -> list[int] | None:
        """The trie nodes at depth r whose path's bytes are all in the class cls and that have a child by a byte of
        the 256-bit mask allowed (the class's level r against the per-byte parent sets); None when allowed has
        more than 16 bytes."""
        if allowed.bit_count() > 16:
            return None
        levels = self._class_trie(cls, r).levels
        if r >= len(levels):
            return []
        parents, level, out = self.parent_sets(), levels[r], set()
        while allowed:
            low = allowed & -allowed
            out |= level & parents[low.bit_length() - 1]
            allowed ^= low
        return sorted(out)

    def parent_sets(self) -> list[set]:
        """Per byte b, the trie nodes with a child by b (once per vocabulary)."""
        if self._parents is None:
            parents: list[set] = [set() for _ in range(256)]
            for n, kids in enumerate(self.children):
                for b in kids:
                    parents[b].add(n)
            self._parents = parents
        return self._parents

    def with_child(self, nodes: frozenset, allowed: int) -> frozenset:
        """The trie nodes of `nodes` that have a child by a byte of the 256-bit mask `allowed` (set intersections
        with the per-byte parent sets, built on first use; `nodes` itself when allowed has many bytes)."""
        if allowed.bit_count() > 16:
            return nodes
        parents = self.parent_sets()
        out: set = set()
        while allowed:
            low = allowed & -allowed
            out |= nodes & parents[low.bit_length() - 1]
            allowed ^= low
        return frozenset(out)

    def to_id_order(self, buf) -> bytes:
        """A byte per token in DFS order (plus the extra last byte) -> a byte per token id (tokens outside the trie
        read the extra byte)."""
        if self._gather is None:
            pos = [len(self.order)] * self.size
            for k, t in enumerate(self.order):
                pos[t] = k
            self._gather = operator.itemgetter(*pos)
        return bytes(self._gather(buf))



class _ClassTrie:
    """TokenVocab._class_trie: levels[h] (h >= 1) the trie nodes at depth h whose path's bytes are all in the class,
    counts[h] the tokens that end at levels 1..h, done once no deeper level exists; full a byte per token in DFS
    order (its length if it ends at levels 1..covered, else 0), made on first use."""
    __slots__ = ("levels", "counts", "done", "full", "covered")

    def __init__(self):
        self.levels: list[set] = [set()]
        self.counts = [0]
        self.done = False
        self.full: bytearray | None = None
        self.covered = 0


def mask_to_words(mask: int, n_words: int) -> bytes:
    """A mask as n_words little-endian u32 words (word w bit j = token 32 w + j): the GPU sampler's layout."""
    return mask.to_bytes(4 * n_words, "little")


class TokenMasks:
    """A compiled grammar bound to a vocabulary: the per-node and per-state mask caches (see the module doc)."""

    def __init__(self, grammar: CompiledGrammar, vocab: TokenVocab):
        self.g, self.vocab = grammar, vocab
        self._node: dict[int, tuple[int, frozenset]] = {}
        self._state: dict[int, int] = {}
        self._mv: dict[int, tuple] = {}
        self._chains: dict[int, tuple] = {}
        self._groups: dict[int, tuple[int, int]] = {}
        self._composing: set[int] = set()
        self._utf8: dict[int, int] = {}
        self._chain_utf8s: dict[int, tuple | None] = {}
        self._run_steps: dict[int, tuple | None] = {}
        self._runs: dict[int, tuple | None] = {}
        self._node_steps: dict[int, tuple | None] = {}
        self._node_runs: dict[int, tuple | None] = {}
        self._char_runs: dict[int, tuple | None] = {}
        self._reps: dict[str, list[int]] = {}
        with vocab.lock:  # (the rule stores' LRU is shared with compiles in other threads)
            self._stores = {n: vocab.rule_store(e) for n, e in grammar.plain_rules.items()}
        self.warmed = False

    def _moves(self, sid: int) -> tuple[list[tuple[int, int]], int, int]:
        """(every (byte, next state) from sid, the largest set of bytes that share one next state, that state).
        Inside a string the shared set is every ordinary character (and the next state sid itself, or the next
        count when the length is bounded)."""
        mv = self._mv.get(sid)
        if mv is None:
            g = self.g
            cand, moves, m = g.allowed_bytes(sid), [], 0
            while cand:
                low = cand & -cand
                b = low.bit_length() - 1
                cand ^= low
                t = g.step(sid, b)
                if t >= 0:
                    moves.append((b, t))
                    m |= low
            nx = g._next[sid]
            dead = _DEAD.get(m)
            if dead is None:
                if len(_DEAD) > 4096:
                    _DEAD.clear()
                dead = _DEAD[m] = dict.fromkeys((b for b in range(256) if not m >> b & 1), -1)
            nx.update(dead)  # every byte now has an entry: the walk reads nx[b] directly
            groups: dict[int, int] = {}
            for b, t in moves:
                groups[t] = groups.get(t, 0) | (1 << b)
            best = max(groups.items(), key=lambda kv: kv[1].bit_count(), default=(-1, 0))
            mv = self._mv[sid] = (moves, best[1], best[0])
        return mv

    def _utf8_bytes(self, sid: int) -> int:
        """The bytes of a state that reads characters in a loop (inside a JSON string, a `.*`), as a 256-bit mask:
        a set S of states (the loop's, equivalent states of an unminimised DFA included) such that from sid and from
        every state of S each ASCII byte of the mask and each valid UTF-8 character leads into S, invalid UTF-8
        dies, and no state of S nor inside a character may end the rule. Then a token whose bytes are all in the
        mask is readable from sid exactly when they are valid UTF-8 up to a last unfinished character. 0 when sid
        is not such a state (checked on the DFA, once per state)."""
        got = self._utf8.get(sid)
        if got is None:
            stacks = self.g.states[sid]
            top = sid
            if len(stacks) == 1 and len(st := next(iter(stacks))) > 1:
                # a loop that never ends its rule never reaches the callers below it: decide on the top alone (a
                # top that may end here lets the caller read on: not such a loop)
                top = self.g.intern(frozenset([st[-1:]]))
                got = 0 if self.g.can_end[st[-1]] else self._utf8.get(top)
            if got is None:
                # most states read no characters, or not all of them: a superset of their bytes says so cheaply
                if self.g.allowed_bytes(top) & _NON_ASCII != _VALID[0] & _NON_ASCII:
                    got = 0
                elif self._runs_into_new_states(top):  # (minLength): _char_run's path, not a loop
                    got = 0
                else:
                    got = self._check_utf8(top)
                self._utf8[top] = got
            self._utf8[sid] = got
        return got

    def _check_utf8(self, sid: int, max_states: int = 64) -> int:
        can_end, moves = self.g.state_can_end, self._moves
        reads: dict[int, dict[int, int]] = {}

        def read(q: int) -> dict[int, int]:  # byte -> next state, every byte q can read
            r = reads.get(q)
            if r is None:
                r = reads[q] = dict((self._mv.get(q) or moves(q))[0])
            return r

        ascii_ = 0
        for b, t in read(sid).items():
            if b < 0x80 and not can_end[t]:
                ascii_ |= 1 << b
        while ascii_:
            # the states reachable from sid by the ASCII bytes and whole characters. A state that does not read all
            # those bytes back into the set, or characters as UTF-8 does (a string's escape state), is "short": the
            # bytes that lead to it from the others (the backslash) are dropped, and the walk starts again
            todo, short, edges = [sid], {sid: False}, []
            while todo:
                q = todo.pop()
                r = read(q)
                nxt = []
                for b in range(0x80):
                    if ascii_ >> b & 1:
                        t = r.get(b)
                        if t is None or can_end[t]:
                            short[q] = True
                        else:
                            nxt.append((t, 1 << b))
                chars = _one_character(read, can_end.__getitem__, q)
                if chars is None:
                    short[q] = True
                else:
                    nxt += [(t, 0) for t in chars[0]]
                for t, by in nxt:
                    edges.append((q, t, by))
                    if t not in short:
                        if len(short) >= max_states:
                            return 0
                        short[t] = False
                        todo.append(t)
            if not any(short.values()):
                return ascii_ | _NON_ASCII
            drop = 0
            for q, t, by in edges:
                if short[t] and not short[q]:
                    if not by:
                        return 0  # a whole character leads to a short state
                    drop |= by
            if short[sid] or not drop:
                return 0
            ascii_ &= ~drop
        return 0

    def _walk(self, sid: int, roots, spans: list, unc: list | None) -> None:
        """Walk the trie below each node of `roots` from state sid: tokens readable to their end go to spans (as
        DFS-order slices); with `unc`, the trie nodes (with children) where the state may end go there instead of
        being read further.

        Two shortcuts keep this fast in Python: a subtree is taken whole (one slice of the DFS order) when, level by
        level down to its depth, all its bytes lead to one shared next state (ordinary characters inside a string,
        bounded or not); and where a state allows fewer bytes than a trie node has children, the allowed bytes are
        looked up instead of the children being scanned. Where a state reads characters in a loop (_utf8_bytes) and a
        subtree's bytes all stay in it, the subtree is taken whole too, filtered by its tokens' UTF-8 validity
        (vocabularies of many multi-byte tokens, Gemma's and Qwen's, defeat the first shortcut); where it reads at
        most k more characters (_char_run: a minLength string), filtered by their character counts as well."""
        g, v = self.g, self.vocab
        nexts, can_end = g._next, g.state_can_end
        children, sub_bytes, depth, height = v.children, v.sub_bytes, v.depth, v.height
        first, below, end = v.first, v.below, v.end
        mvs, moves, utf8, runs = self._mv, self._moves, self._utf8, self._char_runs
        todo = [(t, sid) for t in roots]
        while todo:
            tn, s = todo.pop()
            kids = children[tn]
            mv = mvs.get(s) or moves(s)
            if unc is not None and can_end[s]:  # the rule may end here (the caller reads on) or go on
                unc.append(tn)
            elif kids:
                if len(kids) > 1 and mv[1]:
                    sb, cur, d = sub_bytes[tn], s, depth[tn]
                    while d:
                        m = mvs.get(cur) or moves(cur)
                        if sb & ~m[1] or (unc is not None and can_end[m[2]]):
                            break
                        cur = m[2]
                        d -= 1
                    if not d:
                        spans.append((below[tn], end[tn]))
                        continue
                if sub_bytes[tn] >> 128 and height[tn] + depth[tn] < 255:
                    run = runs.get(s, 0)
                    if run == 0:
                        run = runs[s] = self._char_run(s)
                    if run is not None and run[1] < INF:
                        # a bounded run (a minLength string; no loop: _utf8_bytes would search 64 states to say so):
                        # its tokens filtered by validity and by how many characters they start, at most the run's
                        # k more than the path to tn (children by a continuation byte: the filter drops them too)
                        if not sub_bytes[tn] & ~(run[0] | _NON_ASCII):
                            h = height[tn]
                            top = len(v.token_bytes[v.order[below[tn]]][:h].translate(None, _CONT)) + run[1]
                            if top < 255:
                                for b, c in kids.items():
                                    if not 0x80 <= b < 0xC0:
                                        spans.append((first[c], end[c], h, top))
                                continue
                    else:
                        ub = utf8.get(s)
                        if ub is None:
                            ub = self._utf8_bytes(s)
                        if ub and not sub_bytes[tn] & ~ub:  # the whole subtree reads in a character loop: its
                            h = height[tn]  # tokens filtered by UTF-8 validity (a child by a continuation byte dies)
                            for b, c in kids.items():
                                if not 0x80 <= b < 0xC0:
                                    spans.append((first[c], end[c], h))
                            continue
            if len(mv[0]) < len(kids):
                pairs = [(c, t) for b, t in mv[0] if (c := kids.get(b)) is not None]
            else:
                nx = nexts[s]
                pairs = [(c, t) for b, c in kids.items() if (t := nx[b]) >= 0]
            for child, s2 in pairs:
                if first[child] < below[child]:
                    spans.append((first[child], below[child]))
                if children[child]:
                    todo.append((child, s2))

    def node_info(self, node: int) -> tuple[int, frozenset]:
        """(context-independent accepted tokens as a mask, trie nodes where the node's rule may end)."""
        info = self._node.get(node)
        if info is None:
            with self.vocab.lock:
                info = self._node_info(node)
        return info

    def _node_info(self, node: int) -> tuple[int, frozenset]:
        info = self._node.get(node)
        if info is None:
            g = self.g
            rule = g.rule_of[node]
            store, local = self._stores.get(rule), node - g.start[rule]
            info = store.get(local) if store is not None else None
            if info is None:
                rep = self._rep(rule, local) if store is not None else local
                if rep != local:
                    info = self._node_info(g.start[rule] + rep)
                elif node in g.chain_of:
                    root, i = g.chain_of[node]
                    levels, uncs = self._chain(root)
                    m = levels[i] if isinstance(levels, list) else int(levels.translate(_AT_LEAST[i]), 2)
                    info = (m, uncs[i])
                else:
                    info = self._compose(node) or self.walk_node(node)
                if store is not None:
                    store[local] = info
            self._node[node] = info
        return info

    def _rep(self, rule: str, local: int) -> int:
        """The first node of `rule` (local numbering) whose node_info equals local's because the two read the same
        bytes for as long as a token can be (the longest token's length): a string of minLength 300 has ~25 nodes a
        character, and those more than a token's length from the end share their masks (7,559 nodes, ~1,250 masks
        on Gemma 3). Moore's partition refinement, one round per byte of depth; rules without calls only (their
        nodes' futures are fixed by their expression), and big ones only (MERGE_MIN_NODES)."""
        reps = self._reps_of(rule)
        return reps[local] if reps else local

    def prepare(self, deadline: float | None = None, clock=time.monotonic) -> int:
        """Find the nodes that share masks (_rep) in every big rule without calls now, outside the vocabulary's lock
        (it reads only the grammar); the number of nodes whose masks remain to compute. TimeoutError past deadline."""
        for rule in self._stores:
            self._reps_of(rule, deadline, clock)
        return self.g.n_nodes - sum(len(r) - len(set(r)) for r in self._reps.values())

    def _reps_of(self, rule: str, deadline: float | None = None, clock=time.monotonic) -> list[int]:
        """_classes of a rule, once per vocabulary (kept in the rule's store; [] for a small rule)."""
        reps = self._reps.get(rule)
        if reps is None:
            store = self._stores[rule]
            reps = store.get("reps")
            if reps is None:
                reps = self._classes(rule, deadline, clock)
                with self.vocab.lock:
                    reps = store.setdefault("reps", reps)
            self._reps[rule] = reps
        return reps

    def _classes(self, rule: str, deadline: float | None = None, clock=time.monotonic) -> list[int]:
        g = self.g
        o = g.start[rule]
        n = (g.start[g.rule_names[g.rule_names.index(rule) + 1]] if rule != g.rule_names[-1] else g.n_nodes) - o
        if n < MERGE_MIN_NODES:
            return []
        trans = []  # per node: (bytes, target) by first byte, the same order every round
        for k in range(o, o + n):
            into: dict[int, int] = {}
            for b, t in g.bytes[k].items():
                into[t - o] = into.get(t - o, 0) | 1 << b
            trans.append(sorted((m, t) for t, m in into.items()))
        cls = [int(g.accept[k]) + 2 * int(g.can_end[k]) for k in range(o, o + n)]
        count = len(set(cls))
        for _ in range(self.vocab.max_len + 1):  # after round r equal classes read the same r bytes alike
            if deadline is not None and clock() > deadline:
                raise TimeoutError
            ids: dict[tuple, int] = {}
            cls = [ids.setdefault((c, *[(m, cls[t]) for m, t in tr]), len(ids)) for c, tr in zip(cls, trans)]
            if len(ids) == count:  # stable: no later round splits a class
                break
            count = len(ids)
        first: dict[int, int] = {}
        return [first.setdefault(c, k) for k, c in enumerate(cls)]

    def _chain(self, root: int) -> tuple:
        fam = self._chains.get(root)
        if fam is None:
            with self.vocab.lock:
                rule = self.g.rule_of[root]
                store, key = self._stores.get(rule), ("chain", root - self.g.start[rule])
                fam = store.get(key) if store is not None else None
                if fam is None:
                    fam = self._chain_walk(root)
                    if store is not None:
                        store[key] = fam
                self._chains[root] = fam
        return fam

    def _compose(self, node: int) -> tuple[int, frozenset] | None:
        """node_info of a node that may start by calling rules, from its callees' node_info instead of a walk through
        them (a JSON value's strings, an identifier in a GBNF call): a token is readable from {(node,)} exactly when
        it is readable along one of the first moves, because a state's step is the union of its stacks' steps. So:
        the node's own first bytes (a walk from each successor), plus per call (callee start cs, return r): cs's mask,
        and a walk from {(r,)} of the trie nodes where cs may end. None when no call starts the node, or when a
        callee is still being composed (left recursion: walk_node then names it)."""
        g, v = self.g, self.vocab
        eps = g.eps(node)
        calls = [c for k in eps for c in g.calls[k]]
        if not calls or node in self._composing:
            return None
        self._composing.add(node)
        try:
            infos = []
            for cs, r in calls:
                info = self.node_info(cs) if cs not in self._composing else None
                if info is None:
                    return None
                infos.append(info)
        finally:
            self._composing.discard(node)
        spans: list[tuple[int, int]] = []
        unc: list[int] = [0] if g.state_can_end[g.intern(frozenset([(node,)]))] else []
        m = 0
        root_kids = v.children[0]
        for k in eps:
            into: dict[int, int] = {}  # next node -> the first bytes that lead to it
            for b, t in g.bytes[k].items():
                into[t] = into.get(t, 0) | 1 << b
            for t, lead in into.items():
                st = g.intern(frozenset([(t,)]))
                loop = self._class_loop(st) if lead.bit_count() > 1 else None
                if loop is not None and loop[1] == loop[0] and not lead & ~loop[0]:  # ([a-z_] into [a-z0-9_]*)
                    lm, lu = self._loop_tokens(st, *loop, lead=lead) or (None, None)
                    if lm is not None:
                        m |= lm
                        unc.extend(lu)
                        continue
                while lead:
                    low = lead & -lead
                    lead ^= low
                    c = root_kids.get(low.bit_length() - 1)
                    if c is None:
                        continue
                    if v.first[c] < v.below[c]:
                        spans.append((v.first[c], v.below[c]))
                    if v.children[c]:
                        self._walk(st, (c,), spans, unc)
        for (cs, r), (acc, ends) in zip(calls, infos):
            m |= acc
            if ends:
                after = g.intern(frozenset([(r,)]))
                if g.state_can_end[after]:  # where the callee ends, so may this rule
                    unc.extend(ends)
                if len(ends) > FILTER_UNC:
                    ends = v.with_child(ends, g.allowed_bytes(after))
                self._walk(after, ends, spans, unc)
        return m | v.mask_from(spans), frozenset(unc)

    def walk_node(self, node: int) -> tuple[int, frozenset]:
        """node_info by a walk of the trie from this node alone (uncached; chain members share one walk instead).
        A node that reads exactly r bytes of one class first (a pattern's `[a-z]{12}`: not a shift chain, its
        continuation comes after exactly r) takes the tokens of up to r class bytes from the vocabulary's class
        mask and walks on only from the trie nodes at depth r where the next state reads on (_class_run); the
        byte-by-byte walk would visit every trie node spelled by the class, ~40 ms a node on Gemma 3's trie. A node
        that reads a class in a loop (`[a-z]+`) takes the class's tokens from the vocabulary's class split and reads
        only the tokens that leave the class by a byte the loop's states read on (_class_loop, _loop_tokens): its
        walk took 80 ms on Gemma 3 for [A-Za-z ] even with the subtree shortcut. A node that reads characters (a
        JSON string's, bounded by minLength / maxLength or not) does the same with its characters (_char_run,
        _run_tokens): the walk of a string's node that must read three more characters took 0.7 s on Gemma 3."""
        unc: list[int] = []
        spans: list[tuple[int, int]] = []
        sid = self.g.intern(frozenset([(node,)]))
        run = self._class_run(sid)
        if run is not None:
            cls, r, after = run
            roots = self.vocab.class_nodes(cls, r, self.g.allowed_bytes(after))
            if roots is not None:
                self._walk(after, roots, spans, unc)
                return self.vocab.class_prefix_mask(cls, r) | self.vocab.mask_from(spans), frozenset(unc)
        loop = self._class_loop(sid)
        if loop is not None:
            got = self._loop_tokens(sid, *loop)
            if got is not None:
                return got
        chars = self._char_run(sid)
        if chars is not None:
            got = self._run_tokens(sid, *chars)
            if got is not None:
                return got
        self._walk(sid, (0,), spans, unc)
        return self.vocab.mask_from(spans), frozenset(unc)

    def _class_loop(self, sid: int) -> tuple[int, int, int, int] | None:
        """(cls, first, head exits, exits) when state sid reads bytes of one ASCII class cls through states sid = s0,
        s1, ... into a state that reads every byte of cls back into itself (a pattern's `[a-z]+`,
        `[A-Za-z_][A-Za-z0-9_]*`), at most 5 states before the loop: s0 takes the bytes `first` of cls (all of them
        where s0 is the loop) to s1 and no other byte of cls anywhere, each later state all of cls to the next, none
        of them may end the rule, and the other bytes they read are at most 16, all ASCII: s0's (head exits: a
        token's first byte) and the later states' (exits: after one class byte or more; s0's own where s0 is the
        loop). None otherwise, and for a class that spells few trie nodes (fewer than LOOP_MIN_PAIRS of two bytes: digits, whitespace), where the
        walk is cheaper than the class's split (TokenVocab.class_split, ~20-35 ms once per class on a 262k
        vocabulary)."""
        g = self.g
        can_end, nexts, chain_of, path, cur = g.state_can_end, g._next, g.chain_of, [], sid
        while len(path) < 6 and not can_end[cur] and cur not in path:
            # after s0 every state reads all of cls, >= 2 bytes, to one state (allowed_bytes: a cheap superset), and
            # none is in a bounded repetition (a shift chain: white space, a maxLength string; ~15 states deep)
            if path and cur not in self._mv and (g.allowed_bytes(cur).bit_count() < 2
                                                 or any(st[-1] in chain_of for st in g.states[cur])):
                return None
            moves, shared, nxt = self._mv.get(cur) or self._moves(cur)
            if path and shared.bit_count() < 2:
                return None
            path.append(cur)
            cls = 0
            for b, t in moves:
                if t == cur:
                    cls |= 1 << b
            if cls.bit_count() < 2:
                if nxt < 0:
                    return None
                cur = nxt
                continue
            heads = exits = 0
            for i, q in enumerate(path):
                for b, _ in self._mv[q][0]:
                    if i == 0:
                        heads |= 1 << b
                    if i or len(path) == 1:
                        exits |= 1 << b
            heads &= ~cls
            exits &= ~cls
            if (cls | heads | exits) >> 128 or (heads | exits).bit_count() > 16:
                return None
            first = cls
            for i, (q, q2) in enumerate(zip(path, path[1:])):
                c = cls
                while c:
                    low = c & -c
                    t = nexts[q][low.bit_length() - 1]
                    if t != q2:
                        if i or t >= 0:
                            return None
                        first ^= low  # s0 does not read this byte of cls
                    c ^= low
            levels = self.vocab._class_trie(cls, 2).levels
            if not first or len(levels) < 3 or len(levels[2]) < LOOP_MIN_PAIRS:
                return None
            return cls, first, heads, exits
        return None

    def _loop_tokens(self, sid: int, cls: int, first: int, heads: int, exits: int,
                     lead: int = 0) -> tuple[int, frozenset] | None:
        """walk_node's result for a class loop (_class_loop) without walking the trie its class spells: a token is
        readable exactly when its bytes are all in cls and the first is in `first` (the vocabulary's class masks),
        or when it starts with a head exit, or starts in cls and leaves it by an exit, and its bytes read from sid
        one by one: few tokens, found in the vocabulary's per-token first bytes (TokenVocab.class_split,
        token_heads). With `lead` (bytes of cls; first == cls): the tokens that start with one of them and read on
        from sid after it (_compose: a node's first bytes that lead to sid); s0's exits then come after a class
        byte. None (walk instead) when those tokens are a quarter of the vocabulary."""
        v = self.vocab
        only, firsts = v.class_split(cls)
        if first != cls or lead:
            only &= v.first_byte_mask(lead or first)
        if lead:
            exits, heads = exits | heads, 0
        hits = _positions(firsts, exits) + _positions(v.token_heads(), heads)
        if len(hits) * 4 > v.size:
            return None
        ids, unc = self._read_tokens(sid, hits, lead)
        return only | v.ids_to_mask(ids), frozenset(unc)

    def _read_tokens(self, sid: int, hits, lead: int = 0) -> tuple[list[int], set[int]]:
        """Read the tokens `hits` from state sid byte by byte (with `lead`: only those whose first byte is in it,
        read from their second): (the ids read to their end, the trie nodes with children where the rule may end
        inside one of them)."""
        v = self.vocab
        can_end, nexts, mvs, children = self.g.state_can_end, self.g._next, self._mv, v.children
        ids: list[int] = []
        unc: set[int] = set()
        skip = 1 if lead else 0
        for t in hits:
            data, q = v.token_bytes[t], sid
            if not data or (lead and not lead >> data[0] & 1):
                continue
            for j in range(skip, len(data)):
                if q not in mvs:
                    self._moves(q)  # fills nexts[q] for every byte
                q = nexts[q][data[j]]
                if q < 0:
                    break
                if can_end[q] and j + 1 < len(data):  # the rule may end after j + 1 bytes, inside the token:
                    n = 0  # the caller reads on from that trie node (as _walk, only nodes with children)
                    for c in data[:j + 1]:
                        n = children[n][c]
                    unc.add(n)
            else:
                ids.append(t)
        return ids, unc

    def _run_step(self, q: int) -> tuple[int, int, int] | None:
        """One state of a character run (_char_run): (asc, other, nxt) when q reads every valid UTF-8 character into
        one state nxt, the ASCII bytes asc into nxt too and the ASCII bytes other elsewhere, and neither q nor a
        state inside a character may end the rule; (0, the bytes q reads, -1) when q reads no non-ASCII byte (the
        run's bound) and may not end the rule; else None. Once per state."""
        got = self._run_steps.get(q, 0)
        if got == 0:
            g, got = self.g, None
            if not g.state_can_end[q]:
                moves = (self._mv.get(q) or self._moves(q))[0]
                chars = None
                if g.allowed_bytes(q) >> 128:
                    chars = _one_character(lambda y: dict((self._mv.get(y) or self._moves(y))[0]),
                                           g.state_can_end.__getitem__, q)
                got = _run_step(moves, chars)
            self._run_steps[q] = got
        return got

    def _node_step(self, a: int) -> tuple[int, int, int] | None:
        """_run_step of node a of a rule without calls, on the rule's DFA alone (a state of one stack whose top is
        a reads as a does while no node on the way may end the rule): dict lookups instead of the stack-set
        states' steps, ~5x cheaper (a 100-character string builds ~3,000 of them)."""
        got = self._node_steps.get(a, 0)
        if got == 0:
            g, got = self.g, None
            if not g.can_end[a]:
                nb = g.bytes[a]
                chars = None
                if any(b >= 0x80 for b in nb):
                    chars = _one_character(g.bytes.__getitem__, g.can_end.__getitem__, a)
                got = _run_step(nb.items(), chars)
            self._node_steps[a] = got
        return got

    def _run_summary(self, q: int, step, runs: dict) -> tuple[int, int, int, int] | None:
        """From q (a state, or a node: step is _run_step or _node_step, runs its memo) along its character run to
        the bound or around its loop: (the ASCII bytes every state before the bound reads into the run, the ASCII
        bytes any of them or the bound reads, the bound's bytes (0 in a loop), the characters up to the bound (INF
        in a loop)), or None when a state on the way is not a run state. Iterative, once per state: a
        minLength-2000 string is 2000 states long."""
        path: list[int] = []
        pos: dict[int, int] = {}
        x = q
        while x not in runs:
            if x in pos:  # around a loop: every state on it reads the same characters, without bound
                cyc = path[pos[x]:]
                inter, union = _ASCII, 0
                for y in cyc:
                    asc, other, _ = step(y)
                    inter &= asc
                    union |= asc | other
                for y in cyc:
                    runs[y] = (inter, union, 0, INF)
                del path[pos[x]:]
                break
            got = step(x)
            if got is None:
                runs[x] = None
                break
            if got[2] < 0:
                runs[x] = (_ASCII, got[1], got[1], 0)
                break
            pos[x] = len(path)
            path.append(x)
            x = got[2]
        for y in reversed(path):
            asc, other, nxt = step(y)
            after = runs[nxt]
            runs[y] = None if after is None else (asc & after[0], asc | other | after[1], after[2],
                                                  min(INF, after[3] + 1))
        return runs[q]

    def _char_run(self, sid: int) -> tuple[int, int, int] | None:
        """(A, K, E) when state sid reads characters (every valid UTF-8 character and the ASCII bytes A) one after
        the other through states that read them all into the next, at most K of them (INF: a loop) up to a bound
        that reads none of them, none of these states nor any inside a character able to end the rule, and the
        other bytes they read are the at most 16 ASCII bytes E (a JSON string's quote and backslash). Then a token
        whose bytes are all in A or non-ASCII is readable from sid exactly when it is valid UTF-8 up to an
        unfinished last character and starts at most K characters, and any other token only when its first byte
        outside them is in E (_run_tokens)."""
        g = self.g
        if g.allowed_bytes(sid) & _NON_ASCII != _VALID[0] & _NON_ASCII:  # a cheap superset first
            return None
        step, runs, x = self._run_head(sid)
        s = self._run_summary(x, step, runs)
        if s is None:
            return None
        asc, _, nxt = step(x)
        if nxt < 0:  # x is a bound
            return None
        after = runs[nxt]
        if asc & ~after[0] or asc & after[2]:  # a later state or the bound reads a byte of A elsewhere
            return None
        exits = s[1] & ~asc
        return (asc, s[3], exits) if exits.bit_count() <= 16 else None

    def _runs_into_new_states(self, sid: int) -> bool:
        """sid starts a run of characters (_char_run) whose next state is another one. Asked on a rule's DFA nodes,
        or where the run is known already: computing a stack-set state's run costs ~3 ms, more than it saves."""
        step, runs, x = self._run_head(sid)
        return (step == self._node_step or x in runs) and self._char_run(sid) is not None and step(x)[2] != x

    def _run_head(self, sid: int) -> tuple:
        """(step, its memo, the node or state it steps from) for state sid: the rule's DFA node when sid is one node
        of a rule without calls (dict lookups), the state otherwise."""
        g = self.g
        stacks = g.states[sid]
        x = next(iter(stacks))[-1] if len(stacks) == 1 else -1
        if x >= 0 and g.rule_of[x] in g.plain_rules:
            return self._node_step, self._node_runs, x
        return self._run_step, self._runs, sid

    def _run_tokens(self, sid: int, asc: int, k: int, exits: int) -> tuple[int, frozenset] | None:
        """walk_node's result for a character run (_char_run) without walking the trie: the tokens of valid UTF-8
        and ASCII bytes of asc, of at most k characters, from the vocabulary's masks (class split, UTF-8 validity,
        character counts), and the few that leave them by an exit byte, read byte by byte. None (walk instead)
        when those are a quarter of the vocabulary."""
        v = self.vocab
        only, firsts = v.class_split(asc | _NON_ASCII)
        only &= v.utf8_whole()
        hits = _positions(firsts, exits) + _positions(v.token_heads(), exits)
        if k < INF:
            only &= v.char_count_mask(min(k, 254))
            if k > 254:  # a token of 255 characters or more (the counts stop at 255): read it byte by byte
                hits += [m.start() for m in re.finditer(b"\xff", v.id_chars())]
        if len(hits) * 4 > v.size:
            return None
        ids, unc = self._read_tokens(sid, hits)
        return only | v.ids_to_mask(ids), frozenset(unc)

    def _class_run(self, sid: int) -> tuple[int, int, int] | None:
        """(cls, r, state after) when state sid reads r >= 2 bytes one after the other, each any byte of one
        class cls and nothing else, through states none of which (nor the one after) may end the rule; else None.
        Then a token is readable from sid exactly when it is 1..r class bytes, or r class bytes and a rest the
        state after reads."""
        can_end, cur, cls, r = self.g.state_can_end, sid, 0, 0
        while r < 254:
            if can_end[cur]:
                return None
            moves, shared, nxt = self._mv.get(cur) or self._moves(cur)
            if not moves or len(moves) != shared.bit_count() or (r and shared != cls) or nxt == cur:
                break  # it reads several sets, another class, nothing, or loops
            cls, cur, r = shared, nxt, r + 1
        return (cls, r, cur) if r >= 2 and not can_end[cur] else None

    def _chain_walk(self, root: int) -> tuple:
        """node_info of every member of the chain that starts at `root` (CompiledGrammar._shift_chains), from one
        walk of the trie: each token (and each trie node where the rule may end) gets the smallest level met on its
        path, and member i takes those of level i or above.

        As in _walk, a subtree is taken whole when, level by level down to its depth, all its bytes lead to one node
        (ordinary characters of a string); its tokens' levels then depend only on their length, which one translate
        of the vocabulary's DFS-order lengths writes."""
        g, v = self.g, self.vocab
        level, nbytes, accept = g.level, g.bytes, g.accept
        groups, group = self._groups, self._group
        children, first, below, end = v.children, v.first, v.below, v.end
        sub_bytes, depth, height, dfs_len = v.sub_bytes, v.depth, v.height, v.dfs_len
        top = min(level[root], MAX_CHAIN - 1)
        buf = bytearray(len(v.order) + 1)
        fill = [bytes([lv + 1]) * 256 for lv in range(top + 1)]
        uncs: list[list] = [[] for _ in range(top + 1)]
        todo = [(0, root, top)]
        spans = []  # the DFS-order slices written
        while todo:
            tn, a, lv = todo.pop()
            if accept[a]:
                uncs[lv].append(tn)
            kids, ba = children[tn], nbytes[a]
            if len(kids) > 1 and (groups.get(a) or group(a))[0] and height[tn] + depth[tn] < 256:
                sb, cur, d, lvs, lj = sub_bytes[tn], a, depth[tn], [], lv
                while d:
                    gm, t = groups.get(cur) or group(cur)
                    if sb & ~gm or accept[t]:
                        break
                    lt = level.get(t, 0)
                    lj = lt if lt < lj else lj  # min() without a call: this runs per trie edge
                    lvs.append(lj + 1)
                    cur = t
                    d -= 1
                if not d:
                    lo, hi, h = below[tn], end[tn], height[tn] + 1
                    table = bytearray(256)
                    table[h:h + len(lvs)] = bytes(lvs)
                    buf[lo:hi] = dfs_len[lo:hi].translate(table)
                    spans.append((lo, hi))
                    continue
            if kids and sub_bytes[tn] >> 128 and height[tn] + depth[tn] < 255:
                cu = self._chain_utf8s.get(a, 0)
                if cu == 0:
                    cu = self._chain_utf8s[a] = self._chain_utf8(a)
                if cu is not None and not sub_bytes[tn] & ~cu[0]:
                    # every token below reads as characters from a: its level is that of the node after as many
                    # characters as it starts, if it is valid UTF-8 from here (as in _walk's UTF-8 shortcut)
                    chars, bad = v.dfs_chars()
                    lo, hi, h = below[tn], end[tn], height[tn]
                    cp = len(v.token_bytes[v.order[lo]][:h].translate(None, _CONT))  # characters above tn
                    table = bytearray(256)
                    for k, lk in enumerate(cu[1]):  # lk: the level after k + 1 characters
                        if cp + k + 1 < 256:
                            table[cp + k + 1] = (lk if lk < lv else lv) + 1
                    buf[lo:hi] = chars[lo:hi].translate(table)
                    tail = v.dfs_tail()
                    for k in bad[bisect.bisect_left(bad, lo):bisect.bisect_left(bad, hi)]:
                        if tail[k] > h:
                            buf[k] = 0  # not valid UTF-8 from here: no member reads it
                    spans.append((lo, hi))
                    continue
            if len(ba) < len(kids):
                pairs = [(c, t) for b, t in ba.items() if (c := kids.get(b)) is not None]
            else:
                pairs = [(c, t) for b, c in kids.items() if (t := ba.get(b)) is not None]
            for c, t in pairs:
                lt = level.get(t, 0)
                lc = lt if lt < lv else lv
                n = below[c] - first[c]
                if n:
                    buf[first[c]:below[c]] = fill[lc][:n] if n < 256 else bytes([lc + 1]) * n
                    spans.append((first[c], below[c]))
                if children[c]:
                    todo.append((c, t, lc))
        unc_lists, u = [], frozenset()
        for lv in range(top, -1, -1):
            u = u.union(uncs[lv]) if uncs[lv] else u
            unc_lists.append(u)
        if sum(hi - lo for lo, hi in spans) * 16 < v.size:  # few tokens: every member's mask now, from id lists
            ids: list[list[int]] = [[] for _ in range(top + 1)]
            order = v.order
            for lo, hi in spans:
                for k in range(lo, hi):
                    if buf[k]:  # 0: a token of a UTF-8 subtree that no member reads
                        ids[buf[k] - 1].append(order[k])
            levels, m = [], 0
            for lv in range(top, -1, -1):
                m |= v.ids_to_mask(ids[lv]) if ids[lv] else 0
                levels.append(m)
            levels.reverse()
        else:  # kept as a byte per token id (reversed: the digits' order); members translate it on first use
            levels = v.to_id_order(buf)[::-1]
        return levels, unc_lists[::-1]

    def _chain_utf8(self, a: int) -> tuple[int, list[int]] | None:
        """For a chain walk's UTF-8 shortcut at plain node a: (a 256-bit mask of bytes: some ASCII and every
        non-ASCII, levels) when from a each character (the mask's ASCII bytes, valid UTF-8 sequences) leads to one
        next node, the same for all, and so on from there, until a node that reads none of them: so a token whose
        bytes are in the mask is read exactly when it is valid UTF-8, and ends at the node after as many characters
        as it starts (or inside that character, where every node has that node's level). levels[k]: the smallest
        level (g.level, 0 when absent) from a through the k + 1st character (up to 255 characters). No node on the
        way may accept (the rule would end inside a token). None when a is not such a node."""
        g = self.g
        nbytes, accept, level = g.bytes, g.accept, g.level
        mask, levels, x, run = 0, [], a, level.get(a, 0)
        while len(levels) < 255:
            nb = nbytes[x]
            if not any(b >= 0x80 for b in nb):  # the bound: no character reads on (ASCII bytes of the mask must stop too)
                if not levels or any(mask >> b & 1 for b in nb):
                    return None
                break
            chars = _one_character(nbytes.__getitem__, accept.__getitem__, x)
            if chars is None or len(set(chars[0])) != 1:  # every character must lead to one next node
                return None
            nxt, lows = chars[0][0], {level.get(t, 0) for t, _ in chars[1]}
            asc = 0
            for b, t in nb.items():
                if b < 0x80 and t == nxt:
                    asc |= 1 << b
            if not levels:
                mask = asc
                if not mask:
                    return None
            elif mask & ~asc:
                return None
            lvl = level.get(nxt, 0)
            if lows - {lvl}:  # inside a character every node has the level of the node after it
                return None
            run = min(run, lvl)
            levels.append(run)
            x = nxt
        return mask | _NON_ASCII, levels

    def _group(self, node: int) -> tuple[int, int]:
        """The largest set of bytes that lead from node to one node, and that node ((0, -1) when it reads none)."""
        gr = self._groups.get(node)
        if gr is None:
            sets: dict[int, int] = {}
            for b, t in self.g.bytes[node].items():
                sets[t] = sets.get(t, 0) | (1 << b)
            t, m = max(sets.items(), key=lambda kv: kv[1].bit_count(), default=(-1, 0))
            gr = self._groups[node] = (m, t)
        return gr

    def warm(self, deadline: float | None = None, clock=time.monotonic) -> None:
        """Compute every node's context-independent mask now (compile time) instead of on first use; chain members
        only get their chain's walk (each member's mask is then one translate away). TimeoutError once clock()
        passes deadline (checked between nodes); what was computed stays valid."""
        chain_of = self.g.chain_of
        self.vocab.parent_sets()
        for n in range(self.g.n_nodes):
            if deadline is not None and clock() > deadline:
                raise TimeoutError
            if n in chain_of:
                self._chain(chain_of[n][0])
            else:
                self.node_info(n)
        self.warmed = True

    def mask(self, sid: int) -> int:
        """Tokens whose bytes can be read in state sid (end-of-sequence tokens are the matcher's business)."""
        m = self._state.get(sid)
        if m is None:
            with self.vocab.lock:
                m = self._mask(sid)
        return m

    def _mask(self, sid: int) -> int:
        m = 0
        spans: list[tuple[int, int]] = []
        callers: dict[tuple, frozenset] = {}  # stacks that differ only in their top share the caller's walk
        for st in self.g.states[sid]:
            acc, unc = self.node_info(st[-1])
            m |= acc
            if unc and len(st) > 1:
                prev = callers.get(st[:-1])
                callers[st[:-1]] = unc if prev is None else prev | unc
        for below, unc in callers.items():
            caller = self.g.intern(frozenset([below]))
            if len(unc) > FILTER_UNC:  # (a rule that may end after any character) only where the caller reads on
                unc = self.vocab.with_child(unc, self.g.allowed_bytes(caller))
            self._walk(caller, unc, spans, None)
        if spans:
            m |= self.vocab.mask_from(spans)
        if len(self._state) >= MASK_CACHE_STATES:
            self._state.clear()
        self._state[sid] = m
        return m


class GrammarMatcher:
    """One sequence constrained by a grammar. Tokens in `stop_ids` end the sequence; they are allowed exactly when the
    text so far is a complete document. After a stop token, is_terminated() is true and nothing else is allowed."""

    def __init__(self, masks: TokenMasks, stop_ids=()):
        self.masks, self.g = masks, masks.g
        self.stop_ids = tuple(stop_ids)
        self._stop_mask = masks.vocab.ids_to_mask(self.stop_ids)
        self.sid = self.g.initial
        self.terminated = False
        self._history: list[tuple[int, bool]] = []

    def accept(self, token: int) -> bool:
        """Advance by one token; False (and no change) when the grammar does not allow it here."""
        if self.terminated:
            return False
        if token in self.stop_ids:
            if not self.g.state_can_end[self.sid]:
                return False
            self._history.append((self.sid, self.terminated))
            self.terminated = True
            return True
        if not 0 <= token < self.masks.vocab.size:
            return False
        data = self.masks.vocab.token_bytes[token]
        if not data:
            return False
        s = self.g.walk(self.sid, data)
        if s < 0:
            return False
        self._history.append((self.sid, self.terminated))
        self.sid = s
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw bytes (one history entry); used to force a prefix or check text."""
        s = self.g.walk(self.sid, data)
        if s < 0 or self.terminated:
            return False
        self._history.append((self.sid, self.terminated))
        self.sid = s
        return True

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens (speculative decoding rejects drafted tokens this way)."""
        if not 0 <= n <= len(self._history):
            raise ValueError(f"rollback({n}): only {len(self._history)} tokens can be undone")
        if n:
            self.sid, self.terminated = self._history[-n]
            del self._history[-n:]

    def is_terminated(self) -> bool:
        return self.terminated

    def can_end(self) -> bool:
        """Whether the text so far is a complete document (a stop token is allowed now)."""
        return not self.terminated and self.g.state_can_end[self.sid]

    def mask(self) -> int:
        """The allowed next tokens as an int bitmask (bit i = token i); 0 once terminated."""
        if self.terminated:
            return 0
        m = self.masks.mask(self.sid) & ~self._stop_mask  # a stop token that also spells text is only a stop
        return m | self._stop_mask if self.g.state_can_end[self.sid] else m

    def mask_words(self) -> bytes:
        """mask() as vocab/32 little-endian u32 words, ready to upload for the GPU sampler."""
        return mask_to_words(self.mask(), self.masks.vocab.n_words)
