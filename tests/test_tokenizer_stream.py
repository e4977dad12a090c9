"""The streaming decoder for SentencePiece-style chains: deltas joined equal decode(all ids), decode equals the
`tokenizers` library for many decoder chains (the oracle), and a long stream never re-decodes (O(1) per id).

Run: python -m pytest tests/test_tokenizer_stream.py -q"""

from __future__ import annotations

import json
import random
import time

import pytest

tokenizers = pytest.importorskip("tokenizers")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.test_tokenizer import CORPUS, train_sentencepiece  # noqa: E402
from webinfer.errors import FormatError  # noqa: E402
from webinfer.tokenizer import Tokenizer  # noqa: E402

R = {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}
BF, FUSE = {"type": "ByteFallback"}, {"type": "Fuse"}


def _strip(start, stop, content=" "):
    return {"type": "Strip", "content": content, "start": start, "stop": stop}


def _meta(scheme):
    return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": True}


def _seq(*ds):
    return {"type": "Sequence", "decoders": list(ds)}


CHAINS = {
    "llama2": _seq(R, BF, FUSE, _strip(1, 0)),
    "metaspace_always": _seq(BF, _meta("always")),
    "metaspace_first_fused": _seq(BF, FUSE, _meta("first")),
    "metaspace_never": _meta("never"),
    "strip_both_ends": _seq(R, BF, FUSE, _strip(2, 0), _strip(0, 3)),
    "strip_per_token": _seq(R, _strip(0, 1), BF, FUSE),
    "replace_after_fuse": _seq(BF, FUSE, {"type": "Replace", "pattern": {"String": "▁▁"}, "content": "_"},
                               {"type": "Replace", "pattern": {"String": "lo"}, "content": "L"}),
    "no_fuse": _seq(R, BF),
    "byte_level_fuse": _seq(R, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                            _strip(1, 1)),
    "null": None,
}


@pytest.fixture(scope="module")
def spm_json():
    return json.loads(train_sentencepiece().to_str())


@pytest.fixture(scope="module")
def chains(spm_json):
    """name -> (tokenizers.Tokenizer, ours) sharing one vocabulary, differing only in the decoder."""
    out = {}
    for name, dec in CHAINS.items():
        j = dict(spm_json, decoder=dec)
        s = json.dumps(j)
        out[name] = (tokenizers.Tokenizer.from_str(s), Tokenizer.from_json(json.loads(s)))
    return out


def _hf_decode(hf, ours: Tokenizer, ids, skip=False) -> str:
    """tokenizers' decode; where its Strip(stop > 0) panics (an index underflow in strip.rs when the text is empty
    or all stripped), the empty text it would have returned."""
    try:
        return hf.decode(ids, skip_special_tokens=skip)
    except BaseException as e:  # pyo3 PanicException derives from BaseException
        if type(e).__name__ != "PanicException":
            raise
        return ""


def _stream(ours: Tokenizer, ids, skip=False) -> list[str]:
    dec = ours.decode_stream(skip_special_tokens=skip)
    return [dec.add(i) for i in ids] + [dec.finish()]


@pytest.mark.parametrize("dec", [_seq(R, BF, FUSE, BF), _seq(FUSE, {"type": "ByteLevel"}), {"type": "CTC"}])
def test_chains_that_cannot_stream_are_refused(spm_json, dec):
    """There is no re-decoding fallback: a chain the stages cannot run exactly is refused at load."""
    with pytest.raises(FormatError, match="decoder"):
        Tokenizer.from_json(dict(spm_json, decoder=dec))


def test_corpus_all_chains(chains):
    for name, (hf, ours) in chains.items():
        for t in CORPUS + ["Hello  hello   lo lo▁▁x  ", "€ 😀 \x80"]:
            ids = hf.encode(t, add_special_tokens=True).ids
            for skip in (False, True):
                want = _hf_decode(hf, ours, ids, skip)
                assert ours.decode(ids, skip_special_tokens=skip) == want, (name, t)
                deltas = _stream(ours, ids, skip)
                assert "".join(deltas) == want, (name, t, skip)
                for d in deltas:
                    d.encode("utf-8")  # no lone surrogates


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(0, 520), st.integers(3, 258)), max_size=40))
def test_random_ids_all_chains(chains, ids):
    """Random ids, rich in <0xNN> tokens (ids 3..258), so byte runs are valid, truncated or invalid."""
    for name, (hf, ours) in chains.items():
        ids2 = [i for i in ids if ours.id_to_token(i) is not None]
        want = _hf_decode(hf, ours, ids2)
        assert ours.decode(ids2) == want, name
        assert "".join(_stream(ours, ids2)) == want, name


def test_byte_run_held_until_closed(chains):
    _, ours = chains["llama2"]
    euro = [3 + b for b in "€".encode()]  # three byte tokens
    ok = ours.encode("ok")
    deltas = _stream(ours, ok + euro + ok)
    assert deltas[len(ok):len(ok) + 3] == ["", "", ""]  # nothing until the run is closed by a non-byte token
    assert deltas[len(ok) + 3].startswith("€")
    assert "".join(deltas) == ours.decode(ok + euro + ok)


def test_long_stream_is_linear(chains, monkeypatch):
    """30k ids from the corpus, streamed without one call to decode(), equal to the one-shot decode; and 4x the ids
    take well under the 16x a re-decoding stream would (the bound is loose for a noisy shared machine)."""
    _, ours = chains["llama2"]
    rng = random.Random(0)
    ids = []
    while len(ids) < 30000:
        ids += ours.encode(rng.choice(CORPUS[1:]) + " ") + [3 + rng.randrange(256) for _ in range(rng.randrange(3))]
    want = ours.decode(ids)

    def timed(n):
        t0 = time.perf_counter()
        out = "".join(_stream(ours, ids[:n]))
        return out, time.perf_counter() - t0

    with monkeypatch.context() as m:
        m.setattr(Tokenizer, "decode", lambda *a, **k: pytest.fail("the stream re-decoded"))
        got, _ = timed(len(ids))
        small = min(timed(len(ids) // 8)[1] for _ in range(3))
        large = min(timed(len(ids) // 2)[1] for _ in range(3))
    assert got == want
    assert large < 8 * small, (small, large)
