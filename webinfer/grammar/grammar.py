"""A context-free grammar over bytes, compiled to a pushdown automaton (pure Python).

Each rule's expression (webinfer/grammar/expr.py) becomes a DFA whose edges read a byte or call another rule.
A parse position is a stack of DFA states (nodes): the top is where the current rule is, each lower entry is the
state its caller returns to. Because a rule may end or go on, and alternatives may start alike, the matcher state is
a *set* of stacks; sets are interned to small ints (`sid`) and byte transitions between them are memoized, so a
byte costs one dict lookup once it has been seen in that state.

Restrictions, checked at compile time (GrammarError): a rule that calls itself before reading a byte (left
recursion) is rejected; rules that can never finish are removed, and a grammar whose root can never finish is
rejected.
"""

from __future__ import annotations

from .errors import GrammarError

MAX_NODES = 200_000  # DFA states over all rules: a guard against schemas with huge repetition counts
MAX_CHAIN = 255  # members of a shift chain that share one trie walk (the matcher keeps a level in a byte)


class Grammar:
    """Rules name -> expression; `root` names the start rule. `where` names the request field in errors."""

    def __init__(self, rules: dict[str, tuple], root: str = "root", where: str = "grammar"):
        if root not in rules:
            raise GrammarError(where, f"no rule named {root!r} (the start rule)")
        self.rules, self.root, self.where = dict(rules), root, where

    def compile(self) -> "CompiledGrammar":
        return CompiledGrammar(self)


# -- expression -> NFA -> DFA ----------------------------------------------------------------------------------------


class _NFA:
    def __init__(self):
        self.edges: list[list] = []  # state -> [(label, target)]; label None = epsilon, int = byte mask, str = rule
        # A guess at "one more item used" for bounded repetitions: each optional copy's states -> the next copy's
        # (CompiledGrammar._shift_chains verifies it on the DFA; states not listed map to themselves).
        self.shift: dict[int, int] = {}

    def new(self) -> int:
        self.edges.append([])
        return len(self.edges) - 1

    def build(self, e, s: int, t: int, rules, where: str) -> None:
        kind = e[0]
        if kind == "bytes":
            if e[1]:
                self.edges[s].append((e[1], t))
        elif kind == "seq":
            items = e[1]
            if not items:
                self.edges[s].append((None, t))
            cur = s
            for k, x in enumerate(items):
                nxt = t if k == len(items) - 1 else self.new()
                self.build(x, cur, nxt, rules, where)
                cur = nxt
        elif kind == "alt":
            for x in e[1]:
                self.build(x, s, t, rules, where)
        elif kind == "rep":
            x, lo, hi = e[1], e[2], e[3]
            cur = s
            for _ in range(lo):
                nxt = self.new()
                self.build(x, cur, nxt, rules, where)
                cur = nxt
            if hi is None:
                m = self.new()
                self.edges[cur].append((None, m))
                self.build(x, m, m, rules, where)
                self.edges[m].append((None, t))
            else:
                self.edges[cur].append((None, t))
                before, bounds = cur, []
                for _ in range(hi - lo):
                    nxt = self.new()
                    bounds.append(nxt)
                    self.build(x, cur, nxt, rules, where)
                    self.edges[nxt].append((None, t))
                    cur = nxt
                # copy j's states are [bounds[j], bounds[j + 1]): the same construction, so the same layout
                bounds.append(len(self.edges))
                size = bounds[1] - bounds[0] if len(bounds) > 2 else 0
                if size and all(bounds[j + 1] - bounds[j] == size for j in range(len(bounds) - 1)):
                    for j in range(len(bounds) - 1):  # the last copy's states have no next copy: -1
                        for o in range(size):
                            self.shift[bounds[j] + o] = bounds[j + 1] + o if j < len(bounds) - 2 else -1
                    self.shift.setdefault(before, bounds[0])  # where the first copy starts, as copy 0's end
        elif kind == "ref":
            if e[1] not in rules:
                raise GrammarError(where, f"reference to an undefined rule {e[1]!r}")
            self.edges[s].append((e[1], t))
        else:
            raise ValueError(f"bad grammar expression {e!r}")
        if len(self.edges) > MAX_NODES:
            raise GrammarError(where, f"the grammar needs more than {MAX_NODES} states (repetition counts too large?)")

    def closure(self, states) -> frozenset:
        out, todo = set(states), list(states)
        while todo:
            for label, t in self.edges[todo.pop()]:
                if label is None and t not in out:
                    out.add(t)
                    todo.append(t)
        return frozenset(out)


def _dfa(expr, rules, where: str):
    """-> (byte transitions [dict byte -> state], calls [dict rule -> state], accepting [bool], shift [state or
    None]); state 0 starts. shift is the NFA's shift guess lifted to DFA states (unverified)."""
    nfa = _NFA()
    s, f = nfa.new(), nfa.new()
    nfa.build(expr, s, f, rules, where)
    start = nfa.closure([s])
    index = {start: 0}
    order = [start]
    btrans, calls, acc = [], [], []
    k = 0
    while k < len(order):
        cur = order[k]
        k += 1
        by_byte: dict[int, set] = {}
        by_rule: dict[str, set] = {}
        for q in cur:
            for label, t in nfa.edges[q]:
                if label is None:
                    continue
                if isinstance(label, str):
                    by_rule.setdefault(label, set()).add(t)
                    continue
                m = label
                while m:
                    low = m & -m
                    by_byte.setdefault(low.bit_length() - 1, set()).add(t)
                    m ^= low
        bt, ct = {}, {}
        for table, src in ((bt, by_byte), (ct, by_rule)):
            memo: dict[frozenset, int] = {}
            for key, targets in src.items():
                ft = frozenset(targets)
                if ft not in memo:
                    c = nfa.closure(ft)
                    if c not in index:
                        index[c] = len(order)
                        order.append(c)
                        if len(order) > MAX_NODES:
                            raise GrammarError(where, f"the grammar needs more than {MAX_NODES} states")
                    memo[ft] = index[c]
                table[key] = memo[ft]
        btrans.append(bt)
        calls.append(ct)
        acc.append(f in cur)
    sh = nfa.shift
    shift = []
    for cur in order:
        image = frozenset(sh.get(q, q) for q in cur) if sh else frozenset([-1])
        shift.append(None if -1 in image else index.get(image))
    return btrans, calls, acc, shift


def _has_ref(e) -> bool:
    kind = e[0]
    if kind == "ref":
        return True
    if kind in ("seq", "alt"):
        return any(_has_ref(x) for x in e[1])
    return kind == "rep" and _has_ref(e[1])


# -- the pushdown automaton --------------------------------------------------------------------------------------------


class CompiledGrammar:
    """Nodes (rule DFA states, numbered globally) and the interned stack-set states the matcher walks."""

    def __init__(self, g: Grammar):
        self.where = g.where
        dfas = {name: _dfa(e, g.rules, g.where) for name, e in g.rules.items()}
        # only the rules reachable from the root
        reach, todo = {g.root}, [g.root]
        while todo:
            for ct in dfas[todo.pop()][1]:
                for r in ct:
                    if r not in reach:
                        reach.add(r)
                        todo.append(r)
        names = [n for n in g.rules if n in reach]
        productive = self._productive(names, dfas)
        if g.root not in productive:
            raise GrammarError(g.where, "the grammar (or schema) matches nothing: its start rule can never finish")
        self.rule_names = [n for n in names if n in productive]
        self.start: dict[str, int] = {}
        base = 0
        for n in self.rule_names:
            self.start[n] = base
            base += len(dfas[n][0])
        if base > MAX_NODES:
            raise GrammarError(g.where, f"the grammar needs more than {MAX_NODES} states")
        self.n_nodes = base
        self.bytes: list[dict[int, int]] = []
        self.calls: list[list[tuple[int, int]]] = []  # (callee start node, return node)
        self.accept: list[bool] = []
        self.rule_of: list[str] = []
        for n in self.rule_names:
            bt, ct, acc, _ = dfas[n]
            live = self._coreachable(bt, ct, acc, productive)
            o = self.start[n]
            for st in range(len(bt)):
                ok = st in live
                self.bytes.append({b: o + t for b, t in bt[st].items() if t in live} if ok else {})
                self.calls.append([(self.start[r], o + t) for r, t in ct[st].items() if r in productive and t in live]
                                  if ok else [])
                self.accept.append(acc[st] and ok)
                self.rule_of.append(n)
        self.nullable = self._nullable()
        # rules without calls are plain DFAs fixed by their expression: their nodes' token masks depend on nothing
        # else, so TokenVocab shares them between grammars (key: the expression)
        self.plain_rules = {n: g.rules[n] for n in self.rule_names if not _has_ref(g.rules[n])}
        self.chain_of, self.level = self._shift_chains(dfas)
        self._eps: dict[int, tuple[int, ...]] = {}
        self.can_end = [any(self.accept[m] for m in self.eps(k)) for k in range(self.n_nodes)]
        self._trans: list[dict[int, tuple]] = [dict() for _ in range(self.n_nodes)]
        self._first: list[int | None] = [None] * self.n_nodes
        self._busy: set = set()
        # interned stack sets
        self.states: list[frozenset] = []
        self._index: dict[frozenset, int] = {}
        self._next: list[dict[int, int]] = []
        self.state_can_end: list[bool] = []
        self.initial = self.intern(frozenset([(self.start[g.root],)]))

    def _shift_chains(self, dfas) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
        """Chains of nodes that differ only in how many items of a bounded repetition are left (a string's
        maxLength: one chain per position inside a character), so that the matcher walks the trie once per chain.

        sigma maps a node to "the same, one more item used". The NFA's guess is kept only where it commutes with the
        automaton: accept(sigma(a)) == accept(a), and for every byte, sigma(a) reads it iff a does and sigma is defined
        at a's successor, which it then equals. Then (by induction over a token's bytes) node sigma^i(a) reads a token
        exactly when a does and sigma^i is defined at every node on the way: one walk from a chain's first node,
        keeping the smallest level (how often sigma applies) met on each path, decides the token for every member.
        Only rules without calls (plain DFAs) take part. Returns (node -> (first node of its chain, index), node ->
        level) for chains of 3 or more nodes."""
        sigma: dict[int, int] = {}
        for n in self.rule_names:
            shift, o = dfas[n][3], self.start[n]
            nodes = range(o, o + len(shift))
            if all(t is None for t in shift) or any(self.calls[a] for a in nodes):
                continue
            sigma.update((o + k, o + t) for k, t in enumerate(shift) if t is not None)
        pred: dict[int, set] = {}
        for a in sigma:
            for c in set(self.bytes[a].values()):
                pred.setdefault(c, set()).add(a)
        todo, get = list(sigma), sigma.get
        while todo:  # drop the pairs that break the rules above until none does (a drop re-checks predecessors)
            a = todo.pop()
            sa = get(a)
            if sa is None:
                continue
            ba, bs = self.bytes[a], self.bytes[sa]
            # sigma(a) reads exactly the bytes whose successor has an image, into that image
            if self.accept[a] != self.accept[sa] or {b: t for b, c in ba.items() if (t := get(c)) is not None} != bs:
                del sigma[a]
                todo.extend(pred.get(a, ()))
        level: dict[int, int] = {}
        for a in sigma:  # level: how many times sigma applies (fixed points: as often as wanted)
            path, x = [], a
            while x in sigma and x not in level and sigma[x] != x and len(path) <= len(sigma):
                path.append(x)
                x = sigma[x]
            base = level.get(x, self.INF if sigma.get(x) == x or len(path) > len(sigma) else 0)
            if x in sigma:
                level[x] = base
            for k, y in enumerate(reversed(path)):
                level[y] = base if base == self.INF else base + k + 1
        image = set(sigma.values())
        chain_of: dict[int, tuple[int, int]] = {}
        for r, lv in level.items():
            if r not in image and 2 <= lv < self.INF:
                x = r
                for i in range(lv + 1):  # segments of MAX_CHAIN members, each with its own walk
                    if i % MAX_CHAIN == 0:
                        seg = x
                    chain_of[x] = (seg, i % MAX_CHAIN)
                    x = sigma.get(x)
        return chain_of, level

    INF = 1 << 30

    @staticmethod
    def _coreachable(bt, ct, acc, productive) -> set:
        rev: dict[int, set] = {}
        for s in range(len(bt)):
            for t in set(bt[s].values()):
                rev.setdefault(t, set()).add(s)
            for r, t in ct[s].items():
                if r in productive:
                    rev.setdefault(t, set()).add(s)
        live = {s for s in range(len(bt)) if acc[s]}
        todo = list(live)
        while todo:
            for p in rev.get(todo.pop(), ()):
                if p not in live:
                    live.add(p)
                    todo.append(p)
        return live

    def _productive(self, names, dfas) -> set:
        prod: set = set()
        changed = True
        while changed:
            changed = False
            for n in names:
                if n not in prod and 0 in self._coreachable(*dfas[n][:3], prod):
                    prod.add(n)
                    changed = True
        return prod

    def _nullable(self) -> set:
        """Rules that can finish without reading a byte."""
        null: set = set()
        changed = True
        while changed:
            changed = False
            for name in self.rule_names:
                if name in null:
                    continue
                s = self.start[name]
                seen, todo = {s}, [s]
                while todo:
                    k = todo.pop()
                    if self.accept[k]:
                        null.add(name)
                        changed = True
                        break
                    for cs, r in self.calls[k]:
                        if self.rule_of[cs] in null and r not in seen:
                            seen.add(r)
                            todo.append(r)
        return null

    def eps(self, n: int) -> tuple[int, ...]:
        """Nodes reachable from n by skipping calls of rules that can be empty."""
        e = self._eps.get(n)
        if e is None:
            seen, todo = [n], [n]
            while todo:
                for cs, r in self.calls[todo.pop()]:
                    if self.rule_of[cs] in self.nullable and r not in seen:
                        seen.append(r)
                        todo.append(r)
            e = self._eps[n] = tuple(seen)
        return e

    def trans(self, n: int, b: int) -> tuple:
        """The stacks that replace node n when it reads byte b (without n's rule ending first)."""
        t = self._trans[n].get(b)
        if t is not None:
            return t
        key = (n, b)
        if key in self._busy:
            raise GrammarError(self.where, f"rule {self.rule_of[n]!r} is left-recursive (it can call itself before "
                                           "reading a byte); rewrite it with repetition")
        self._busy.add(key)
        out: list[tuple] = []
        for m in self.eps(n):
            nb = self.bytes[m].get(b)
            if nb is not None and (nb,) not in out:
                out.append((nb,))
            for cs, r in self.calls[m]:
                for x in self.trans(cs, b):
                    y = (r,) + x
                    if y not in out:
                        out.append(y)
        self._busy.discard(key)
        t = self._trans[n][b] = tuple(out)
        return t

    def first_bytes(self, n: int) -> int:
        """Bytes node n can read without its rule ending first (a 256-bit mask)."""
        m = self._first[n]
        if m is None:
            if n in self._busy:  # a rule reached again before a byte: trans() names the left recursion
                for b in range(256):
                    self.trans(n, b)
                raise GrammarError(self.where, f"rule {self.rule_of[n]!r} is left-recursive")
            self._busy.add(n)
            m = 0  # trans(n, b) is non-empty exactly when some node of eps(n) or a rule it calls reads b
            for k in self.eps(n):
                for b in self.bytes[k]:
                    m |= 1 << b
                for cs, _ in self.calls[k]:
                    m |= self.first_bytes(cs)
            self._busy.discard(n)
            self._first[n] = m
        return m

    def allowed_bytes(self, sid: int) -> int:
        """A superset of the bytes allowed in state sid (exact unless a byte dies deeper in a stack)."""
        m = 0
        for st in self.states[sid]:
            for n in reversed(st):
                m |= self.first_bytes(n)
                if not self.can_end[n]:
                    break
        return m

    def check(self) -> None:
        """Visit every (node, byte) transition: raises GrammarError for left recursion now rather than mid-request."""
        for n in range(self.n_nodes):
            for b in range(256):
                self.trans(n, b)

    # -- stack sets ----------------------------------------------------------------------------------------------
    def intern(self, stacks: frozenset) -> int:
        sid = self._index.get(stacks)
        if sid is None:
            sid = self._index[stacks] = len(self.states)
            self.states.append(stacks)
            self._next.append({})
            self.state_can_end.append(any(all(self.can_end[n] for n in st) for st in stacks))
        return sid

    def step(self, sid: int, b: int) -> int:
        """The state after reading byte b in state sid; -1 when b is not allowed there."""
        nxt = self._next[sid]
        r = nxt.get(b)
        if r is None:
            out: set = set()
            for st in self.states[sid]:
                i = len(st) - 1
                while i >= 0:
                    n = st[i]
                    for x in self.trans(n, b):
                        out.add(st[:i] + x)
                    if not self.can_end[n]:
                        break
                    i -= 1
            r = nxt[b] = self.intern(frozenset(out)) if out else -1
        return r

    def walk(self, sid: int, data: bytes) -> int:
        for b in data:
            sid = self.step(sid, b)
            if sid < 0:
                break
        return sid

    def shortest_completion(self, sid: int) -> int:
        """Fewest bytes that finish a document from state sid (the random-walk tests finish documents with it)."""
        mins = self._min_lengths()
        best = None
        for st in self.states[sid]:
            total = sum(mins[n] for n in st)
            best = total if best is None else min(best, total)
        return best if best is not None else -1

    def _min_lengths(self) -> list[int]:
        """Per node: fewest bytes to reach the end of its rule (Bellman-Ford style relaxation)."""
        if getattr(self, "_mins", None) is not None:
            return self._mins
        INF = 1 << 60
        d = [0 if self.accept[n] else INF for n in range(self.n_nodes)]
        changed = True
        while changed:
            changed = False
            for n in range(self.n_nodes):
                best = d[n]
                for t in self.bytes[n].values():
                    best = min(best, 1 + d[t])
                for cs, r in self.calls[n]:
                    best = min(best, d[cs] + d[r])
                if best < d[n]:
                    d[n] = best
                    changed = True
        self._mins = d
        return d
