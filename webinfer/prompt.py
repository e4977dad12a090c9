"""The one prompt builder: request text or messages -> prompt token ids, the same for every front end (HTTP, the
Python API, the CLI, the page).

One BOS rule, Hugging Face's: a text prompt gets the model's BOS (and EOS) when its tokenizer config says so
(`special_tokens.add_bos_token` / `add_eos_token` in the manifest, taken from tokenizer_config.json or the GGUF's
tokenizer.ggml.add_bos_token); a chat template renders every special token itself, so its output is encoded with
no additions (transformers' apply_chat_template(tokenize=True) does the same).

Message content is untrusted: text in it that spells a control token (`<|im_start|>system`) is tokenized as text,
never as the control token, so a user cannot forge a turn (webinfer/tokenizer/chat.py marks which spans of the
rendered prompt are content). This is the one place where our ids may differ from transformers', which parses
specials everywhere. A template that rewrites content (not only trims it) cannot be marked; such a prompt is
encoded as transformers encodes it.
"""

from __future__ import annotations

import json

from webinfer.errors import ChatTemplateError, InvalidRequestError
from webinfer.tokenizer.chat import chat_segments


class Prompter:
    def __init__(self, tokenizer, chat_template: str | None, special_tokens: dict, bos_token_id: int | None,
                 eos_token_ids=(), vocab_size: int = 0):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.special_tokens = dict(special_tokens or {})
        self.bos_token_id = bos_token_id
        self.eos_token_id = next(iter(eos_token_ids), None)
        self.vocab_size = vocab_size

    @classmethod
    def for_package(cls, package, tokenizer) -> "Prompter":
        c = package.config
        return cls(tokenizer, package.chat_template, package.special_tokens, c.bos_token_id, c.eos_token_ids,
                   c.vocab_size)

    def text_ids(self, text: str) -> list[int]:
        """A plain-text prompt, with BOS/EOS as the tokenizer config asks."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.special_tokens.get("add_bos_token") and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        if self.special_tokens.get("add_eos_token") and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None) -> str:
        if not self.chat_template:
            raise InvalidRequestError("messages", "this model has no chat template: pack it with --chat-template FILE, "
                                                  "or send a plain prompt to /v1/completions")
        st = self.special_tokens
        # imported at the first render: jinja2's import (~0.7 s in Pyodide) is then off the page's load path (the
        # worker renders once in the background after ready, webinfer/browser_worker.py start_deferred)
        from webinfer.chat_template import render  # noqa: PLC0415

        return render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                      bos_token=st.get("bos_token") or "", eos_token=st.get("eos_token") or "", tools=tools)

    def chat_ids(self, messages: list[dict], tools: list | None = None) -> list[int]:
        """Messages through the chat template; the template writes the special tokens, the contents are text.
        tools: OpenAI's `tools`, passed to the template as transformers passes them (InvalidRequestError naming
        `tools` when the template ignores them)."""
        if tools:
            if self.render_chat(messages, tools=tools) == self.render_chat(messages):
                raise InvalidRequestError("tools", "this model's chat template does not support tools (it renders "
                                                   "the same prompt with and without them)")
        self._check_template_text(messages, tools)
        render_ = (lambda msgs: self.render_chat(msgs, tools=tools)) if tools else self.render_chat
        try:
            segments = chat_segments(render_, messages)
        except ChatTemplateError:  # a template that rewrites content (e.g. splits out reasoning): see the docstring
            return list(self.tokenizer.encode(render_(messages), add_special_tokens=False))
        return list(self.tokenizer.encode_segments(segments, add_special_tokens=False))

    def _check_template_text(self, messages: list[dict], tools: list | None) -> None:
        """`tools` and past tool calls' arguments are rendered by the template (with tojson), outside any content
        span, so they are encoded as template text: refuse any that spell a special token (a forged turn)."""
        specials = [t for t in (self.tokenizer.id_to_token(i) for i in getattr(self.tokenizer, "special_ids", ()))
                    if t]
        texts = [(f"tools[{k}]", t) for k, t in enumerate(tools or ())]
        texts += [(f"messages[{i}].tool_calls[{j}].function", c["function"])
                  for i, m in enumerate(messages) for j, c in enumerate(m.get("tool_calls") or ())]
        for where, obj in texts:
            text = json.dumps(obj, ensure_ascii=False)
            if any(t in text for t in specials):
                raise InvalidRequestError(where, "spells a special token of the model")

    def prompt_ids(self, prompt) -> list[int]:
        """A completions `prompt`: text, or a list of token ids taken as they are."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if self.vocab_size and any(not 0 <= t < self.vocab_size for t in prompt):
                raise InvalidRequestError("prompt", f"token ids must be in [0, {self.vocab_size})")
            return list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequestError("prompt", "must be a non-empty string or a non-empty list of token ids")
        return self.text_ids(prompt)
