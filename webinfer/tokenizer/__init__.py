"""A pure-Python BPE tokenizer reading Hugging Face tokenizer.json, for CPython and Pyodide (no numpy, no regex).

Supported, with ids and text identical to the `tokenizers` library:
- byte-level BPE (GPT-2, StarCoder/SmolLM, Llama 3, Qwen2, DeepSeek LLM/Coder, Falcon, Command-R): ByteLevel
  pre-tokenizer alone, or after Split(known pattern) / Digits steps; split patterns run as hand-written scanners
  (webinfer/pretokenize.py), never as a regex from the file.
- SentencePiece-style BPE (Llama 2, Gemma): normalizer Prepend("▁") / Replace(" ", "▁") or a Metaspace
  pre-tokenizer, Split on a literal string, byte fallback to `<0xNN>` tokens, fuse_unk, and the matching decoders.
- added tokens (matched before normalization, leftmost-longest, with lstrip / rstrip / single_word / normalized),
  the post-processor's BOS/EOS when add_special_tokens=True.

Anything else in the file is rejected with a FormatError naming tokenizer.json and the field.

Encoding is in encode.py, decoding in decode.py. Decoding is streaming only: `decode(ids)` runs the same stream
`decode_stream()` hands out, so the engine's text deltas and a one-shot decode cannot disagree.

Untrusted text (issue 15): `encode(text, parse_special=False)` never yields a special token's id for text that
spells one, and `encode_segments([(template_text, True), (user_text, False), ...])` encodes a rendered chat
prompt whose message content is untrusted with the same ids as encode("".join(texts)) whenever the content spells
no special token. webinfer.tokenizer.chat.chat_segments(render, messages) gives those segments for a chat template.
"""

from __future__ import annotations

from webinfer.tokenizer.common import CHAR_TO_BYTE, err
from webinfer.tokenizer.decode import DecoderChain, StreamDecoder
from webinfer.tokenizer.encode import Encoder

__all__ = ["StreamDecoder", "Tokenizer"]


class Tokenizer:
    """Encode text to ids and back. Build with Tokenizer.from_json(parsed tokenizer.json)."""

    def __init__(self, obj: dict):
        if not isinstance(obj, dict):
            raise err("(root)", f"is a {type(obj).__name__}", "a JSON object")
        self._enc = Encoder(obj)
        self._chain = DecoderChain(obj.get("decoder"))
        self.byte_level = _is_byte_level(obj.get("decoder"))  # ByteLevel decoder: tokens spell bytes as characters
        model = self._enc.model
        self.special_ids: frozenset[int] = self._enc.special_ids
        self.vocab_size = 1 + max(max(model.id_to_token), max(self._enc.added_by_id, default=0))

    @classmethod
    def from_json(cls, obj: dict) -> Tokenizer:
        return cls(obj)

    # -- lookups --------------------------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        return self._enc.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        t = self._enc.added_by_id.get(i)
        return t.content if t is not None else self._enc.model.id_to_token.get(i)

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes token i contributes inside a text (what structured output's token trie matches), as the
        `tokenizers` library decodes it; None for special tokens and unknown ids. An added token that is not
        special is text (Gemma's "\\n" and "\\n\\n", Qwen's "<tool_call>"): its content goes through the decoder
        like any token. ByteLevel vocabularies map characters back to bytes; SentencePiece-style ones read
        "\u2581" as a space and "<0xNN>" as byte NN."""
        s = self.id_to_token(i)
        if s is None or i in self.special_ids:
            return None
        if self.byte_level:
            try:
                return bytes(CHAR_TO_BYTE[c] for c in s)
            except KeyError:
                return s.encode("utf-8")
        if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            try:
                return bytes([int(s[3:5], 16)])
            except ValueError:
                pass
        return s.replace("\u2581", " ").encode("utf-8")

    # -- encode ---------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False, parse_special: bool = True) -> list[int]:
        """Text -> ids. add_special_tokens: the post-processor's BOS/EOS, as HF's encode(add_special_tokens=True)
        (the package's tokenizer.json carries the model's add_bos_token / add_eos_token in its post-processor).
        parse_special=False: text spelling a special token (`<|im_start|>`) is encoded as plain text."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        return self._enc.encode_segments([(text, parse_special)], add_special_tokens)

    def encode_segments(self, segments, add_special_tokens: bool = False) -> list[int]:
        """[(text, trusted), ...] -> ids of the joined text, where special tokens are recognised only inside
        trusted segments. Segment boundaries do not change the ids otherwise: normalization, pre-tokenization and
        BPE run over the joined text, so a chat prompt rendered as template pieces (trusted) and message contents
        (untrusted) gets exactly encode(joined) unless a content spells a special token."""
        return self._enc.encode_segments(segments, add_special_tokens)

    # -- decode ---------------------------------------------------------------------------------------------
    def decode_stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self._chain, self.id_to_token, self.special_ids, skip_special_tokens)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        d = self.decode_stream(skip_special_tokens)
        return d.push(ids) + d.finish()


def _is_byte_level(d) -> bool:
    while isinstance(d, dict) and d.get("type") == "Sequence" and len(d.get("decoders") or []) == 1:
        d = d["decoders"][0]
    return isinstance(d, dict) and d.get("type") == "ByteLevel"
