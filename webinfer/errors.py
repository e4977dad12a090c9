"""Typed errors. Every message names what was wrong, where (file, field) and what was expected."""

from __future__ import annotations


class WebinferError(Exception):
    """Base class of every error webinfer raises on purpose."""


class FormatError(WebinferError):
    """A file (GGUF, safetensors, tokenizer.json, manifest, config.json) is malformed or unsupported.

    file: the file's path or name; field: the header field, key or tensor; expected: what a valid file holds.
    """

    def __init__(self, file: str, field: str, problem: str, expected: str | None = None):
        self.file, self.field, self.problem, self.expected = str(file), field, problem, expected
        msg = f"{self.file}: {field}: {problem}"
        if expected:
            msg += f" (expected {expected})"
        super().__init__(msg)


class UnsupportedArchitectureError(FormatError):
    """The model's architecture is not in the supported list."""


class IntegrityError(WebinferError):
    """A file's bytes do not match the size or sha256 the manifest records."""

    def __init__(self, file: str, expected: str, actual: str):
        self.file, self.expected, self.actual = str(file), expected, actual
        super().__init__(f"{self.file}: content does not match the manifest: expected {expected}, got {actual}")


class ContextOverflowError(WebinferError):
    """A prompt does not fit in the model's context (or in the KV cache at all)."""

    def __init__(self, n_prompt: int, n_ctx: int, what: str = "context length"):
        self.n_prompt, self.n_ctx = n_prompt, n_ctx
        super().__init__(f"the prompt has {n_prompt} tokens, more than the {what} of {n_ctx} tokens")


class GPUError(WebinferError):
    """The GPU rejected something (shader compile error, validation error, limits)."""


class NoAdapterError(GPUError):
    """No WebGPU adapter could be found."""


class DeviceLostError(GPUError):
    """The GPU device was lost (often out of memory); rebuild the engine to continue."""


class ChatTemplateError(WebinferError, ValueError):
    """A chat template failed to compile, or called raise_exception(...) while rendering (e.g. an unsupported role)."""


class ServerBusyError(WebinferError):
    """A request could be served, but not now: too much of its kind of work is already queued (HTTP 503 with
    Retry-After)."""


class InvalidRequestError(WebinferError, ValueError):
    """A request (API call or HTTP body) breaks a limit or has a bad parameter; param names the field."""

    def __init__(self, param: str, problem: str):
        self.param, self.problem = param, problem
        super().__init__(f"{param}: {problem}")
