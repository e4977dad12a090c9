"""Structured output: grammars over bytes and per-step token masks, in pure Python (it runs inside Pyodide).

    vocab = TokenVocab.from_tokenizer(tokenizer)               # once per tokenizer (a trie of the token bytes)
    cache = GrammarCache(vocab)                                 # once per engine: compiled grammars and their masks
    masks = cache.get(response_format)                          # per request (cached by content); None: unconstrained
    m = GrammarMatcher(masks, stop_ids=eos_ids)                 # per sequence
    per step:  words = m.mask_words()  -> upload (vocab/32 u32 words) for the GPU sampler
               m.accept(sampled_id)    -> False only if the sampler ignored the mask
    m.rollback(n); m.is_terminated(); m.can_end()

Sources: JSON Schema (json_schema.py), any JSON object, a regular expression (expr.py), GBNF / EBNF (ebnf.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

from .ebnf import ebnf_grammar
from .errors import GrammarError
from .expr import regex
from .grammar import CompiledGrammar, Grammar
from .json_schema import json_object_grammar, json_schema_grammar, tool_call_grammar
from .matcher import GrammarMatcher, TokenMasks, TokenVocab, mask_to_words

__all__ = ["CompiledGrammar", "Grammar", "GrammarCache", "GrammarError", "GrammarMatcher", "TokenMasks", "TokenVocab",
           "ebnf_grammar", "grammar_from_response_format", "json_object_grammar", "json_schema_grammar",
           "cache_key", "mask_to_words", "regex_grammar", "response_format_key", "tool_call_grammar"]


def regex_grammar(pattern: str, where: str = "response_format.regex") -> Grammar:
    """Text that matches `pattern` as a whole (re.fullmatch semantics, see RegexParser for the syntax)."""
    if not isinstance(pattern, str):
        raise GrammarError(where, f"is {type(pattern).__name__}, expected a regular expression string")
    return Grammar({"root": regex(pattern, where)}, "root", where)


def grammar_from_response_format(rf) -> Grammar | None:
    """The grammar an OpenAI `response_format` asks for; None for {"type": "text"} / None.

    {"type": "json_object"}; {"type": "json_schema", "json_schema": {"schema": {...}, "strict": ..., "name": ...}};
    extensions: {"type": "regex", "regex": "..."} and {"type": "grammar", "grammar": "<GBNF / EBNF text>"}.
    """
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise GrammarError("response_format", "expected an object with a string field 'type'")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or "schema" not in js:
            raise GrammarError("response_format.json_schema", "expected an object with a 'schema' field")
        return json_schema_grammar(js["schema"])
    if kind == "regex":
        return regex_grammar(rf.get("regex"))
    if kind == "grammar":
        return ebnf_grammar(rf.get("grammar"))
    raise GrammarError("response_format.type", f"is {kind!r}, expected text, json_object, json_schema, regex or grammar")


WARM_MAX_NODES = 20_000  # grammars with more nodes whose masks differ (after TokenMasks.prepare: a minLength of
# thousands has ~1,250 on Gemma 3) compute node masks on first use instead
FAILED_TTL_S = 60.0  # a grammar that ran out of time is refused at once for this long (a retrying client costs one
# compile a minute), then tried again (its timeout may have come from a busy machine)


def response_format_key(response_format) -> str | None:
    """The cache key of a response_format (None: unconstrained)."""
    if response_format is None or (isinstance(response_format, dict) and response_format.get("type") == "text"):
        return None
    return cache_key(response_format)


def cache_key(key) -> str:
    """GrammarCache's key for a JSON value (a response_format, a tool-call grammar's inputs)."""
    try:
        return json.dumps(key, sort_keys=True)
    except (TypeError, ValueError):
        raise GrammarError("response_format", "is not JSON-serialisable") from None


class GrammarCache:
    """Compiled grammars bound to one vocabulary, kept by content (LRU): requests with the same schema share the
    mask caches, so the second request costs nothing to compile and starts with warm masks. With `warm` (default)
    get() also computes every node's context-independent mask (TokenMasks.warm; shift-chain members get their
    chain's walk, their masks follow on first use): compile time instead of a slow first step; the engine can run
    get() off the decoding loop.

    timeout_s bounds a compile (checked between nodes and between rounds of TokenMasks.prepare): past it the
    request gets a GrammarError (a 400 naming `where`), nothing is cached but the refusal, for FAILED_TTL_S."""

    def __init__(self, vocab: TokenVocab, capacity: int = 32, warm: bool = True, timeout_s: float | None = None,
                 clock=time.monotonic):
        self.vocab, self.capacity, self.warm, self.timeout_s, self.clock = vocab, capacity, warm, timeout_s, clock
        self._lru: OrderedDict[str, TokenMasks] = OrderedDict()
        self._failed: OrderedDict[str, tuple[float, GrammarError]] = OrderedDict()  # key -> (until, refusal)
        # the server compiles in threads: requests that bring the same new grammar at once compile it once (the
        # others wait for that compile), different grammars compile side by side (the vocabulary's lock keeps its
        # shared caches whole, one node at a time)
        self._lock = threading.Lock()
        self._building: dict[str, threading.Event] = {}

    def get(self, response_format) -> TokenMasks | None:
        key = response_format_key(response_format)
        if key is None:
            return None
        return self.compile(key, lambda: grammar_from_response_format(response_format), "response_format")

    def get_grammar(self, key, build, where: str = "response_format") -> TokenMasks:
        """The masks of the grammar `build()` makes, cached under the JSON of `key` (e.g. a tool-call grammar keyed
        by its tools and format); `where` names the request field a timeout is blamed on."""
        return self.compile(cache_key(key), build, where)

    def peek(self, key: str) -> TokenMasks | None:
        """The cached masks under `key` (cache_key's JSON), without compiling; None if absent.
        A refusal still in force is raised, so a caller can skip handing the request to a compile thread."""
        with self._lock:
            return self._cached(key)

    def _cached(self, key: str) -> TokenMasks | None:
        """(under _lock) The cached masks, or None; the refusal still in force raised."""
        masks = self._lru.get(key)
        if masks is not None:
            self._lru.move_to_end(key)
            return masks
        failed = self._failed.get(key)
        if failed is not None:
            if self.clock() < failed[0]:
                e = failed[1]
                raise GrammarError(e.param, e.problem)  # a new error each time: no traceback grows
            del self._failed[key]
        return None

    def compile(self, key: str, build, where: str) -> TokenMasks:
        """The masks cached under `key` (cache_key's JSON), or those of build()'s grammar, compiled now."""
        while True:
            with self._lock:
                masks = self._cached(key)
                if masks is not None:
                    return masks
                busy = self._building.get(key)
                if busy is None:
                    done = self._building[key] = threading.Event()
                    break
            busy.wait()  # then take its result from the cache, or compile it here if it failed
        try:
            deadline = None if self.timeout_s is None else self.clock() + self.timeout_s
            try:
                g = build().compile()
                if deadline is not None and self.clock() > deadline:
                    raise TimeoutError
                masks = TokenMasks(g, self.vocab)
                if self.warm:  # now, so that no decoding step pays for one
                    if masks.prepare(deadline, self.clock) <= WARM_MAX_NODES:  # (outside the vocabulary's lock)
                        masks.warm(deadline, self.clock)
            except TimeoutError:
                e = GrammarError(where, f"took more than {self.timeout_s:g} s to compile for this model's vocabulary "
                                        f"and was stopped (the grammar timeout, `webinfer serve --grammar-timeout`); "
                                        f"large repetition counts (minLength, minItems, {{m,n}}) cost the most")
                with self._lock:
                    self._failed[key] = (self.clock() + FAILED_TTL_S, e)
                    if len(self._failed) > self.capacity:
                        self._failed.popitem(last=False)
                raise e from None
            with self._lock:
                self._lru[key] = masks
                if len(self._lru) > self.capacity:
                    self._lru.popitem(last=False)
            return masks
        finally:
            with self._lock:
                del self._building[key]
            done.set()
