"""Build a Hugging Face tokenizer.json (plus chat template and special tokens) from GGUF tokenizer metadata,
and normalise an HF folder's tokenizer files.

We emit the subset of tokenizer.json that Hugging Face itself writes for these models, so the `tokenizers`
library loads our output unchanged (tests compare its encodings with transformers' own GGUF conversion):
- `tokenizer.ggml.model == "gpt2"`: byte-level BPE; the pre-tokenizer follows `tokenizer.ggml.pre`.
- `tokenizer.ggml.model == "llama"`: SentencePiece-style BPE with byte fallback, merges derived from the scores
  (a merge a+b -> ab ranks by the score of ab, the way SentencePiece BPE picks the best-scoring pair).
"""

from __future__ import annotations

import json
from pathlib import Path

from webinfer.errors import FormatError

# GGUF token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


# tokenizer.ggml.pre -> (normalizer, pre_tokenizer)
BPE_PRE = {
    "gpt2": (None, _byte_level(True)),
    "default": (None, _byte_level(True)),
    "smollm": (None, {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _byte_level(True)]}),
    "llama-bpe": (None, {"type": "Sequence", "pretokenizers": [_split(_LLAMA3_RE), _byte_level(False)]}),
    "qwen2": ({"type": "NFC"}, {"type": "Sequence", "pretokenizers": [_split(_QWEN2_RE), _byte_level(False)]}),
}


def _added(i: int, content: str, special: bool) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": not special, "special": special}


def _bpe_model(vocab: dict, merges: list, *, byte_fallback: bool, unk: str | None) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
            "ignore_merges": False, "vocab": vocab, "merges": merges}


def tokenizer_from_gguf(fields: dict, file: str) -> tuple[dict, str | None, dict]:
    model = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise FormatError(file, "tokenizer.ggml.tokens", "missing or not a list of strings", "the vocabulary")
    n = len(tokens)
    types = fields.get("tokenizer.ggml.token_type") or [NORMAL] * n
    if len(types) != n:
        raise FormatError(file, "tokenizer.ggml.token_type", f"has {len(types)} entries", f"{n} (one per token)")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # duplicates (rare, unused slots) keep their first id, as HF does
    added = [_added(i, t, types[i] == CONTROL) for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)]

    if model == "gpt2":
        pre = fields.get("tokenizer.ggml.pre") or "default"
        if pre not in BPE_PRE:
            raise FormatError(file, "tokenizer.ggml.pre", f"{pre!r} is not supported", "one of " + ", ".join(BPE_PRE))
        merges_raw = fields.get("tokenizer.ggml.merges")
        if not isinstance(merges_raw, list):
            raise FormatError(file, "tokenizer.ggml.merges", "missing", "a list of 'a b' merges for a gpt2 tokenizer")
        merges = []
        for j, m in enumerate(merges_raw):
            parts = m.split(" ") if isinstance(m, str) else []
            if len(parts) != 2:
                raise FormatError(file, f"tokenizer.ggml.merges[{j}]", f"is {m!r}", "'left right'")
            merges.append(parts)
        normalizer, pre_tok = BPE_PRE[pre]
        tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
              "normalizer": normalizer, "pre_tokenizer": pre_tok,
              "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
              "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
              "model": _bpe_model(vocab, merges, byte_fallback=False, unk=None)}
    elif model == "llama":
        scores = fields.get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != n:
            raise FormatError(file, "tokenizer.ggml.scores", "missing or wrong length", f"{n} scores")
        merges = _merges_from_scores(tokens, scores, types)
        unk_id = fields.get("tokenizer.ggml.unknown_token_id")
        tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
              "normalizer": {"type": "Sequence", "normalizers": [
                  {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "},
                                                              "content": "\u2581"}]},
              "pre_tokenizer": None, "post_processor": None,
              "decoder": {"type": "Sequence", "decoders": [
                  {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                  {"type": "ByteFallback"}, {"type": "Fuse"},
                  {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
              "model": _bpe_model(vocab, merges, byte_fallback=True,
                                  unk=tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < n else None)}
    else:
        raise FormatError(file, "tokenizer.ggml.model", f"{model!r} is not supported", "'gpt2' or 'llama'")

    def tok(key):
        i = fields.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < n else None

    special = {"bos_token": tok("bos"), "eos_token": tok("eos"), "unk_token": tok("unknown"),
               "pad_token": tok("padding"),
               "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", model == "llama")),
               "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False))}
    template = fields.get("tokenizer.chat_template")
    return tj, template if isinstance(template, str) else None, special


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[list[str]]:
    """Every split a|b of a normal token whose halves are tokens is a merge, ranked by the token's score."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for i, t in enumerate(tokens):
        if types[i] != NORMAL or len(t) < 2:
            continue
        for cut in range(1, len(t)):
            a, b = t[:cut], t[cut:]
            if a in ids and b in ids:
                found.append((-float(scores[i]), i, ids[a], [a, b]))
    found.sort(key=lambda x: x[:3])
    return [m for *_, m in found]


# ----------------------------------------------------------------------------------------------------------
# HF folders


def _read_json(path: Path, field: str = "(json)") -> dict:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise FormatError(path, "(file)", "does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(path, field, f"is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise FormatError(path, field, f"is a {type(data).__name__}", "a JSON object")
    return data


def _token_text(v) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def tokenizer_from_hf(folder: Path) -> tuple[dict, str | None, dict]:
    tj = _read_json(folder / "tokenizer.json")
    model = tj.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict):
        raise FormatError(folder / "tokenizer.json", "model.vocab", "missing", "a tokenizer model with a vocab")
    if model.get("type") != "BPE":
        raise FormatError(folder / "tokenizer.json", "model.type", f"is {model.get('type')!r}", "'BPE'")
    if not isinstance(model.get("merges"), list):
        raise FormatError(folder / "tokenizer.json", "model.merges", "missing", "a list of merges")
    if not isinstance(tj.get("added_tokens", []), list):
        raise FormatError(folder / "tokenizer.json", "added_tokens", "is not a list")
    cfg_path = folder / "tokenizer_config.json"
    cfg = _read_json(cfg_path) if cfg_path.exists() else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{name, template}, ...]: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    special = {"bos_token": _token_text(cfg.get("bos_token")), "eos_token": _token_text(cfg.get("eos_token")),
               "unk_token": _token_text(cfg.get("unk_token")), "pad_token": _token_text(cfg.get("pad_token")),
               "add_bos_token": bool(cfg.get("add_bos_token", False)),
               "add_eos_token": bool(cfg.get("add_eos_token", False))}
    return tj, template if isinstance(template, str) else None, special
