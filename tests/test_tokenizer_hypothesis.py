"""Random unicode text: ids equal the `tokenizers` library's, decode(encode(s)) == s for byte-level BPE, and the
streaming decoder's deltas add up to decode(ids). Tokenizers are trained once per module on a tiny corpus."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tokenizers import Regex, pre_tokenizers  # noqa: E402

from tests.test_tokenizer import _both, train_byte_level, train_sentencepiece  # noqa: E402
from webinfer import pretokenize  # noqa: E402

# mostly the characters the scanners treat specially, plus anything (hypothesis text() excludes surrogates)
_interesting = st.sampled_from(list(" \t\n\r\u3000\xa0'sStTlLdDmMreRE0123456789½²①aZé日😀\u200d\u0301.,!?<|>") + ["<|im_start|>", "'ll", "'S"])
TEXT = st.lists(st.one_of(_interesting, st.text(max_size=4)), max_size=24).map("".join)
SETTINGS = settings(max_examples=150, deadline=None)


@pytest.fixture(scope="module")
def tokenizers_under_test():
    split = lambda p: pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), behavior="isolated"),  # noqa: E731
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    digits = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return {
        "gpt2": _both(train_byte_level()),
        "llama3": _both(train_byte_level(split(pretokenize.LLAMA3_PATTERN))),
        "qwen2": _both(train_byte_level(split(pretokenize.QWEN2_PATTERN))),
        "smollm2": _both(train_byte_level(digits)),
        "spm": _both(train_sentencepiece()),
    }


@SETTINGS
@given(text=TEXT)
def test_random_text_matches_tokenizers(tokenizers_under_test, text):
    for name, (hf, ours) in tokenizers_under_test.items():
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids, name
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), name
        if name != "spm":
            assert ours.decode(ids) == text, name  # byte-level BPE is lossless
        dec = ours.decode_stream()
        assert "".join(dec.add(i) for i in ids) + dec.finish() == ours.decode(ids), name


@SETTINGS
@given(ids=st.lists(st.integers(0, 599), max_size=30))
def test_random_ids_stream(tokenizers_under_test, ids):
    """Arbitrary id sequences (invalid UTF-8 included) decode like tokenizers, and stream to the same text."""
    for name in ("gpt2", "spm"):
        hf, ours = tokenizers_under_test[name]
        ids2 = [i for i in ids if ours.id_to_token(i) is not None]
        assert ours.decode(ids2) == hf.decode(ids2, skip_special_tokens=False), name
        dec = ours.decode_stream()
        deltas = [dec.add(i) for i in ids2]
        assert "".join(deltas) + dec.finish() == ours.decode(ids2), name
