"""The reference model on the packed SmolLM2-135M against Hugging Face transformers running the same GGUF
(transformers dequantizes it to float32; our Q8_0/Q4_1 repack is lossless, so only float order differs).

Run: python -m pytest tests/test_reference_smollm2.py -v -s     (-s prints the measured logit differences)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.model, pytest.mark.oracle, pytest.mark.slow]

N_TOKENS = 32
PROMPTS = [  # (text, chat)
    ("Once upon a time", False),
    ("The three primary colors are", False),
    ("def fibonacci(n):\n", False),
    ("Explain in three sentences why the sky is blue.", True),
]


@pytest.fixture(scope="module")
def package(smollm2_package):
    from webinfer.package import Package

    return Package.open(smollm2_package)


@pytest.fixture(scope="module")
def ref_model(package):
    from webinfer_packager.reference.model import ReferenceModel, limit_blas_threads

    old = limit_blas_threads(1)  # ~10x faster decode on a busy 2-core machine (see limit_blas_threads)
    yield ReferenceModel.from_package(package, max_seq_len=256)
    if old:
        limit_blas_threads(old)


def greedy_with_logits(model, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Greedy decode through the KV cache (prefill, then one token per step); logits [n, V] of every step."""
    model.reset()
    logits = [model.forward(ids, 0)[-1]]
    out = [int(np.argmax(logits[-1]))]
    while len(out) < n:
        logits.append(model.forward([out[-1]], len(ids) + len(out) - 1)[-1])
        out.append(int(np.argmax(logits[-1])))
    return out, np.stack(logits)


@pytest.mark.parametrize("text,chat", PROMPTS)
def test_greedy_ids_and_logits_match_transformers(package, ref_model, smollm2_hf, text, chat):
    import torch
    from webinfer.prompt import Prompter
    from webinfer.tokenizer import Tokenizer

    model, hf_tok = smollm2_hf
    prompter = Prompter.for_package(package, Tokenizer.from_json(package.tokenizer_json()))
    ids = prompter.chat_ids([{"role": "user", "content": text}]) if chat else prompter.text_ids(text)
    # our prompt building agrees with transformers' tokenizer and apply_chat_template
    if chat:
        want_ids = hf_tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        want_ids = list(want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids)
    else:
        want_ids = hf_tok.encode(text, add_special_tokens=False)
    assert ids == want_ids

    out, logits = greedy_with_logits(ref_model, ids, N_TOKENS)      # [N], [N, V]
    with torch.no_grad():
        hf_ids = model.generate(torch.tensor([ids]), max_new_tokens=N_TOKENS, do_sample=False,
                                pad_token_id=hf_tok.eos_token_id)[0, len(ids):].tolist()
        # teacher-forced HF logits over the same sequence: row len(ids)-1+i predicts output token i. Its argmax
        # equals `out` at every step iff HF greedy from this prompt gives `out` (by induction), also past an EOS
        hf_logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1: len(ids) - 1 + N_TOKENS].numpy()
    diff = float(np.abs(logits - hf_logits).max())
    print(f"\n{text!r} chat={chat}: max |logit diff| over {N_TOKENS} steps = {diff:.2e} "
          f"(logit range {float(hf_logits.min()):.1f}..{float(hf_logits.max()):.1f})")
    assert out[: len(hf_ids)] == hf_ids                  # HF's generate stops at EOS, ours ran on
    assert len(hf_ids) == N_TOKENS or hf_ids[-1] in package.config.eos_token_ids
    assert hf_logits.argmax(axis=-1).tolist() == out
    assert diff < 1e-3
    if text == "Once upon a time":
        from webinfer.tokenizer import Tokenizer

        assert Tokenizer.from_json(package.tokenizer_json()).decode(out[:24]).startswith(
            ", the city of Nova Haven was a thriving metropolis, with towering skyscrapers and bustling streets. But as")
