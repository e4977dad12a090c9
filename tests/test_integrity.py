"""Integrity and validation of packages on every native path (issue 15).

- Shards are hashed as they are first read (Package.open's reader): a flipped byte, a truncated or missing shard
  fails generate/serve/the reference model with IntegrityError naming the shard, never silently.
- Config values that parse but cannot run (non-finite / non-positive eps or theta, bad rope_scaling), tokenizer ids
  beyond vocab_size, negative or duplicate ids, merges naming unknown tokens, and chat templates that cannot render a
  small conversation within bounds are refused by the one validator, at pack, at verify and at load.
- Declared sizes are checked before they size anything: 10**6 or 10**9 layers fail at once.
- pack removes OUT.tmp-* on SIGTERM as on errors.

Run: python -m pytest tests/test_integrity.py -q
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tests import synthetic
from webinfer.errors import FormatError, IntegrityError, WebinferError
from webinfer.package import Package
from webinfer_packager.pack.build import pack
from webinfer_packager.pack.verify import verify_package


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("intact")
    return pack(synthetic.write_gguf(tmp / "m.gguf"), tmp / "pkg", progress=False)


@pytest.fixture()
def pkg(intact, tmp_path):
    import shutil

    return Path(shutil.copytree(intact, tmp_path / "pkg"))


def _biggest_bin(pkg: Path) -> Path:
    return max(pkg.glob("*.bin"), key=lambda p: p.stat().st_size)


def _flip(f: Path, at: int | None = None) -> None:
    data = bytearray(f.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x40
    f.write_bytes(bytes(data))


def _read_all(p: Package) -> None:
    for name, t in p.tensors.items():
        for c in t.components:
            for b in range(len(t.bindings)):
                p.read_component(name, c, b)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "inf scale"])
def test_damaged_shard_fails_loading_naming_the_shard(pkg, damage):
    f = _biggest_bin(pkg)
    if damage == "flip":
        _flip(f)
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:-100])
    elif damage == "delete":
        f.unlink()
    else:  # a scale set to +inf (f16 0x7c00) where the first q4 tensor's scales begin
        p = Package.open(pkg)
        t = next(t for t in p.tensors.values() if "scales" in t.components)
        ref = t.bindings[0].parts[0].components["scales"]
        data = bytearray((pkg / ref.file).read_bytes())
        data[ref.offset:ref.offset + 2] = b"\x00\x7c"
        (pkg / ref.file).write_bytes(bytes(data))
        f = pkg / ref.file
    p = Package.open(pkg)  # the manifest alone is fine
    with pytest.raises(IntegrityError) as e:
        _read_all(p)
    assert f.name in str(e.value) and e.value.file.endswith(f.name)
    # the native paths: the reference model and the CLI both stop with the typed error, not a traceback
    from webinfer_packager.reference.model import ReferenceModel

    with pytest.raises(IntegrityError):
        ReferenceModel.from_package(pkg)
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "generate", str(pkg), "--prompt", "once",
                        "--max-tokens", "2", "--backend", "reference"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr and f.name in r.stderr, r.stderr


def test_a_file_changed_after_it_was_verified_is_hashed_again(pkg):
    p = Package.open(pkg)
    _read_all(p)  # hashed once, found intact
    f = _biggest_bin(pkg)
    st = f.stat()
    _flip(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(IntegrityError):
        _read_all(Package.open(pkg))
    _flip(f)  # back to the intact bytes: accepted again
    _read_all(Package.open(pkg))


def test_intact_package_hashes_each_file_once(pkg, monkeypatch):
    import webinfer.package as P

    calls = []
    real = P.sha256_file
    monkeypatch.setattr(P, "sha256_file", lambda fh: calls.append(fh.name) or real(fh))
    _read_all(Package.open(pkg))
    _read_all(Package.open(pkg))
    assert sorted(calls) == sorted(str(pkg / n) for n in {c.file for t in Package.open(pkg).tensors.values()
                                                           for b in t.bindings for prt in b.parts
                                                           for c in prt.components.values()})


# ---------------------------------------------------------------------------------------------------- config ranges


def _edit_manifest(pkg: Path, fn) -> None:
    m = json.loads((pkg / "manifest.json").read_text())
    fn(m)
    (pkg / "manifest.json").write_text(json.dumps(m))


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
CONFIG_CASES = {  # name: (config update, field named)
    "eps inf": ({"rms_norm_eps": math.inf}, "rms_norm_eps"),
    "eps zero": ({"rms_norm_eps": 0}, "rms_norm_eps"),
    "eps negative": ({"rms_norm_eps": -1e-5}, "rms_norm_eps"),
    "eps nan": ({"rms_norm_eps": math.nan}, "rms_norm_eps"),
    "theta inf": ({"rope_theta": math.inf}, "rope_theta"),
    "theta zero": ({"rope_theta": 0.0}, "rope_theta"),
    "theta negative": ({"rope_theta": -10000.0}, "rope_theta"),
    "scaling unsupported type": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    "scaling not an object": ({"rope_scaling": "linear"}, "rope_scaling"),
    "scaling zero factor": ({"rope_scaling": {"type": "linear", "factor": 0}}, "rope_scaling.factor"),
    "scaling inf factor": ({"rope_scaling": {"type": "linear", "factor": math.inf}}, "rope_scaling.factor"),
    "llama3 missing low": ({"rope_scaling": {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}},
                           "rope_scaling.low_freq_factor"),
    "llama3 missing original": ({"rope_scaling": {k: v for k, v in LLAMA3.items()
                                                  if k != "original_max_position_embeddings"}},
                                "rope_scaling.original_max_position_embeddings"),
    "llama3 low == high": ({"rope_scaling": {**LLAMA3, "high_freq_factor": 1.0}}, "rope_scaling.high_freq_factor"),
    "llama3 low > high": ({"rope_scaling": {**LLAMA3, "low_freq_factor": 5.0}}, "rope_scaling.high_freq_factor"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_config_out_of_range_is_refused_at_load_and_verify(pkg, case):
    update, field = CONFIG_CASES[case]
    _edit_manifest(pkg, lambda m: m["config"].update(update))
    with pytest.raises(FormatError) as e:
        Package.open(pkg)
    assert e.value.field == f"config.{field}" and e.value.file.endswith("manifest.json"), str(e.value)
    problems = verify_package(pkg)
    assert len(problems) == 1 and f"config.{field}" in problems[0]


@pytest.mark.parametrize("case", ["eps inf", "theta zero", "scaling unsupported type", "llama3 low == high"])
def test_config_out_of_range_is_refused_at_pack(tmp_path, case):
    update, field = CONFIG_CASES[case]
    src = synthetic.write_hf(tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(update)
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError) as e:
        pack(src, tmp_path / "out", progress=False)
    assert field in e.value.field and e.value.file.endswith(("hf", "config.json")), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_valid_llama3_scaling_is_accepted(pkg):
    _edit_manifest(pkg, lambda m: m["config"].update(rope_scaling=LLAMA3))
    assert Package.open(pkg).config.rope_scaling == LLAMA3


# ---------------------------------------------------------------------------------------------------- declared sizes


@pytest.mark.parametrize("layers", [10**6, 10**9])
def test_absurd_layer_count_fails_at_once(pkg, layers):
    _edit_manifest(pkg, lambda m: m["config"].update(num_hidden_layers=layers))
    t0 = time.perf_counter()
    with pytest.raises(FormatError) as e:
        Package.open(pkg)
    assert e.value.field == "tensors" and str(layers) in str(e.value)
    assert len(verify_package(pkg)) == 1
    assert time.perf_counter() - t0 < 5  # was minutes (10**6) or out of memory (10**9)


def test_hf_layer_count_beyond_the_weights_fails_at_once(tmp_path):
    src = synthetic.write_hf(tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = 10**9
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError) as e:
        pack(src, tmp_path / "out", progress=False)
    assert e.value.field == "num_hidden_layers"


# ---------------------------------------------------------------------------------------------------- tokenizer


def _replace_tokenizer(pkg: Path, fn) -> None:
    """Edit the package's tokenizer.json and re-hash it, as a careless or hostile packer would."""
    m = json.loads((pkg / "manifest.json").read_text())
    old = m["tokenizer"]["file"]
    tok = json.loads((pkg / old).read_text())
    fn(tok)
    data = json.dumps(tok).encode()
    sha = hashlib.sha256(data).hexdigest()
    (pkg / old).unlink()
    (pkg / f"{sha}.json").write_bytes(data)
    entry = {"name": f"{sha}.json", "bytes": len(data), "sha256": sha}
    m["files"] = [f for f in m["files"] if f["name"] != old] + [entry]
    m["tokenizer"] = {"file": f"{sha}.json", "bytes": len(data), "sha256": sha}
    (pkg / "manifest.json").write_text(json.dumps(m))


def _first_merge_parts(tok):
    m = tok["model"]["merges"][0]
    return m.split(" ") if isinstance(m, str) else m


TOKENIZER_CASES = {  # name: (edit, field fragment)
    "vocab id beyond vocab_size": (lambda t: t["model"]["vocab"].update({"zzz_extra": 5000}), "model.vocab"),
    "added token beyond vocab_size": (lambda t: t["added_tokens"].append(
        {"id": 400, "content": "<|extra|>", "special": True}), "added_tokens[id=400]"),
    "negative id": (lambda t: t["model"]["vocab"].update({"zzz_neg": -3}), "model.vocab"),
    "duplicate id": (lambda t: t["model"]["vocab"].update({"zzz_dup": 5}), "model.vocab"),
    "merge of unknown tokens": (lambda t: t["model"]["merges"].append("qqq www"), "model.merges"),
}


@pytest.mark.parametrize("case", TOKENIZER_CASES)
def test_bad_tokenizer_is_refused_at_load_and_verify(pkg, case):
    edit, field = TOKENIZER_CASES[case]
    _replace_tokenizer(pkg, edit)
    from webinfer.tokenizer import Tokenizer

    p = Package.open(pkg)
    with pytest.raises(FormatError) as e:  # loading: ids past vocab_size in tokenizer_json(), the rest when built
        Tokenizer.from_json(p.tokenizer_json())
    assert field in e.value.field and e.value.file.endswith(".json"), str(e.value)
    with pytest.raises(FormatError) as e:
        p.validate()
    assert field in e.value.field and e.value.file == p.manifest["tokenizer"]["file"], str(e.value)
    problems = verify_package(pkg)
    assert len(problems) == 1 and field in problems[0], problems


@pytest.mark.parametrize("case", ["added token beyond vocab_size", "merge of unknown tokens"])
def test_bad_tokenizer_is_refused_at_pack(tmp_path, case):
    edit, field = TOKENIZER_CASES[case]
    src = synthetic.write_hf(tmp_path / "hf")
    tok = json.loads((src / "tokenizer.json").read_text())
    edit(tok)
    (src / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(FormatError) as e:
        pack(src, tmp_path / "out", progress=False)
    assert field in e.value.field, str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


# ---------------------------------------------------------------------------------------------------- chat template

BAD_TEMPLATES = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "huge output": "{{ 'x' * 1000000000 }}",
    "does not compile": "{% for %}",
    "unsafe": "{{ messages.__class__.__mro__ }}",
}


@pytest.mark.parametrize("case", BAD_TEMPLATES)
def test_bad_chat_template_is_refused_at_verify_and_pack(pkg, tmp_path, case):
    _edit_manifest(pkg, lambda m: m.update(chat_template=BAD_TEMPLATES[case]))
    problems = verify_package(pkg)
    assert len(problems) == 1 and "chat_template" in problems[0], problems
    src = synthetic.write_hf(tmp_path / "hf")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = BAD_TEMPLATES[case]
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError) as e:
        pack(src, tmp_path / "out", progress=False)
    assert e.value.field == "chat_template"


# ---------------------------------------------------------------------------------------------------- random manifests

_EVIL = st.one_of(st.integers(-2**70, 2**70), st.sampled_from([0, -1, 10**6, 10**9, 10**18, math.inf, -math.inf,
                                                               math.nan, 1e308, 1e-320, True, None, "", "x", [], {}]))


@st.composite
def _mutation(draw):
    """A path into the manifest (config, a tensor, a binding, a file entry) and a hostile value for it."""
    where = draw(st.sampled_from(["config", "tensor", "binding", "component", "file", "top"]))
    return where, draw(st.integers(0, 10**6)), draw(_EVIL)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.lists(_mutation(), min_size=1, max_size=3))
def test_random_manifest_mutations_fail_typed_and_fast(intact, mutations):
    m = json.loads((intact / "manifest.json").read_text())
    for where, k, v in sorted(mutations, key=lambda x: x[0] == "top"):  # top-level replacements last
        if where == "config":
            keys = sorted(m["config"])
            m["config"][keys[k % len(keys)]] = v
        elif where == "top":
            keys = ["format_version", "files", "tensors", "tokenizer", "config"]
            m[keys[k % len(keys)]] = v
        else:
            t = m["tensors"][k % len(m["tensors"])]
            if where == "tensor":
                key = ["shape", "dtype", "group_size", "k_padded", "bindings"][k % 5]
                t[key] = [v, v] if key == "shape" and k % 2 else v
            elif where == "binding":
                t["bindings"][0]["rows"] = [0, v]
            elif where == "component":
                c = next(iter(t["bindings"][0]["parts"][0]["components"].values()))
                c[["offset", "bytes", "file"][k % 3]] = v
            else:
                m["files"][k % len(m["files"])][["bytes", "name", "sha256"][k % 3]] = v
    t0 = time.perf_counter()
    try:
        p = Package.from_manifest(m, lambda *_: b"")
    except FormatError:
        pass
    else:
        assert p.config.num_hidden_layers * 9 <= len(m["tensors"])
    assert time.perf_counter() - t0 < 2


# ---------------------------------------------------------------------------------------------------- pack cleanup


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_pack_removes_its_temp_folder_on_signals(tmp_path, sig):
    src = synthetic.write_large_synthetic_hf(tmp_path / "big", gigabytes=0.1, hidden=512, ffn=1408, vocab=8000)
    out = tmp_path / "out"
    code = f"from webinfer_packager.pack.build import pack; pack({str(src)!r}, {str(out)!r}, progress=False)"
    # SIGINT back to its default in the child: a test run started in the background (`cmd &` in a script) ignores
    # SIGINT, the child would inherit that and pack on to the end (exit 0), and the test would check nothing
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    while not any(tmp_path.glob("out.tmp-*/*.bin")):  # a shard is being written
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() - t0 < 120
        time.sleep(0.02)
    proc.send_signal(sig)
    assert proc.wait(60) in (128 + sig, -sig, 1)  # SystemExit(143), or KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]


def test_error_types_are_webinfer_errors():
    assert issubclass(IntegrityError, WebinferError) and issubclass(FormatError, WebinferError)


def _rehash_file(pkg: Path, old: str) -> None:
    """Give an edited shard its new content name everywhere in the manifest, as a hostile packer would."""
    data = (pkg / old).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    new = f"{sha}.bin"
    (pkg / old).rename(pkg / new)
    text = (pkg / "manifest.json").read_text().replace(old.split(".")[0], sha)
    (pkg / "manifest.json").write_text(text)


@pytest.mark.parametrize("component, value", [("scales", b"\x00\x7c"), ("scales", b"\x00\x7e"), ("data", None)])
def test_non_finite_values_with_matching_hashes_fail_verify_and_pack_checks(pkg, component, value):
    import struct

    p = Package.open(pkg)
    t = next(t for t in p.tensors.values() if component in t.components)
    ref = t.bindings[0].parts[0].components[component]
    data = bytearray((pkg / ref.file).read_bytes())
    data[ref.offset:ref.offset + (len(value) if value else 4)] = value or struct.pack("<f", math.inf)
    (pkg / ref.file).write_bytes(bytes(data))
    _rehash_file(pkg, ref.file)
    p = Package.open(pkg)
    _read_all(p)  # the hashes match: only the value check can tell
    with pytest.raises(FormatError) as e:
        p.validate()
    assert e.value.field == f"tensors[{t.name}].{component}"
    problems = verify_package(pkg)
    assert len(problems) == 1 and f"tensors[{t.name}].{component}" in problems[0]
