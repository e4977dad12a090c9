"""webinfer runtime: tokenizer, chat templates, package reader, GPU backend, kernels, engine and scheduler.

Pure Python plus jinja2, so the same code runs under CPython (native WebGPU through wgpu-py) and inside Pyodide
in a Web Worker (the browser's WebGPU through the JS FFI). numpy is never imported here.

    import webinfer
    llm = webinfer.open("path/to/package")          # or: await webinfer.load(...) inside an event loop
    r = asyncio.run(llm.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=32))
"""

__version__ = "0.1.0"


def __getattr__(name):  # webinfer.open / webinfer.load, imported on first use (keeps `import webinfer` light)
    if name in ("open", "load"):
        from webinfer import factory

        return getattr(factory, name)
    raise AttributeError(f"module 'webinfer' has no attribute {name!r}")
