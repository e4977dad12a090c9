"""Render a model's own jinja2 chat template the way transformers' apply_chat_template(tokenize=False) does.

Chat templates come from model files, so they are untrusted code: they run in jinja2's ImmutableSandboxedEnvironment
with the same options and helpers transformers provides (trim_blocks, lstrip_blocks, loop controls, a `{% generation %}`
block, raise_exception, strftime_now, a tojson that does not HTML-escape). Pure Python + jinja2: runs in Pyodide.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from webinfer.errors import ChatTemplateError


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers uses it to mark assistant tokens): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes <, >, & for HTML; chat templates expect plain JSON
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore attributes, so a template cannot reach interpreter internals."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not compile: line {e.lineno}: {e.message}") from e


def render(template: str, messages: list[dict], add_generation_prompt: bool = False, bos_token: str | None = None,
           eos_token: str | None = None, **extra) -> str:
    """The prompt text for `messages` (a list of {"role", "content", ...} dicts). `extra` are further template
    variables (tools, documents, unk_token, custom flags ...), passed as transformers passes template kwargs."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts with 'role' and 'content'")
    variables = dict(extra)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    if bos_token is not None:
        variables["bos_token"] = bos_token
    if eos_token is not None:
        variables["eos_token"] = eos_token
    try:
        return compile_template(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        if isinstance(e, jinja2.exceptions.SecurityError):
            raise
        raise ChatTemplateError(str(e)) from e
