"""Every pre-tokenizer llama.cpp names for the supported families (webinfer.pretokenize.LLAMA_CPP_PRE), and every
split pattern's hand-written scanner, against the `tokenizers` library running the same patterns as Oniguruma
regexes: pieces and ids on a multilingual corpus and on random text (hypothesis)."""

from __future__ import annotations

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tokenizers import Regex, pre_tokenizers  # noqa: E402

from tests.test_tokenizer import CORPUS, train_byte_level  # noqa: E402
from webinfer import pretokenize  # noqa: E402
from webinfer.tokenizer import Tokenizer  # noqa: E402

MULTILINGUAL = [
    "Tiếng Việt có dấu: Xin chào thế giới, người Việt Nam",  # precomposed
    "Tie\u0302\u0301ng Vie\u0323\u0302t co\u0301 da\u0302\u0301u",  # the same with combining marks
    "Zażółć gęślą jaźń. ŻÓŁW, źdźbło",
    "Ça va? L'été où l'œil s'émerveille, naïveté, À bientôt",
    "Ca\u0327a va? L'e\u0301te\u0301",
    "हिन्दी में नमस्ते दुनिया, क्षत्रिय ज्ञान १२३४",
    "مرحبا بالعالم، هذا اختبار ١٢٣ «نص»",
    "שָׁלוֹם עוֹלָם, זה מבחן",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "日本語のテキスト、漢字とカタカナ。中文：你好，世界！",
    "한국어 텍스트: 안녕하세요 세계 ᄀᄁ",
    "emoji 👨\u200d👩\u200d👧\u200d👦 👍🏽 🏳\ufe0f\u200d🌈 ❤\ufe0f 🇫🇷",
    "digits 1 12 123 1234 12345 123456789012345678901234567890 ３４５ ٣٤٥ ½ ² ⅷ",
    "def f(x):\n\treturn {'a': [1, 2], \"b\": x ** 2}  # comment\r\n\r\n\n  \n",
    "if (a && b) { c += 1; } $x = <y> ^ ~z | `w`; // — ‘quoted’ “text” …",
    "   \t\t \u3000\u3000 \xa0 \u2003\u2009 end  \n\n\n   ",
    "MIXED Case: I'M, You'RE, they'VE, we'LL, it'S, He'D, 'ſ 'K",
    "Ａｂｃ ｆｕｌｌ ｗｉｄｔｈ！ ＡＢＣ",
    "Ωμέγα ελληνικά, кириллица Пример, Ⰰⱻ ꙀꙭK",
]
TEXTS = CORPUS + MULTILINGUAL

_chars = st.sampled_from(list(" \t\n\r\u3000\xa0'sSK0123456789３٣½aZé\u0301日가ก😀\u200d.,!?$+<=>^~|`—‘。ｚ") + ["  ", "\r\n", "'ll"])
# assigned characters only: Python's unicodedata and Oniguruma may be at different Unicode versions, and a code
# point one of them does not know yet (e.g. U+13441 before Unicode 15) is a letter to one and unassigned to the other
_any = st.text(alphabet=st.characters(exclude_categories=["Cn", "Cs"]), max_size=4)
TEXT = st.lists(st.one_of(_chars, _any), max_size=30).map("".join)
SETTINGS = settings(max_examples=200, deadline=None)

# one representative per distinct pre-tokenizer
PRE_NAMES = {}
for name, cfg in pretokenize.LLAMA_CPP_PRE.items():
    PRE_NAMES.setdefault(json.dumps(cfg), name)
PRE_NAMES = sorted(PRE_NAMES.values())


def test_every_llama_cpp_name_is_known():
    for name in ("gpt-2", "starcoder", "deepseek-llm", "deepseek-coder", "falcon", "command-r", "llama-bpe",
                 "qwen2", "smollm", "refact", "dbrx", "smaug-bpe", "mpt", "olmo"):
        assert name in pretokenize.LLAMA_CPP_PRE, name


@pytest.fixture(scope="module")
def by_pre():
    """pre name -> (tokenizers.Tokenizer, ours): one trained vocabulary, the pre-tokenizer (and normalizer) swapped."""
    base = json.loads(train_byte_level(vocab_size=900).to_str())
    out = {}
    for name in PRE_NAMES:
        normalizer, pre = pretokenize.LLAMA_CPP_PRE[name]
        s = json.dumps(dict(base, normalizer=normalizer, pre_tokenizer=pre))
        out[name] = (tokenizers.Tokenizer.from_str(s), Tokenizer.from_json(json.loads(s)))
    return out


def _pieces(ours: Tokenizer, text: str) -> list[str]:
    pieces = [text]
    for step in ours._enc.pre_steps:
        pieces = step(pieces, True)
    return [p for p in pieces if p]


def _check(hf, ours, text, name):
    want = [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(text)]
    assert _pieces(ours, text) == want, (name, text)
    ids = hf.encode(text, add_special_tokens=False).ids
    assert ours.encode(text) == ids, (name, text)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text, (name, text)


@pytest.mark.parametrize("name", PRE_NAMES)
def test_pre_tokenizer_corpus(by_pre, name):
    hf, ours = by_pre[name]
    for t in TEXTS:
        if hf.normalizer is None:
            _check(hf, ours, t, name)
        else:  # NFC first (Qwen2): pre-tokenize the normalized text, as tokenizers does
            _check(hf, ours, hf.normalizer.normalize_str(t), name)
            assert ours.encode(t) == hf.encode(t, add_special_tokens=False).ids


@SETTINGS
@given(text=TEXT)
def test_pre_tokenizers_random(by_pre, text):
    for name, (hf, ours) in by_pre.items():
        if hf.normalizer is not None:
            text = hf.normalizer.normalize_str(text)
        _check(hf, ours, text, name)


@pytest.mark.parametrize("pattern", sorted(pretokenize.KNOWN_PATTERNS))
def test_scanner_equals_regex(pattern):
    """Each scanner alone against tokenizers' Split(Regex(pattern), "isolated")."""
    hf = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    scan = pretokenize.KNOWN_PATTERNS[pattern]
    for t in TEXTS + ["a \n  \n b  ", " \n", "x\r\n  ", "12345678", "\u3000。x"]:
        assert scan(t) == [p for p, _ in hf.pre_tokenize_str(t)], t


@SETTINGS
@given(text=TEXT)
def test_scanners_random(text):
    for pattern, scan in pretokenize.KNOWN_PATTERNS.items():
        want = [p for p, _ in pre_tokenizers.Split(Regex(pattern), behavior="isolated").pre_tokenize_str(text)]
        assert scan(text) == want, pattern


@pytest.mark.parametrize("behavior", ["isolated", "removed", "merged_with_previous", "merged_with_next"])
def test_split_on_string(behavior):
    hf = pre_tokenizers.Split(" ", behavior=behavior)
    name = "".join(w.capitalize() for w in behavior.split("_"))
    for t in TEXTS + ["a  b", "  x", "x  ", " ", ""]:
        assert pretokenize.split_string(t, " ", name) == [p for p, _ in hf.pre_tokenize_str(t)], t


def test_digit_runs():
    hf = pre_tokenizers.Digits(individual_digits=False)
    for t in TEXTS:
        assert pretokenize.split_digit_runs(t) == [p for p, _ in hf.pre_tokenize_str(t)], t


def test_scanners_are_linear():
    """Long runs of each character class (where a scanner that rescans a run per piece goes quadratic): 8x the
    input must take far less than the 64x a quadratic scan would. Loose bound, small and large timed alternately
    and the best of 5 kept, for a shared machine."""
    import time

    runs = (" ", "a", "1", "!", "日", " a", "\n ", "\u3000", "1a", "\r\n")
    small, large = ("".join(ch * k for ch in runs) for k in (1000, 8000))  # small: past CPU-cache effects
    for pattern, scan in pretokenize.KNOWN_PATTERNS.items():
        assert "".join(scan(large)) == large
        best = [float("inf"), float("inf")]
        for _ in range(5):
            for k, text in enumerate((small, large)):
                t0 = time.perf_counter()
                scan(text)
                best[k] = min(best[k], time.perf_counter() - t0)
        assert best[1] < 40 * best[0], (pattern, best)
