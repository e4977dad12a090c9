"""lm-evaluation-harness, the tool most model scores come from, against `webinfer serve`: its `local-completions`
model scores a multiple-choice task through /v1/completions (token-id prompts, `echo`, `logprobs: 1`,
`max_tokens: 1`), and every choice's loglikelihood and is-greedy flag equal what lm-eval's own transformers
backend (`hf`, the same GGUF in float32) computes, within float order. The server runs the CPU engine (the engine
of a machine without a fast GPU) and, for SmolLM2, the GPU model. Offline: a local JSON task, the tokenizer saved
from the GGUF.

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


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """(folder with the task, per model: its tokenizer folder and lm-eval hf backend's results, computed once)."""
    tmp = tmp_path_factory.mktemp("lm_eval")
    data = tmp / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "choices": ch, "answer": a}) + "\n" for c, ch, a in DOCS))
    (tmp / "capitals.yaml").write_text(TASK.format(data=data))
    return tmp, {}


def _model(task, name: str, gguf: Path) -> tuple[Path, dict, str]:
    """The model's tokenizer folder, lm-eval hf's results on it, and the model args both sides share (Gemma: with
    its BOS, as lm-eval's hf backend adds it for Gemma by itself)."""
    from transformers import AutoTokenizer

    tmp, models = task
    if name not in models:
        tok = tmp / f"tokenizer-{name}"
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tok)
        common = f"tokenizer={tok}" + (",add_bos_token=True" if name == "gemma" else "")
        models[name] = (tok, _lm_eval(tmp, f"hf-{name}", "hf", f"pretrained={gguf.parent},gguf_file={gguf.name},"
                                                                 f"dtype=float32,{common}"), common)
    return models[name]


@pytest.mark.parametrize("name, backend", [("smollm2", "cpu"), pytest.param("smollm2", "native", marks=pytest.mark.gpu),
                                           ("gemma", "cpu")])
def test_lm_eval_scores_through_webinfer_serve_as_through_transformers(task, request, name, backend):
    """SmolLM2-135M (Q4_1) on the CPU engine and the GPU model, Gemma 3 270M (Q4_K_M, 262k vocabulary) on the CPU
    engine: measured 4.8e-5, 5.6e-5 and 9.9e-5 at most."""
    package = request.getfixturevalue(f"{name}_package")
    tok, theirs, common = _model(task, name, request.getfixturevalue(f"{name}_gguf"))
    p, client = _server(package, backend=backend)
    try:
        ours = _lm_eval(task[0], f"webinfer-{name}-{backend}", "local-completions",
                        f"base_url={client.base_url}completions,model=m,tokenized_requests=True,num_concurrent=1,"
                        f"max_retries=1,{common}")
    finally:
        _stop(p)
    assert sorted(ours) == sorted(theirs) == list(range(len(DOCS)))
    worst = 0.0
    for d in ours:
        for (ll, greedy), (ll_hf, greedy_hf) in zip(ours[d], theirs[d], strict=True):
            worst = max(worst, abs(ll - ll_hf))
            assert abs(ll - ll_hf) < 5e-4 and greedy == greedy_hf, (d, ours[d], theirs[d])
    # the model knows some capitals, not all: the scores decide, not a constant
    picks = [max(range(4), key=lambda j: ours[d][j][0]) for d in sorted(ours)]
    assert 0 < sum(pick == a for pick, (_, _, a) in zip(picks, DOCS)) < len(DOCS)
    print(f"{name} on {backend}: largest |loglikelihood - lm-eval hf's| {worst:.2e}")
