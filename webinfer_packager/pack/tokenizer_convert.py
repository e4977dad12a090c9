"""Build a Hugging Face tokenizer.json (plus chat template and special tokens) from GGUF tokenizer metadata,
and normalise an HF folder's tokenizer files.

We emit the tokenizer.json that transformers' own GGUF conversion builds (transformers/integrations/gguf/
gguf_tokenizer_mapping.py), so the `tokenizers` library loads our output unchanged and tests compare the two:
- `tokenizer.ggml.model == "gpt2"`: byte-level BPE; the pre-tokenizer is the one llama.cpp runs for
  `tokenizer.ggml.pre` (webinfer.pretokenize.LLAMA_CPP_PRE: one table for the runtime's scanners and this file).
- `tokenizer.ggml.model == "llama"`: SentencePiece-style BPE with byte fallback, merges recovered from the
  vocabulary and ranked by score (Gemma: by position, with its all-space tokens respelled with "▁"); a Metaspace
  pre-tokenizer that follows `tokenizer.ggml.add_space_prefix` (Llama 2), or Gemma's Replace(" ", "▁").
- BOS/EOS: the post-processor adds them as HF's tokenizer does for that model (from a GGUF: `add_bos_token`, which a
  llama vocabulary without the flag defaults to true; from an HF folder: tokenizer.json's own post-processor), so
  `Tokenizer.encode(text, add_special_tokens=True)` equals transformers' `tokenizer(text)`. special_tokens'
  add_bos_token / add_eos_token record what the post-processor does.
"""

from __future__ import annotations

import json
from pathlib import Path

from webinfer.errors import FormatError
from webinfer.pretokenize import LLAMA_CPP_PRE
from webinfer.tokenizer.common import BYTE_TO_CHAR
from webinfer.tokenizer.encode import build_post

# GGUF token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_GEMMA = ("gemma", "gemma2", "gemma3")
_BYTE_ALPHABET = frozenset(BYTE_TO_CHAR.values())


def _added(i: int, content: str, special: bool) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _bpe_model(vocab: dict, merges: list, *, byte_fallback: bool, unk: str | None) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
            "ignore_merges": False, "vocab": vocab, "merges": merges}


def template_post(bos: str | None, bos_id: int | None, eos: str | None, eos_id: int | None,
                  add_bos: bool, add_eos: bool) -> dict:
    """HF's TemplateProcessing for `[bos] $A [eos]`, as transformers' update_post_processor writes it."""
    add_bos, add_eos = add_bos and bos is not None and bos_id is not None, add_eos and eos is not None and eos_id is not None
    single, pair, specials = [], [], {}

    def special(tok, i, type_id):
        specials[tok] = {"id": tok, "ids": [i], "tokens": [tok]}
        return {"SpecialToken": {"id": tok, "type_id": type_id}}

    for type_id, seq, out in ((0, "A", single), (1, "B", pair)):
        if add_bos:
            out.append(special(bos, bos_id, type_id))
        out.append({"Sequence": {"id": seq, "type_id": type_id}})
        if add_eos:
            out.append(special(eos, eos_id, type_id))
    return {"type": "TemplateProcessing", "single": single, "pair": single + pair, "special_tokens": specials}


def tokenizer_from_gguf(fields: dict, file: str) -> tuple[dict, str | None, dict]:
    model = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise FormatError(file, "tokenizer.ggml.tokens", "missing or not a list of strings", "the vocabulary")
    n = len(tokens)
    types = fields.get("tokenizer.ggml.token_type") or [NORMAL] * n
    if len(types) != n:
        raise FormatError(file, "tokenizer.ggml.token_type", f"has {len(types)} entries", f"{n} (one per token)")
    gemma = model == "llama" and fields.get("general.architecture") in _GEMMA
    if gemma:  # Gemma stores its all-space tokens with real spaces; its text has "▁" for them
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # duplicates (rare, unused slots) keep their first id, as HF does
    original = fields.get("tokenizer.ggml.tokens")
    # control tokens are special; user-defined ones (`<think>`, Gemma's "\n\n") plain added tokens, matched whole
    added = [_added(i, t, types[i] == CONTROL) for i, t in enumerate(tokens)
             if (types[i] == CONTROL and (model != "gpt2" or set(t) <= _BYTE_ALPHABET))
             or (types[i] == USER_DEFINED and original[i] == t)]

    if model == "gpt2":
        pre = fields.get("tokenizer.ggml.pre") or "default"
        if pre not in LLAMA_CPP_PRE:
            raise FormatError(file, "tokenizer.ggml.pre", f"{pre!r} is not supported", "one of " + ", ".join(LLAMA_CPP_PRE))
        merges_raw = fields.get("tokenizer.ggml.merges")
        if not isinstance(merges_raw, list):
            raise FormatError(file, "tokenizer.ggml.merges", "missing", "a list of 'a b' merges for a gpt2 tokenizer")
        merges = []
        for j, m in enumerate(merges_raw):
            parts = m.split(" ") if isinstance(m, str) else []
            if len(parts) != 2:
                raise FormatError(file, f"tokenizer.ggml.merges[{j}]", f"is {m!r}", "'left right'")
            merges.append(parts)
        normalizer, pre_tok = LLAMA_CPP_PRE[pre]
        tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
              "normalizer": normalizer, "pre_tokenizer": pre_tok,
              "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
              "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
              "model": _bpe_model(vocab, merges, byte_fallback=False, unk=None)}
    elif model == "llama":
        scores = fields.get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != n:
            raise FormatError(file, "tokenizer.ggml.scores", "missing or wrong length", f"{n} scores")
        # Gemma's scores do not follow its merge order; its token order does (transformers' gemma_tokenizer)
        merges = _merges_from_scores(tokens, [-i for i in range(n)] if gemma else scores)
        unk_id = fields.get("tokenizer.ggml.unknown_token_id")
        unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < n else None
        replace = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
        decoders = [replace, {"type": "ByteFallback"}, {"type": "Fuse"}]
        if gemma:
            normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
            pre_tok = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        else:
            prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
            normalizer = None
            pre_tok = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first" if prefix else "never",
                       "split": False}
            if prefix:
                decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
              "normalizer": normalizer, "pre_tokenizer": pre_tok, "post_processor": None,
              "decoder": {"type": "Sequence", "decoders": decoders},
              "model": _bpe_model(vocab, merges, byte_fallback=True, unk=unk)}
    else:
        raise FormatError(file, "tokenizer.ggml.model", f"{model!r} is not supported", "'gpt2' or 'llama'")

    def tok(key):
        i = fields.get(f"tokenizer.ggml.{key}_token_id")
        return (tokens[i], i) if isinstance(i, int) and 0 <= i < n else (None, None)

    # transformers: a llama vocabulary without the flag gets BOS (llama.cpp's default too)
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", model == "llama"))
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        tj["post_processor"] = template_post(*tok("bos"), *tok("eos"), add_bos, add_eos)
    pre_ids, post_ids = build_post(tj["post_processor"])
    special = {"bos_token": tok("bos")[0], "eos_token": tok("eos")[0], "unk_token": tok("unknown")[0],
               "pad_token": tok("padding")[0], "add_bos_token": bool(pre_ids), "add_eos_token": bool(post_ids)}
    template = fields.get("tokenizer.chat_template")
    return tj, template if isinstance(template, str) else None, special


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[list[str]]:
    """transformers' generate_merges: every split a|b of a token whose halves are tokens is a merge; merges rank by
    the token's score (best first), then longer left part, then longer right part, then vocabulary order."""
    ids = {t: i for i, t in enumerate(tokens)}  # as transformers' dict: a duplicate token keeps its last id
    best = {t: float(s) for t, s in zip(tokens, scores)}
    found = []
    for t, score in best.items():
        local = []
        for cut in range(1, len(t)):
            a, b = t[:cut], t[cut:]
            if a in ids and b in ids:
                local.append((ids[a], ids[b], a, b))
        local.sort()
        found += [(score, len(a), len(b), a, b) for _, _, a, b in local]
    found.sort(key=lambda m: m[:3], reverse=True)
    return [[a, b] for *_, a, b in found]


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
    bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
    # transformers (5.x) ignores add_bos_token / add_eos_token in tokenizer_config.json when there is a
    # tokenizer.json: its post-processor alone decides, and so it does here; the flags we record are its effect
    pre_ids, post_ids = build_post(tj.get("post_processor"))
    special = {"bos_token": bos, "eos_token": eos,
               "unk_token": _token_text(cfg.get("unk_token")), "pad_token": _token_text(cfg.get("pad_token")),
               "add_bos_token": bool(pre_ids), "add_eos_token": bool(post_ids)}
    return tj, template if isinstance(template, str) else None, special
