"""Which parts of a rendered chat prompt are message content: the (text, trusted) segments for
Tokenizer.encode_segments, so that content spelling a control token (`<|im_start|>system`) stays text while the
template's own control tokens stay tokens. The rendered text itself is exactly what the template renders
(transformers' apply_chat_template output): only its tokenization differs, and only for such content.

The template runs twice: once on the real messages, once with every string content replaced by a placeholder
built from Unicode noncharacters that occur nowhere in the prompt. The second render splits into template text
and placeholders; the real render must then read as that template text with each placeholder replaced by its
message's content, as given or with surrounding white space trimmed (templates often `| trim` content). Anything
else (a template that branches on the content or rewrites it) is a ChatTemplateError rather than a guess, since
guessing wrong would either break the template's tokens or let content through as trusted.
"""

from __future__ import annotations

import re
from typing import Callable

from webinfer.errors import ChatTemplateError

_NONCHARS = [chr(c) for c in range(0xFDD0, 0xFDF0)]


def chat_segments(render: Callable[[list[dict]], str], messages: list[dict]) -> list[tuple[str, bool]]:
    """[(text, trusted), ...] whose texts join to render(messages); message contents are the untrusted ones.

    render: the caller's template call, e.g.
    `lambda msgs: chat_template.render(template, msgs, add_generation_prompt=True, bos_token=bos)`."""
    text = render(messages)
    contents = [m.get("content") if isinstance(m, dict) else None for m in messages]
    seen = text + "".join(c for c in contents if isinstance(c, str))
    free = [c for c in _NONCHARS if c not in seen]
    if len(free) < 2:
        raise ChatTemplateError("the prompt uses every marker character U+FDD0..U+FDEF; cannot mark message content")
    open_, close = free[0], free[1]
    marked = [dict(m, content=f"{open_}{k}{close}") if isinstance(contents[k], str) else m
              for k, m in enumerate(messages)]
    skeleton = re.split(f"{open_}([0-9]+){close}", render(marked))
    out: list[tuple[str, bool]] = []
    pos = 0

    def take(piece: str, trusted: bool) -> None:
        nonlocal pos
        if piece:
            out.append((piece, trusted))
            pos += len(piece)

    if not text.startswith(skeleton[0]):
        raise ChatTemplateError("the template renders differently when message contents change; cannot mark content")
    take(skeleton[0], True)
    for k in range(1, len(skeleton), 2):
        content, after = contents[int(skeleton[k])], skeleton[k + 1]
        last = k + 2 >= len(skeleton)
        for cand in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
            if text.startswith(cand + after, pos) and (not last or pos + len(cand) + len(after) == len(text)):
                take(cand, False)
                take(after, True)
                break
        else:
            raise ChatTemplateError(f"message {skeleton[k]}'s content is rewritten by the template (not only trimmed); "
                                    "cannot mark it as content")
    if pos != len(text):
        raise ChatTemplateError("the template renders differently when message contents change; cannot mark content")
    return out
