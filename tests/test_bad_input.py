"""Bad inputs, table-driven (in the spirit of llama.cpp's test-gguf): each must raise FormatError naming the
file and field, never a numpy/struct traceback, and leave neither OUT nor a temp folder behind.

Run: python -m pytest tests/test_bad_input.py -q
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webinfer.errors import FormatError, UnsupportedArchitectureError
from tests import synthetic
from webinfer_packager.pack.gguf_source import validate_gguf_header
from webinfer_packager.pack.hf_source import validate_safetensors_header
from webinfer_packager.pack.build import pack
from webinfer.package import Package


def gguf_header(version=3, n_tensors=0, kvs=b"", n_kv=0, tensors=b""):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + tensors


def kv_string(key: str, value_len: int, value=b"") -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, value_len) + value


def kv_array(key: str, item_type: int, count: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IIQ", 9, item_type, count)


def _mutate_gguf(data: bytes, case: str) -> bytes:
    if case == "truncated":
        return data[: len(data) // 2]
    if case == "magic":
        return b"GGML" + data[4:]
    if case == "version":
        return data[:4] + struct.pack("<I", 7) + data[8:]
    if case == "tensor_count":
        return data[:8] + struct.pack("<Q", 1 << 60) + data[16:]
    raise AssertionError(case)


GGUF_HEADER_CASES = {  # name: (bytes, field the error must name)
    "empty": (b"", "magic"),
    "short magic": (b"GG", "magic"),
    "bad version": (gguf_header(version=1), "version"),
    "huge kv count": (gguf_header(n_kv=1 << 62), "kv_count"),
    "huge string": (gguf_header(n_kv=1, kvs=kv_string("general.name", 1 << 62)), "general.name"),
    "huge array": (gguf_header(n_kv=1, kvs=kv_array("tokenizer.ggml.tokens", 8, 1 << 61)), "tokenizer.ggml.tokens"),
    "huge u32 array": (gguf_header(n_kv=1, kvs=kv_array("x.scores", 4, 1 << 62)), "x.scores"),
    "unknown value type": (gguf_header(n_kv=1, kvs=struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)), "k"),
}


@pytest.mark.parametrize("case", list(GGUF_HEADER_CASES))
def test_gguf_header_cases(case):
    data, field = GGUF_HEADER_CASES[case]
    with pytest.raises(FormatError) as e:
        validate_gguf_header("bad.gguf", data)
    assert field in e.value.field and e.value.file == "bad.gguf"


def _tensor_info(name, dims, type_id, offset):
    n = name.encode()
    return (struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", type_id, offset))


@pytest.mark.parametrize("infos,field", [
    ([("a", [32], 0, 1 << 40)], "tensor_info[a].offset"),                      # outside the data section
    ([("a", [32], 0, 0), ("b", [32], 0, 64)], "tensor_info[b].offset"),      # overlapping (a is 128 bytes)
    ([("a", [32], 77, 0)], "tensor_info[a].type"),                           # unknown ggml type
    ([("a", [33], 2, 0)], "tensor_info[a].dims"),                            # Q4_0 row not a block multiple
    ([("a", [32] * 9, 0, 0)], "tensor_info[a].n_dims"),
])
def test_gguf_tensor_info_cases(infos, field):
    data = gguf_header(n_tensors=len(infos), tensors=b"".join(_tensor_info(*i) for i in infos))
    data += b"\0" * (-len(data) % 32) + b"\0" * 256
    with pytest.raises(FormatError) as e:
        validate_gguf_header("t.gguf", data)
    assert e.value.field == field


def _st(header: dict, data_len: int = 16) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"\0" * data_len


ST_CASES = {
    "tiny file": (b"\1\2", "header length"),
    "huge header length": (struct.pack("<Q", 1 << 60) + b"{}", "header length"),
    "not json": (struct.pack("<Q", 4) + b"{{{{", "header"),
    "not an object": (_st([1, 2]), "header"),
    "unknown dtype": (_st({"w": {"dtype": "I4", "shape": [2], "data_offsets": [0, 1]}}), "w.dtype"),
    "out of bounds": (_st({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}), "w.data_offsets"),
    "size mismatch": (_st({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}), "w.data_offsets"),
    "overlap": (_st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}), ".data_offsets"),
    "bad shape": (_st({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}), "w.shape"),
}


@pytest.mark.parametrize("case", list(ST_CASES))
def test_safetensors_header_cases(case):
    data, field = ST_CASES[case]
    with pytest.raises(FormatError) as e:
        validate_safetensors_header("m.safetensors", data, len(data))
    assert field in e.value.field


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"", b"GGUF\3\0\0\0", b"GGUF\2\0\0\0"]))
def test_random_bytes_only_raise_format_error(data, prefix):
    for fn in (lambda d: validate_gguf_header("r.gguf", d), lambda d: validate_safetensors_header("r", d, len(d))):
        try:
            fn(prefix + data)
        except FormatError:
            pass


# ---------------------------------------------------------------------------------------------------------
# whole-pack cases: the source is broken after being written; pack must fail cleanly


def _edit_json(path: Path, fn):
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def _hf(tmp, edit):
    src = synthetic.write_hf(tmp / "hf")
    edit(src)
    return src


def _gguf(tmp, edit, **kw):
    p = synthetic.write_gguf(tmp / "m.gguf", **kw)
    p.write_bytes(edit(p.read_bytes()))
    return p


PACK_CASES = {  # name: (make source, file-name fragment, field fragment, error class)
    "gguf truncated": (lambda t: _gguf(t, lambda d: _mutate_gguf(d, "truncated")), "m.gguf", "", FormatError),
    "gguf magic": (lambda t: _gguf(t, lambda d: _mutate_gguf(d, "magic")), "m.gguf", "magic", FormatError),
    "gguf version": (lambda t: _gguf(t, lambda d: _mutate_gguf(d, "version")), "m.gguf", "version", FormatError),
    "gguf tensor count": (lambda t: _gguf(t, lambda d: _mutate_gguf(d, "tensor_count")), "m.gguf", "tensor_count",
                          FormatError),
    "gguf missing tensor": (lambda t: _gguf(t, lambda d: d.replace(b"blk.1.ffn_up.weight", b"blk.1.ffn_XX.weight")),
                            "m.gguf", "blk.1.ffn_up.weight", FormatError),
    "gguf unsupported arch": (lambda t: _gguf(t, lambda d: d.replace(b"\5\0\0\0\0\0\0\0llama", b"\5\0\0\0\0\0\0\0gpt_j", 1)
                                              .replace(b"llama.", b"gpt_j.")), "m.gguf", "general.architecture",
                              UnsupportedArchitectureError),
    "hf shape disagrees": (lambda t: _hf(t, lambda s: _edit_json(s / "config.json",
                                                                 lambda c: c.update(intermediate_size=128))),
                           "model.safetensors", "mlp.gate_proj.weight.shape", FormatError),
    "hf config missing field": (lambda t: _hf(t, lambda s: _edit_json(s / "config.json", lambda c: c.pop("hidden_size"))),
                                "config.json", "hidden_size", FormatError),
    "hf unsupported arch": (lambda t: _hf(t, lambda s: _edit_json(s / "config.json", lambda c: c.update(
        model_type="gpt2", architectures=["GPT2LMHeadModel"]))), "config.json", "model_type",
                            UnsupportedArchitectureError),
    "hf tokenizer not json": (lambda t: _hf(t, lambda s: (s / "tokenizer.json").write_text("{oops")),
                              "tokenizer.json", "(json)", FormatError),
    "hf tokenizer no model": (lambda t: _hf(t, lambda s: _edit_json(s / "tokenizer.json", lambda d: d.pop("model"))),
                              "tokenizer.json", "model", FormatError),
    "hf safetensors truncated": (lambda t: _hf(t, lambda s: (s / "model.safetensors").write_bytes(
        (s / "model.safetensors").read_bytes()[:5000])), "model.safetensors", "data_offsets", FormatError),
    "hf config not json": (lambda t: _hf(t, lambda s: (s / "config.json").write_text("[")), "config.json", "(json)",
                           FormatError),
}


@pytest.mark.parametrize("case", [c for c in PACK_CASES if PACK_CASES[c][3] is not None])
def test_pack_rejects_cleanly(tmp_path, case):
    make, file_part, field_part, cls = PACK_CASES[case]
    src = make(tmp_path)
    before = set(tmp_path.iterdir())
    with pytest.raises(cls) as e:
        pack(src, tmp_path / "out", progress=False)
    assert file_part in e.value.file and field_part in e.value.field, str(e.value)
    assert set(tmp_path.iterdir()) == before  # no OUT, no OUT.tmp-*


def test_unsupported_gguf_quant_type(tmp_path):
    """IQ3_S has Q3_K's block size, so retyping one tensor keeps every offset valid: only the type is bad."""
    p = synthetic.write_gguf(tmp_path / "m.gguf", types={"linear": "Q4_0", "up": "Q3_K"}, hidden_size=256,
                             intermediate_size=512, head_dim=64)
    data = bytearray(p.read_bytes())
    name = b"blk.0.ffn_up.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8
    assert struct.unpack_from("<I", data, at)[0] == 11  # Q3_K
    struct.pack_into("<I", data, at, 21)  # IQ3_S
    p.write_bytes(bytes(data))
    with pytest.raises(FormatError) as e:
        pack(p, tmp_path / "out", progress=False)
    assert e.value.field == "tensor blk.0.ffn_up.weight.type" and "IQ3_S" in e.value.problem
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]


def test_partial_rotary_embeddings_are_refused_by_name(tmp_path):
    """Phi-4-mini ropes 96 of each head's 128 dims: running it with whole-head RoPE would be silently wrong, so a
    GGUF's rope.dimension_count below head_dim and a config's partial_rotary_factor (either place transformers 5
    writes it) are refused naming the field; the whole head (head_dim 16 here) packs."""
    pack(synthetic.write_gguf(tmp_path / "ok.gguf", rope_dims=16), tmp_path / "ok", progress=False)
    with pytest.raises(UnsupportedArchitectureError) as e:
        pack(synthetic.write_gguf(tmp_path / "m.gguf", rope_dims=12), tmp_path / "out", progress=False)
    assert e.value.field == "llama.rope.dimension_count" and "12" in e.value.problem and e.value.expected.startswith("16")
    for where in ("top", "rope_parameters"):
        src = synthetic.write_hf(tmp_path / f"hf-{where}")
        cfg = json.loads((src / "config.json").read_text())
        if where == "top":
            cfg["partial_rotary_factor"] = 0.75
        else:
            cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        (src / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(UnsupportedArchitectureError) as e:
            pack(src, tmp_path / f"out-{where}", progress=False)
        assert e.value.field == ("partial_rotary_factor" if where == "top" else "rope_parameters.partial_rotary_factor")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out-top").exists()


def test_gguf_rope_frequency_factors_are_read_and_bad_ones_refused(tmp_path):
    """Llama 3.1 GGUFs scale RoPE through a rope_freqs tensor: it becomes freq_factors scaling (ignoring it would
    be silently wrong); a tensor of the wrong length or with a zero factor is refused, naming the tensor."""
    import numpy as np

    for i, bad in enumerate([np.ones(5), np.array([1.0, 2, 0, 1, 1, 1, 1, 1])]):
        p = synthetic.write_gguf(tmp_path / f"bad{i}.gguf", rope_freqs=bad)
        with pytest.raises(FormatError) as e:
            pack(p, tmp_path / "out", progress=False)
        assert e.value.field == "tensor rope_freqs.weight"
        assert not (tmp_path / "out").exists()
    out = pack(synthetic.write_gguf(tmp_path / "ok.gguf", rope_freqs=True), tmp_path / "out", progress=False)
    scaling = Package.open(out).config.rope_scaling
    assert scaling["rope_type"] == "freq_factors"
    np.testing.assert_allclose(scaling["factors"], np.linspace(1.0, 8.0, 8), rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# declared sizes and metadata memory (issue 15)


def _insert_kv(data: bytes, key: bytes, type_and_value: bytes) -> bytes:
    """A GGUF with one more metadata entry, padded so the data section moves by a multiple of the alignment
    (tensor offsets are relative to it and stay valid)."""
    kv = struct.pack("<Q", len(key)) + key + type_and_value
    assert len(kv) % 32 == 0, len(kv)
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    return data[:16] + struct.pack("<Q", n_kv + 1) + kv + data[24:]


def _gguf_with_big_arrays(tmp_path, mb: int = 4) -> Path:
    data = synthetic.write_gguf(tmp_path / "m.gguf").read_bytes()
    key = b"junk.bytes"
    fixed = 8 + len(key) + 4 + 4 + 8
    count = (mb << 20) - fixed - ((mb << 20) - fixed) % 32 + (32 - fixed % 32) % 32
    count -= (fixed + count) % 32
    data = _insert_kv(data, key, struct.pack("<IIQ", 9, 0, count) + b"\x07" * count)  # array of u8
    key = b"junk.strings"
    fixed = 8 + len(key) + 4 + 4 + 8
    n = (mb << 20) // 9
    while (fixed + 9 * n) % 32:
        n -= 1
    data = _insert_kv(data, key, struct.pack("<IIQ", 9, 8, n) + (struct.pack("<Q", 1) + b"x") * n)
    p = tmp_path / "big-meta.gguf"
    p.write_bytes(data)
    return p


def test_gguf_metadata_arrays_cost_memory_in_proportion(tmp_path):
    """8 MB of array elements used to take 1.6 GB in GGUFReader's per-element objects (~200x); now unused keys
    cost nothing (here 2 x 4 MB of arrays)."""
    import subprocess
    import sys

    from webinfer_packager.pack.gguf_source import GGUFSource

    p = _gguf_with_big_arrays(tmp_path)
    # peak RSS of a fresh process around opening the source (tracemalloc would slow the walk 30x)
    code = ("import resource; from webinfer_packager.pack.gguf_source import GGUFSource; "
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"GGUFSource({str(p)!r}); print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    base, peak = (int(v) * 1024 for v in r.stdout.split()[-2:])
    assert peak - base < 48 << 20, f"{(peak - base) / 2**20:.0f} MiB"  # was ~200x the 8 MB of arrays
    GGUFSource(p)
    out = pack(p, tmp_path / "out", progress=False)  # and the model still packs
    assert (out / "manifest.json").is_file()


def test_gguf_fields_match_gguf_reader(tmp_path):
    """The lazy decoder gives exactly what GGUFReader's field contents give, key for key."""
    from gguf import GGUFReader

    from webinfer_packager.pack.gguf_source import read_gguf_fields

    p = synthetic.write_gguf(tmp_path / "m.gguf")
    ref = {k: f.contents() for k, f in GGUFReader(p).fields.items() if not k.startswith("GGUF.")}
    got = read_gguf_fields(p)
    assert set(got) == set(ref) and all(got[k] == ref[k] for k in ref)


def test_gguf_huge_block_count_fails_at_once(tmp_path):
    import time

    p = synthetic.write_gguf(tmp_path / "m.gguf")
    data = p.read_bytes()
    at = data.index(b"llama.block_count") + len(b"llama.block_count") + 4
    struct.pack_into("<I", data := bytearray(data), at, 5_000_000)
    p.write_bytes(bytes(data))
    t0 = time.perf_counter()
    with pytest.raises(FormatError) as e:
        pack(p, tmp_path / "out", progress=False)
    assert e.value.field == "llama.block_count" and "5000000" in str(e.value)
    assert time.perf_counter() - t0 < 10  # was: MemoryError after 25-40 s
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]  # no OUT.tmp-*


def test_tokenize_cli_lone_surrogate_is_a_typed_error(tmp_path):
    import subprocess
    import sys

    tj = tmp_path / "tokenizer.json"
    tj.write_text(json.dumps(synthetic.tiny_tokenizer_json()))
    f = tmp_path / "in.jsonl"
    f.write_text('"fine"\n"bad \\ud800 text"\n')
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "tokenize", str(tj), "--file", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "line 2" in r.stderr and "surrogate" in r.stderr
    f.write_bytes(b'"ok"\n"\xff\xfe"\n')
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "tokenize", str(tj), "--file", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "UTF-8" in r.stderr, r.stderr
