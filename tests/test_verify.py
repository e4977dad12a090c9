"""`webinfer verify` and Package's manifest validation: intact packages pass; flipped bytes, truncated or
missing files, parts outside their file and wrong versions are each reported naming the file or field.

Run: python -m pytest tests/test_verify.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from webinfer.errors import FormatError
from webinfer.package import Package
from tests import synthetic
from webinfer_packager.pack.build import pack
from webinfer_packager.pack.verify import verify_package


@pytest.fixture()
def pkg(tmp_path):
    return pack(synthetic.write_gguf(tmp_path / "m.gguf"), tmp_path / "pkg", progress=False)


def _bins(pkg):
    return sorted(pkg.glob("*.bin"))


def test_intact_package_verifies(pkg):
    assert verify_package(pkg) == []
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "verify", str(pkg)], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "extra"])
def test_damaged_files_are_named(pkg, damage):
    f = _bins(pkg)[0]
    if damage == "flip":
        b = bytearray(f.read_bytes())
        b[len(b) // 2] ^= 1
        f.write_bytes(bytes(b))
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:-10])
    elif damage == "delete":
        f.unlink()
    else:
        f = pkg / "stray.bin"
        f.write_bytes(b"x")
    problems = verify_package(pkg)
    assert len(problems) == 1 and f.name in problems[0]
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "verify", str(pkg)], capture_output=True, text=True)
    assert r.returncode != 0 and f.name in r.stderr


def _edit_manifest(pkg, fn):
    m = json.loads((pkg / "manifest.json").read_text())
    fn(m)
    (pkg / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("edit,field", [
    (lambda m: m.update(format_version=2), "format_version"),
    (lambda m: m.update(format="gguf"), "format"),
    (lambda m: m["config"].pop("head_dim"), "config.head_dim"),
    (lambda m: m["tensors"][1]["bindings"][0]["parts"][0]["components"]["data"].update(offset=1 << 30), "components.data"),
    (lambda m: m["tensors"][2]["bindings"][0]["parts"][0]["components"]["qweight"].update(offset=100), "offset"),
    (lambda m: m["tensors"].pop(3), "tensors"),
    (lambda m: m["tensors"][2].update(shape=[64, 32]), "tensors[layers.0.q]"),
])
def test_bad_manifest_names_field(pkg, edit, field):
    _edit_manifest(pkg, edit)
    with pytest.raises(FormatError) as e:
        Package.open(pkg)
    assert field in e.value.field
    if field == "format_version":
        assert "2" in str(e.value) and "1" in str(e.value)  # both versions named
    assert verify_package(pkg) and field.split("[")[0] in verify_package(pkg)[0]


def test_from_manifest_with_a_custom_reader(pkg):
    """The browser path: no local files, only a manifest dict and a byte-range reader."""
    blobs = {p.name: p.read_bytes() for p in pkg.iterdir()}
    m = json.loads(blobs["manifest.json"])
    p = Package.from_manifest(m, lambda name, off, n: blobs[name][off:off + n])
    local = Package.open(pkg)
    assert p.read_component("layers.1.down", "scales") == local.read_component("layers.1.down", "scales")
    assert p.tokenizer_json() == local.tokenizer_json() and p.config == local.config


@pytest.mark.slow
def test_pack_memory_is_bounded(tmp_path):
    """A ~0.4 GB f16 model packs in a fresh process whose peak RSS stays well below the model size."""
    src = synthetic.write_large_synthetic_hf(tmp_path / "big", gigabytes=0.4, hidden=1024, ffn=2816, vocab=32000)
    size = (src / "model.safetensors").stat().st_size
    # peak RSS minus the RSS after imports: python + numpy + gguf + safetensors alone take 100-200 MB
    code = ("import resource,sys; from webinfer_packager.pack.build import pack; "
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"pack({str(src)!r}, {str(tmp_path / 'out')!r}, progress=False); "
            "print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    base, peak = (int(v) * 1024 for v in r.stdout.split()[-2:])
    assert size > 350e6 and peak - base < 0.5 * size, (base, peak, size)
    assert verify_package(tmp_path / "out") == []
