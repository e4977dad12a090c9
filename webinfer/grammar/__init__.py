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
from collections import OrderedDict

from .ebnf import ebnf_grammar
from .errors import GrammarError
from .expr import regex
from .grammar import CompiledGrammar, Grammar
from .json_schema import json_object_grammar, json_schema_grammar, tool_call_grammar
from .matcher import GrammarMatcher, TokenMasks, TokenVocab, mask_to_words

__all__ = ["CompiledGrammar", "Grammar", "GrammarCache", "GrammarError", "GrammarMatcher", "TokenMasks", "TokenVocab",
           "ebnf_grammar", "grammar_from_response_format", "json_object_grammar", "json_schema_grammar",
           "mask_to_words", "regex_grammar", "tool_call_grammar"]


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


WARM_MAX_NODES = 20_000  # bigger grammars (huge repetition counts) compute node masks on first use instead


class GrammarCache:
    """Compiled grammars bound to one vocabulary, kept by content (LRU): requests with the same schema share the
    mask caches, so the second request costs nothing to compile and starts with warm masks. With `warm` (default)
    get() also computes every node's context-independent mask (TokenMasks.warm; shift-chain members get their
    chain's walk, their masks follow on first use): compile time instead of a slow first step; the engine can run
    get() off the decoding loop."""

    def __init__(self, vocab: TokenVocab, capacity: int = 32, warm: bool = True):
        self.vocab, self.capacity, self.warm = vocab, capacity, warm
        self._lru: OrderedDict[str, TokenMasks] = OrderedDict()
        # the server compiles in threads: requests that bring the same new grammar at once compile it once (the
        # others wait for that compile), different grammars compile side by side (the vocabulary's lock keeps its
        # shared caches whole, one node at a time)
        self._lock = threading.Lock()
        self._building: dict[str, threading.Event] = {}

    def get(self, response_format) -> TokenMasks | None:
        if response_format is None or (isinstance(response_format, dict) and response_format.get("type") == "text"):
            return None
        return self.get_grammar(response_format, lambda: grammar_from_response_format(response_format))

    def get_grammar(self, key, build) -> TokenMasks:
        """The masks of the grammar `build()` makes, cached under the JSON of `key` (e.g. a tool-call grammar keyed
        by its tools and format)."""
        try:
            key = json.dumps(key, sort_keys=True)
        except (TypeError, ValueError):
            raise GrammarError("response_format", "is not JSON-serialisable") from None
        while True:
            with self._lock:
                masks = self._lru.get(key)
                if masks is not None:
                    self._lru.move_to_end(key)
                    return masks
                busy = self._building.get(key)
                if busy is None:
                    done = self._building[key] = threading.Event()
                    break
            busy.wait()  # then take its result from the cache, or compile it here if it failed
        try:
            masks = TokenMasks(build().compile(), self.vocab)
            if self.warm and masks.g.n_nodes <= WARM_MAX_NODES:  # now, so that no decoding step pays for one
                masks.warm()
            with self._lock:
                self._lru[key] = masks
                if len(self._lru) > self.capacity:
                    self._lru.popitem(last=False)
            return masks
        finally:
            with self._lock:
                del self._building[key]
            done.set()
