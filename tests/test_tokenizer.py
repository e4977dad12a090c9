"""webinfer.tokenizer against the `tokenizers` library (the oracle): exact ids and decoded text on a varied corpus,
for locally trained byte-level and SentencePiece-style (byte fallback) BPEs, for each known split pattern, and for
SmolLM2's real vocabulary; plus validation errors and the streaming decoder."""

from __future__ import annotations

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from webinfer import pretokenize  # noqa: E402
from webinfer.errors import FormatError  # noqa: E402
from webinfer.tokenizer import Tokenizer  # noqa: E402

CORPUS = [
    "",
    "Hello world",
    "Hello, World! How's it going? I'M fine, they'RE here, we'd've",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs\t",
    "line one\nline two\r\n\r\nline four\n\n\n",
    " \n \n  x\u3000y\u00a0z\u2003w\x1c\x1f",
    "digits 0 12 345 6789 3.14159 1,000,000 12345678901234567890",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))",
    "if (a && b) { c += 1; } else { d = [1, 2, 3]; }",
    "日本語のテキストです。中文文本。한국어",
    "مرحبا بالعالم — שלום עולם",
    "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "emoji 😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 🎉🎉",
    "looks like bytes: \\xff\\xfe <0xFF> <0x41> \xff\xfe\x80",
    "special <|endoftext|> inside<|im_start|>text<|im_end|>and<|im_start|><|im_start|>",
    "café naïve résumé Straße ÆØÅ ½ ² Ⅻ ①",
    "'s 'S 'ſ 'll 'LL 'Ll ''x '",
    "    \n\tmixed \t \n  white\u2028space\u2029end ",
    "https://example.com/path?q=1&r=[2]#frag user@example.org",
]

TRAIN = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello world! Hello there, how are you doing today? I'm fine, thanks.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n",
    "Numbers: 1 2 3 10 20 30 100 200 300 1234 5678 3.14 2.71",
    "Once upon a time, in a land far away, there lived a small robot.",
    "café naïve 日本語 テキスト emoji 😀",
]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _check(hf, ours: Tokenizer, texts, add_special_tokens=False):
    for t in texts:
        want = hf.encode(t, add_special_tokens=add_special_tokens).ids
        got = ours.encode(t, add_special_tokens=add_special_tokens)
        assert got == want, f"encode {t!r}"
        for skip in (False, True):
            assert ours.decode(want, skip_special_tokens=skip) == hf.decode(want, skip_special_tokens=skip), f"decode {t!r}"


def _both(hf) -> tuple:
    s = hf.to_str()
    return tokenizers.Tokenizer.from_str(s), Tokenizer.from_json(json.loads(s))


# --- locally trained tokenizers -------------------------------------------------------------------------------


def train_byte_level(pre_tokenizer=None, vocab_size=600):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN, trainer)
    return tok


def train_sentencepiece(metaspace: str | None = None):
    """BPE with byte fallback, Llama-2 style (normalizer Prepend+Replace) or with a Metaspace pre-tokenizer.

    The trainer does not create <0xNN> tokens, so they are inserted into the model vocabulary afterwards
    (ids 3..258, as in Llama 2), and the trained tokens are renumbered after them."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=metaspace, split=True)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator([t for t in TRAIN if "日" not in t], trainer)
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in old:
        vocab.setdefault(t, len(vocab))
    j["model"]["vocab"] = vocab
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return tokenizers.Tokenizer.from_str(json.dumps(j))


@pytest.fixture(scope="module")
def byte_level():
    tok = train_byte_level()
    # added tokens with HF's flags: lstrip/rstrip, a normalized (non-special) one, a single-word one
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True), AddedToken("fox jumps", normalized=True),
                    AddedToken("robot", single_word=True)])
    return _both(tok)


@pytest.fixture(scope="module")
def sentencepiece():
    return _both(train_sentencepiece())


def test_byte_level_corpus(byte_level):
    hf, ours = byte_level
    _check(hf, ours, CORPUS + ["a <mask>  b", "x<mask>y", "the fox jumps", "robot robots arobot (robot)"])


def test_byte_level_post_processor_bos_eos():
    tok = train_byte_level()
    tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A <|im_end|>",
                                                       special_tokens=[("<|im_start|>", 1), ("<|im_end|>", 2)])
    hf, ours = _both(tok)
    _check(hf, ours, ["Hello world", ""], add_special_tokens=True)
    assert ours.encode("Hi", add_special_tokens=True)[0] == 1


@pytest.mark.parametrize("pattern", [pretokenize.GPT2_PATTERN, pretokenize.LLAMA3_PATTERN, pretokenize.QWEN2_PATTERN])
def test_split_patterns(pattern):
    """Llama 3 / Qwen2 form: Split(pattern) then ByteLevel without its own regex."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf, ours = _both(train_byte_level(pre))
    _check(hf, ours, CORPUS)


def test_digits_then_byte_level():
    """SmolLM2's real pre-tokenizer: individual digits, then GPT-2 byte level."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    hf, ours = _both(train_byte_level(pre))
    _check(hf, ours, CORPUS)


def test_byte_level_add_prefix_space():
    hf, ours = _both(train_byte_level(pre_tokenizers.ByteLevel(add_prefix_space=True)))
    _check(hf, ours, CORPUS)


def test_sentencepiece_corpus(sentencepiece):
    hf, ours = sentencepiece
    _check(hf, ours, CORPUS + ["<s>Hello</s> world", "  ", " a"])
    _check(hf, ours, ["Hello world", "日本"], add_special_tokens=True)
    assert ours.encode("日", add_special_tokens=False)[-3:] == [3 + b for b in "日".encode()]  # byte fallback


@pytest.mark.parametrize("scheme", ["always", "first"])
def test_sentencepiece_metaspace(scheme):
    hf, ours = _both(train_sentencepiece(metaspace=scheme))
    _check(hf, ours, CORPUS + ["<s>Hello</s> world"])


def test_pieces_cover_input():
    for split in (pretokenize.split_gpt2, pretokenize.split_llama3, pretokenize.split_qwen2, pretokenize.split_digits):
        for t in CORPUS:
            assert "".join(split(t)) == t


# --- SmolLM2's real vocabulary -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_json(smollm2_gguf):
    """Hugging Face's own conversion of the GGUF vocabulary (transformers), independent of our packager."""
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    return t.backend_tokenizer.to_str()


@pytest.mark.model
@pytest.mark.oracle
def test_smollm2_vocabulary(smollm2_json):
    hf, ours = tokenizers.Tokenizer.from_str(smollm2_json), Tokenizer.from_json(json.loads(smollm2_json))
    _check(hf, ours, CORPUS)
    # SmolLM2's published tokenizer.json splits digits individually before ByteLevel
    j = json.loads(smollm2_json)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, j["pre_tokenizer"]]}
    _check(tokenizers.Tokenizer.from_str(json.dumps(j)), Tokenizer.from_json(j), CORPUS)
    assert ours.encode("<|im_start|>user") == [1, 4093]


@pytest.mark.model
@pytest.mark.oracle
def test_packager_conversion_matches_transformers(smollm2_json, smollm2_gguf):
    """Our GGUF -> tokenizer.json conversion (used by `webinfer pack` and `webinfer tokenize x.gguf`) gives the ids
    of transformers' conversion plus SmolLM2's Digits step (llama.cpp's "smollm" pre-tokenizer splits every \\p{N};
    transformers' GGUF loader omits that, which changes e.g. " ½" and " ²", tokens of the vocabulary)."""
    from webinfer_packager.cli.tokenize import load_tokenizer

    ours = load_tokenizer(smollm2_gguf)
    j = json.loads(smollm2_json)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, j["pre_tokenizer"]]}
    hf = tokenizers.Tokenizer.from_str(json.dumps(j))
    for t in CORPUS:
        assert ours.encode(t) == hf.encode(t, add_special_tokens=False).ids, t


# --- streaming ----------------------------------------------------------------------------------------------------


def _stream_check(ours: Tokenizer, ids: list[int], skip=False):
    dec = ours.decode_stream(skip_special_tokens=skip)
    deltas = [dec.add(i) for i in ids]
    deltas.append(dec.finish())
    assert "".join(deltas) == ours.decode(ids, skip_special_tokens=skip)
    for d in deltas[:-1]:
        d.encode("utf-8")  # a str holding a lone surrogate would fail here
    return deltas


def test_stream_byte_level_holds_split_emoji(byte_level):
    hf, ours = byte_level
    ids = ours.encode("a 👨\u200d👩\u200d👧 b")
    deltas = _stream_check(ours, ids)
    assert "\ufffd" not in "".join(deltas)
    assert any(d == "" for d in deltas)  # the emoji's first byte tokens produce nothing until it is complete
    for t in CORPUS:
        _stream_check(ours, hf.encode(t).ids)
        _stream_check(ours, hf.encode(t).ids, skip=True)
    truncated = ours.encode("😀")[:-1]  # an incomplete sequence at the end becomes U+FFFD only at finish()
    assert _stream_check(ours, truncated)[-1] == ours.decode(truncated)


def test_stream_sentencepiece(sentencepiece):
    hf, ours = sentencepiece
    for t in CORPUS:
        ids = hf.encode(t, add_special_tokens=True).ids
        _stream_check(ours, ids)
        _stream_check(ours, ids, skip=True)
    ids = ours.encode("Hello 日本 world")
    deltas = _stream_check(ours, ids)
    assert deltas[0] == "Hello"  # the prepended space of the first word is stripped
    assert "\ufffd" not in "".join(deltas)
    # a valid run followed by a stray byte turns into one U+FFFD per byte (HF ByteFallback), never retracted text
    bad = ours.encode("€")[-3:] + [3 + 0xFF] + ours.encode(" ok")
    assert "".join(_stream_check(ours, bad)) == hf.decode(bad)


# --- validation ---------------------------------------------------------------------------------------------------


def _tiny():
    return {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}


@pytest.mark.parametrize("mutate, field", [
    (lambda j: j.pop("model"), "model"),
    (lambda j: j["model"].update(vocab=[]), "model.vocab"),
    (lambda j: j["model"]["vocab"].update(c=1), "model.vocab['c']"),
    (lambda j: j["model"]["vocab"].update(c="3"), "model.vocab['c']"),
    (lambda j: j["model"].update(merges=["a c"]), "model.merges[0]"),
    (lambda j: j["model"].update(merges=["a b c"]), "model.merges[0]"),
    (lambda j: j["model"].update(type="WordPiece"), "model.type"),
    (lambda j: j["model"].update(byte_fallback=True), "model.vocab"),
    (lambda j: (j["model"]["vocab"].update({"<0x4G>": 9}), j["model"].update(byte_fallback=True)), "model.vocab['<0x4G>']"),
    (lambda j: j.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated"}), "pre_tokenizer.pattern"),
    (lambda j: j.update(normalizer={"type": "BertNormalizer"}), "normalizer.type"),
    (lambda j: j.update(added_tokens=[{"id": 0, "content": "zz"}]), "added_tokens[id=0]"),
])
def test_validation_errors(mutate, field):
    j = _tiny()
    mutate(j)
    with pytest.raises(FormatError) as e:
        Tokenizer.from_json(j)
    assert e.value.file == "tokenizer.json" and e.value.field == field


def test_tiny_merges_both_forms():
    for merges in (["a b"], [["a", "b"]]):
        j = _tiny()
        j["model"]["merges"] = merges
        assert Tokenizer.from_json(j).encode("abab") == [2, 2]
