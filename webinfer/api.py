"""OpenAI-shaped Python API over an AsyncEngine (runs in Pyodide as well as CPython). Get one from webinfer.load().

    r = await llm.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=32)
    r["choices"][0]["message"]["content"]
    async for chunk in await llm.chat.completions.create(messages=..., stream=True):
        chunk["choices"][0]["delta"].get("content", "")

Requests are the request bodies of OpenAI's /v1/chat/completions and /v1/completions, as keyword arguments; the
HTTP server and the page's worker pass the decoded JSON body as it is, so one mapping (`parse_request`) turns
request fields into a prompt and SamplingParams for every front end. Every field of OpenAI's reference is either
honoured or, when it asks for something not implemented, refused with InvalidRequestError naming it; an unknown
field is refused too. Nothing runs before the whole request is checked.

Chat requests take `tools` / `tool_choice` / `parallel_tool_calls` (webinfer/tool_calls.py: the template's call
format, parsed into message.tool_calls and streamed as delta.tool_calls; forced calls through the grammar engine),
and both endpoints take `n` (choices share the prompt's KV blocks; choice i's seed is choice_seed(seed, i)).
docs/api.md lists every field.

Results are plain dicts shaped like OpenAI's, plus extensions: `usage.ttft_s`, `usage.time_per_output_token_s`,
the produced ids in `choices[i]["token_ids"]` and the prompt's ids in `prompt_token_ids` (non-streaming result, and
the first chunk of a stream).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from webinfer.engine.engine import AsyncEngine, RequestOutput
from webinfer.engine.stopping import SamplingParams, TextStream, incremental_decoder
from webinfer.errors import InvalidRequestError, ServerBusyError
from webinfer.tool_calls import (ToolCallParser, call_grammar, check_tool_choice, check_tools, collect, delta_calls,
                                 grammar_key, template_format)


@dataclass
class Limits:
    """Caps on what one request may ask for (the server exposes the same to the network)."""
    max_messages: int = 256
    max_message_chars: int = 32_000
    max_prompt_chars: int = 64_000
    max_tokens: int = 4096
    max_stop: int = 4
    max_stop_chars: int = 64
    temperature: tuple[float, float] = (0.0, 2.0)
    max_top_k: int = 1000
    max_speculative_tokens: int = 16
    max_n: int = 16                 # choices per request
    max_prompts: int = 32           # prompts in one completions request (an array); prompts x n <= max_choices
    max_choices: int = 64
    max_prompt_logprobs: int = 1_000_000  # echo with logprobs k: prompt tokens x (k + 1) entries kept (~100 MB)
    grammar_timeout_s: float | None = 30.0  # a schema/regex/grammar compile (minLength 2000 on Gemma 3: ~9 s)
    max_grammar_compiles: int = 8   # compiles running or queued at once (threads); more are ServerBusyError


# While a grammar compiles in a thread (pure Python, holding the GIL), the engine loop re-takes the GIL after each
# of its GPU calls and waited up to the default 5 ms switch interval for it: decoding slowed 5-9x (measured on
# lavapipe, docs/structured-output.md). 0.5 ms while a compile runs keeps the loop's host time close to alone.
COMPILE_SWITCH_INTERVAL_S = 0.0005
COMPILE_THREADS = 4


class _SwitchInterval:
    """sys.setswitchinterval lowered while any compile of any LLM in the process runs, restored after the last."""

    def __init__(self):
        self._lock, self._count, self._saved = threading.Lock(), 0, None

    def lower(self) -> None:
        with self._lock:
            if self._count == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, COMPILE_SWITCH_INTERVAL_S))
            self._count += 1

    def restore(self) -> None:
        with self._lock:
            self._count -= 1
            if self._count == 0:
                sys.setswitchinterval(self._saved)


_switch_interval = _SwitchInterval()


# OpenAI request fields that ask for something not implemented: accepted only with their neutral values.
_NEUTRAL: dict[str, tuple] = {
    "best_of": (1,), "suffix": ("",),
    "functions": ([],), "function_call": ("none", "auto"), "audio": (), "modalities": (["text"],),
    "prediction": (), "reasoning_effort": (), "verbosity": (), "web_search_options": (), "store": (False,),
    "service_tier": ("auto", "default"),
}
# Fields that change nothing about the output: identifiers and metadata (accepted with any value of their type).
_INERT = {"model": str, "user": str, "safety_identifier": str, "prompt_cache_key": str, "metadata": dict}
_SAMPLING = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
             "stop_token_ids", "ignore_eos", "stream", "stream_options", "speculative_tokens", "min_p", "logit_bias",
             "response_format", "frequency_penalty", "presence_penalty", "repetition_penalty", "logprobs",
             "top_logprobs", "n", "prompt_logprobs")
CHAT_FIELDS = frozenset(("messages", "tools", "tool_choice", "parallel_tool_calls") + _SAMPLING) | set(_NEUTRAL) | set(_INERT)
COMPLETION_FIELDS = frozenset(("prompt", "echo") + _SAMPLING) | set(_NEUTRAL) | set(_INERT)


def _num(name: str, v, lo, hi, integer=False):
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        raise InvalidRequestError(name, f"must be {'an integer' if integer else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise InvalidRequestError(name, f"must be between {lo} and {hi}, got {v}")
    return v


# Names and ids a template may write as its own text (outside the content spans marked untrusted): nothing that
# could spell a control token
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def _text(content, where: str) -> str:
    """A message's content: a string, or OpenAI's list of {"type": "text", "text": ...} parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidRequestError(where, "must be a string or a list of {\"type\": \"text\", \"text\": str} parts")


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's tool_calls, with each arguments JSON string parsed (templates write them with tojson,
    as transformers' and vLLM's callers pass them)."""
    if not isinstance(calls, list) or not calls:
        raise InvalidRequestError(where, "must be a non-empty list of {id, type: \"function\", function: {name, arguments}}")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and _ID.match(fn["name"])
                and isinstance(fn.get("arguments"), str) and c.get("type", "function") == "function"
                and isinstance(c.get("id", "x"), str) and _ID.match(c.get("id", "x"))):
            raise InvalidRequestError(f"{where}[{j}]", "must be {\"id\": str, \"type\": \"function\", "
                                                       "\"function\": {\"name\": str, \"arguments\": str}} (id and "
                                                       "name: letters, digits, _ . : -)")
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            raise InvalidRequestError(f"{where}[{j}].function.arguments", "is not a JSON string") from None
        out.append({"id": c.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def check_messages(messages, limits: Limits) -> list[dict]:
    """Messages as OpenAI sends them -> what the chat template gets: roles system (developer is taken as system),
    user, assistant (content may be null when it has tool_calls) and tool (with tool_call_id)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of {role, content}")
    if len(messages) > limits.max_messages:
        raise InvalidRequestError("messages", f"at most {limits.max_messages} messages, got {len(messages)}")
    total, out = 0, []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise InvalidRequestError(f"messages[{i}]", "must be {\"role\": str, \"content\": str}")
        role = "system" if m["role"] == "developer" else m["role"]
        if role not in ("system", "user", "assistant", "tool"):
            raise InvalidRequestError(f"messages[{i}].role", f"must be system, developer, user, assistant or tool, "
                                                             f"got {m['role']!r}")
        msg = {"role": role}
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
            total += sum(len(str(c["function"]["arguments"])) for c in msg["tool_calls"])
            msg["content"] = None if m.get("content") is None else _text(m["content"], f"messages[{i}].content")
        else:
            msg["content"] = _text(m.get("content"), f"messages[{i}].content")
        if role == "tool":
            if not (isinstance(m.get("tool_call_id"), str) and _ID.match(m["tool_call_id"])):
                raise InvalidRequestError(f"messages[{i}].tool_call_id", "a tool message needs the id of its call "
                                                                         "(letters, digits, _ . : -)")
            msg["tool_call_id"] = m["tool_call_id"]
        if m.get("name") is not None:
            if not (isinstance(m["name"], str) and _ID.match(m["name"])):
                raise InvalidRequestError(f"messages[{i}].name", "must be 1-128 letters, digits, _ . : -")
            msg["name"] = m["name"]
        n = len(msg["content"] or "")
        if n > limits.max_message_chars:
            raise InvalidRequestError(f"messages[{i}].content", f"at most {limits.max_message_chars} characters")
        total += n
        out.append(msg)
    if total > limits.max_prompt_chars:
        raise InvalidRequestError("messages", f"at most {limits.max_prompt_chars} characters in all, got {total}")
    return out


@dataclass
class ParsedRequest:
    kind: str                      # "chat" | "completion"
    prompt: Any                    # checked messages, or the completions prompt (text or ids)
    params: SamplingParams
    stream: bool
    include_usage: bool            # stream_options.include_usage: a last chunk with usage and no choices
    response_format: Any = None    # checked shape; compiled to a grammar by the LLM
    continuous_usage: bool = False # stream_options.continuous_usage_stats (vLLM's extension): usage on every chunk
    n: int = 1                     # choices, sampled independently (choice i's seed: choice_seed(seed, i))
    tools: list | None = None      # checked `tools` (chat), passed to the template
    tool_choice: Any = "none"      # "none" | "auto" | "required" | {"name": ...}
    parallel_tool_calls: bool = True
    echo: bool = False             # completions: the prompt comes back before the completion (with its logprobs)
    score_only: bool = False       # completions with echo and max_tokens 0: the prompt's logprobs, no completion
    batch: bool = False            # completions: `prompt` is an array of prompts (prompts[p]'s choice j: p * n + j)
    prompt_logprobs: int | None = None  # vLLM's extension: each prompt token's logprob and the top k, in the response


def parse_request(kind: str, req: dict, limits: Limits, speculative_tokens: int = 0) -> ParsedRequest:
    """The one mapping from an OpenAI request body to what the engine runs (HTTP, Python and the page use it)."""
    allowed = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    for k, v in req.items():
        if k not in allowed:
            raise InvalidRequestError(k, "is not a field of this endpoint")
        if k in _NEUTRAL and v is not None and v not in _NEUTRAL[k]:
            raise InvalidRequestError(k, f"is not supported by this server yet (got {v!r})")
        if k in _INERT and v is not None and not isinstance(v, _INERT[k]):
            raise InvalidRequestError(k, f"must be a {_INERT[k].__name__}")
    g = req.get
    stream = g("stream") or False
    if not isinstance(stream, bool):
        raise InvalidRequestError("stream", "must be true or false")
    opts = g("stream_options")
    if opts is not None and not (isinstance(opts, dict) and set(opts) <= {"include_usage", "continuous_usage_stats"}
                                 and all(isinstance(v, bool) for v in opts.values())):
        raise InvalidRequestError("stream_options", "must be {\"include_usage\": bool, \"continuous_usage_stats\": bool}")
    if opts and not stream:
        raise InvalidRequestError("stream_options", "is only allowed with stream: true")
    mt = g("max_tokens") if g("max_tokens") is not None else g("max_completion_tokens")
    name = "max_tokens" if g("max_tokens") is not None else "max_completion_tokens"
    echo = g("echo") or False
    if not isinstance(echo, bool):
        raise InvalidRequestError("echo", "must be true or false")
    # max_tokens 0 with echo: score the prompt only (the engine samples one token, which is dropped)
    mt = 64 if mt is None else _num(name, mt, 0 if echo else 1, limits.max_tokens, integer=True)
    score_only = mt == 0
    t = 1.0 if g("temperature") is None else _num("temperature", g("temperature"), *limits.temperature)
    p = 1.0 if g("top_p") is None else _num("top_p", g("top_p"), 0.0, 1.0)
    if p == 0:
        raise InvalidRequestError("top_p", "must be greater than 0")
    k = 0 if g("top_k") is None else _num("top_k", g("top_k"), 0, limits.max_top_k, integer=True)
    s = 0 if g("seed") is None else _num("seed", g("seed"), 0, 2**63 - 1, integer=True)
    stop = g("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        raise InvalidRequestError("stop", "must be a string or a list of strings")
    if len(stop) > limits.max_stop or any(len(x) > limits.max_stop_chars for x in stop):
        raise InvalidRequestError("stop", f"at most {limits.max_stop} strings of at most {limits.max_stop_chars} characters")
    stop_ids = g("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in stop_ids)):
        raise InvalidRequestError("stop_token_ids", "must be a list of token ids")
    ignore_eos = g("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise InvalidRequestError("ignore_eos", "must be true or false")
    spec = speculative_tokens if g("speculative_tokens") is None else _num(
        "speculative_tokens", g("speculative_tokens"), 0, limits.max_speculative_tokens, integer=True)
    min_p = 0.0 if g("min_p") is None else _num("min_p", g("min_p"), 0.0, 1.0)
    bias = _logit_bias(g("logit_bias"))
    rf = g("response_format")
    if rf is not None and not (isinstance(rf, dict) and isinstance(rf.get("type"), str)):
        raise InvalidRequestError("response_format", "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\" | "
                                                     "\"regex\" | \"grammar\", ...}")
    if rf is not None and rf["type"] != "text":
        spec = 0  # a constrained request's mask depends on each accepted token: no speculation
    pen = {f: float(_num(f, g(f), -2.0, 2.0)) for f in ("frequency_penalty", "presence_penalty") if g(f) is not None}
    if g("repetition_penalty") is not None:
        pen["repetition_penalty"] = float(_num("repetition_penalty", g("repetition_penalty"), 0.01, 10.0))
    lp = _logprobs(kind, g)
    plp = None if g("prompt_logprobs") is None else _num("prompt_logprobs", g("prompt_logprobs"), 0, 20, integer=True)
    if plp is not None and stream:
        raise InvalidRequestError("prompt_logprobs", "is not available with stream: true (as in vLLM)")
    scored = [k for k in (lp if echo else None, plp) if k is not None]  # the engine keeps the larger top list
    params = SamplingParams(max_tokens=max(mt, 1), temperature=float(t), top_p=float(p), top_k=k, seed=s, stop=stop,
                            stop_token_ids=list(stop_ids), ignore_eos=ignore_eos, speculative_tokens=spec,
                            min_p=float(min_p), logit_bias=bias, logprobs=lp,
                            prompt_logprobs=max(scored) if scored else None, **pen)
    n = 1 if g("n") is None else _num("n", g("n"), 1, limits.max_n, integer=True)
    tools = check_tools(g("tools")) if g("tools") else None
    choice = check_tool_choice(g("tool_choice"), tools or [])
    ptc = True if g("parallel_tool_calls") is None else g("parallel_tool_calls")
    if not isinstance(ptc, bool):
        raise InvalidRequestError("parallel_tool_calls", "must be true or false")
    if choice not in ("none", "auto") and rf is not None and rf["type"] != "text":
        raise InvalidRequestError("tool_choice", "a forced tool call cannot be combined with response_format")
    if choice not in ("none", "auto"):
        params.speculative_tokens = 0  # the call's grammar mask depends on each accepted token
    extra = dict(n=n, tools=tools, tool_choice=choice, parallel_tool_calls=ptc)
    batch = False
    if kind == "chat":
        prompt = check_messages(g("messages"), limits)
    else:
        prompt = g("prompt")
        batch = isinstance(prompt, list) and bool(prompt) and all(isinstance(x, (str, list)) for x in prompt)
        if batch and (len(prompt) > limits.max_prompts or len(prompt) * n > limits.max_choices):
            raise InvalidRequestError("prompt", f"at most {limits.max_prompts} prompts and {limits.max_choices} "
                                                f"choices (prompts x n) in one request, got {len(prompt)} x {n}")
        chars = sum(len(x) for x in prompt if isinstance(x, str)) if batch else len(prompt) if isinstance(prompt, str) else 0
        if chars > limits.max_prompt_chars:
            raise InvalidRequestError("prompt", f"at most {limits.max_prompt_chars} characters, got {chars}")
    return ParsedRequest(kind, prompt, params, stream, bool(opts and opts.get("include_usage")),
                         None if rf is None or rf["type"] == "text" else rf, bool(opts and opts.get("continuous_usage_stats")),
                         **extra, echo=echo, score_only=score_only, batch=batch, prompt_logprobs=plp)


def choice_seed(seed: int, i: int) -> int:
    """The sampling seed of choice i of a request with `seed` (n > 1): choice 0 keeps the seed itself, so n=1 and
    the first of n choices agree; the others take 32 bits of sha256("seed:i"), independent of each other."""
    return seed if i == 0 else int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:4], "little")


def _logprobs(kind: str, g) -> int | None:
    """How many alternatives each token's logprob comes with (None: no logprobs). Chat: logprobs (bool) and
    top_logprobs (0..20); completions: logprobs (an integer 0..20; OpenAI allows up to 5)."""
    lp, top = g("logprobs"), g("top_logprobs")
    if kind == "chat":
        if lp is not None and not isinstance(lp, bool):
            raise InvalidRequestError("logprobs", "must be true or false")
        n = 0 if top is None else _num("top_logprobs", top, 0, 20, integer=True)
        if top is not None and not lp:
            raise InvalidRequestError("top_logprobs", "needs logprobs: true")
        return n if lp else None
    if top is not None:
        raise InvalidRequestError("top_logprobs", "is a chat field: completions take logprobs as an integer")
    return None if lp is None else _num("logprobs", lp, 0, 20, integer=True)


def _logit_bias(v) -> dict:
    """OpenAI's logit_bias: {token id (a JSON key, so a string): bias in [-100, 100]}."""
    if v is None:
        return {}
    if not isinstance(v, dict) or len(v) > 1024:
        raise InvalidRequestError("logit_bias", "must be an object of at most 1024 {token id: bias} entries")
    out = {}
    for key, b in v.items():
        try:
            t = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
        if t < 0:
            raise InvalidRequestError("logit_bias", f"token id {t} is negative")
        out[t] = float(_num(f"logit_bias[{key}]", b, -100, 100))
    return out


def usage_of(lasts: list, n_prompt: int) -> dict:
    """OpenAI's usage for a request's choices (their last outputs so far): the prompt counted once, the completion
    tokens of all choices; timings and cache hits are choice 0's."""
    first = lasts[0]
    n_out = sum(o.num_output_tokens for o in lasts if o is not None)
    u = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
         "prompt_tokens_details": {"cached_tokens": first.num_cached_tokens if first else 0},
         "ttft_s": first.ttft_s if first else None,
         "time_per_output_token_s": first.time_per_output_token_s if first else None}
    proposed = sum(o.num_proposed for o in lasts if o is not None)
    if proposed:
        u["speculative"] = {"proposed_tokens": proposed, "accepted_tokens": sum(o.num_accepted for o in lasts if o)}
    return u


_END = object()  # _Merged: an iterator ended


class _Merged:
    """The items of async iterators as they come, each as (key, item), and (key, _END) when one ends; iterators may
    join while it runs. An iterator's exception is raised to the consumer; aclose() cancels and closes them all (a
    consumer that leaves early aborts its requests at once)."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.running = 0

    def add(self, key, gen) -> None:
        async def pump() -> None:
            try:
                async for item in gen:
                    self.queue.put_nowait((key, item))
            except Exception as e:
                self.queue.put_nowait((key, e))
            finally:
                await gen.aclose()
                self.queue.put_nowait((key, _END))

        self.tasks.append(asyncio.get_running_loop().create_task(pump()))
        self.running += 1

    async def __aiter__(self):
        while self.running:
            key, item = await self.queue.get()
            if isinstance(item, Exception):
                raise item
            self.running -= item is _END
            yield key, item

    async def aclose(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class LLM:
    """engine: token ids in and out; tokenizer + prompter: text and chat messages <-> ids."""

    def __init__(self, engine: AsyncEngine, tokenizer, prompter, model_name: str = "webinfer",
                 limits: Limits | None = None, speculative_tokens: int = 0):
        """speculative_tokens: the default of the `speculative_tokens` request extension (proposals verified per
        step; needs an engine with a proposer)."""
        self.engine, self.tokenizer, self.prompter = engine, tokenizer, prompter
        self.model_name, self.limits = model_name, limits or Limits()
        self.speculative_tokens = speculative_tokens
        self._grammars = None  # grammar.GrammarCache over this tokenizer, built on the first constrained request
        self._compile_pool = None  # its compile threads (CPython), made on the first compile
        self.compiles = 0  # compiles running or queued in them
        self._compiles_lock = threading.Lock()
        self.owns_runner = False  # webinfer.load sets it for the runner it made (close() closes that one)
        self.chat = _Chat(self)
        self.completions = _Completions(self)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def grammars(self):
        """The grammar.GrammarCache over this tokenizer (built on first use: a vocabulary's trie takes a while)."""
        if self._grammars is None:
            from webinfer.grammar import GrammarCache, TokenVocab

            self._grammars = GrammarCache(TokenVocab.from_tokenizer(self.tokenizer, self.engine.runner.vocab_size),
                                          timeout_s=self.limits.grammar_timeout_s)
        return self._grammars

    async def close(self) -> None:
        """End the engine (open streams get EngineStepError); a runner this LLM owns (webinfer.load made it) is
        closed too: the CPU engine's second thread ends. A runner passed in stays its owner's to close."""
        await self.engine.close()
        if self._compile_pool is not None:
            self._compile_pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.engine.runner, "close", None) if self.owns_runner else None
        if close is not None:
            close()

    def prompt_ids(self, r: ParsedRequest) -> list[int]:
        """The request's prompt ids; for an array of prompts (r.batch), a list of each one's ids."""
        if r.kind == "chat":
            return self.prompter.chat_ids(r.prompt, r.tools)
        if not r.batch:
            return self.prompter.prompt_ids(r.prompt)
        out = []
        for i, x in enumerate(r.prompt):
            try:
                out.append(self.prompter.prompt_ids(x))
            except InvalidRequestError as e:
                raise InvalidRequestError(f"prompt[{i}]", e.problem) from None
        return out

    def tool_format(self, r: ParsedRequest):
        """The tool-call format to parse the reply with (None: no tool calls in this request)."""
        if r.tool_choice == "none" or not r.tools:
            return None
        fmt = template_format(self.prompter.chat_template)
        if fmt is None:
            raise InvalidRequestError("tools", "this model's chat template has no tool-call format webinfer reads "
                                               "(supported: <tool_call> JSON as Qwen2.5 / Hermes, Llama 3.1 JSON)")
        return fmt

    def text_stream(self, params: SamplingParams) -> TextStream:
        skip = frozenset() if params.ignore_eos else self.engine.eos_ids
        return TextStream(incremental_decoder(self.tokenizer), params.stop, skip)

    def prepare(self, kind: str, request: dict) -> tuple[ParsedRequest, list]:
        """The checked request and its prompt ids (a list of each prompt's ids for an array of prompts: r.batch)
        (template rendering and tokenization: the costly, synchronous part, which a server runs in a worker
        thread)."""
        r = parse_request(kind, request, self.limits, self.speculative_tokens)
        if r.params.speculative_tokens and self.engine.proposer is None:
            raise InvalidRequestError("speculative_tokens", "this engine has no speculative proposer (start it with "
                                                            "speculative decoding on, e.g. --speculative prompt-lookup)")
        vocab = self.engine.runner.vocab_size
        if any(not 0 <= t < vocab for t in r.params.logit_bias):
            raise InvalidRequestError("logit_bias", f"token ids must be in [0, {vocab})")
        self.tool_format(r)  # a 400 before any work when the template has no format we read
        ids = self.prompt_ids(r)
        for one in ids if r.batch else [ids]:
            self.engine.scheduler.check_prompt(len(one))  # ContextOverflowError before any output
        k = r.params.prompt_logprobs
        if k is not None:  # the scores are kept until the prompt's first token: bound what one request holds
            n = sum(map(len, ids)) if r.batch else len(ids)
            if n * (k + 1) > self.limits.max_prompt_logprobs:
                field, what = ("logprobs", "echo with logprobs") if k != r.prompt_logprobs else \
                    ("prompt_logprobs", "prompt_logprobs")
                raise InvalidRequestError(field, f"{what} {k} over {n} prompt tokens keeps "
                                                      f"{n * (k + 1)} values, more than "
                                                      f"{self.limits.max_prompt_logprobs}: ask for fewer")
        return r, ids

    async def create(self, kind: str, request: dict, executor=None):
        """A completion (kind "completion") or chat completion for an OpenAI request body: the result dict, or an
        async iterator of chunks when request["stream"]. executor: where prepare() runs (None: inline)."""
        if executor is not None:
            r, ids = await asyncio.get_running_loop().run_in_executor(executor, self.prepare, kind, request)
        else:
            r, ids = self.prepare(kind, request)
        return await self.run(r, ids)

    async def run(self, r: ParsedRequest, ids: list):
        """Generate for a prepared request (see create)."""
        kind = r.kind
        fmt = self.tool_format(r)
        masks = await self._masks(r, fmt)
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        prompts = ids if r.batch else [ids]
        outs = self._all_outputs(r, prompts, masks)
        head = {"id": rid, "created": int(time.time()), "model": self.model_name}
        if r.stream:
            return self._stream(r, head, outs, ids, fmt)
        n = r.n * len(prompts)
        text = [[] for _ in range(n)]
        out_ids = [[] for _ in range(n)]
        lps = [[] for _ in range(n)]
        prompt_lps: list = [None] * n
        last: list[RequestOutput | None] = [None] * n
        try:
            async for i, out in outs:
                text[i].append(out.text)
                out_ids[i] += out.token_ids
                lps[i] += out.logprobs or []
                prompt_lps[i] = out.prompt_logprobs if prompt_lps[i] is None else prompt_lps[i]
                last[i] = out
        finally:
            await outs.aclose()
        choices = []
        for i in range(n):
            reason = last[i].finish_reason if last[i] else "abort"
            choice = {"index": i, "finish_reason": reason, "token_ids": out_ids[i]}
            if kind == "chat":
                choice["message"] = {"role": "assistant", "content": "".join(text[i])}
                if fmt is not None:
                    content, calls = collect(ToolCallParser(fmt).feed("".join(text[i]), final=True))
                    if calls:
                        choice["message"] = {"role": "assistant", "content": content or None, "tool_calls": calls}
                        choice["finish_reason"] = "tool_calls" if reason == "stop" else reason
            else:
                choice["text"] = (self._echo_text(r, prompts, i) if r.echo else "") + "".join(text[i])
            if r.params.logprobs is not None:
                echo = (prompts[i // r.n], self._top(prompt_lps[i - i % r.n] or [], r.params.logprobs)) \
                    if r.echo else None
                choice["logprobs"] = self._logprobs(kind, out_ids[i], lps[i], echo)
            if r.prompt_logprobs is not None and kind != "chat":
                choice["prompt_logprobs"] = self._prompt_logprobs(prompts[i // r.n], prompt_lps[i - i % r.n] or [],
                                                                  r.prompt_logprobs)
            choices.append(choice)
        usage = usage_of(last, sum(len(p) for p in prompts))
        out = {**head, "object": "chat.completion" if kind == "chat" else "text_completion", "choices": choices,
               "usage": usage, "prompt_token_ids": ids}
        if r.prompt_logprobs is not None and kind == "chat":  # (vLLM: on the response, the one prompt's)
            out["prompt_logprobs"] = self._prompt_logprobs(ids, prompt_lps[0] or [], r.prompt_logprobs)
        return out

    @staticmethod
    def _top(scores: list, k: int) -> list:
        """Prompt logprobs with each top list cut to k (the engine computed the larger of echo's and
        prompt_logprobs' k)."""
        return [(lp, top[:k], rank) for lp, top, rank in scores]

    def _prompt_logprobs(self, ids: list[int], scores: list, k: int) -> list:
        """vLLM's prompt_logprobs: None for the first prompt token, then per token {id: {logprob, rank,
        decoded_token}} with the prompt token and the top k. rank: 1-based in the whole vocabulary (logit
        descending, id ascending), the prompt token's counted by the sampler."""
        out: list = [None]
        for t, (lp, top, rank) in zip(ids[1:], scores):
            d = {i: {"logprob": v, "rank": j + 1, "decoded_token": self._token(i)[0]}
                 for j, (i, v) in enumerate(top[:k])}
            if t not in d:
                d[t] = {"logprob": lp, "rank": rank, "decoded_token": self._token(t)[0]}
            out.append(d)
        return out

    def _echo_text(self, r: ParsedRequest, prompts: list, i: int) -> str:
        """Choice i's prompt as echo returns it: the prompt string as sent, or its token ids decoded."""
        p = r.prompt[i // r.n] if r.batch else r.prompt
        return p if isinstance(p, str) else self.tokenizer.decode(prompts[i // r.n])

    def _token(self, t: int) -> tuple[str, list[int]]:
        """A token's text and bytes as OpenAI's logprobs show them (special tokens: their name)."""
        b = self.tokenizer.token_bytes(t)
        if b is None:
            name = self.tokenizer.id_to_token(t) or ""
            return name, list(name.encode())
        return b.decode("utf-8", errors="replace"), list(b)

    def _logprobs(self, kind: str, ids: list[int], lps: list, echo: tuple | None = None) -> dict:
        """OpenAI's logprobs object for these tokens: chat's {"content": [...]}, completions' parallel lists.
        echo: (prompt ids, their prompt logprobs): the prompt's tokens first, the first one with null logprobs."""
        rows = [(t, lp) for t, lp in zip(ids, lps) if lp is not None]
        if kind == "chat":
            content = []
            for t, (lp, top, _) in rows:
                text, b = self._token(t)
                content.append({"token": text, "logprob": lp, "bytes": b, "top_logprobs": [
                    {"token": (tt := self._token(i))[0], "logprob": v, "bytes": tt[1]} for i, v in top]})
            return {"content": content, "refusal": None}
        if echo is not None:
            p_ids, p_lps = echo
            rows = list(zip(p_ids, [None] + list(p_lps))) + rows
        tokens, offsets, pos = [], [], 0
        for t, _ in rows:
            tokens.append(self._token(t)[0])
            offsets.append(pos)
            pos += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [lp[0] if lp else None for _, lp in rows], "text_offset": offsets,
                "top_logprobs": [{self._token(i)[0]: v for i, v in lp[1]} if lp else None for _, lp in rows]}

    async def _masks(self, r: ParsedRequest, fmt):
        """The grammar's TokenMasks for response_format or a forced tool call (None: unconstrained). GrammarError,
        a 400 naming the field, when it cannot be enforced or its compile passes limits.grammar_timeout_s;
        ServerBusyError when limits.max_grammar_compiles are already under way. A cached grammar is returned at
        once; a new one compiles in a thread (CPython), off the event loop, with the GIL handed over often."""
        if r.response_format is None and r.tool_choice in ("none", "auto"):
            return None
        from webinfer.grammar import cache_key, grammar_from_response_format, response_format_key

        cache = self.grammars
        if r.response_format is not None:
            key = response_format_key(r.response_format)
            if key is None:
                return None
            build, where = functools.partial(grammar_from_response_format, r.response_format), "response_format"
        else:
            tool_key = grammar_key(r.tools, r.tool_choice, fmt, r.parallel_tool_calls)
            key, build, where = cache_key(tool_key), functools.partial(call_grammar, tool_key), "tools"
        masks = cache.peek(key)
        if masks is not None:
            return masks
        get = functools.partial(cache.compile, key, build, where)
        if sys.platform == "emscripten":  # Pyodide: no threads
            return get()
        if self.compiles >= self.limits.max_grammar_compiles:
            raise ServerBusyError(f"{self.compiles} grammar compiles are under way (the limit); retry later")
        if self._compile_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._compile_pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="webinfer-grammar")
        fut = self._compile_pool.submit(get)
        _switch_interval.lower()
        with self._compiles_lock:
            self.compiles += 1
        # counted until the thread is done with it (or it is dropped from the queue), not until this request
        # stops waiting: a client that leaves does not free the slot of a compile still running
        fut.add_done_callback(self._compile_done)  # (in the thread that ends it: no event loop needed)
        return await asyncio.wrap_future(fut)

    def _compile_done(self, _fut) -> None:
        with self._compiles_lock:
            self.compiles -= 1
        _switch_interval.restore()

    async def _all_outputs(self, r: ParsedRequest, prompts: list, masks) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) of every prompt's n choices as they come (prompt p's choice j: p * n + j); the
        prompts run side by side. A score-only request's one sampled token is dropped here."""
        def shown(out: RequestOutput) -> RequestOutput:
            if not r.score_only:
                return out
            return dataclasses.replace(out, token_ids=[], text="", logprobs=[], num_output_tokens=0,
                                       finish_reason="length" if out.finish_reason is not None else None)

        merged = _Merged()
        try:
            for p, ids in enumerate(prompts):
                merged.add(p, self._outputs(r, ids, masks))
            async for p, item in merged:
                if item is not _END:
                    yield p * r.n + item[0], shown(item[1])
        finally:
            await merged.aclose()

    async def _outputs(self, r: ParsedRequest, ids: list[int], masks) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) of the request's n choices as they come. Choice 0 runs alone until its prompt is
        computed (its first output); the others then start and find the prompt's full blocks in the prefix cache,
        so the prompt is computed once (the last partial block again per choice). Leaving early aborts them all."""
        from webinfer.grammar import GrammarMatcher

        def start(i: int):
            # (the prompt's logprobs are choice 0's: the others take the prompt from the prefix cache)
            params = r.params if i == 0 else dataclasses.replace(r.params, seed=choice_seed(r.params.seed, i),
                                                                 prompt_logprobs=None)
            matcher = GrammarMatcher(masks, stop_ids=self.engine.eos_ids) if masks is not None else None
            return self.engine.generate(ids, params, self.text_stream(params), matcher)

        merged = _Merged()
        try:
            merged.add(0, start(0))
            async for i, item in merged:
                if i == 0 and len(merged.tasks) == 1:  # the prompt is in the cache now (or choice 0 ended)
                    for j in range(1, r.n):
                        merged.add(j, start(j))
                if item is not _END:
                    yield i, item
        finally:
            await merged.aclose()  # the consumer left: abort now, not at garbage collection

    async def _stream(self, r: ParsedRequest, head: dict, outs, prompt_ids: list, fmt) -> AsyncIterator[dict]:
        chat = r.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        prompts = prompt_ids if r.batch else [prompt_ids]
        n, n_prompt = r.n * len(prompts), sum(len(p) for p in prompts)
        parsers = [ToolCallParser(fmt) if fmt is not None else None for _ in range(n)]
        started, last = [False] * n, [None] * n
        prompt_lps: dict[int, list] = {}  # prompt p's logprobs, from its choice 0's first output (which comes first)
        n_done = 0
        try:
            async for i, out in outs:
                last[i] = out
                reason = out.finish_reason
                c = {"index": i, "finish_reason": reason, "token_ids": out.token_ids}
                if chat:
                    delta = {"role": "assistant"} if not started[i] else {}
                    if parsers[i] is None:
                        delta["content"] = out.text
                    else:
                        ev = parsers[i].feed(out.text, final=reason is not None)
                        delta["content"] = "".join(e[1] for e in ev if e[0] == "content")
                        calls = delta_calls(ev)
                        if calls:
                            delta["tool_calls"] = calls
                        if reason == "stop" and parsers[i].n_calls:
                            c["finish_reason"] = "tool_calls"
                    c["delta"] = delta
                else:  # (echo: a choice's first chunk starts with its prompt)
                    c["text"] = (self._echo_text(r, prompts, i) if r.echo and not started[i] else "") + out.text
                if out.prompt_logprobs is not None:
                    prompt_lps[i // r.n] = out.prompt_logprobs
                if r.params.logprobs is not None:
                    echo = (prompts[i // r.n], prompt_lps.get(i // r.n, [])) if r.echo and not started[i] else None
                    c["logprobs"] = self._logprobs(r.kind, out.token_ids, out.logprobs or [], echo)
                d = {**head, "object": obj, "choices": [c]}
                if not any(started):
                    d["prompt_token_ids"] = prompt_ids
                started[i] = True
                n_done += reason is not None
                if n_done == n and reason is not None or r.continuous_usage:
                    d["usage"] = usage_of(last, n_prompt)
                yield d
                if n_done == n and reason is not None and r.include_usage:
                    yield {**head, "object": obj, "choices": [], "usage": usage_of(last, n_prompt)}
        finally:
            await outs.aclose()  # the consumer left: abort now, not at garbage collection


class _ChatCompletions:
    def __init__(self, llm: LLM):
        self.llm = llm

    async def create(self, **request):
        return await self.llm.create("chat", request)


class _Chat:
    def __init__(self, llm: LLM):
        self.completions = _ChatCompletions(llm)


class _Completions:
    def __init__(self, llm: LLM):
        self.llm = llm

    async def create(self, **request):
        return await self.llm.create("completion", request)
