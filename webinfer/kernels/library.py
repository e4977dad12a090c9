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


class LazyPipeline:
    """A pipeline compiled when first used (`get`), or before that by `KernelLibrary.create_deferred` (the page runs
    it in the background once the engine is ready). An engine build then compiles only what a single chat needs
    (each shader costs seconds on a software GPU in the browser); the WGSL is the same either way, so the bits are."""

    def __init__(self, lib: "KernelLibrary", key: PipelineKey):
        self.lib, self.key = lib, key

    @property
    def ready(self) -> bool:
        return self.key in self.lib._cache

    def get(self) -> Any:
        if not self.ready:
            self.lib.created_on_use += 1
        return self.lib._make(self.key)


class LazyBindGroup:
    """A bind group of a LazyPipeline, created with it on first use (an "auto" layout needs the pipeline)."""

    def __init__(self, pipeline: LazyPipeline, bindings: list):
        self.pipeline, self._bindings, self._made = pipeline, bindings, None

    def get(self) -> tuple[Any, Any]:
        """(pipeline, bind group), created now if they were not (then kept: this runs per layer and step)."""
        if self._made is None:
            p = self.pipeline.get()
            self._made = (p, self.pipeline.lib.device.create_bind_group(p, self._bindings))
        return self._made


class KernelLibrary:
    def __init__(self, device: Device):
        self.device = device
        self._cache: dict[PipelineKey, Any] = {}
        self._deferred: dict[PipelineKey, LazyPipeline] = {}  # asked for lazily, in the order asked
        self.created_on_use = 0  # lazy pipelines compiled at first use (not ahead by create_deferred)

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

    def _key(self, family: str, entry_point: str, defines: dict[str, object] | None, use_f16: bool | None):
        return PipelineKey(family, entry_point, tuple(sorted((defines or {}).items())), use_f16,
                           self.device.caps.variant_key())

    def spec(self, key: PipelineKey) -> dict:
        """{"code", "entry", "label"}: what the device compiles for `key`."""
        code = self.source(key.family, dict(key.defines), key.use_f16)
        label = f"{key.family}:{key.entry_point}:" + ",".join(f"{k}={v}" for k, v in key.defines)
        return {"code": code, "entry": key.entry_point, "label": label}

    def _make(self, key: PipelineKey) -> Any:
        p = self._cache.get(key)
        if p is None:
            s = self.spec(key)
            p = self.device.create_pipeline(s["code"], label=s["label"], entry_point=s["entry"])
            self._cache[key] = p
        return p

    def pipeline(self, family: str, entry_point: str = "main", defines: dict[str, object] | None = None,
                 use_f16: bool | None = None) -> Any:
        return self._make(self._key(family, entry_point, defines, use_f16))

    def lazy_pipeline(self, family: str, entry_point: str = "main", defines: dict[str, object] | None = None,
                      use_f16: bool | None = None) -> LazyPipeline:
        """The pipeline `pipeline` would return, compiled only at its first `get` (or by create_deferred)."""
        key = self._key(family, entry_point, defines, use_f16)
        return self._deferred.setdefault(key, LazyPipeline(self, key))

    def variant_pipeline(self, family: str, defines: tuple[tuple[str, object], ...], lazy: bool = False) -> Any:
        """The pipeline of a kernel variant's decided defines (f32 arithmetic: no F16 define); lazy: a LazyPipeline."""
        return (self.lazy_pipeline if lazy else self.pipeline)(family, defines=dict(defines), use_f16=False)

    def deferred(self) -> list[dict]:
        """The specs (`spec`) of the lazy pipelines not compiled yet, in the order they were asked for."""
        return [self.spec(k) for k in self._deferred if k not in self._cache]

    async def create_deferred(self, before_each=None) -> int:
        """Compile every lazy pipeline not compiled yet, one at a time through the device's asynchronous creation
        (the page stays responsive; a chat's GPU work does not queue behind it). before_each: an async callable
        awaited before each (the page waits there while the engine is busy). Returns how many it compiled."""
        n = 0
        for key in list(self._deferred):
            if before_each is not None:
                await before_each()
            if key in self._cache:  # used meanwhile
                continue
            s = self.spec(key)
            p = await self.device.create_pipeline_async(s["code"], label=s["label"], entry_point=s["entry"])
            if key not in self._cache:
                self._cache[key] = p
                n += 1
        return n

    def __len__(self) -> int:
        return len(self._cache)
