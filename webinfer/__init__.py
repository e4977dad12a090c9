"""webinfer runtime: tokenizer, chat templates, package reader, GPU backend, kernels, engine and scheduler.

Pure Python plus jinja2, so the same code runs under CPython (native WebGPU through wgpu-py) and inside Pyodide
in a Web Worker (the browser's WebGPU through the JS FFI). numpy is never imported here.
"""

__version__ = "0.1.0"
