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

Results are plain dicts shaped like OpenAI's, plus extensions: `usage.ttft_s`, `usage.time_per_output_token_s`,
the produced ids in `choices[i]["token_ids"]` and the prompt's ids in `prompt_token_ids` (non-streaming result, and
the first chunk of a stream).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from webinfer.engine.engine import AsyncEngine, RequestOutput
from webinfer.engine.stopping import SamplingParams, TextStream, incremental_decoder
from webinfer.errors import InvalidRequestError


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


# OpenAI request fields that ask for something not implemented: accepted only with their neutral values.
_NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (False,),
    "top_logprobs": (0,), "n": (1,), "best_of": (1,), "echo": (False,), "suffix": ("",),
    "tools": ([],), "tool_choice": ("none", "auto"),
    "functions": ([],), "function_call": ("none", "auto"), "audio": (), "modalities": (["text"],),
    "prediction": (), "reasoning_effort": (), "verbosity": (), "web_search_options": (), "store": (False,),
    "service_tier": ("auto", "default"),
}
# Fields that change nothing about the output: identifiers and metadata (accepted with any value of their type).
_INERT = {"model": str, "user": str, "safety_identifier": str, "prompt_cache_key": str, "metadata": dict,
          "parallel_tool_calls": bool}
_SAMPLING = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
             "stop_token_ids", "ignore_eos", "stream", "stream_options", "speculative_tokens", "min_p", "logit_bias",
             "response_format")
CHAT_FIELDS = frozenset(("messages",) + _SAMPLING) | set(_NEUTRAL) | set(_INERT)
COMPLETION_FIELDS = frozenset(("prompt",) + _SAMPLING) | set(_NEUTRAL) | set(_INERT)


def _num(name: str, v, lo, hi, integer=False):
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        raise InvalidRequestError(name, f"must be {'an integer' if integer else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise InvalidRequestError(name, f"must be between {lo} and {hi}, got {v}")
    return v


def check_messages(messages, limits: Limits) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of {role, content}")
    if len(messages) > limits.max_messages:
        raise InvalidRequestError("messages", f"at most {limits.max_messages} messages, got {len(messages)}")
    total = 0
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise InvalidRequestError(f"messages[{i}]", "must be {\"role\": str, \"content\": str}")
        if m["role"] not in ("system", "user", "assistant"):
            raise InvalidRequestError(f"messages[{i}].role", f"must be system, user or assistant, got {m['role']!r}")
        if len(m["content"]) > limits.max_message_chars:
            raise InvalidRequestError(f"messages[{i}].content", f"at most {limits.max_message_chars} characters")
        total += len(m["content"])
    if total > limits.max_prompt_chars:
        raise InvalidRequestError("messages", f"at most {limits.max_prompt_chars} characters in all, got {total}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


@dataclass
class ParsedRequest:
    kind: str                      # "chat" | "completion"
    prompt: Any                    # checked messages, or the completions prompt (text or ids)
    params: SamplingParams
    stream: bool
    include_usage: bool            # stream_options.include_usage: a last chunk with usage and no choices
    response_format: Any = None    # checked shape; compiled to a grammar by the LLM
    continuous_usage: bool = False # stream_options.continuous_usage_stats (vLLM's extension): usage on every chunk


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
    mt = 64 if mt is None else _num(name, mt, 1, limits.max_tokens, integer=True)
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
    params = SamplingParams(max_tokens=mt, temperature=float(t), top_p=float(p), top_k=k, seed=s, stop=stop,
                            stop_token_ids=list(stop_ids), ignore_eos=ignore_eos, speculative_tokens=spec,
                            min_p=float(min_p), logit_bias=bias)
    if kind == "chat":
        prompt = check_messages(g("messages"), limits)
    else:
        prompt = g("prompt")
        if isinstance(prompt, str) and len(prompt) > limits.max_prompt_chars:
            raise InvalidRequestError("prompt", f"at most {limits.max_prompt_chars} characters, got {len(prompt)}")
    return ParsedRequest(kind, prompt, params, stream, bool(opts and opts.get("include_usage")),
                         None if rf is None or rf["type"] == "text" else rf, bool(opts and opts.get("continuous_usage_stats")))


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


def usage(last: RequestOutput | None, n_prompt: int) -> dict:
    n_out = last.num_output_tokens if last else 0
    u = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
         "prompt_tokens_details": {"cached_tokens": last.num_cached_tokens if last else 0},
         "ttft_s": last.ttft_s if last else None,
         "time_per_output_token_s": last.time_per_output_token_s if last else None}
    if last is not None and last.num_proposed:
        u["speculative"] = {"proposed_tokens": last.num_proposed, "accepted_tokens": last.num_accepted}
    return u


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
        self.chat = _Chat(self)
        self.completions = _Completions(self)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    async def close(self) -> None:
        await self.engine.close()

    def prompt_ids(self, r: ParsedRequest) -> list[int]:
        return self.prompter.chat_ids(r.prompt) if r.kind == "chat" else self.prompter.prompt_ids(r.prompt)

    def text_stream(self, params: SamplingParams) -> TextStream:
        skip = frozenset() if params.ignore_eos else self.engine.eos_ids
        return TextStream(incremental_decoder(self.tokenizer), params.stop, skip)

    def prepare(self, kind: str, request: dict) -> tuple[ParsedRequest, list[int]]:
        """The checked request and its prompt ids (template rendering and tokenization: the costly, synchronous
        part, which a server runs in a worker thread)."""
        r = parse_request(kind, request, self.limits, self.speculative_tokens)
        if r.params.speculative_tokens and self.engine.proposer is None:
            raise InvalidRequestError("speculative_tokens", "this engine has no speculative proposer (start it with "
                                                            "speculative decoding on, e.g. --speculative prompt-lookup)")
        vocab = self.engine.runner.vocab_size
        if any(not 0 <= t < vocab for t in r.params.logit_bias):
            raise InvalidRequestError("logit_bias", f"token ids must be in [0, {vocab})")
        ids = self.prompt_ids(r)
        self.engine.scheduler.check_prompt(len(ids))  # ContextOverflowError before any output
        return r, ids

    async def create(self, kind: str, request: dict, executor=None):
        """A completion (kind "completion") or chat completion for an OpenAI request body: the result dict, or an
        async iterator of chunks when request["stream"]. executor: where prepare() runs (None: inline)."""
        if executor is not None:
            r, ids = await asyncio.get_running_loop().run_in_executor(executor, self.prepare, kind, request)
        else:
            r, ids = self.prepare(kind, request)
        return await self.run(r, ids)

    async def run(self, r: ParsedRequest, ids: list[int]):
        """Generate for a prepared request (see create)."""
        kind = r.kind
        matcher = await self._matcher(r.response_format) if r.response_format is not None else None
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        gen = self.engine.generate(ids, r.params, self.text_stream(r.params), matcher)
        head = {"id": rid, "created": int(time.time()), "model": self.model_name}
        if r.stream:
            return self._stream(r, head, gen, ids)
        text, out_ids, last = [], [], None
        try:
            async for out in gen:
                text.append(out.text)
                out_ids += out.token_ids
                last = out
        finally:
            await gen.aclose()
        choice = {"index": 0, "finish_reason": last.finish_reason if last else "abort", "token_ids": out_ids}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice["text"] = "".join(text)
        return {**head, "object": "chat.completion" if kind == "chat" else "text_completion", "choices": [choice],
                "usage": usage(last, len(ids)), "prompt_token_ids": ids}

    async def _matcher(self, response_format):
        """A GrammarMatcher for response_format (GrammarError, a 400 naming the field, when it cannot be enforced).
        Compiling a schema can take seconds: CPython does it in a thread, off the event loop."""
        from webinfer.grammar import GrammarCache, GrammarMatcher, TokenVocab

        if self._grammars is None:
            self._grammars = GrammarCache(TokenVocab.from_tokenizer(self.tokenizer, self.engine.runner.vocab_size))
        if sys.platform == "emscripten":  # Pyodide: no threads
            masks = self._grammars.get(response_format)
        else:
            masks = await asyncio.to_thread(self._grammars.get, response_format)
        return GrammarMatcher(masks, stop_ids=self.engine.eos_ids)

    async def _stream(self, r: ParsedRequest, head: dict, gen, prompt_ids: list[int]) -> AsyncIterator[dict]:
        chat = r.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        try:
            first = True
            async for out in gen:
                c = {"index": 0, "finish_reason": out.finish_reason, "token_ids": out.token_ids}
                if chat:
                    c["delta"] = {"role": "assistant", "content": out.text} if first else {"content": out.text}
                else:
                    c["text"] = out.text
                d = {**head, "object": obj, "choices": [c]}
                if first:
                    d["prompt_token_ids"] = prompt_ids
                if out.finish_reason is not None or r.continuous_usage:
                    d["usage"] = usage(out, len(prompt_ids))
                first = False
                yield d
                if out.finish_reason is not None and r.include_usage:
                    yield {**head, "object": obj, "choices": [], "usage": usage(out, len(prompt_ids))}
        finally:
            await gen.aclose()  # the consumer left: abort now, not at garbage collection


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
