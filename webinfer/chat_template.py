"""Render a model's own jinja2 chat template the way transformers' apply_chat_template(tokenize=False) does.

Chat templates come from model files, so they are untrusted code: they run in jinja2's ImmutableSandboxedEnvironment
with the same options and helpers transformers provides (trim_blocks, lstrip_blocks, loop controls, a `{% generation %}`
block, raise_exception, strftime_now, a tojson that does not HTML-escape). Pure Python + jinja2: runs in Pyodide.

The sandbox stops a template from reaching the interpreter, but not from spinning or allocating without end, so every
render also runs under a `TemplateLimits` budget (TemplateBudgetError when exceeded):
- steps: each loop iteration, call, filter and intercepted operator costs one; wall-clock seconds are checked at
  every step (a nested `for` over ranges, an exponential macro recursion);
- sizes: no string, list or output longer than `max_chars`, no integer wider than `max_int_bits` (`'a' * 10**9`,
  `' '|center(10**9)`, `'%1000000000d' % 1`, `2 ** 10**9`), checked before the operation where its size is known
  beforehand and right after it otherwise (`~`, filters, method calls);
- allocation: the total length of the strings and lists those operations produce is capped at `alloc_chars`, which
  bounds memory even when each piece is small (a loop that keeps a growing list of copies).
`lipsum` (unbounded text) is not offered. Loops are counted by rewriting each `for` to iterate through a counting
wrapper before the template is compiled; template names starting with `__wi_` are refused so it cannot be shadowed.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.visitor import NodeTransformer

from webinfer.errors import ChatTemplateError


class TemplateBudgetError(ChatTemplateError):
    """Rendering a chat template went over a TemplateLimits bound (steps, time, size or allocation)."""


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one render. Real templates need a few thousand steps and well under 10 ms for long chats."""
    max_steps: int = 1_000_000
    max_seconds: float = 2.0
    max_chars: int = 1 << 20        # any one string or list, and the rendered output
    alloc_chars: int = 64 << 20     # total length produced by size-checked operations in one render
    max_int_bits: int = 4096


DEFAULT_LIMITS = TemplateLimits()
_PREFIX = "__wi_"
_state = threading.local()  # the budget of the render running in this thread (renders do not nest)


class _Budget:
    def __init__(self, limits: TemplateLimits):
        self.limits = limits
        self.steps = limits.max_steps
        self.deadline = time.monotonic() + limits.max_seconds
        self.alloc = limits.alloc_chars

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise TemplateBudgetError(f"the chat template took more than {self.limits.max_steps} steps")
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(f"the chat template ran longer than {self.limits.max_seconds} s")


def _budget() -> _Budget | None:
    return getattr(_state, "budget", None)


def _limits() -> TemplateLimits:
    b = _budget()
    return b.limits if b is not None else DEFAULT_LIMITS


def _step() -> None:
    b = _budget()
    if b is not None:
        b.step()


def _too_big(what: str, n: int, limit: int) -> TemplateBudgetError:
    return TemplateBudgetError(f"the chat template would make {what} of {n:,}, over the limit of {limit:,}")


def _check_len(n: int) -> None:
    lim = _limits()
    if n > lim.max_chars:
        raise _too_big("a string or list of length", n, lim.max_chars)


def _sized(x):
    """x, after checking its size against the limits and charging its length to the allocation budget."""
    lim = _limits()
    if isinstance(x, int) and not isinstance(x, bool):
        if x.bit_length() > lim.max_int_bits:
            raise _too_big("an integer of bits", x.bit_length(), lim.max_int_bits)
    elif isinstance(x, (str, list, tuple, dict, bytes)):
        _check_len(len(x))
        b = _budget()
        if b is not None:
            b.alloc -= len(x)
            if b.alloc < 0:
                raise TemplateBudgetError(f"the chat template allocated more than {lim.alloc_chars:,} characters")
    return x


def _int_arg(v) -> None:
    if isinstance(v, int) and not isinstance(v, bool):
        _check_len(abs(v))  # widths, counts and repeats: anything larger would build something too big


_WIDE_FORMAT = re.compile(r"\d{7,}")  # a width or precision of a million or more in a format spec


def _check_format(fmt: str) -> None:
    if _WIDE_FORMAT.search(fmt):
        raise TemplateBudgetError("the chat template formats with a width or precision over the size limit")


def _estimate(op: str, a, b) -> None:
    """Refuse an operation whose result would be too big, before computing it."""
    lim = _limits()
    ints = isinstance(a, int) and isinstance(b, int)
    if op == "*":
        if ints:
            if a.bit_length() + b.bit_length() > lim.max_int_bits:
                raise _too_big("an integer of bits", a.bit_length() + b.bit_length(), lim.max_int_bits)
        elif isinstance(a, (str, list, tuple)) and isinstance(b, int):
            _check_len(len(a) * max(b, 0))
        elif isinstance(b, (str, list, tuple)) and isinstance(a, int):
            _check_len(len(b) * max(a, 0))
    elif op == "**" and ints and b > 0 and abs(a) > 1:
        if b * a.bit_length() > lim.max_int_bits:
            raise _too_big("an integer of bits", b * a.bit_length(), lim.max_int_bits)
    elif op == "+" and isinstance(a, (str, list, tuple)) and isinstance(b, (str, list, tuple)):
        _check_len(len(a) + len(b))
    elif op == "%" and isinstance(a, str):
        _check_format(a)
        for v in (b if isinstance(b, tuple) else b.values() if isinstance(b, dict) else (b,)):
            _int_arg(v)  # `%*d`: the width comes from the arguments


def _check_method(obj, args, kwargs) -> None:
    """Bounds for str/list methods called from a template (ljust, center, zfill, replace, expandtabs, format ...)."""
    fn = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(fn, "__self__", None)
    if not isinstance(owner, (str, list, tuple, dict)):
        return
    for v in (*args, *kwargs.values()):
        _int_arg(v)
    name = getattr(fn, "__name__", "")
    if isinstance(owner, str):
        if name in ("format", "format_map"):
            _check_format(owner)
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            _check_len(len(owner) + (owner.count(args[0]) if args[0] else len(owner) + 1) * len(args[1]))
        elif name == "join" and len(args) == 1 and hasattr(args[0], "__len__"):
            _check_len(len(owner) * max(len(args[0]) - 1, 0))
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                _check_len(len(owner) + owner.count("\t") * max(tab, 0))


def _wrap_filter(f):
    value_at = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # context/env/eval_ctx comes first

    @functools.wraps(f)
    def bounded(*args, **kwargs):
        _step()
        for v in (*args[value_at + 1:], *kwargs.values()):
            _int_arg(v)
        if f.__name__ == "do_replace" and len(args) >= value_at + 3:
            s, old, new = (str(a) for a in args[value_at:value_at + 3])
            _check_len(len(s) + (s.count(old) if old else len(s) + 1) * len(new))
        if f.__name__ == "do_join" and len(args) > value_at:
            items = _sized(list(args[value_at]))  # materialised to know the count before joining
            sep = args[value_at + 1] if len(args) > value_at + 1 else kwargs.get("d", "")
            _check_len(len(str(sep)) * max(len(items) - 1, 0) + sum(len(x) for x in items if isinstance(x, str)))
            args = (*args[:value_at], items, *args[value_at + 1:])
        if f.__name__ == "do_format" and len(args) > value_at and isinstance(args[value_at], str):
            _check_format(args[value_at])
        return _sized(f(*args, **kwargs))
    return bounded


def _iter(iterable):
    """What every `for` loop iterates through: one step per item."""
    for x in iterable:
        _step()
        yield x


def _range(*args):
    _step()
    return safe_range(*args)


class _Instrument(NodeTransformer):
    """Route every loop through _iter and check the result of every `~` concatenation."""

    def visit_Name(self, node):
        if node.name.startswith(_PREFIX):
            raise ChatTemplateError(f"chat template uses the reserved name {node.name!r}")
        return node

    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_PREFIX + "iter", "load"), [node.iter], [], None, None)
        return node

    def visit_Concat(self, node):
        node = self.generic_visit(node)
        return nodes.Call(nodes.Name(_PREFIX + "sized", "load"), [node], [], None, None)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+", "%", "//", "/", "-"])

    def call_binop(self, context, operator, left, right):
        _step()
        _estimate(operator, left, right)
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
        _step()
        _check_method(__obj, args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))


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
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {k: _wrap_filter(f) for k, f in env.filters.items()}
    env.globals.pop("lipsum", None)
    env.globals.update({"raise_exception": _raise_exception, "strftime_now": _strftime_now, "namespace": _Namespace,
                        "range": _range, _PREFIX + "iter": _iter, _PREFIX + "sized": _sized})
    try:
        ast = _Instrument().visit(env.parse(source))
        return env.template_class.from_code(env, env.compile(ast), env.make_globals(None), None)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not compile: line {e.lineno}: {e.message}") from e
    except RecursionError:
        raise ChatTemplateError("chat template does not compile: nested too deeply") from None


def render(template: str, messages: list[dict], add_generation_prompt: bool = False, bos_token: str | None = None,
           eos_token: str | None = None, limits: TemplateLimits | None = None, **extra) -> str:
    """The prompt text for `messages` (a list of {"role", "content", ...} dicts). `extra` are further template
    variables (tools, documents, unk_token, custom flags ...), passed as transformers passes template kwargs.
    Raises ChatTemplateError (TemplateBudgetError past `limits`) or jinja2's SecurityError."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts with 'role' and 'content'")
    variables = dict(extra)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    if bos_token is not None:
        variables["bos_token"] = bos_token
    if eos_token is not None:
        variables["eos_token"] = eos_token
    compiled = compile_template(template)
    budget = _Budget(limits or DEFAULT_LIMITS)
    outer, _state.budget = _budget(), budget
    try:
        out, n = [], 0
        for chunk in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt, **variables):
            n += len(chunk)
            if n > budget.limits.max_chars:
                raise _too_big("an output of length", n, budget.limits.max_chars)
            budget.step()
            out.append(chunk)
        return "".join(out)
    except jinja2.exceptions.SecurityError:
        raise
    except ChatTemplateError:
        raise
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(str(e)) from e
    except RecursionError:
        raise TemplateBudgetError("the chat template recursed too deeply") from None
    except MemoryError:
        raise TemplateBudgetError("the chat template ran out of memory") from None
    except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError) as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    finally:
        _state.budget = outer
