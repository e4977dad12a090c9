"""OpenAI-shaped Python API over an AsyncEngine (runs in Pyodide as well as CPython).

    llm = LLM(engine)
    r = await llm.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=32)
    r["choices"][0]["message"]["content"]
    async for chunk in await llm.chat.completions.create(messages=..., stream=True):
        chunk["choices"][0]["delta"].get("content", "")

Results are plain dicts shaped like OpenAI's, plus `usage.ttft_s`, `usage.time_per_output_token_s` and the
produced ids in `choices[i]["token_ids"]` (an extension). Every parameter is checked before anything runs:
a bad one raises InvalidRequestError naming it, a prompt that cannot fit raises ContextOverflowError.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

from webinfer.engine.engine import AsyncEngine, RequestOutput
from webinfer.engine.stopping import SamplingParams
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


def _num(name: str, v, lo, hi, integer=False):
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        raise InvalidRequestError(name, f"must be {'an integer' if integer else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise InvalidRequestError(name, f"must be between {lo} and {hi}, got {v}")
    return v


def sampling_params(limits: Limits, max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None,
                    stop=None, ignore_eos=False) -> SamplingParams:
    mt = 64 if max_tokens is None else _num("max_tokens", max_tokens, 1, limits.max_tokens, integer=True)
    t = 1.0 if temperature is None else _num("temperature", temperature, *limits.temperature)
    p = 1.0 if top_p is None else _num("top_p", top_p, 0.0, 1.0)
    if p == 0:
        raise InvalidRequestError("top_p", "must be greater than 0")
    k = 0 if top_k is None else _num("top_k", top_k, 0, limits.max_top_k, integer=True)
    s = 0 if seed is None else _num("seed", seed, 0, 2**63 - 1, integer=True)
    if stop is None:
        stop = []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        raise InvalidRequestError("stop", "must be a string or a list of strings")
    if len(stop) > limits.max_stop or any(len(x) > limits.max_stop_chars for x in stop):
        raise InvalidRequestError("stop", f"at most {limits.max_stop} strings of at most {limits.max_stop_chars} characters")
    return SamplingParams(max_tokens=mt, temperature=float(t), top_p=float(p), top_k=k, seed=s, stop=stop,
                          ignore_eos=bool(ignore_eos))


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


def _usage(last: RequestOutput | None, n_prompt: int) -> dict:
    n_out = last.num_output_tokens if last else 0
    gaps = last.token_times_s if last else []
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": last.num_cached_tokens if last else 0},
            "ttft_s": last.ttft_s if last else None,
            "time_per_output_token_s": (sum(gaps) / len(gaps)) if gaps else None}


class LLM:
    def __init__(self, engine: AsyncEngine, limits: Limits | None = None):
        self.engine, self.limits = engine, limits or Limits()
        self.chat = _Chat(self)
        self.completions = _Completions(self)

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        from webinfer.chat_template import render

        e = self.engine
        if not e.chat_template:
            raise InvalidRequestError("messages", "this model has no chat template: use completions with a prompt")
        sp = e.special_tokens
        text = render(e.chat_template, messages, add_generation_prompt=True, bos_token=sp.get("bos_token") or "",
                      eos_token=sp.get("eos_token") or "")
        return list(e.tokenizer.encode(text))

    def text_prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.engine.runner.vocab_size
            if vocab and any(not 0 <= t < vocab for t in prompt):
                raise InvalidRequestError("prompt", f"token ids must be in [0, {vocab})")
            return list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequestError("prompt", "must be a non-empty string or a list of token ids")
        if len(prompt) > self.limits.max_prompt_chars:
            raise InvalidRequestError("prompt", f"at most {self.limits.max_prompt_chars} characters, got {len(prompt)}")
        return list(self.engine.tokenizer.encode(prompt))

    async def _run(self, kind: str, prompt_ids: list[int], params: SamplingParams, stream: bool):
        self.engine.scheduler.check_prompt(len(prompt_ids))  # ContextOverflowError before any output
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        gen = self.engine.generate(prompt_ids, params)
        if stream:
            return self._stream(kind, rid, created, gen, len(prompt_ids))
        text, ids, last = [], [], None
        try:
            async for out in gen:
                text.append(out.text)
                ids += out.token_ids
                last = out
        finally:
            await gen.aclose()
        choice = {"index": 0, "finish_reason": last.finish_reason if last else "abort", "token_ids": ids}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice["text"] = "".join(text)
        return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion", "created": created,
                "model": self.engine.model_name, "choices": [choice], "usage": _usage(last, len(prompt_ids))}

    async def _stream(self, kind, rid, created, gen, n_prompt) -> AsyncIterator[dict]:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(out: RequestOutput | None, first: bool) -> dict:
            c = {"index": 0, "finish_reason": out.finish_reason if out else None,
                 "token_ids": out.token_ids if out else []}
            text = out.text if out else ""
            if kind == "chat":
                c["delta"] = ({"role": "assistant", "content": text} if first else {"content": text})
            else:
                c["text"] = text
            d = {"id": rid, "object": obj, "created": created, "model": self.engine.model_name, "choices": [c]}
            if out is not None and out.finish_reason is not None:
                d["usage"] = _usage(out, n_prompt)
            return d

        try:
            first = True
            async for out in gen:
                yield chunk(out, first)
                first = False
        finally:
            await gen.aclose()  # the consumer left: abort now, not at garbage collection


class _ChatCompletions:
    def __init__(self, llm: LLM):
        self.llm = llm

    async def create(self, messages, stream: bool = False, max_tokens=None, temperature=None, top_p=None, top_k=None,
                     seed=None, stop=None, model=None, ignore_eos: bool = False, **_ignored):
        lim = self.llm.limits
        msgs = check_messages(messages, lim)
        params = sampling_params(lim, max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos)
        return await self.llm._run("chat", self.llm.chat_prompt_ids(msgs), params, bool(stream))


class _Chat:
    def __init__(self, llm: LLM):
        self.completions = _ChatCompletions(llm)


class _Completions:
    def __init__(self, llm: LLM):
        self.llm = llm

    async def create(self, prompt, stream: bool = False, max_tokens=None, temperature=None, top_p=None, top_k=None,
                     seed=None, stop=None, model=None, ignore_eos: bool = False, **_ignored):
        params = sampling_params(self.llm.limits, max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos)
        return await self.llm._run("completion", self.llm.text_prompt_ids(prompt), params, bool(stream))
