"""Per-request sampling parameters and stop conditions.

Token-level stops (EOS ids, max_tokens, context length) are checked by the scheduler right after a token is
sampled. Stop strings need text, so `TextStream` turns the growing list of output ids into text deltas:
text that could still become a stop string is held back, and a matched stop string (and all after it) is cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_STOP, FINISH_LENGTH, FINISH_ABORT = "stop", "length", "abort"


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # extra ids that end the request like EOS
    ignore_eos: bool = False
    speculative_tokens: int = 0  # at most this many proposed tokens verified per step (0: no speculation)
    min_p: float = 0.0            # keep tokens with p >= min_p * p_max (after temperature)
    logit_bias: dict = field(default_factory=dict)  # token id -> added to its logit
    frequency_penalty: float = 0.0   # l -= f * count (output tokens so far)
    presence_penalty: float = 0.0    # l -= p * [count > 0]
    repetition_penalty: float = 1.0  # tokens of the prompt or output: l / r if l > 0 else l * r
    logprobs: int | None = None      # None: none; k: each token's logprob and the top k alternatives (0..20)
    prompt_logprobs: int | None = None  # k: each prompt token's logprob (after the first) and the top k (0..20)

    @property
    def penalized(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in 0..20, got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise ValueError(f"prompt_logprobs must be in 0..20, got {self.prompt_logprobs}")


def token_stop_reason(token_id: int, num_output: int, num_total: int, params: SamplingParams,
                      eos_ids: frozenset[int], max_len: int) -> str | None:
    """Finish reason after sampling token_id (already counted in num_output/num_total), or None to continue."""
    if (not params.ignore_eos and token_id in eos_ids) or token_id in params.stop_token_ids:
        return FINISH_STOP
    if num_output >= params.max_tokens or num_total >= max_len:
        return FINISH_LENGTH
    return None


def incremental_decoder(tokenizer):
    """The tokenizer's streaming decoder (webinfer.tokenizer.Tokenizer.decode_stream), special tokens skipped: the
    one decoder every text stream uses."""
    return tokenizer.decode_stream(skip_special_tokens=True)


class TextStream:
    """Output ids -> text deltas, with stop strings.

    decoder: add(id) -> str delta, finish() -> str (see incremental_decoder). Text that could still be the start
    of a stop string is held back; when one matches, it and everything after it are dropped and stopped is set.
    skip_ids (EOS) never reach the text.
    """

    def __init__(self, decoder, stop: list[str], skip_ids: frozenset[int] = frozenset()):
        self.decoder, self.stop, self.skip_ids = decoder, list(stop), skip_ids
        self.raw = ""       # everything decoded so far
        self.emitted = ""   # text already handed out; always a prefix of the final text
        self.stopped = False
        self.max_stop = max((len(s) for s in self.stop), default=0)

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def push(self, token_ids: list[int], final: bool = False) -> tuple[str, bool]:
        """Add new ids; returns (text delta, matched a stop string). final: flush everything held back."""
        if self.stopped:
            return "", True
        before = len(self.raw)
        self.raw += "".join(self.decoder.add(t) for t in token_ids if t not in self.skip_ids)
        if final:
            self.raw += self.decoder.finish()
        # a new match must end in the new text, so it starts at most max_stop - 1 characters earlier
        search_from = max(0, before - self.max_stop + 1)
        cut = None
        for s in self.stop:
            i = self.raw.find(s, search_from)
            if i != -1 and (cut is None or i < cut):
                cut = i
        if cut is not None:
            self.stopped = True
            safe = self.raw[:cut]
        elif final:
            safe = self.raw
        else:
            safe = self.raw[:len(self.raw) - self._holdback(self.raw)]
        delta = safe[len(self.emitted):]
        self.emitted = safe
        return delta, self.stopped

    @property
    def text(self) -> str:
        return self.emitted
