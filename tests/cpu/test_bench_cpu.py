"""`webinfer bench --backend cpu --quick --json` on a tiny synthetic package (with a 2048-token context, so the
speculative prompts fit): every section present, figures sane, and the speculative runs' output identical to plain
decoding in both modes (the bench itself compares them)."""

from __future__ import annotations

import json

from tests.synthetic import write_hf
from webinfer_packager.cli.main import main


def test_cpu_bench_quick_json(tmp_path, capsys):
    from webinfer_packager.pack.build import pack

    write_hf(tmp_path / "hf", arch="llama", max_position_embeddings=2048)
    pkg = pack(tmp_path / "hf", tmp_path / "pkg", progress=False)
    assert main(["bench", str(pkg), "--backend", "cpu", "--quick", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["read_bw_gb_s"] > 0 and res["variant"] in ("base", "relaxed"), res
    for v in res["gemv"].values():
        assert v["exact"]["gb_s"] > 0 and v["fast"]["gb_s"] > 0, v
    for mode in ("exact", "fast"):
        assert res["decode"][mode]["decode_tok_s"] > 0, res["decode"]
        assert res["threads"][mode]["2"]["decode_tok_s"] > 0, res["threads"]
        prof = res["profile"][mode]  # the remainder is timed (matrices skipped), not a difference
        assert 0 < prof["rest_ms"] and prof["step_ms"] > 0 and prof["matrices_alone_total_ms"] > 0, prof
        sp = res["speculative"][mode]
        assert sp["backend"] == "cpu" and sp["cpu_mode"] == mode, sp
        ran = [v for v in sp["prompts"].values() if "speedup" in v]
        assert len(ran) == 3 and all(v["identical"] for v in ran), sp["prompts"]
