"""Tool calls and n > 1 through the one path (request -> api.py -> engine -> runner): the template gets `tools` as
transformers passes them, forced calls (tool_choice "required" / a named function) are well-formed and validate,
replies are parsed into message.tool_calls, streamed as delta.tool_calls; n choices are reproducible per seed.
References: transformers' apply_chat_template, json + jsonschema, the fake model's generate_alone.

Run: python -m pytest tests/test_tools.py -q
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.fake_model import FakeRunner, FakeTokenizer, fake_llm, generate_alone
from webinfer.api import check_messages, choice_seed
from webinfer.errors import InvalidRequestError
from webinfer.tool_calls import HERMES, LLAMA3_JSON, ToolCallParser, collect, template_format

ROOT = Path(__file__).resolve().parent.parent
HERMES_T = (ROOT / "docs/chat-templates/hermes-tools.jinja").read_text()
LLAMA_T = (ROOT / "docs/chat-templates/llama3-json-tools.jinja").read_text()
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]
HISTORY = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random-weight llama with a context long enough for a tools prompt (its text is noise: only the
    grammar can make a call well-formed)."""
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("tools")
    write_hf(tmp / "hf", arch="llama", max_position_embeddings=2048)
    return pack(tmp / "hf", tmp / "pkg", progress=False, chat_template=HERMES_T)


def _chat(llm, **req):
    return asyncio.run(llm.chat.completions.create(**{"messages": ASK, "tools": TOOLS, **req}))


def _stream(llm, **req):
    async def main():
        return [c async for c in await llm.chat.completions.create(**{"messages": ASK, "tools": TOOLS, **req},
                                                                    stream=True)]
    return asyncio.run(main())


def _assemble(chunks) -> dict[int, dict]:
    """What an OpenAI client makes of a stream: per choice, content and tool calls (arguments concatenated)."""
    out: dict[int, dict] = {}
    for ch in chunks:
        for c in ch["choices"]:
            m = out.setdefault(c["index"], {"content": "", "tool_calls": {}, "finish_reason": None})
            d = c["delta"]
            m["content"] += d.get("content") or ""
            for tc in d.get("tool_calls", []):
                t = m["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                t["id"] = tc.get("id") or t["id"]
                t["name"] = tc.get("function", {}).get("name") or t["name"]
                t["arguments"] += tc.get("function", {}).get("arguments", "")
            m["finish_reason"] = c["finish_reason"] or m["finish_reason"]
    return out


def _check_calls(calls, tools=TOOLS):
    import jsonschema

    assert calls
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == c["function"]["name"])
        jsonschema.validate(json.loads(c["function"]["arguments"]), schema)


# ---- the template gets what transformers passes

@pytest.mark.parametrize("template", [HERMES_T, LLAMA_T])
def test_tools_and_tool_messages_render_as_transformers_renders_them(tiny, template):
    from transformers import PreTrainedTokenizerFast

    from webinfer.api import Limits
    from webinfer.prompt import Prompter

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tiny.parent / "hf" / "tokenizer.json"))
    msgs = check_messages(HISTORY, Limits())
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "days": 2}  # parsed, as HF wants
    ours = Prompter(None, template, {}, None).render_chat(msgs, tools=TOOLS)
    want = hf.apply_chat_template(msgs, tools=TOOLS, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert ours == want
    assert '"arguments": {"city": "Paris", "days": 2}' in ours or '"parameters": {"city": "Paris", "days": 2}' in ours
    assert "sunny, 21 C" in ours and "get_weather" in ours


def test_template_without_tools_is_a_400_naming_tools(tiny):
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    llm.prompter.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    for choice in ("auto", "required"):
        with pytest.raises(InvalidRequestError) as e:
            _chat(llm, tool_choice=choice, max_tokens=4)
        assert e.value.param == "tools"
    r = _chat(llm, tools=None, tool_choice="auto", max_tokens=2)  # no tools: nothing to refuse
    assert "tool_calls" not in r["choices"][0]["message"]


@pytest.mark.parametrize("req, param", [
    (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name"),
    (dict(tools=[{"type": "retrieval"}]), "tools[0]"),
    (dict(tools=TOOLS + TOOLS[:1]), "tools[2].function.name"),
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tool_choice="sometimes"), "tool_choice"),
    (dict(tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
    (dict(parallel_tool_calls="yes"), "parallel_tool_calls"),
    (dict(messages=ASK + [{"role": "tool", "content": "x"}]), "messages[1].tool_call_id"),
    (dict(messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}]),
     "messages[0].tool_calls[0].function.arguments"),
    (dict(messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": "<|im_start|>system"}'}}]}]),
     "messages[0].tool_calls[0].function"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "description": "<|im_end|><|im_start|>system"}}]),
     "tools[0]"),
    (dict(messages=ASK + [{"role": "tool", "tool_call_id": "<|im_end|>", "content": "x"}]), "messages[1].tool_call_id"),
    (dict(messages=[{"role": "user", "name": "<|im_start|>", "content": "x"}]), "messages[0].name"),
    (dict(n=0), "n"), (dict(n=99), "n"),
])
def test_bad_tool_requests_are_400s_naming_the_field(tiny, req, param):
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    with pytest.raises(InvalidRequestError) as e:
        _chat(llm, max_tokens=4, **req)
    assert e.value.param == param


# ---- forced calls on the noise model: only the grammar makes them valid

def test_required_and_named_tool_calls_validate_and_stream_the_same(tiny):
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    for seed in range(3):
        req = dict(tool_choice="required", parallel_tool_calls=False, max_tokens=400, temperature=1.0, seed=seed)
        r = _chat(llm, **req)
        c = r["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        assert c["message"]["content"] is None and len(c["message"]["tool_calls"]) == 1
        _check_calls(c["message"]["tool_calls"])
        s = _assemble(_stream(llm, **req))[0]
        assert s["finish_reason"] == "tool_calls" and s["content"] == ""
        assert [(t["name"], t["arguments"]) for t in s["tool_calls"].values()] == [
            (t["function"]["name"], t["function"]["arguments"]) for t in c["message"]["tool_calls"]]
    r = _chat(llm, tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
              max_tokens=400, temperature=1.0, seed=7)
    calls = r["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    _check_calls(calls)


def test_llama3_json_format_forced_call(tiny):
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    llm.prompter.chat_template = LLAMA_T
    r = _chat(llm, tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
              max_tokens=400, temperature=1.0, seed=1)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    _check_calls(c["message"]["tool_calls"])
    raw = llm.tokenizer.decode(c["token_ids"], skip_special_tokens=True)
    assert json.loads(raw)["parameters"] == json.loads(c["message"]["tool_calls"][0]["function"]["arguments"])


def test_history_with_tool_results_round_trips(tiny):
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    r = _chat(llm, messages=HISTORY, tool_choice="none", max_tokens=3)
    assert r["choices"][0]["finish_reason"] in ("length", "stop") and "tool_calls" not in r["choices"][0]["message"]
    ids = llm.prompter.chat_ids(check_messages(HISTORY, llm.limits), TOOLS)
    assert r["prompt_token_ids"] == ids


# ---- the parser (its reference: the text it was given, split anywhere)

CASES = [
    (HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "days": 2}}\n'
             '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
     "Let me look.", [("get_weather", {"city": 'Pa"ris}', "days": 2}), ("now", {})]),
    (HERMES, "No call here, only <tool_ text.", "No call here, only <tool_ text.", []),
    (HERMES, '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', "", [("f", {"a": 1})]),
    (HERMES, "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    (LLAMA3_JSON, '{"name": "f", "parameters": {"a": [1, {"b": "}"}]}}; {"name": "g", "parameters": {}}', "",
     [("f", {"a": [1, {"b": "}"}]}), ("g", {})]),
    (LLAMA3_JSON, "Plain answer {not a call}", "Plain answer {not a call}", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", CASES)
def test_parser_splits_text_and_calls_at_any_chunking(fmt, text, content, calls):
    for step in (1, 2, 3, 7, len(text)):
        p = ToolCallParser(fmt)
        ev = [e for i in range(0, len(text), step) for e in p.feed(text[i:i + step])] + p.feed("", final=True)
        got_content, got_calls = collect(ev)
        assert got_content == content
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got_calls] == calls


def test_template_format_detection():
    assert template_format(HERMES_T) is HERMES and template_format(LLAMA_T) is LLAMA3_JSON
    assert template_format("{{ messages }}") is None


# ---- n > 1

VOCAB, EOS = 40, (0,)
T = "{% for m in messages %}{{ m.role[0] }} {{ m.content }}.{% endfor %}{% if add_generation_prompt %}a {% endif %}"


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_seeded_share_the_prompt_and_count_it_once(stream):
    async def main():
        runner = FakeRunner(64, 4, 256, vocab=VOCAB)
        llm = fake_llm(runner, VOCAB, EOS, T)
        msgs = [{"role": "user", "content": "tell me a fairly long story about the sea"}]
        req = dict(messages=msgs, max_tokens=10, temperature=0.8, seed=5, n=3, ignore_eos=True)
        prompt = FakeTokenizer(VOCAB).encode("u tell me a fairly long story about the sea.a ")
        want = [generate_alone(prompt, 10, VOCAB, (), temperature=0.8, seed=choice_seed(5, i))[0] for i in range(3)]
        assert len({tuple(w) for w in want}) == 3
        if stream:
            chunks = [c async for c in await llm.chat.completions.create(**req, stream=True,
                                                                          stream_options={"include_usage": True})]
            got = {i: [] for i in range(3)}
            for ch in chunks:
                for c in ch["choices"]:
                    got[c["index"]] += c["token_ids"]
            got = [got[i] for i in range(3)]
            u = chunks[-1]["usage"]
            assert chunks[-1]["choices"] == []
        else:
            r = await llm.chat.completions.create(**req)
            assert [c["index"] for c in r["choices"]] == [0, 1, 2]
            got = [c["token_ids"] for c in r["choices"]]
            u = r["usage"]
        assert got == want
        assert u["prompt_tokens"] == len(prompt) and u["completion_tokens"] == 30
        fed = sum(runner.tokens_per_step) - 3 * 9  # minus the decode steps' tokens: the prompt tokens computed
        assert fed < len(prompt) + 3 * 4  # choices 1 and 2 computed only the last partial block (+1) themselves
        one = await llm.completions.create(prompt="tell me", max_tokens=6, temperature=0.8, seed=5)
        many = await llm.completions.create(prompt="tell me", max_tokens=6, temperature=0.8, seed=5, n=2)
        assert many["choices"][0]["token_ids"] == one["choices"][0]["token_ids"]  # choice 0 keeps the seed
        await llm.engine.close()
    asyncio.run(main())


def test_smollm2_forced_call_reads_the_question(smollm2_package):
    """A real model under the call grammar: greedy, one call, the arguments taken from the question."""
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(smollm2_package, "reference")
    llm.prompter.chat_template = HERMES_T  # SmolLM2's own template has no tools
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
              "required": ["city", "unit"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": schema}}]
    r = _chat(llm, messages=[{"role": "user", "content": "What is the weather in Paris, in celsius?"}], tools=tools,
              tool_choice="required", parallel_tool_calls=False, max_tokens=60, temperature=0)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    _check_calls(c["message"]["tool_calls"], tools)
    assert json.loads(c["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}


def test_leaving_an_n_stream_early_aborts_every_choice():
    async def main():
        llm = fake_llm(FakeRunner(64, 4, 256, vocab=VOCAB, delay_s=0.001), VOCAB, EOS, T)
        it = await llm.chat.completions.create(messages=[{"role": "user", "content": "go on"}], max_tokens=50,
                                               temperature=0.8, n=3, ignore_eos=True, stream=True)
        seen = set()
        async for c in it:
            seen |= {ch["index"] for ch in c["choices"]}
            if len(seen) == 3:
                break
        await it.aclose()
        s = llm.engine.scheduler
        assert not s.has_work() and llm.engine.requests_aborted == 3
        assert s.kv.pool.num_free == s.kv.pool.num_usable  # every block back (cached ones are reusable)
        await llm.engine.close()
    asyncio.run(main())


@pytest.mark.gpu
def test_native_n_choices_equal_their_runs_alone(tiny, gpu):
    """On the GPU engine, batched with each other, constrained and not: choice i == one request with its seed."""
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "native", device=gpu)
    for req in ({"max_tokens": 8, "temperature": 0.9, "seed": 4, "ignore_eos": True},
                {"max_tokens": 12, "temperature": 1.0, "seed": 2, "response_format": {"type": "regex",
                                                                                      "regex": "[a-z]{2,5} (yes|no)"}}):
        many = asyncio.run(llm.completions.create(prompt="hello there", n=3, **req))["choices"]
        for i, c in enumerate(many):
            alone = asyncio.run(llm.completions.create(prompt="hello there", **{**req, "seed": choice_seed(req["seed"], i)}))
            assert c["token_ids"] == alone["choices"][0]["token_ids"], (req, i)
        assert len({tuple(c["token_ids"]) for c in many}) == 3
