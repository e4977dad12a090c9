"""Prompt building shared by `webinfer generate` and `webinfer eval`: text / --chat / --messages -> token ids,
with the package's own tokenizer (webinfer.tokenizer) and chat template (webinfer.chat_template), exactly as the
runtime builds them; tests/test_reference_smollm2.py checks the ids against transformers' tokenizer and
apply_chat_template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from webinfer.chat_template import render
from webinfer.errors import FormatError
from webinfer.tokenizer import Tokenizer


class PromptTokenizer:
    """encode(text) without special tokens / decode(ids) over a package's tokenizer.json."""

    def __init__(self, tokenizer_json: dict):
        self._tok = Tokenizer.from_json(tokenizer_json)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids))


def render_chat(template: str, messages: list[dict], special_tokens: dict) -> str:
    return render(template, messages, add_generation_prompt=True, bos_token=special_tokens.get("bos_token") or "",
                  eos_token=special_tokens.get("eos_token") or "")


def load_messages(path: str | Path) -> list[dict]:
    """A JSON file holding a list of {"role": str, "content": str}."""
    try:
        msgs = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FormatError(str(path), "(json)", f"is not valid JSON: {e}") from None
    if not isinstance(msgs, list) or not msgs:
        raise FormatError(str(path), "(top level)", f"is {type(msgs).__name__}", "a non-empty list of {role, content}")
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise FormatError(str(path), f"[{i}]", f"is {m!r}", '{"role": str, "content": str}')
    return msgs


def text_ids(package: Any, tok: PromptTokenizer, text: str) -> list[int]:
    """Plain text -> ids, with BOS in front when the model's tokenizer says add_bos_token."""
    ids = tok.encode(text)
    bos = package.config.bos_token_id
    if package.special_tokens.get("add_bos_token") and bos is not None:
        ids = [bos] + ids
    return ids


def prompt_ids(package: Any, tok: PromptTokenizer, prompt: str | None = None, messages: list[dict] | None = None,
               chat: bool = False) -> list[int]:
    """--prompt TEXT (raw, or as one user message with --chat) or --messages -> prompt token ids."""
    if messages is None and not chat:
        return text_ids(package, tok, prompt or "")
    if messages is None:
        messages = [{"role": "user", "content": prompt or ""}]
    if not package.chat_template:
        raise FormatError("manifest.json", "chat_template", "is null: this model has no chat template",
                          "a jinja2 template (or use --prompt without --chat)")
    # the template writes every special token itself (HF apply_chat_template does not add BOS either)
    return tok.encode(render_chat(package.chat_template, messages, package.special_tokens))
