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
"""

from __future__ import annotations

import operator

from .grammar import CompiledGrammar

_BITS = bytes.maketrans(b"\x00\x01", b"01")
MASK_CACHE_STATES = 4096  # masks kept per grammar (each up to vocab/8 bytes); the cache restarts when full


class TokenVocab:
    """Byte strings of a vocabulary (None for tokens that never appear inside structured output: special / control
    tokens) in a trie: children[node] maps byte -> child node, ends[node] lists the token ids spelled by its path."""

    def __init__(self, token_bytes: list[bytes | None]):
        self.token_bytes = token_bytes
        self.size = len(token_bytes)
        self.n_words = (self.size + 31) // 32
        self._gather = None
        self.children: list[dict[int, int]] = [{}]
        self.ends: list[list[int]] = [[]]
        children, ends = self.children, self.ends
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
                    ends.append([])
                node = nxt
            ends[node].append(tid)
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
            self.order.extend(ends[node])
            self.below[node] = len(self.order)
            stack.append((node, True))
            for c in children[node].values():
                stack.append((c, False))

    @classmethod
    def from_tokenizer(cls, tok, vocab_size: int | None = None) -> "TokenVocab":
        """From a webinfer Tokenizer: ByteLevel vocabularies map characters back to bytes; SentencePiece-style ones
        read "▁" as a space and "<0xNN>" as byte NN. Special (added) tokens get no bytes."""
        n = max(vocab_size or 0, tok.vocab_size)
        return cls([tok.token_bytes(i) for i in range(n)])

    def ids_to_mask(self, ids) -> int:
        ba = bytearray((self.size + 7) // 8)
        for t in ids:
            ba[t >> 3] |= 1 << (t & 7)
        return int.from_bytes(ba, "little")

    def mask_from(self, spans: list[tuple[int, int]]) -> int:
        """The mask of the tokens of DFS-order slices order[lo:hi]. Large sets go through a byte per token in DFS
        order (slices set at C speed) that one precomputed gather puts back in id order."""
        n = sum(hi - lo for lo, hi in spans)
        if n * 16 < self.size:
            ids: list[int] = []
            for lo, hi in spans:
                ids.extend(self.order[lo:hi])
            return self.ids_to_mask(ids)
        if self._gather is None:
            pos = [len(self.order)] * self.size  # tokens outside the trie read the extra zero byte at the end
            for k, t in enumerate(self.order):
                pos[t] = k
            self._gather = operator.itemgetter(*pos)
        buf = bytearray(len(self.order) + 1)
        one = memoryview(b"\x01" * len(buf))
        for lo, hi in spans:
            buf[lo:hi] = one[: hi - lo]
        bits = bytes(self._gather(buf))[::-1].translate(_BITS)
        return int(bits, 2)


def mask_to_words(mask: int, n_words: int) -> bytes:
    """A mask as n_words little-endian u32 words (word w bit j = token 32 w + j): the GPU sampler's layout."""
    return mask.to_bytes(4 * n_words, "little")


class TokenMasks:
    """A compiled grammar bound to a vocabulary: the per-node and per-state mask caches (see the module doc)."""

    def __init__(self, grammar: CompiledGrammar, vocab: TokenVocab):
        self.g, self.vocab = grammar, vocab
        self._node: dict[int, tuple[int, list[int]]] = {}
        self._state: dict[int, int] = {}
        self._mv: dict[int, tuple] = {}
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
            for b in range(256):  # every byte now has an entry: the walk reads nx[b] directly
                if not m >> b & 1:
                    nx[b] = -1
            groups: dict[int, int] = {}
            for b, t in moves:
                groups[t] = groups.get(t, 0) | (1 << b)
            best = max(groups.items(), key=lambda kv: kv[1].bit_count(), default=(-1, 0))
            mv = self._mv[sid] = (moves, best[1], best[0])
        return mv

    def _walk(self, sid: int, roots, spans: list, unc: list | None) -> None:
        """Walk the trie below each node of `roots` from state sid: tokens readable to their end go to spans (as
        DFS-order slices); with `unc`, the trie nodes (with children) where the state may end go there instead of
        being read further.

        Two shortcuts keep this fast in Python: a subtree is taken whole (one slice of the DFS order) when, level by
        level down to its depth, all its bytes lead to one shared next state (ordinary characters inside a string,
        bounded or not); and where a state allows fewer bytes than a trie node has children, the allowed bytes are
        looked up instead of the children being scanned."""
        g, v = self.g, self.vocab
        nexts, can_end = g._next, g.state_can_end
        children, sub_bytes, depth = v.children, v.sub_bytes, v.depth
        first, below, end = v.first, v.below, v.end
        mvs, moves = self._mv, self._moves
        todo = [(t, sid) for t in roots]
        while todo:
            tn, s = todo.pop()
            kids = children[tn]
            mv = mvs.get(s) or moves(s)
            if unc is not None and can_end[s]:
                unc.append(tn)
            elif len(kids) > 1 and mv[1]:
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

    def node_info(self, node: int) -> tuple[int, list[int]]:
        """(context-independent accepted tokens as a mask, trie nodes where the node's rule may end)."""
        info = self._node.get(node)
        if info is None:
            unc: list[int] = []
            spans: list[tuple[int, int]] = []
            self._walk(self.g.intern(frozenset([(node,)])), (0,), spans, unc)
            info = self._node[node] = (self.vocab.mask_from(spans), sorted(set(unc)))
        return info

    def warm(self) -> None:
        """Compute every node's context-independent mask now (compile time) instead of on first use."""
        for n in range(self.g.n_nodes):
            self.node_info(n)
        self.warmed = True

    def mask(self, sid: int) -> int:
        """Tokens whose bytes can be read in state sid (end-of-sequence tokens are the matcher's business)."""
        m = self._state.get(sid)
        if m is not None:
            return m
        m = 0
        spans: list[tuple[int, int]] = []
        for st in self.g.states[sid]:
            acc, unc = self.node_info(st[-1])
            m |= acc
            if unc and len(st) > 1:
                self._walk(self.g.intern(frozenset([st[:-1]])), unc, spans, None)
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
