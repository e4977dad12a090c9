"""webinfer.chat_template.render against transformers' apply_chat_template(tokenize=False), character for character."""

from __future__ import annotations

import pytest

from webinfer.chat_template import render
from webinfer.errors import ChatTemplateError

# Llama-2-chat style: system folded into the first user turn, raise_exception on roles that do not alternate
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# Qwen2-style: tools through tojson, namespace, loop controls, indented block tags (trim_blocks / lstrip_blocks matter)
QWEN2 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message.role == "system" and loop.first %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if message.role == "assistant" and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {% for tc in message.tool_calls %}
<tool_call>
{{ tc.function | tojson(indent=2) }}
</tool_call>
        {% endfor %}
        {{- '<|im_end|>\\n' }}
    {% elif message.role == "stop" %}
        {% break %}
    {% else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{% endif %}
{{- '<!-- turns: ' ~ ns.turns ~ ', year ' ~ strftime_now('%Y') ~ ' -->' }}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "  And 3+3? <b>&amp;</b> 😀 日本 \n"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "   "}],
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>", eos_token="</s>")


def _same(hf_tokenizer, template, messages, **kw):
    for gen in (False, True):
        want = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=gen, **kw)
        got = render(template, messages, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>",
                     **({"tools": kw["tools"]} if "tools" in kw else {}))
        assert got == want, (gen, messages)


@pytest.fixture(scope="module")
def smollm2_template(smollm2_gguf):
    from gguf import GGUFReader

    return GGUFReader(smollm2_gguf).fields["tokenizer.chat_template"].contents()


@pytest.mark.oracle
@pytest.mark.model
def test_smollm2_template(hf_tokenizer, smollm2_template):
    for conv in CONVERSATIONS:
        _same(hf_tokenizer, smollm2_template, conv)
    out = render(smollm2_template, CONVERSATIONS[0], add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert out.endswith("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.oracle
def test_llama2_template(hf_tokenizer):
    for conv in CONVERSATIONS[:2]:
        _same(hf_tokenizer, LLAMA2, conv)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="must alternate"):
        render(LLAMA2, bad, bos_token="<s>", eos_token="</s>")


@pytest.mark.oracle
def test_qwen2_template(hf_tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Météo <now> & later",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    call = [{"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
            {"role": "stop", "content": "never rendered"}, {"role": "user", "content": "after stop"}]
    for conv in CONVERSATIONS + [call]:
        _same(hf_tokenizer, QWEN2, conv)
        _same(hf_tokenizer, QWEN2, conv, tools=tools)
    assert '"description": "Météo <now> & later"' in render(QWEN2, call, tools=tools)  # no HTML escaping


def test_sandbox_blocks_attribute_escape_and_mutation():
    import jinja2

    for evil in ("{{ messages.__class__.__mro__ }}", "{{ messages.append(1) }}"):
        with pytest.raises(jinja2.exceptions.SecurityError, match="unsafe"):
            render(evil, [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render("{% for %}", [])
