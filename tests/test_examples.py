"""The examples run as written (on a tiny random-weight package: the text is noise, the plumbing is real)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.gpu
def test_chat_api_example_runs_two_conversations(tmp_path, gpu):
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    write_hf(tmp_path / "hf", arch="llama")
    pkg = pack(tmp_path / "hf", tmp_path / "pkg", progress=False)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "chat_api.py"), str(pkg)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "> What is the capital of France?" in r.stdout and "> Name three colors of the rainbow." in r.stdout
