"""Sampling controls on the CPU engine: structured output (response_format), logit_bias, min_p, the penalties and
logprobs through the one path (request -> API -> engine -> the wasm runner's sampler), on a tiny random-weight
model whose unconstrained text is noise. References: the numpy reference backend's ids (and logprobs) for the same
requests (its Sampler applies the controls in float64), re.fullmatch, json + the jsonschema library. The
kernel-level checks against the reference Sampler are tests/cpu/test_kernels.py::test_sampling_controls_match_reference
and ::test_penalties_and_logprobs_match_reference.
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
def llms(tmp_path_factory):
    from webinfer_packager.cli.backend import open_llm
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("cpu_controls")
    write_hf(tmp / "hf", arch="llama")
    pkg = pack(tmp / "hf", tmp / "pkg", progress=False)
    return open_llm(pkg, "reference"), open_llm(pkg, "cpu")


def _complete(llm, **req):
    return asyncio.run(llm.completions.create(prompt="hello world", **{"temperature": 0, **req}))


def test_structured_output_on_the_cpu(llms):
    import jsonschema

    ref, cpu = llms
    regex = {"type": "regex", "regex": "(yes|no)[.!]"}
    c = _complete(cpu, max_tokens=16, response_format=regex)["choices"][0]
    assert c["finish_reason"] == "stop" and re.fullmatch("(yes|no)[.!]", c["text"]), c
    assert not re.fullmatch("(yes|no)[.!]", _complete(cpu, max_tokens=16)["choices"][0]["text"])  # noise without it
    c = _complete(cpu, max_tokens=400, response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    c = c["choices"][0]
    assert c["finish_reason"] == "stop", c
    jsonschema.validate(json.loads(c["text"]), SCHEMA)


@pytest.mark.parametrize("req", [
    {"max_tokens": 16, "response_format": {"type": "regex", "regex": "[a-z]{3,6} (one|two|three)"}},
    {"max_tokens": 120, "response_format": {"type": "json_object"}},
    {"max_tokens": 6, "logit_bias": {"7": 8.0, "9": 6.0}, "temperature": 0.9, "seed": 1},
    {"max_tokens": 6, "min_p": 0.2, "temperature": 1.2, "seed": 5, "ignore_eos": True},
    {"max_tokens": 5, "logit_bias": {"42": -100, "43": 100}, "min_p": 0.5, "temperature": 1.0, "seed": 3,
     "ignore_eos": True},
])
def test_cpu_equals_reference_under_controls(llms, req):
    ref, cpu = llms
    a, b = _complete(ref, **req)["choices"][0], _complete(cpu, **req)["choices"][0]
    assert a["token_ids"] == b["token_ids"] and a["finish_reason"] == b["finish_reason"], (req, a, b)


from tests.test_sampling_controls import PEN  # noqa: E402  the GPU engine's requests, for the CPU engine
from tests.test_sampling_controls import REQS as PEN_REQS  # noqa: E402


def test_penalties_and_logprobs_equal_the_reference_alone_and_batched(llms):
    """Penalties (token counts in the module's memory) and logprobs through the API: the same ids, text and
    logprobs as the reference backend (its Sampler in float64), each request alone and all in one batch."""
    ref, cpu = llms

    def run(llm, reqs):
        async def main():
            return await asyncio.gather(*(llm.completions.create(**dict(r)) for r in reqs))
        return asyncio.run(main())

    want = [run(ref, [r])[0] for r in PEN_REQS]
    plain = run(ref, [{k: v for k, v in PEN_REQS[0].items() if k not in PEN}])[0]
    assert plain["choices"][0]["token_ids"] != want[0]["choices"][0]["token_ids"]  # the penalties change the output
    alone = [run(cpu, [r])[0] for r in PEN_REQS]
    batched = run(cpu, PEN_REQS)
    for w, a, b in zip(want, alone, batched):
        for got in (a, b):
            g, e = got["choices"][0], w["choices"][0]
            assert g["token_ids"] == e["token_ids"] and g["text"] == e["text"]
            lg, lw = g.get("logprobs"), e.get("logprobs")
            assert (lg is None) == (lw is None)
            if lw is None:
                continue
            assert lg["tokens"] == lw["tokens"]
            assert lg["token_logprobs"] == pytest.approx(lw["token_logprobs"], abs=2e-3)
            for tg, tw in zip(lg["top_logprobs"], lw["top_logprobs"]):
                assert list(tg) == list(tw)
                assert list(tg.values()) == pytest.approx(list(tw.values()), abs=2e-3)


@pytest.mark.gpu
def test_auto_backend_times_both_engines(gpu):
    """"auto" on a real adapter: a start-up GEMV of the model's shape on each side decides, and the reason says so.
    (lavapipe reports itself as a CPU adapter, i.e. fallback: the proxy below presents it as a real one.)"""
    from dataclasses import replace

    from webinfer.cpu.browser import choose_backend, time_backends
    from webinfer.cpu.wasm import WasmtimeHost

    class Real:  # the lavapipe device, reported as a non-fallback adapter
        info = replace(gpu.info, is_fallback=False)

        def __getattr__(self, name):
            return getattr(gpu, name)

    async def get_device():
        return Real()

    async def make_host():
        return WasmtimeHost()

    assert asyncio.run(choose_backend("auto", get_device))[0] == "webgpu"  # no shape: no measurement
    choice, why = asyncio.run(choose_backend("auto", get_device, shape=(256, 320), make_host=make_host))
    m = re.search(r"q4a 256x320: WebGPU \(.*\) ([0-9.]+) ms, CPU ([0-9.]+) ms", why)
    assert m, why
    gpu_ms, cpu_ms = map(float, m.groups())
    assert choice == ("cpu" if cpu_ms < gpu_ms else "webgpu") and gpu_ms > 0 and cpu_ms > 0, why
    fallback = asyncio.run(choose_backend("auto", lambda: _ready(gpu), shape=(256, 320), make_host=make_host))
    assert fallback[0] == "cpu" and "fallback" in fallback[1]
    assert all(t > 0 for t in asyncio.run(time_backends(Real(), WasmtimeHost(), 64, 100, reps=2)))


async def _ready(value):
    return value


@pytest.mark.gpu
def test_cli_auto_takes_the_cpu_engine_on_a_software_adapter(gpu, tmp_path):
    """`webinfer serve`'s default --backend auto, by the page's rule: lavapipe is a software (CPU-type) adapter, so
    the CPU engine runs, says why, and gives the CPU backend's ids; a draft model keeps the GPU."""
    import io

    from webinfer.cpu.runner import CpuRunner
    from webinfer_packager.cli.backend import auto_backend, open_llm
    from webinfer_packager.pack.build import pack

    assert gpu.info.is_fallback, gpu.info  # lavapipe
    write_hf(tmp_path / "hf", arch="llama")
    pkg = pack(tmp_path / "hf", tmp_path / "pkg", progress=False)
    from webinfer.package import Package

    choice, dev, why = auto_backend(Package.open(pkg), gpu)
    assert (choice, dev) == ("cpu", None) and "fallback" in why, why
    assert auto_backend(Package.open(pkg), gpu, draft=True)[:2] == ("native", gpu)
    said = io.StringIO()
    auto, cpu = open_llm(pkg, "auto", device=gpu, warn=said), open_llm(pkg, "cpu")
    assert isinstance(auto.engine.runner, CpuRunner)
    assert "--backend auto: the CPU engine (the WebGPU adapter is a fallback (software) one" in said.getvalue()
    req = {"max_tokens": 8, "ignore_eos": True}
    assert _complete(auto, **req)["choices"][0]["token_ids"] == _complete(cpu, **req)["choices"][0]["token_ids"]
    for llm in (auto, cpu):
        asyncio.run(llm.close())


def test_prompt_lookup_on_the_cpu_gives_the_same_ids(tmp_path):
    """Speculative decoding (prompt lookup) on the CPU engine: proposals are verified (and some accepted) and the
    greedy ids are those of plain decoding, alone and beside a second request (the packed GEMM rows are bit for
    bit the GEMV's, so verification rows cannot change a token). adaptive_proposals off: always verify."""
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm
    from webinfer_packager.pack.build import pack

    write_hf(tmp_path / "hf", arch="llama")
    pkg = pack(tmp_path / "hf", tmp_path / "pkg", progress=False)
    plain = open_llm(pkg, "cpu")
    spec = open_llm(pkg, "cpu", options=EngineOptions(speculative="prompt-lookup", adaptive_proposals=False))
    prompt = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7]  # repeats: prompt lookup proposes
    req = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}

    async def both(llm):
        return await asyncio.gather(llm.completions.create(**req), llm.completions.create(**{**req, "prompt": [3, 4]}))

    want = [r["choices"][0]["token_ids"] for r in asyncio.run(both(plain))]
    got = asyncio.run(both(spec))
    assert [r["choices"][0]["token_ids"] for r in got] == want
    alone = asyncio.run(spec.completions.create(**req))
    assert alone["choices"][0]["token_ids"] == want[0]
    sp = alone["usage"]["speculative"]  # this model's greedy text repeats: 8 of 9 proposals accepted
    assert sp["proposed_tokens"] > 0 and sp["accepted_tokens"] > 0, sp
    for llm in (plain, spec):
        asyncio.run(llm.close())


@pytest.mark.gpu
def test_generate_defaults_to_auto_and_reports_the_choice(gpu, tmp_path, capsys):
    """`webinfer generate` without --backend: auto, which on this software adapter is the CPU engine; --json says
    which backend ran, and the ids are --backend cpu's."""
    from webinfer_packager.cli.main import main
    from webinfer_packager.pack.build import pack

    write_hf(tmp_path / "hf", arch="llama")
    pkg = pack(tmp_path / "hf", tmp_path / "pkg", progress=False)
    args = ["generate", str(pkg), "--prompt", "hello world", "--max-tokens", "5", "--temperature", "0", "--json"]
    assert gpu.info.is_fallback  # lavapipe
    runs, said = [], []
    for extra in ([], ["--backend", "cpu"]):
        assert main(args + extra) == 0
        out = capsys.readouterr()
        runs.append(json.loads(out.out))
        said.append(out.err)
    assert "--backend auto: the CPU engine (the WebGPU adapter is a fallback (software) one" in said[0], said
    assert [r["backend"] for r in runs] == ["cpu", "cpu"], runs
    assert runs[0]["output_ids"] == runs[1]["output_ids"] and len(runs[0]["output_ids"]) == 5, runs
