"""The official `openai` Python client against a real `webinfer serve` (a subprocess on the numpy reference backend):
every request field of /v1/chat/completions and /v1/completions either works or is a 400 naming it, streamed and
not; tools, n and response_format end to end. A tiny random-weight model where only the shape matters (its tools
template: docs/chat-templates/hermes-tools.jinja), SmolLM2 where the content does.

Run: python -m pytest tests/test_openai_client.py -q
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")  # a test dependency (pyproject [test]); skipped only outside the test env

ROOT = Path(__file__).resolve().parent.parent
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(pkg: Path, backend: str = "reference"):
    """`webinfer serve PKG` in a subprocess, once healthy: (process, an openai client of it)."""
    from tests.test_serve_cli import wait_healthy

    port = _free_port()
    p = subprocess.Popen([sys.executable, "-m", "webinfer_packager.cli.main", "serve", str(pkg), "--backend",
                          backend, "--port", str(port), "--no-site"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(p, url, 180)
    return p, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _stop(p) -> None:
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("oai")
    write_hf(tmp / "hf", arch="llama", max_position_embeddings=2048)
    pkg = pack(tmp / "hf", tmp / "pkg", progress=False,
               chat_template=(ROOT / "docs/chat-templates/hermes-tools.jinja").read_text())
    p, c = _server(pkg)
    yield c
    _stop(p)


def _chat(client, stream=False, **kw):
    kw = {"model": "m", "messages": ASK, "max_tokens": 4, **kw}
    if stream:
        return list(client.chat.completions.create(stream=True, **kw))
    return client.chat.completions.create(**kw)


def _complete(client, stream=False, **kw):
    kw = {"model": "m", "prompt": "hello", "max_tokens": 4, **kw}
    if stream:
        return list(client.completions.create(stream=True, **kw))
    return client.completions.create(**kw)


# Each field of OpenAI's reference with a value that asks for something (not the neutral default). extra_body
# carries what the client does not know by name. The rule: it works, or it is a 400 whose param names it.
CHAT_FIELDS = [
    ("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("logit_bias", {"5": 1.0}), ("logprobs", True),
    ("top_logprobs", 2), ("max_completion_tokens", 3), ("metadata", {"k": "v"}), ("n", 2), ("seed", 3),
    ("stop", ["zz"]), ("temperature", 0.7), ("top_p", 0.9), ("user", "u"), ("parallel_tool_calls", False),
    ("response_format", {"type": "json_object"}), ("tools", TOOLS), ("tool_choice", "auto"),
    ("store", True), ("service_tier", "flex"), ("reasoning_effort", "low"), ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}), ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}), ("verbosity", "low"), ("safety_identifier", "s"), ("prompt_cache_key", "k"),
    ("functions", [{"name": "f", "parameters": {}}]), ("function_call", {"name": "f"}),
]
COMPLETION_FIELDS = [
    ("best_of", 2), ("echo", True), ("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("logit_bias", {"5": 1.0}),
    ("logprobs", 2), ("n", 2), ("seed", 3), ("stop", "zz"), ("suffix", "end"), ("temperature", 0.7), ("top_p", 0.9),
    ("user", "u"),
]
KNOWN = {"max_completion_tokens", "metadata", "seed", "stop", "temperature", "top_p", "user", "parallel_tool_calls",
         "response_format", "tools", "tool_choice", "n", "logit_bias", "safety_identifier", "prompt_cache_key", "echo"}


def _works_or_names(call, field, value, stream):
    try:
        r = call(stream=stream, **({field: value} if field not in ("best_of", "suffix") else {"extra_body": {field: value}}))
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param is not None and e.param.split(".")[0].split("[")[0] == field, (field, e)
        assert field not in KNOWN, f"{field} is implemented, yet: {e}"
        return
    chunks = r if stream else [r]
    assert chunks and all(ch.id == chunks[0].id for ch in chunks)
    if field == "n":
        idx = {c.index for ch in chunks for c in ch.choices}
        assert idx == {0, 1}, idx


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field, value", CHAT_FIELDS, ids=[f for f, _ in CHAT_FIELDS])
def test_every_chat_field_works_or_is_a_400_naming_it(client, field, value, stream):
    _works_or_names(lambda **kw: _chat(client, **kw), field, value, stream)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field, value", COMPLETION_FIELDS, ids=[f for f, _ in COMPLETION_FIELDS])
def test_every_completion_field_works_or_is_a_400_naming_it(client, field, value, stream):
    _works_or_names(lambda **kw: _complete(client, **kw), field, value, stream)


@pytest.mark.parametrize("kw, param", [
    (dict(temperature=5), "temperature"), (dict(max_tokens=0), "max_tokens"), (dict(n=0), "n"),
    (dict(extra_body={"bogus": 1}), "bogus"), (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}),
     "response_format"),
    (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_errors_are_400s_naming_the_field(client, kw, param, stream):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, stream=stream, **kw)
    assert e.value.param.startswith(param), e.value


def test_tool_calls_and_their_round_trip(client):
    import jsonschema

    r = _chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=400,
              temperature=1.0, seed=2)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    chunks = _chat(client, stream=True, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                   max_tokens=400, temperature=1.0, seed=2)
    deltas = [tc for ch in chunks for ch_c in ch.choices for tc in (ch_c.delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather" and all(d.index == 0 for d in deltas)
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason] == ["tool_calls"]
    # the assistant's call and the tool's answer go back in as the client builds them
    history = ASK + [c.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r2 = _chat(client, messages=history, tools=TOOLS, max_tokens=3)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_n_and_response_format(client):
    r = _chat(client, n=3, temperature=0.9, seed=4, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == sum(
        len(c.model_extra["token_ids"]) for c in r.choices)
    again = _chat(client, n=3, temperature=0.9, seed=4, max_tokens=6)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    r = _chat(client, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER,
                                                                              "strict": True}}, max_tokens=400)
    import jsonschema

    jsonschema.validate(json.loads(r.choices[0].message.content), WEATHER)


def test_smollm2_content_through_the_client(smollm2_package):
    p, client = _server(smollm2_package)
    try:
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
        assert "Paris" in r.choices[0].message.content
        s = client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(s)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    finally:
        _stop(p)


def test_lm_eval_loglikelihood_requests(client):
    """What lm-evaluation-harness's local-completions model sends to score a continuation (token-id prompts in an
    array, echo, logprobs 1, max_tokens 1, of which it drops the last entry), and what scoring tools send
    (max_tokens 0): the prompt's logprobs in OpenAI's legacy shape, read back by the official client."""
    ids = [[5, 9, 13, 2, 40, 41, 3], [7, 8, 9]]
    r = client.completions.create(model="m", prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0,
                                  seed=1234)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.prompt_tokens == 10
    for c, p in zip(r.choices, ids):
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(p) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(x <= 0 for x in lp.token_logprobs[1:]) and all(len(t) == 1 for t in lp.top_logprobs[1:])
        # lm-eval's is_greedy: the token's logprob is the best one's (the last entry is the sampled, greedy token)
        assert lp.token_logprobs[-1] == max(lp.top_logprobs[-1].values())
    only = client.completions.create(model="m", prompt=ids[0], echo=True, logprobs=1, max_tokens=0)
    c = only.choices[0]
    assert c.logprobs.token_logprobs == r.choices[0].logprobs.token_logprobs[:-1]
    assert c.finish_reason == "length" and only.usage.completion_tokens == 0 and c.model_extra["token_ids"] == []
    chunks = list(client.completions.create(model="m", prompt="hello there", echo=True, max_tokens=3, stream=True))
    whole = client.completions.create(model="m", prompt="hello there", echo=True, max_tokens=3)
    assert chunks[0].choices[0].text.startswith("hello there")
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text


def test_vllm_prompt_logprobs(client):
    """vLLM's prompt_logprobs extension through the official client's extra_body: on the real engine the values are
    echo's (the same rows, the engine computing the larger top list once), the top k ranked 1..k in order, the
    prompt token among them or ranked after them (its rank in the vocabulary); chat puts the list on the
    response."""
    ids = [5, 9, 13, 2, 40, 41, 3, 17]
    r = client.completions.create(model="m", prompt=ids, echo=True, logprobs=2, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 4})
    c = r.choices[0]
    plp = c.model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for j, (t, d) in enumerate(zip(ids[1:], plp[1:]), 1):
        d = {int(k): v for k, v in d.items()}  # (JSON object keys are strings)
        assert d[t]["logprob"] == c.logprobs.token_logprobs[j], j
        top = sorted((v["rank"], k, v["logprob"], v["decoded_token"]) for k, v in d.items() if v["rank"] <= 4)
        assert [x[0] for x in top] == [1, 2, 3, 4] and all(a[2] >= b[2] for a, b in zip(top, top[1:]))
        assert {x[3]: x[2] for x in top[:2]} == c.logprobs.top_logprobs[j]  # echo's top 2 (keyed by token text)
        listed = t in {x[1] for x in top}
        assert len(d) == 4 + (not listed) and (d[t]["rank"] > 4) == (not listed)
        if listed:
            assert d[t]["rank"] == 1 + sum(v["logprob"] > d[t]["logprob"] for v in d.values())
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}], max_tokens=2,
                                          extra_body={"prompt_logprobs": 0})
    plp = chat.model_extra["prompt_logprobs"]
    assert len(plp) == len(chat.model_extra["prompt_token_ids"]) and plp[0] is None
    assert all(len(d) == 1 and list(d.values())[0]["logprob"] <= 0 for d in plp[1:])
