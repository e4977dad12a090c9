"""The examples run as written (on a tiny random-weight package: the text is noise, the plumbing is real)."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.gpu
def test_chat_api_example_runs_two_conversations(tmp_path, gpu):
    from tests.synthetic import write_hf
    from webinfer_packager.cli.backend import open_llm
    from webinfer_packager.pack.build import pack

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from chat_api import QUESTIONS
    finally:
        sys.path.pop(0)
    write_hf(tmp_path / "hf", arch="llama")
    pkg = pack(tmp_path / "hf", tmp_path / "pkg", progress=False)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "chat_api.py"), str(pkg)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # the two answers, batched in the example, equal each question asked alone (greedy, batch-invariant engine)
    llm = open_llm(pkg, "native", device=gpu)
    alone = [asyncio.run(llm.chat.completions.create(messages=[{"role": "user", "content": q}], max_tokens=48,
                                                     temperature=0))["choices"][0]["message"]["content"]
             for q in QUESTIONS]
    assert all(alone)
    assert r.stdout == "".join(f"> {q}\n{a}\n\n" for q, a in zip(QUESTIONS, alone))
