"""lm-evaluation-harness, the tool most model scores come from, against `webinfer serve`: its `local-completions`
model scores a multiple-choice task through /v1/completions (token-id prompts, `echo`, `logprobs: 1`,
`max_tokens: 1`), and every choice's loglikelihood and is-greedy flag equal what lm-eval's own transformers
backend (`hf`, the same GGUF in float32) computes, within float order. The server runs the CPU engine (the engine
of a machine without a fast GPU). Offline: a local JSON task, the tokenizer saved from the GGUF.

Run: python -m pytest tests/test_lm_eval.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")  # a test dependency (pyproject [test]); skipped only outside the test env

from tests.test_openai_client import _server, _stop  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.oracle, pytest.mark.slow]

DOCS = [("France", [" Paris", " Lyon", " Marseille", " Nice"], 0),
        ("Italy", [" Milan", " Rome", " Naples", " Turin"], 1),
        ("Spain", [" Barcelona", " Seville", " Madrid", " Valencia"], 2),
        ("Germany", [" Munich", " Hamburg", " Frankfurt", " Berlin"], 3),
        ("Japan", [" Tokyo", " Osaka", " Kyoto", " Nagoya"], 0),
        ("Canada", [" Toronto", " Ottawa", " Vancouver", " Montreal"], 1),
        ("Australia", [" Sydney", " Melbourne", " Canberra", " Perth"], 2),
        ("Brazil", [" Rio de Janeiro", " Sao Paulo", " Salvador", " Brasilia"], 3)]
TASK = """task: webinfer_capitals
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: What is the capital of {{{{country}}}}?\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def _lm_eval(tmp: Path, out: str, model: str, model_args: str) -> dict[int, list]:
    """Run lm_eval's CLI on the task; per document, each choice's [loglikelihood, is_greedy] as lm-eval logged it."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--device",
                        "cpu", "--tasks", "webinfer_capitals", "--include_path", str(tmp), "--output_path",
                        str(tmp / out), "--log_samples"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (samples,) = (tmp / out).rglob("samples_webinfer_capitals_*.jsonl")
    docs = [json.loads(line) for line in samples.read_text().splitlines()]
    return {d["doc_id"]: [[float(x[0][0]), x[0][1]] for x in d["resps"]] for d in docs}


def test_lm_eval_scores_through_webinfer_serve_as_through_transformers(smollm2_package, smollm2_gguf, tmp_path):
    from transformers import AutoTokenizer

    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "choices": ch, "answer": a}) + "\n" for c, ch, a in DOCS))
    (tmp_path / "capitals.yaml").write_text(TASK.format(data=data))
    tok = tmp_path / "tokenizer"
    AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name).save_pretrained(tok)

    p, client = _server(smollm2_package, backend="cpu")
    try:
        ours = _lm_eval(tmp_path, "webinfer", "local-completions",
                        f"base_url={client.base_url}completions,model=m,tokenizer={tok},tokenized_requests=True,"
                        "num_concurrent=1,max_retries=1")
    finally:
        _stop(p)
    theirs = _lm_eval(tmp_path, "hf", "hf", f"pretrained={smollm2_gguf.parent},gguf_file={smollm2_gguf.name},"
                                            f"tokenizer={tok},dtype=float32")
    assert sorted(ours) == sorted(theirs) == list(range(len(DOCS)))
    worst = 0.0
    for d in ours:
        for (ll, greedy), (ll_hf, greedy_hf) in zip(ours[d], theirs[d], strict=True):
            worst = max(worst, abs(ll - ll_hf))
            assert abs(ll - ll_hf) < 5e-4 and greedy == greedy_hf, (d, ours[d], theirs[d])
    # the model knows some capitals, not all: the scores decide, not a constant
    picks = [max(range(4), key=lambda j: ours[d][j][0]) for d in sorted(ours)]
    assert 0 < sum(p == a for p, (_, _, a) in zip(picks, DOCS)) < len(DOCS)
    print(f"largest |loglikelihood - lm-eval hf's| {worst:.2e}")
