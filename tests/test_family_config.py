"""The family fields of ModelConfig (webinfer/package.py): defaults for old manifests, validation naming the field,
the canonical tensor list, and the Hugging Face config readings the packer refuses. Fast: no torch."""

from __future__ import annotations

import json

import pytest

from webinfer.errors import FormatError
from webinfer.package import ModelConfig, expected_tensors

BASE = dict(architecture="gemma3", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
            rope_scaling=None, max_position_embeddings=256, tie_word_embeddings=True, attention_bias=False,
            bos_token_id=2, eos_token_ids=[1], pad_token_id=0)


def test_old_manifest_gets_llama_defaults_and_round_trips():
    c = ModelConfig.from_dict({**BASE, "architecture": "llama"})
    assert (c.activation, c.qk_norm, c.post_norms, c.embedding_multiplier, c.layer_types) == ("silu", False, False,
                                                                                             1.0, None)
    assert c.attn_scale == 16 ** -0.5 and not c.is_sliding(0) and c.layer_rope(0) == (1e6, None)
    full = {**BASE, "qk_norm": True, "post_norms": True, "activation": "gelu_tanh", "sliding_window": 4,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "rope_local_theta": 1e4,
            "query_pre_attn_scalar": 20, "embedding_multiplier": 8.0}
    c = ModelConfig.from_dict(full)
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert c.layer_rope(0) == (1e4, None) and c.layer_rope(2) == (1e6, None) and c.attn_scale == 20 ** -0.5


def test_expected_tensors_order_with_qk_and_post_norms():
    c = ModelConfig.from_dict({**BASE, "qk_norm": True, "post_norms": True})
    names = [n for n, _ in expected_tensors(c) if n.startswith("layers.0.")]
    assert names == [f"layers.0.{p}" for p in ("attn_norm", "q", "k", "v", "q_norm", "k_norm", "o", "post_attn_norm",
                                               "ffn_norm", "gate", "up", "down", "post_ffn_norm")]
    assert dict(expected_tensors(c))["layers.0.q_norm"] == [16]


@pytest.mark.parametrize("change,field", [
    ({"activation": "relu"}, "config.activation"),
    ({"layer_types": ["full_attention"]}, "config.layer_types"),
    ({"layer_types": ["sliding_attention"] * 3}, "config.sliding_window"),
    ({"sliding_window": 4}, "config.layer_types"),
    ({"sliding_window": 0, "layer_types": ["full_attention"] * 3}, "config.sliding_window"),
    ({"qk_norm": "yes"}, "config.qk_norm"),
    ({"query_pre_attn_scalar": -1}, "config.query_pre_attn_scalar"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "config.rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, "config.rope_scaling.low_freq_factor"),
    ({"rope_scaling": {"rope_type": "freq_factors", "factors": [1.0] * 7}}, "config.rope_scaling.factors"),
    ({"rope_scaling": {"rope_type": "freq_factors", "factors": [1.0] * 7 + [0.0]}}, "config.rope_scaling.factors"),
    ({"architecture": "gpt2"}, "config.architecture"),
])
def test_bad_family_fields_name_the_field(change, field):
    with pytest.raises(FormatError) as e:
        ModelConfig.from_dict({**BASE, **change})
    assert e.value.field == field, str(e.value)


def test_hf_source_refuses_unknown_rope_and_activation(tmp_path):
    from tests.synthetic import write_hf
    from webinfer_packager.pack.hf_source import HFSource

    for i, (change, field) in enumerate([({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
                                         ({"hidden_act": "relu2"}, "hidden_act")]):
        src = write_hf(tmp_path / f"m{i}")
        cfg = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(FormatError) as e:
            HFSource(src)
        assert e.value.field == field and "config.json" in e.value.file


def test_pack_chat_template_file_replaces_the_sources(tmp_path):
    """`webinfer pack SRC --chat-template FILE` stores FILE's template; a template that does not compile is refused
    before anything is written."""
    from webinfer.errors import ChatTemplateError
    from webinfer.package import Package
    from webinfer_packager.cli.main import main
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    src = write_hf(tmp_path / "hf")
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}", encoding="utf-8")
    assert main(["pack", str(src), "-o", str(tmp_path / "pkg"), "--chat-template", str(tpl), "--quiet"]) == 0
    assert Package.open(tmp_path / "pkg").chat_template == tpl.read_text(encoding="utf-8")
    with pytest.raises(ChatTemplateError):
        pack(src, tmp_path / "bad", progress=False, chat_template="{% for %}")
    assert not (tmp_path / "bad").exists()


def test_pack_without_output_names_the_folder_after_the_model(tmp_path, monkeypatch, capsys):
    """`webinfer pack SOURCE` (no -o) packs into $WEBINFER_HOME/packages/ under the source's name (or --name, made
    one safe path component), never into the default model's folder: packing Gemma there used to fail with
    "packages/SmolLM2-135M-Instruct already exists", and with --force would have replaced SmolLM2."""
    from webinfer_packager.cli.main import main
    from tests.synthetic import write_hf

    monkeypatch.setenv("WEBINFER_HOME", str(tmp_path / "home"))
    default = tmp_path / "home" / "packages" / "SmolLM2-135M-Instruct"
    default.mkdir(parents=True)
    src = write_hf(tmp_path / "tiny-model")
    assert main(["pack", str(src), "--quiet"]) == 0
    assert (tmp_path / "home" / "packages" / "tiny-model" / "manifest.json").is_file()
    assert main(["pack", str(src), "--quiet", "--name", "../a/b c"]) == 0
    assert (tmp_path / "home" / "packages" / "a_b_c" / "manifest.json").is_file()
    assert not any(default.iterdir())
    assert capsys.readouterr().out.split() == [str(tmp_path / "home" / "packages" / n) for n in ("tiny-model", "a_b_c")]
