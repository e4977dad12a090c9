"""Structured output and logit controls through the one path (request -> API -> engine -> runner's sampler):
response_format (regex, JSON Schema), logit_bias and min_p, on the numpy reference and the native GPU, on a tiny
random-weight model (whose unconstrained text is noise: only the constraint can make it valid).
References: re.fullmatch, json + the jsonschema library, and the other backend's ids.

Run: python -m pytest tests/test_structured.py -q
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests.synthetic import write_hf

SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}},
          "required": ["a", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("structured")
    write_hf(tmp / "hf", arch="llama")
    return pack(tmp / "hf", tmp / "pkg", progress=False)


def _complete(llm, **req):
    return asyncio.run(llm.completions.create(prompt="hello world", **{"temperature": 0, **req}))


def test_regex_and_schema_on_the_reference(tiny):
    import jsonschema

    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    r = _complete(llm, max_tokens=16, response_format={"type": "regex", "regex": "(yes|no)[.!]"})
    c = r["choices"][0]
    assert c["finish_reason"] == "stop" and re.fullmatch("(yes|no)[.!]", c["text"]), c
    plain = _complete(llm, max_tokens=16)["choices"][0]["text"]
    assert not re.fullmatch("(yes|no)[.!]", plain)  # the noise model does not do this by itself
    r = _complete(llm, max_tokens=400, response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    c = r["choices"][0]
    assert c["finish_reason"] == "stop", c
    jsonschema.validate(json.loads(c["text"]), SCHEMA)


def test_bad_schema_is_a_400_naming_the_field(tiny):
    from webinfer.errors import InvalidRequestError
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    with pytest.raises(InvalidRequestError) as e:
        _complete(llm, max_tokens=4, response_format={"type": "json_schema", "json_schema": {"schema": {"type": 5}}})
    assert e.value.param.startswith("response_format")


def test_logit_bias_and_min_p(tiny):
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny, "reference")
    r = _complete(llm, max_tokens=5, logit_bias={"42": 100}, ignore_eos=True)
    assert r["choices"][0]["token_ids"] == [42] * 5
    r = _complete(llm, max_tokens=5, logit_bias={"42": -100, "43": 100}, min_p=0.5, temperature=1.0, seed=3,
                  ignore_eos=True)
    assert r["choices"][0]["token_ids"] == [43] * 5  # min_p keeps only the dominant token


@pytest.mark.gpu
def test_native_equals_reference_under_constraints(tiny, gpu):
    from webinfer_packager.cli.backend import open_llm

    ref, nat = open_llm(tiny, "reference"), open_llm(tiny, "native", device=gpu)
    for req in ({"max_tokens": 16, "response_format": {"type": "regex", "regex": "[a-z]{3,6} (one|two|three)"}},
                {"max_tokens": 120, "response_format": {"type": "json_object"}},
                {"max_tokens": 6, "logit_bias": {"7": 8.0, "9": 6.0}, "temperature": 0.9, "seed": 1}):
        a, b = _complete(ref, **req)["choices"][0], _complete(nat, **req)["choices"][0]
        assert a["token_ids"] == b["token_ids"] and a["finish_reason"] == b["finish_reason"], (req, a, b)
