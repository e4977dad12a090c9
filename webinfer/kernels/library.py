"""Shader sources and the pipeline cache: (family, entry point, defines, device capabilities) -> compiled pipeline.

Every kernel variant comes from one WGSL file per op family in shaders/, specialised by the preprocessor with
defines such as F16, SUBGROUPS, SG_SIZE and tile sizes. The library adds the `enable` directives the backend needs
and the standard defines below, so a shader can write `#ifdef F16`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from ..gpu.device import Device
from .preprocess import preprocess


@lru_cache(maxsize=None)
def load_source(filename: str) -> str:
    """Read shaders/<filename> (installed as the package webinfer_shaders; also inside the Pyodide wheel)."""
    if not filename.endswith(".wgsl"):
        filename += ".wgsl"
    return resources.files("webinfer_shaders").joinpath(filename).read_text(encoding="utf-8")


@dataclass(frozen=True)
class PipelineKey:
    """What identifies a compiled pipeline in the cache."""

    family: str  # the shaders/<family>.wgsl file
    entry_point: str
    defines: tuple[tuple[str, object], ...]  # sorted
    use_f16: bool | None
    caps: tuple  # Capabilities.variant_key()


class KernelLibrary:
    def __init__(self, device: Device):
        self.device = device
        self._cache: dict[PipelineKey, Any] = {}

    def standard_defines(self, use_f16: bool | None = None) -> dict[str, object]:
        caps = self.device.caps
        d: dict[str, object] = {}
        if (caps.f16 if use_f16 is None else (use_f16 and caps.f16)):
            d["F16"] = 1
        if caps.subgroups:
            d["SUBGROUPS"] = 1
            d["SG_SIZE"] = caps.subgroup_size
        return d

    def source(self, family: str, defines: dict[str, object] | None = None, use_f16: bool | None = None) -> str:
        defs = self.standard_defines(use_f16)
        defs.update(defines or {})
        body = preprocess(load_source(family), defs, load_source, family)
        return self.device.wgsl_enables("F16" in defs, "SUBGROUPS" in defs) + body

    def pipeline(self, family: str, entry_point: str = "main", defines: dict[str, object] | None = None,
                 use_f16: bool | None = None) -> Any:
        key = PipelineKey(family, entry_point, tuple(sorted((defines or {}).items())), use_f16,
                          self.device.caps.variant_key())
        p = self._cache.get(key)
        if p is None:
            code = self.source(family, dict(key.defines), use_f16)
            label = f"{family}:{entry_point}:" + ",".join(f"{k}={v}" for k, v in key.defines)
            p = self.device.create_pipeline(code, label=label, entry_point=entry_point)
            self._cache[key] = p
        return p

    def variant_pipeline(self, family: str, defines: tuple[tuple[str, object], ...]) -> Any:
        """The pipeline of a kernel variant's decided defines (f32 arithmetic: no F16 define)."""
        return self.pipeline(family, defines=dict(defines), use_f16=False)

    def __len__(self) -> int:
        return len(self._cache)
