"""GPU fixtures: one session-scoped native device with browser-like limits.

GPU tests skip only when no adapter exists, and never in CI: with CI=true or WEBINFER_REQUIRE_GPU=1 a missing
adapter is a failure, so a broken lavapipe install cannot turn the GPU suite into silent skips.
"""

from __future__ import annotations

import os

import pytest


def _require_gpu() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get("WEBINFER_REQUIRE_GPU") == "1"


@pytest.fixture(scope="session")
def gpu():
    from webinfer.errors import NoAdapterError

    try:
        from webinfer.gpu.native import request_device_sync

        dev = request_device_sync(limits="browser")
    except (NoAdapterError, ImportError) as e:
        if _require_gpu():
            pytest.fail(f"CI requires a WebGPU adapter (lavapipe), but: {e}")
        pytest.skip(f"no WebGPU adapter: {e}")
    yield dev


@pytest.fixture(scope="session")
def kernels(gpu):
    from webinfer.kernels.library import KernelLibrary

    return KernelLibrary(gpu)


@pytest.fixture(scope="session")
def gpu_f32():
    """A second device with f16 forced off, to test the f32 paths even where shader-f16 exists."""
    from webinfer.errors import NoAdapterError
    from webinfer.gpu.native import request_device_sync

    old = os.environ.get("WEBINFER_FORCE_F32")
    os.environ["WEBINFER_FORCE_F32"] = "1"
    try:
        dev = request_device_sync(limits="browser")
    except NoAdapterError as e:
        if _require_gpu():
            pytest.fail(str(e))
        pytest.skip(str(e))
    finally:
        if old is None:
            os.environ.pop("WEBINFER_FORCE_F32", None)
        else:
            os.environ["WEBINFER_FORCE_F32"] = old
    yield dev


def load_runner(package, *, device, num_blocks: int = 64, **kw):
    """GPUModel.load synchronously (package: a path or a Package), for tests that drive the runner step by step."""
    import asyncio

    from webinfer.engine.gpu_model import GPUModel
    from webinfer.package import Package

    pkg = package if isinstance(package, Package) else Package.open(package)
    return asyncio.run(GPUModel.load(device, pkg, num_blocks=num_blocks, **kw))


def generate_ids(package, prompt_ids: list[int], max_tokens: int, *, runner, ignore_eos: bool = True, **sampling):
    """One request through the one path (webinfer.factory.llm_for over `runner`: engine, scheduler, API), as a
    user's completions call with token ids runs it; the produced ids (EOS included when it ends the request)."""
    import asyncio

    from webinfer.factory import EngineOptions, llm_for
    from webinfer.package import Package

    pkg = package if isinstance(package, Package) else Package.open(package)
    # the GPU model's step capacity; the reference runner has none (numpy takes any step)
    llm = llm_for(pkg, runner, EngineOptions(max_seqs=1, max_batch_tokens=getattr(runner, "max_tokens", 64)))

    async def main():
        try:
            r = await llm.completions.create(prompt=list(prompt_ids), max_tokens=max_tokens, ignore_eos=ignore_eos,
                                             temperature=sampling.pop("temperature", 0.0), **sampling)
            return r["choices"][0]["token_ids"]
        finally:
            await llm.close()

    return asyncio.run(main())


def prompt_logprobs_of(package, runner, prompts: list[list[int]], *, budget: int, seqs: int, top: int,
                       beside: bool = False) -> list:
    """Each prompt's prompt logprobs (SamplingParams.prompt_logprobs=top) through the one path over `runner`, the
    prompts running together in chunks of up to `budget` tokens and score groups of `seqs` rows, prefix cache off;
    beside: with a plain request running next to them."""
    import asyncio

    from webinfer.engine.stopping import SamplingParams
    from webinfer.factory import EngineOptions, llm_for
    from webinfer.package import Package

    pkg = package if isinstance(package, Package) else Package.open(package)
    llm = llm_for(pkg, runner, EngineOptions(max_seqs=seqs, max_batch_tokens=budget, enable_prefix_caching=False))

    async def one(p):
        async for o in llm.engine.generate(p, SamplingParams(max_tokens=1, prompt_logprobs=top)):
            return o.prompt_logprobs

    async def main():
        jobs = [one(p) for p in prompts]
        if beside:
            jobs.append(llm.completions.create(prompt=[7, 8, 9], max_tokens=6, ignore_eos=True))
        out = await asyncio.gather(*jobs)
        await llm.close()
        return out[:len(prompts)]

    return asyncio.run(main())
