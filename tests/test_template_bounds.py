"""Chat templates are untrusted: every render is bounded in steps, time, sizes and allocation.

Each attack below froze or exhausted `serve` before (issue 15); now it raises TemplateBudgetError quickly, while
real templates (tests/test_chat_template.py) render unchanged. The hypothesis test builds random templates of nested
loops, repetitions and concatenations and checks that each render ends within the bounds, whatever it does.

Run: python -m pytest tests/test_template_bounds.py -q
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given, settings, strategies as st

from webinfer.chat_template import TemplateBudgetError, TemplateLimits, render
from webinfer.errors import ChatTemplateError

MSGS = [{"role": "user", "content": "hi"}]

ATTACKS = {
    "nested range loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops over a list": "{% set x = range(100000)|list %}{% for a in x %}{% for b in x %}{% endfor %}"
                                "{% endfor %}",
    "loops with output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "string repetition": "{{ 'a' * 1000000000 }}",
    "list repetition": "{{ ([1] * 1000000000)|length }}",
    "repetition on the left": "{{ 1000000000 * 'ab' }}",
    "doubling by ~": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s|length }}",
    "doubling by +": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s|length }}",
    "list doubling": "{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s|length }}",
    "growing list of copies": "{% set ns = namespace(l=[], s='x' * 500000) %}{% for i in range(100000) %}"
                              "{% set ns.l = ns.l + [ns.s ~ i] %}{% endfor %}",
    "big power": "{{ 2 ** 1000000000 }}",
    "int squaring": "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "center filter": "{{ 'x'|center(1000000000) }}",
    "indent filter": "{{ 'x\ny'|indent(1000000000) }}",
    "ljust method": "{{ 'x'.ljust(1000000000) }}",
    "zfill method": "{{ 'x'.zfill(1000000000) }}",
    "format width": "{{ '{:>1000000000}'.format(1) }}",
    "format dynamic width": "{{ '{:>{}}'.format(1, 1000000000) }}",
    "percent width": "{{ '%1000000000d' % 1 }}",
    "percent star width": "{{ '%*d' % (1000000000, 1) }}",
    "format filter width": "{{ '%1000000000s'|format('x') }}",
    "replace blowup": "{% set s = 'x' * 100000 %}{{ s|replace('', s) }}",
    "replace method blowup": "{% set s = 'x' * 100000 %}{{ s.replace('x', s) }}",
    "expandtabs": "{% set s = '\t' * 100000 %}{{ s.expandtabs(100000) }}",
    "exponential macro": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    "deep recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "recursive loop": "{% for x in [[1]] * 1000 recursive %}{{ loop([[1]] * 1000) }}{% endfor %}",
    "range too big": "{% for i in range(10**12) %}{% endfor %}",
    "join of a huge range": "{{ range(100000)|join(' ' * 100000) }}",
    "join method": "{{ (' ' * 100000).join(range(100000)|map('string')|list) }}",
    "slice filter": "{{ [1]|slice(1000000000)|list|length }}",
    "wordwrap": "{{ 'x'|wordwrap(1000000000) }}",
}


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_is_stopped_quickly(name):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ChatTemplateError):
            render(ATTACKS[name], MSGS)
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    limits = TemplateLimits()
    # generous: the time limit plus slack for a loaded machine; memory well under what the attack wanted
    assert elapsed < limits.max_seconds + 10, elapsed
    assert peak < 512 << 20, f"{name}: peak {peak / 2**20:.0f} MiB"


def test_budget_error_is_a_template_error_naming_the_limit():
    with pytest.raises(TemplateBudgetError, match="steps"):
        render(ATTACKS["nested range loops"], MSGS, limits=TemplateLimits(max_seconds=60))
    with pytest.raises(TemplateBudgetError, match="longer than 0.05 s"):
        render(ATTACKS["nested range loops"], MSGS, limits=TemplateLimits(max_steps=10**12, max_seconds=0.05))
    with pytest.raises(TemplateBudgetError, match="output"):
        render("{% for i in range(3000) %}{{ 'x' * 1000 }}{% endfor %}", MSGS)


def test_reserved_names_cannot_shadow_the_loop_counter():
    with pytest.raises(ChatTemplateError, match="reserved"):
        render("{% set __wi_iter = range %}{% for i in range(3) %}{{ i }}{% endfor %}", MSGS)


def test_ordinary_work_is_within_bounds():
    """A long conversation through a template that accumulates with ~ and + stays far inside the bounds."""
    tpl = ("{% set ns = namespace(t='') %}{% for m in messages %}{% set ns.t = ns.t ~ '<|' + m.role + '|>' ~ "
           "m.content|trim ~ '\n' %}{% endfor %}{{ ns.t }}{% for i in range(10) %}{{ '%02d' % i }}{% endfor %}"
           "{{ 'ab'.ljust(4) ~ 'x'|center(5) ~ 'a\tb'.expandtabs(4) ~ '{:>3}'.format(7) }}")
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "w" * 200}
            for i in range(256)]
    out = render(tpl, msgs)
    assert out.count("<|user|>") == 128 and out.endswith("0001020304050607080" + "9ab    x  a   b  7")


def test_lipsum_is_not_offered():
    with pytest.raises(ChatTemplateError):
        render("{{ lipsum(1000000) }}", MSGS)


# random templates: nested loops over ranges, repetitions and concatenations; each render either succeeds or raises
# ChatTemplateError, within the time bound and without large allocations
_expr = st.sampled_from(["'ab'", "'x' * {n}", "ns.s", "ns.s ~ ns.s", "ns.s + 'y'", "(ns.s * {n})", "i ~ j",
                         "range({n})|join", "[ns.s] * {n}", "ns.s|center({n})", "ns.s.ljust({n})"])
_n = st.sampled_from([1, 2, 10, 1000, 10**5, 10**7, 10**9])


@st.composite
def _template(draw):
    depth = draw(st.integers(1, 3))
    body = "{% set ns.s = " + draw(_expr).format(n=draw(_n)) + " %}"
    if draw(st.booleans()):
        body += "{{ " + draw(_expr).format(n=draw(_n)) + " }}"
    for level in range(depth):
        var = "ij"[level % 2]
        body = f"{{% for {var} in range({draw(_n) if draw(st.booleans()) else 100000}) %}}{body}{{% endfor %}}"
    return "{% set ns = namespace(s='a') %}{% set i = 0 %}{% set j = 0 %}" + body + "{{ ns.s|length }}"


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_template())
def test_random_loop_templates_end_within_bounds(tpl):
    """(memory is covered by the attacks above, under tracemalloc, which would make this 10x slower)"""
    limits = TemplateLimits(max_seconds=0.5)
    t0 = time.perf_counter()
    try:
        render(tpl, MSGS, limits=limits)
    except ChatTemplateError:
        pass
    assert time.perf_counter() - t0 < limits.max_seconds + 5, tpl
