"""`webinfer bench --quick --json --skip-hf` on a tiny synthetic package: valid JSON with every key, sane numbers.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/test_bench.py -q
"""

from __future__ import annotations

import json

import pytest

from webinfer_packager.cli.main import main

pytestmark = pytest.mark.gpu

KEYS = ["adapter", "copy_gbps", "gemv", "kernels", "step_ms", "host_overhead_frac", "dispatches_per_token", "ttft_s",
        "prefill_tok_s", "decode_tok_s", "hf_transformers"]


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    tmp = tmp_path_factory.mktemp("bench")
    write_hf(tmp / "hf", arch="llama")
    return pack(tmp / "hf", tmp / "pkg", progress=False)


def test_bench_quick_json(tiny_package, tmp_path, capsys):
    out_file = tmp_path / "bench.json"
    assert main(["bench", str(tiny_package), "--quick", "--json", "--skip-hf", "--output", str(out_file)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(printed)  # --json: stdout is only the JSON document
    assert json.loads(out_file.read_text()) == res
    for k in KEYS:
        assert k in res, f"missing top-level key {k}"
    assert res["adapter"]["name"] and "timestamp-query" in res["adapter"]["features"]
    assert res["copy_gbps"] > 0
    assert res["gemv_ksplit"] == 1  # CI's lavapipe is a fallback adapter: the engine's layout there
    names = [g["name"] for g in res["gemv"]]
    assert names[0] == "4096x4096" and "qkv" in names and "lm_head" in names
    for g in res["gemv"]:
        assert g["ms"] > 0 and g["gbps"] > 0 and g["ratio"] > 0
    # the tiny model: 64 hidden, 4 heads + 2*2 kv heads of 16 -> fused qkv is 128 x 64
    assert {g["name"]: g["shape"] for g in res["gemv"]}["qkv"] == [128, 64]
    # a 32-token context is one attention split: the decode kernel writes the output, no reduce pass
    assert "attn.decode" in res["kernels"] and "attn.reduce" not in res["kernels"] and "sample" in res["kernels"]
    assert all(ms > 0 for ms in res["kernels"].values())
    assert res["prefill_kernels"]["tokens"] == 32 and res["prefill_kernels"]["attn.prefill"] > 0
    assert "attn.decode" not in res["prefill_kernels"]
    assert res["step_ms"] > 0 and res["kernel_ms"] > 0
    # the GPU span of a step against the wall time of the same step: a share, never negative
    assert 0.0 <= res["host_overhead_frac"] < 1.0
    hm = res["host_ms_per_step"]  # the host's own share of that step, apart from the GPU's
    assert hm["record_ms"] > 0 and hm["encode_submit_ms"] > 0
    assert hm["record_ms"] + hm["encode_submit_ms"] < res["step_ms"]
    assert hm["tok_s_bound"] == pytest.approx(1e3 / (hm["record_ms"] + hm["encode_submit_ms"]), rel=0.01)
    blk = res["decode_block"]
    assert blk["steps"] == 8 and blk["tok_s"] > 0 and blk["single_step_tok_s"] > 0
    assert blk["ratio"] == pytest.approx(blk["tok_s"] / blk["single_step_tok_s"], rel=1e-2)
    assert res["dispatches_per_token"] == 1 + 5 * 2 + 3  # embed, 5 per layer (2 layers), final norm + head + sample
    for k in ("ttft_s", "prefill_tok_s", "decode_tok_s"):
        assert res[k] > 0
    assert res["decode_tokens"] == 8 and res["prompt_tokens"] == 32
    t40 = res["ttft_40"]  # the quick bench's prompt is 32 tokens: all of it
    assert t40["prompt_tokens"] == 32 and t40["ttft_s"] > 0
    assert t40["decode_steps"] == pytest.approx(t40["ttft_s"] * 1e3 / res["step_ms"], rel=0.02)
    ps = res["prompt_scoring"]  # the same prompt scored (echo's prompt logprobs) beside its prefill
    assert ps["prompt_tokens"] == 32 and ps["prefill_s"] > 0 and ps["scored_s"] > 0
    assert ps["vs_prefill"] == pytest.approx(ps["scored_s"] / ps["prefill_s"], rel=0.01)
    assert res["attention"]["decode"]["ms"] > 0 and res["attention"]["prefill"]["ms"] > 0
    assert res["attention"]["decode"]["queries"] == 4 and res["attention"]["prefill"]["queries"] == 32
    assert res["sampling"]["vocab"] == 300 and res["sampling"]["greedy_ms"] > 0 and res["sampling"]["top_k_top_p_ms"] > 0
    assert res["hf_transformers"]["decode_tok_s"] is None and "skip" in res["hf_transformers"]["reason"]
    nt = res["next_turn"]  # a chat's second turn, the answer computed (exact) and reused, one chat each
    assert not nt["rows_match_chunks"] and len(nt["reuse"]) == len(nt["compute"]) == 1
    assert nt["compute_median_ms"] > 0 and nt["reuse_median_ms"] > 0
    c = nt["compute"][0]
    assert c["cached_tokens"] <= c["prompt_tokens"] - c["answer_tokens"]
    sv = res["serving"]  # issue 4's part, measured on the same device in the same run
    assert set(sv) >= {"concurrency", "prefix_cache", "mixed"}
    assert sv["prefix_cache"]["cached_tokens"] > 0


def test_bench_table(tiny_package, capsys):
    assert main(["bench", str(tiny_package), "--quick", "--skip-hf", "--skip-serving"]) == 0
    text = capsys.readouterr().out
    assert "copy" in text and "gemv q4" in text and "decode step" in text and "first token" in text
    assert "host / step" in text and "next turn" in text


@pytest.mark.oracle
def test_hf_peer_runs_the_folder_the_package_was_packed_from(tiny_package):
    """bench_hf(..., hf_folder): the peer for a package packed from an HF folder (the real-GPU run's synthetic
    model, scripts/device_bench.py), here on the CPU in f32; without the folder such a package has no peer."""
    import torch

    from webinfer.package import Package
    from webinfer_packager.bench.run import bench_hf

    pkg = Package.open(tiny_package)
    assert bench_hf(pkg, 4)["decode_tok_s"] is None  # not the default GGUF: says why instead
    res = bench_hf(pkg, 4, hf_folder=tiny_package.parent / "hf")
    assert res["decode_tok_s"] > 0
    assert (res["device"], res["dtype"]) == (("cpu", "float32") if not torch.cuda.is_available() else
                                             (torch.cuda.get_device_name(0), "bfloat16"))


def test_sampling_bench_times_every_config_and_checks_ids(tiny_package, tmp_path):
    """`python -m webinfer_packager.bench.sampling`: the sampler's time per configuration on a package's logits,
    A/B against another sample.wgsl (here the same file: the two sides must agree on every id), each id checked
    against the reference sampler."""
    from webinfer.kernels.library import load_source
    from webinfer_packager.bench import sampling

    other = tmp_path / "sample.wgsl"
    other.write_text(load_source("sample"))
    res = sampling.run(str(tiny_package), 1, str(other))
    assert [c["config"] for c in res["configs"]] == [name for name, _ in sampling.CONFIGS]
    for c in res["configs"]:
        assert c["ms"]["this"] > 0 and c["ms"]["other"] > 0
        assert c["ids"]["this"] != "WRONG" and c["same_ids"], c
