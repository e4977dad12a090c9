"""Packing tiny synthetic models (HF llama/qwen2, GGUF with Q4_0/Q4_1/Q8_0/F32) and, when present, SmolLM2.
References: gguf.quants.dequantize, the float weights the synthetic writers drew, the `tokenizers` library,
and transformers' own GGUF tokenizer conversion.

Run: python -m pytest tests/test_pack.py -q
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from webinfer.package import Package
from webinfer_packager.pack import quant
from tests import synthetic
from webinfer_packager.pack.build import OutputExistsError, pack


def tensor(pkg: Package, name: str) -> np.ndarray:
    t = pkg.tensors[name]
    rows = []
    for b in range(len(t.bindings)):
        comps = {c: pkg.read_component(name, c, b) for c in t.components}
        r0, r1 = t.bindings[b].rows
        rows.append(quant.dequantize(t.dtype, comps, [r1 - r0, *t.shape[1:]], t.group_size, t.k_padded))
    return np.concatenate(rows)


def tree_bytes(d: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


@pytest.mark.parametrize("arch,sharded,tied", [("llama", False, True), ("qwen2", True, False)])
def test_hf_pack_values_and_config(tmp_path, arch, sharded, tied):
    src = synthetic.write_hf(tmp_path / "hf", arch=arch, sharded=sharded, tied=tied)
    pkg = Package.open(pack(src, tmp_path / "pkg", quant="q4", progress=False))
    w = synthetic.hf_weights(synthetic.TINY, arch=arch, tied=tied)
    c = pkg.config
    assert (c.architecture, c.hidden_size, c.num_key_value_heads, c.kv_dim, c.q_dim) == (arch, 64, 2, 32, 64)
    assert c.tie_word_embeddings is tied and c.attention_bias is (arch == "qwen2")
    assert ("lm_head" in pkg.tensors) is (not tied)
    assert np.array_equal(tensor(pkg, "layers.1.attn_norm"), w["model.layers.1.input_layernorm.weight"])
    if arch == "qwen2":
        assert np.array_equal(tensor(pkg, "layers.0.k_bias"), w["model.layers.0.self_attn.k_proj.bias"])
    for name, hf in (("layers.0.q", "model.layers.0.self_attn.q_proj.weight"),
                     ("layers.1.down", "model.layers.1.mlp.down_proj.weight")):
        t = pkg.tensors[name]
        assert t.dtype == "q4" and not t.lossless
        got = tensor(pkg, name)
        err = quant.error_stats(w[hf], got)
        assert err["rms_rel"] < 0.12 and err["rms_rel"] == pytest.approx(t.error["rms_rel"], rel=1e-6)
    assert pkg.chat_template == synthetic.CHATML and pkg.special_tokens["eos_token"] == "<|im_end|>"
    assert pkg.tokenizer_json()["model"]["vocab"]["<|im_end|>"] == 299


@pytest.mark.parametrize("linear", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"])
def test_gguf_repack_lossless_and_unpermuted(tmp_path, linear):
    import gguf
    from gguf.quants import dequantize

    src = synthetic.write_gguf(tmp_path / "m.gguf", types={"linear": linear})
    pkg = Package.open(pack(src, tmp_path / "pkg", progress=False))
    r = gguf.GGUFReader(src)
    raw = {t.name: t for t in r.tensors}
    for name, gname, heads in (("layers.0.q", "blk.0.attn_q.weight", 4), ("layers.1.k", "blk.1.attn_k.weight", 2),
                               ("layers.0.up", "blk.0.ffn_up.weight", None), ("embed", "token_embd.weight", None)):
        t = pkg.tensors[name]
        assert t.lossless and t.error == {"max_rel": 0.0, "rms_rel": 0.0}
        assert t.dtype == quant.GGUF_REPACK[raw[gname].tensor_type.name] and t.source_type == raw[gname].tensor_type.name
        ref = dequantize(raw[gname].data, raw[gname].tensor_type)
        if heads:  # llama.cpp's adjacent-pair order, undone independently of the packer's index helper
            n = ref.shape[0]
            ref = ref.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(n, -1)
        assert np.array_equal(tensor(pkg, name), ref), name


KQ = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def test_hf_pack_q4k_m_mix(tmp_path):
    """llama.cpp's Q4_K_M recipe from float weights: q4k, q6k for the output head and for v/down in the layers
    llama.cpp favours (of 2 layers: layer 1); values against the float weights the writer drew."""
    src = synthetic.write_hf(tmp_path / "hf", tied=False, **KQ)
    pkg = Package.open(pack(src, tmp_path / "pkg", quant="q4k_m", progress=False))
    w = synthetic.hf_weights({**synthetic.TINY, **KQ}, tied=False)
    want = {"embed": "q6k", "lm_head": "q6k", "layers.0.q": "q4k", "layers.0.v": "q4k", "layers.0.down": "q4k",
            "layers.1.v": "q6k", "layers.1.down": "q6k", "layers.1.gate": "q4k", "layers.1.o": "q4k"}
    assert {n: pkg.tensors[n].dtype for n in want} == want
    for name, hf in (("embed", "model.embed_tokens.weight"), ("layers.0.q", "model.layers.0.self_attn.q_proj.weight"),
                     ("layers.1.down", "model.layers.1.mlp.down_proj.weight")):
        t = pkg.tensors[name]
        assert (t.group_size, t.k_padded, t.lossless) == (256, t.shape[1], False)
        err = quant.error_stats(w[hf], tensor(pkg, name))
        assert err["rms_rel"] < (0.03 if t.dtype == "q6k" else 0.1)
        assert err["rms_rel"] == pytest.approx(t.error["rms_rel"], rel=1e-6)
    assert pkg.quantization["quant"] == "q4k_m"


@pytest.mark.parametrize("quant_name,err", [("q3k", 0.2), ("q2k", 0.33), ("iq4xs", 0.1), ("iq4nl", 0.1)])
def test_hf_pack_below_4_5_bits(tmp_path, quant_name, err):
    """Float weights requantized to the low-bit formats; q6k for the embedding; rows of K % 256 != 0 (TINY's
    hidden 64 below) take llama.cpp's IQ4_NL fallback."""
    src = synthetic.write_hf(tmp_path / "hf", tied=False, **KQ)
    pkg = Package.open(pack(src, tmp_path / "pkg", quant=quant_name, progress=False))
    w = synthetic.hf_weights({**synthetic.TINY, **KQ}, tied=False)
    assert (pkg.tensors["embed"].dtype, pkg.tensors["layers.1.down"].dtype) == ("q6k", quant_name)
    e = quant.error_stats(w["model.layers.1.mlp.down_proj.weight"], tensor(pkg, "layers.1.down"))
    assert e["rms_rel"] < err and e["rms_rel"] == pytest.approx(pkg.tensors["layers.1.down"].error["rms_rel"], rel=1e-6)
    small = Package.open(pack(synthetic.write_hf(tmp_path / "hf64"), tmp_path / "p64", quant=quant_name,
                              progress=False))
    assert small.tensors["layers.0.q"].dtype == "iq4nl"


def test_embedding_option_overrides_a_gguf_embedding(tmp_path):
    src = synthetic.write_gguf(tmp_path / "m.gguf", types={"linear": "Q5_0", "embed": "Q8_0"})
    pkg = Package.open(pack(src, tmp_path / "pkg", embedding="q4", progress=False))
    e, q = pkg.tensors["embed"], pkg.tensors["layers.0.q"]
    assert (e.dtype, e.source_type, e.lossless) == ("q4", "Q8_0", False) and 0 < e.error["rms_rel"] < 0.15
    assert (q.dtype, q.lossless) == ("q5_0", True)


def test_kquant_falls_back_when_k_is_not_a_multiple_of_256(tmp_path):
    """K = 64: q4k -> q5_0 and the q6k head -> q8 (llama.cpp's fallbacks), instead of padding K to 256."""
    pkg = Package.open(pack(synthetic.write_hf(tmp_path / "hf"), tmp_path / "pkg", quant="q4k", progress=False))
    assert pkg.tensors["layers.0.q"].dtype == "q5_0" and pkg.tensors["layers.0.q"].group_size == 32
    assert pkg.tensors["embed"].dtype == "q8"


def test_group_size_must_match_the_format(tmp_path):
    from webinfer.errors import FormatError

    out = pack(synthetic.write_hf(tmp_path / "hf", **KQ), tmp_path / "pkg", quant="q4k", progress=False)
    m = json.loads((out / "manifest.json").read_text())
    t = next(t for t in m["tensors"] if t["name"] == "layers.0.up")
    t["group_size"] = 32
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match=r"group_size.*256 for q4k"):
        Package.open(out)


def test_hf_rope_parameters_of_transformers_5(tmp_path):
    """transformers >= 5 saves rope_theta inside rope_parameters; reading the old key only gave 10000 silently."""
    src = synthetic.write_hf(tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    (src / "config.json").write_text(json.dumps(cfg))
    c = Package.open(pack(src, tmp_path / "pkg", progress=False)).config
    assert c.rope_theta == 100000.0 and c.rope_scaling is None


def test_cli_quant_choices_match_the_packer():
    from webinfer_packager.cli.main import build_parser
    from webinfer_packager.pack import build

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["pack"]
    opt = next(a for a in sub._actions if a.dest == "quant")
    assert tuple(opt.choices) == build.QUANT_CHOICES
    assert build.DEFAULT_QUANT in build.QUANT_CHOICES
    assert f"default {build.DEFAULT_QUANT})" in opt.help


def test_gguf_metadata_and_tensors_match_gguf_reader(tmp_path):
    """The packer's own header walk (no GGUFReader: minutes on a 262k vocabulary) against GGUFReader."""
    import gguf

    from webinfer_packager.pack.gguf_source import GGUFSource

    path = synthetic.write_gguf(tmp_path / "m.gguf", types={"linear": "Q5_1", "embed": "F16"})
    src, ref = GGUFSource(path), gguf.GGUFReader(path)
    assert src.fields == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}  # header
    for t in ref.tensors:
        ours = src.tensors[t.name]
        assert ours.tensor_type == t.tensor_type and ours.shape.tolist() == t.shape.tolist() and ours.n_bytes == t.n_bytes
        assert ours.data.dtype == t.data.dtype and np.array_equal(ours.data, t.data), t.name
    st = src.tensor("embed", shape=[synthetic.TINY["vocab_size"], synthetic.TINY["hidden_size"]])
    assert st.raw_rows(0, 3).dtype == np.float16


def test_gguf_f32_and_hf_give_identical_weights(tmp_path):
    """Same float weights via GGUF (Q/K permuted by llama.cpp's rule) and via HF: identical packed shard bytes."""
    g = pack(synthetic.write_gguf(tmp_path / "m.gguf", types={"linear": "F32", "embed": "F32"}), tmp_path / "a",
             progress=False)
    h = pack(synthetic.write_hf(tmp_path / "hf"), tmp_path / "b", progress=False)
    pa, pb = Package.open(g), Package.open(h)
    for name, t in pa.tensors.items():
        for c in t.components:
            assert pa.read_component(name, c) == pb.read_component(name, c), (name, c)


def test_deterministic_force_and_existing_output(tmp_path):
    src = synthetic.write_gguf(tmp_path / "m.gguf", types={"linear": "F16"})
    a = pack(src, tmp_path / "a", progress=False)
    b = pack(src, tmp_path / "b", progress=False)
    assert tree_bytes(a) == tree_bytes(b)
    with pytest.raises(OutputExistsError):
        pack(src, a, progress=False)
    pack(src, a, progress=False, quant="q4", group_size=64, force=True)
    assert Package.open(a).tensors["layers.0.q"].group_size == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "m.gguf"]  # no temp or old folders left


def test_shards_split_rows_and_are_content_addressed(tmp_path):
    src = synthetic.write_hf(tmp_path / "hf", vocab_size=20000)  # embed q8: 20000 x 68 bytes > 1 MiB
    out = pack(src, tmp_path / "pkg", shard_mb=1, asymmetric=True, progress=False)
    pkg = Package.open(out)
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["files"]) >= 3
    for f in m["files"]:
        data = (out / f["name"]).read_bytes()
        assert len(data) == f["bytes"] <= 1 << 20 and hashlib.sha256(data).hexdigest() == f["sha256"]
        assert f["name"] == f["sha256"] + "." + f["name"].split(".")[1]
    parts = pkg.tensors["embed"].bindings[0].parts
    assert len(parts) >= 2 and len({p.components["qweight"].file for p in parts}) >= 2
    assert all(ref.offset % 256 == 0 for p in parts for ref in p.components.values())
    w = synthetic.hf_weights({**synthetic.TINY, "vocab_size": 20000})["model.embed_tokens.weight"]
    assert quant.error_stats(w, tensor(pkg, "embed"))["rms_rel"] < 0.01
    assert pkg.tensors["layers.0.gate"].dtype == "q4a"


def test_gguf_tokenizer_matches_tokenizers_library(tmp_path):
    from tokenizers import Tokenizer

    out = pack(synthetic.write_gguf(tmp_path / "m.gguf"), tmp_path / "pkg", progress=False)
    pkg = Package.open(out)
    ours = Tokenizer.from_str(json.dumps(pkg.tokenizer_json()))
    ref = Tokenizer.from_str(json.dumps(synthetic.tiny_tokenizer_json()))
    for text in ["hello world", "Once upon a time, the end.", "<|im_start|>user\nhi<|im_end|>", "ünï 12"]:
        assert ours.encode(text).ids == ref.encode(text).ids
    assert pkg.special_tokens["bos_token"] == "<|im_start|>" and pkg.config.eos_token_ids == (299,)


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_package(smollm2_package, smollm2_gguf):
    import gguf
    from gguf.quants import dequantize

    pkg = Package.open(smollm2_package)
    c = pkg.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.vocab_size, c.rope_theta, c.tie_word_embeddings) == (30, 576, 9, 3, 64, 49152, 100000.0, True)
    assert all(t.lossless for t in pkg.tensors.values())
    raw = {t.name: t for t in gguf.GGUFReader(smollm2_gguf).tensors}
    ref = dequantize(raw["blk.7.attn_k.weight"].data, raw["blk.7.attn_k.weight"].tensor_type)
    ref = ref.reshape(3, 32, 2, 576).swapaxes(1, 2).reshape(192, 576)
    assert np.array_equal(tensor(pkg, "layers.7.k"), ref)
    assert pkg.special_tokens["eos_token"] == "<|im_end|>" and "<|im_start|>" in pkg.chat_template


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.oracle
def test_smollm2_tokenizer_matches_transformers(smollm2_package, smollm2_gguf):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ours = Tokenizer.from_str(json.dumps(Package.open(smollm2_package).tokenizer_json()))
    ref = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    for text in ["Once upon a time", "it's 3.14159 -- ok?\n\n  x", "<|im_start|>user\nünïcode 日本語<|im_end|>"]:
        assert ours.encode(text).ids == ref.encode(text, add_special_tokens=False)
