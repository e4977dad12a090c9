"""The one way from a package to an LLM. Every front end goes through it: `webinfer serve`, `chat` and `generate`,
the Python API and the page's worker.

    llm = await webinfer.load("path/to/package")                 # native GPU (wgpu-py), CPython
    llm = await webinfer.load(package, backend="browser")        # inside Pyodide, the page's WebGPU
    llm = await webinfer.load(package, runner=my_runner)         # any ModelRunner (the numpy reference, a CPU runner)
    llm = webinfer.open("path/to/package")                       # the same, synchronously (CPython, no running loop)

A package path is opened (and verified) with Package.open; a Package object is used as it is.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from webinfer.api import LLM, Limits
from webinfer.engine.engine import AsyncEngine
from webinfer.engine.speculative import PromptLookup
from webinfer.errors import WebinferError
from webinfer.package import Package
from webinfer.prompt import Prompter
from webinfer.tokenizer import Tokenizer

BACKENDS = ("native", "browser", "cpu")


@dataclass
class EngineOptions:
    """How much of the device the engine takes and how it batches."""
    context_tokens: int = 4096       # KV cache slots shared by all running requests (at most the model's context)
    block_size: int = 16
    max_seqs: int = 16               # requests stepped together
    max_batch_tokens: int = 256      # tokens per step (prefill chunk budget)
    max_model_len: int | None = None # longest single request (default: the model's context)
    kv_f16: bool = False
    enable_prefix_caching: bool = True
    speculative: str | None = None   # "prompt-lookup", or a draft model's package path (native backend): requests
                                     # verify up to speculative_tokens proposals a step
    speculative_tokens: int = 4       # the default per request when speculative is on (a request may override)
    adaptive_proposals: bool = True   # verify only the proposals that pay for their rows on this device (measured)
    cpu_mode: str = "exact"           # backend "cpu": f32 activations (exact) or int8 ones (fast)
    cpu_threads: int = 1              # backend "cpu" natively: 1 to 16 (every matrix split; the same ids; past 2
                                      # each decode block on the count its timings show fastest, cpu/threads.py)
    decode_block: int = 8             # decode steps run on the GPU per read-back when all requests decode (1: off)
    decode_block_ms: float = 50.0     # ... and at most about this long (a slow GPU gets single steps; 0: no cap)
    gemv_ksplit: int | None = None    # GPU decode GEMVs: lanes per row group (gemv.wgsl KSPLIT; the logits' last bits
                                      # depend on it); None: kernels/linear.py default_ksplit (1 on a CPU adapter, 8)

    @property
    def runner_rows(self) -> int:
        """Sequence rows a step may hold: one per request, plus room for one request's proposals."""
        return self.max_seqs + (self.speculative_tokens if self.speculative else 0)

    def model_len(self, cfg) -> int:
        """The longest request: the model's context, the KV pool and max_model_len, whichever is smallest."""
        return min(self.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings,
                   self.context_tokens)


def kv_blocks(context_tokens: int, block_size: int) -> int:
    """KV blocks for `context_tokens` slots, plus the null block 0."""
    return 1 + -(-context_tokens // block_size)


async def load_gpu_runner(package: Package, device, opts: EngineOptions, read=None):
    from webinfer.engine.gpu_model import GPUModel

    return await GPUModel.load(device, package, num_blocks=kv_blocks(opts.context_tokens, opts.block_size),
                               block_size=opts.block_size, max_batch_tokens=opts.max_batch_tokens,
                               max_seqs=opts.runner_rows, max_model_len=opts.model_len(package.config),
                               kv_f16=opts.kv_f16, read=read, max_steps=opts.decode_block,
                               gemv_ksplit=opts.gemv_ksplit)


async def load_cpu_runner(package: Package, opts: EngineOptions, host=None):
    """The WebAssembly SIMD engine (webinfer/cpu): wasmtime natively, JS WebAssembly in the page (host)."""
    from webinfer.cpu import load_cpu_runner as load_wasm

    if opts.kv_f16:  # (it was ignored: a caller asking for half the cache memory got the f32 cache silently)
        raise WebinferError("kv_f16=True: the CPU engine keeps its KV cache in f32 (an f16 cache is a GPU option, "
                            "with shader-f16); load without kv_f16, or on a GPU backend")
    runner = await load_wasm(package, mode=opts.cpu_mode,
                             num_blocks=kv_blocks(opts.context_tokens, opts.block_size), block_size=opts.block_size,
                             max_model_len=opts.model_len(package.config), max_batch_tokens=opts.max_batch_tokens,
                             max_seqs=opts.runner_rows, host=host, threads=opts.cpu_threads)
    if host is None:  # natively the module is compiled in full at load: its timings hold now (the page measures
        runner.calibrate_head()  # after its warm-up, webinfer/browser_worker.py)
    if host is None and runner.threads > 2:
        # natively two threads on two idle cores gain 1.6-1.8x (docs/cpu-backend.md): fixed; past two the fastest
        # count depends on the machine's bandwidth and cores, so each decode block measures it (the page's host
        # turns the choice on for any count: its cores are shared with the browser)
        runner.choose_threads()
    return runner


async def load(package, *, backend: str = "native", runner=None, device=None, options: EngineOptions | None = None,
               limits: Limits | None = None, name: str | None = None) -> LLM:
    """An LLM over `package` (a path or a Package) on `backend`, or over the given `runner`."""
    pkg = package if isinstance(package, Package) else Package.open(package)
    opts = options or EngineOptions()
    owned = runner is None  # a runner made here is the LLM's: LLM.close() closes it
    if runner is None and backend == "cpu":
        runner = await load_cpu_runner(pkg, opts)
    if runner is None:
        if device is None:
            if backend == "native":
                from webinfer.gpu.native import request_device

                device = await request_device(limits="browser")
            elif backend == "browser":
                from webinfer.gpu.browser import request_device

                device = await request_device()
            else:
                raise WebinferError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}, or pass a runner")
        runner = await load_gpu_runner(pkg, device, opts)
    proposer = None
    if opts.speculative not in (None, "prompt-lookup"):
        proposer = await load_draft(pkg, opts, device)
    llm = llm_for(pkg, runner, opts, limits, name, proposer=proposer)
    llm.owns_runner = owned
    return llm


async def load_draft(target: Package, opts: EngineOptions, device):
    """speculative = a draft package: its GPU runner on the target's device, as a DraftModel proposer."""
    from webinfer.engine.speculative import DraftModel

    if device is None:
        raise WebinferError("a draft model needs a GPU device (the native backend)")
    draft = opts.speculative if isinstance(opts.speculative, Package) else Package.open(opts.speculative)
    a, b = (p.tokenizer_json() for p in (target, draft))
    if (a.get("model"), a.get("added_tokens")) != (b.get("model"), b.get("added_tokens")) \
            or draft.config.vocab_size != target.config.vocab_size:
        raise WebinferError(f"draft model {draft.name!r}: its tokenizer differs from {target.name!r}'s; speculative "
                            f"decoding needs the same vocabulary")
    dopts = replace(opts, speculative=None, max_seqs=opts.max_seqs, decode_block=max(opts.speculative_tokens, 2))
    return DraftModel(await load_gpu_runner(draft, device, dopts))


def llm_for(pkg: Package, runner, opts: EngineOptions | None = None, limits: Limits | None = None,
            name: str | None = None, proposer=None) -> LLM:
    """The engine, tokenizer and prompt builder of `pkg` over a loaded runner. proposer: a loaded draft model
    (load_draft) when opts.speculative names one."""
    opts = opts or EngineOptions()
    tok = Tokenizer.from_json(pkg.tokenizer_json())
    if opts.speculative not in (None, "prompt-lookup") and proposer is None:
        raise WebinferError(f"speculative {opts.speculative!r}: prompt-lookup, or a draft package on a GPU backend")
    if opts.speculative == "prompt-lookup":
        proposer = PromptLookup()
    engine = AsyncEngine(runner, eos_ids=pkg.config.eos_token_ids,
                         max_num_batched_tokens=min(opts.max_batch_tokens, getattr(runner, "max_tokens", 1 << 30)),
                         max_num_seqs=opts.max_seqs, enable_prefix_caching=opts.enable_prefix_caching,
                         proposer=proposer, decode_block=opts.decode_block, decode_block_ms=opts.decode_block_ms,
                         adaptive_proposals=opts.adaptive_proposals)
    return LLM(engine, tok, Prompter.for_package(pkg, tok), name or pkg.name or "webinfer", limits,
               speculative_tokens=opts.speculative_tokens if opts.speculative else 0)


def open(package, **kw) -> LLM:  # noqa: A001  (webinfer.open mirrors the builtin's role for a model)
    """load() for synchronous callers (CPython, outside a running event loop); use the LLM inside one."""
    return asyncio.run(load(package, **kw))
