"""`webinfer pack`: a GGUF file or Hugging Face folder -> a webinfer package (docs/package-format.md).

Streaming and memory-bounded: tensors are read one at a time through mmap, converted in row chunks (so the float
copy of even the largest tensor is never held whole), and appended to content-addressed shards on disk. Peak
memory is about one tensor's encoded components plus one float chunk. The package is built in
`OUT.tmp-<random>` beside OUT and renamed into place at the end; on any error the temp folder is removed.

GGUF tensors of a package format are repacked bit-exactly; the rest are requantized (docs/package-format.md,
"Formats at pack time").

    pack(Path("model.gguf"), Path("out"))                 # or: webinfer pack model.gguf -o out
    pack(Path("hf_folder"), Path("out"), quant="q4k_m")   # or: webinfer pack hf_folder -o out --quant q4k_m
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from webinfer.errors import FormatError, WebinferError
from webinfer.formats import FORMATS, GROUP_SIZES, QUANT_DTYPES
from webinfer.package import (FORMAT, FORMAT_VERSION, MAX_BINDING_BYTES, ModelConfig, Package, check_chat_template,
                              check_tokenizer, expected_tensors)
from webinfer_packager.pack import quant
from webinfer_packager.pack.shards import ShardWriter

CHUNK_ELEMENTS = 1 << 22  # floats converted at once (16 MiB of float32)


class OutputExistsError(WebinferError):
    pass


def open_source(source: Path):
    source = Path(source)
    if source.is_dir():
        from webinfer_packager.pack.hf_source import HFSource

        return HFSource(source)
    if not source.exists():
        raise FormatError(source, "(file)", "does not exist", "a GGUF file or a Hugging Face folder")
    from webinfer_packager.pack.gguf_source import GGUFSource

    return GGUFSource(source)


# `--quant` choices for tensors that are requantized (GGUF tensors in a format of formats.FORMATS are kept as they
# are). "q4k_m" is llama.cpp's Q4_K_M recipe: q4k, with q6k for the output head and for attn_v / ffn_down in the
# layers where llama.cpp spends more bits (first and last eighth, every third in between).
QUANT_CHOICES = ("q4", "q4a", "q4k", "q5k", "q6k", "q8", "q4k_m", "q3k", "q2k", "iq4xs", "iq4nl")
# Chosen by measurement (docs/package-format.md, "Requantization quality"): on SmolLM2-135M requantized from f32,
# the smallest choice within 5 % of the unquantized perplexity (q4 +20 %, q4k +5.7 %, q5k +0.6 %).
DEFAULT_QUANT = "q5k"
# A K-quant needs K % 256 == 0; otherwise llama.cpp's fallback with 32-element groups (its own choice for the
# formats below 4.5 bits is IQ4_NL too)
_K_FALLBACK = {"q4k": "q5_0", "q5k": "q5_1", "q6k": "q8", "q3k": "iq4nl", "q2k": "iq4nl", "iq4xs": "iq4nl"}


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers) of the Q4_K_M recipe."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def requant_dtype(name: str, k: int, quant_name: str, embedding: str | None, n_layers: int) -> str:
    """The format a requantized tensor gets under `--quant quant_name` (`embedding` overrides embed / lm_head)."""
    part = name.rsplit(".", 1)[-1]
    is_embed = name in ("embed", "lm_head")
    if is_embed and embedding:
        dtype = embedding
    elif quant_name == "q4k_m":
        more = part in ("v", "down") and _more_bits(int(name.split(".")[1]), n_layers)
        dtype = "q6k" if is_embed or more else "q4k"
    elif is_embed:
        dtype = "q8" if quant_name in ("q4", "q4a") else "q6k" if quant_name != "q8" else quant_name
    else:
        dtype = quant_name
    if FORMATS[dtype].fixed_group == quant.QK_K and k % quant.QK_K:
        dtype = _K_FALLBACK[dtype]
    return dtype


def _target_dtype(name: str, shape: list[int], src_type: str, *, quant_name: str, group_size: int,
                  embedding: str | None, n_layers: int):
    """(dtype, group_size, repack) for one canonical tensor: GGUF blocks of a package format are repacked as they
    are (bit-exactly) unless --embedding names another dtype for embed / lm_head; norms and biases stay f32;
    everything else is requantized."""
    part = name.rsplit(".", 1)[-1]
    if part.endswith("norm") or part in ("q_bias", "k_bias", "v_bias"):
        return "f32", None, False
    lossless = quant.GGUF_REPACK.get(src_type)
    explicit = embedding if name in ("embed", "lm_head") else None  # the user's --embedding wins over the source's
    if lossless and explicit in (None, lossless):
        return lossless, FORMATS[lossless].fixed_group or quant.GGUF_BLOCK, True
    dtype = requant_dtype(name, shape[1], quant_name, embedding, n_layers)
    return dtype, FORMATS[dtype].fixed_group or group_size, False


def _encode(st, name: str, shape: list[int], dtype: str, gs: int | None, repack: bool):
    """Encode one tensor in row chunks; returns (components [N, row_bytes] uint8, error, lossless)."""
    n = shape[0]
    k = shape[1] if len(shape) == 2 else 1
    step = max(1, CHUNK_ELEMENTS // k)
    chunks: dict[str, list[np.ndarray]] = {}
    max_diff = max_w = sq_diff = sq_w = 0.0
    exact = True
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        w = st.float_rows(r0, r1).reshape(r1 - r0, k)
        if not np.all(np.isfinite(w)):
            raise FormatError(st.name, "values", f"rows {r0}..{r1} hold NaN or infinity", "finite weights")
        if repack:
            comps = quant.repack_gguf(st.type_name, st.raw_rows(r0, r1), r1 - r0, k)
        else:
            comps = quant.quantize(dtype, w, gs or 32)
        comps = {c: np.ascontiguousarray(a).view(np.uint8).reshape(r1 - r0, -1) for c, a in comps.items()}
        w_hat = quant.dequantize(dtype, comps, [r1 - r0, k], gs, quant.k_padded_for(k, gs) if gs else None)
        exact = exact and np.array_equal(w, w_hat)
        d = (w_hat.astype(np.float64) - w)
        max_diff = max(max_diff, float(np.abs(d).max()))
        max_w = max(max_w, float(np.abs(w).max()))
        sq_diff += float(np.dot(d.ravel(), d.ravel()))
        sq_w += float(np.dot(w.ravel().astype(np.float64), w.ravel().astype(np.float64)))
        for c, a in comps.items():
            chunks.setdefault(c, []).append(a)
    comps = {c: np.concatenate(v) if len(v) > 1 else v[0] for c, v in chunks.items()}
    err = {"max_rel": max_diff / max_w if max_w else 0.0, "rms_rel": (sq_diff / sq_w) ** 0.5 if sq_w else 0.0}
    return comps, err, exact


def _write_tensor(writer: ShardWriter, comps: dict[str, np.ndarray]) -> list[dict]:
    n = next(iter(comps.values())).shape[0]
    per_binding = max(1, MAX_BINDING_BYTES // max(a.shape[1] for a in comps.values()))
    bindings = []
    for b0 in range(0, n, per_binding):
        b1 = min(n, b0 + per_binding)
        bindings.append({"rows": [b0, b1], "parts": writer.write_rows(comps, b0, b1)})
    return bindings


MIN_SOURCE_TENSORS_PER_LAYER = 6  # norms, q|k|v, o, gate|up, down: a fused layer (Phi-3) has no fewer


def _build(src, folder: Path, *, quant_name, group_size, embedding, shard_mb, name, progress,
           chat_template=None) -> dict:
    try:
        cfg = ModelConfig.from_dict(src.config, str(src.path), "config")
    except FormatError as e:
        raise FormatError(src.path, e.field, e.problem, e.expected) from None
    # declared sizes against what the source holds, before anything is sized by them (10**6 layers): every layer
    # holds at least MIN_SOURCE_TENSORS_PER_LAYER source tensors, even with fused q/k/v and gate/up (Phi-3)
    available = len(getattr(src, "tensors", None) or getattr(src, "index", None) or ())
    if cfg.num_hidden_layers * MIN_SOURCE_TENSORS_PER_LAYER > available:
        raise FormatError(src.path, "num_hidden_layers", f"{cfg.num_hidden_layers} layers need at least "
                          f"{cfg.num_hidden_layers * MIN_SOURCE_TENSORS_PER_LAYER} tensors but the source holds "
                          f"{available}")
    tok_json, src_template, special = src.tokenizer()
    chat_template = chat_template or src_template
    check_tokenizer(tok_json, cfg, f"{src.path} (tokenizer)")  # fail before hours of packing, not after
    check_chat_template(chat_template, special, f"{src.path} (chat template)")
    want = expected_tensors(cfg)
    sources = [(n, shape, src.tensor(n, shape)) for n, shape in want]  # checks every tensor before writing any
    writer = ShardWriter(folder, shard_mb << 20)
    tensors = []
    total = sum(int(np.prod(s)) for _, s, _ in sources)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="w", unit_scale=True, desc="pack", file=sys.stderr)
    params = 0
    for n, shape, st in sources:
        dtype, gs, repack = _target_dtype(n, shape, st.type_name, quant_name=quant_name, group_size=group_size,
                                          embedding=embedding, n_layers=cfg.num_hidden_layers)
        comps, err, exact = _encode(st, n, shape, dtype, gs, repack)
        if repack and not exact:  # a repack changes layout, never values: anything else is a packer bug
            raise WebinferError(f"{st.name}: {st.type_name} repacked as {dtype} does not decode bit-identically "
                                f"(max_rel {err['max_rel']:.3g}); please report this")
        entry = {"name": n, "dtype": dtype, "shape": shape}
        if gs:
            entry.update(group_size=gs, k_padded=quant.k_padded_for(shape[1], gs))
        entry.update(source_type=st.type_name, lossless=bool(exact), error=err, bindings=_write_tensor(writer, comps))
        tensors.append(entry)
        params += int(np.prod(shape))
        del comps
        if hasattr(src, "release"):
            src.release()
        if bar:
            bar.update(int(np.prod(shape)))
    writer.finish()
    if bar:
        bar.close()
    for t in tensors:
        for b in t["bindings"]:
            writer.resolve(b["parts"])
    tok_bytes = json.dumps(tok_json, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
    import hashlib

    tok_sha = hashlib.sha256(tok_bytes).hexdigest()
    (folder / f"{tok_sha}.json").write_bytes(tok_bytes)
    files = writer.files + [{"name": f"{tok_sha}.json", "bytes": len(tok_bytes), "sha256": tok_sha}]
    total_bytes = sum(f["bytes"] for f in files)
    weight_bytes = sum(f["bytes"] for f in writer.files)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "name": name or src.default_name,
        "source": {"kind": src.kind, "name": src.name},
        "config": cfg.to_dict(),
        "tokenizer": {"file": f"{tok_sha}.json", "bytes": len(tok_bytes), "sha256": tok_sha},
        "chat_template": chat_template,
        "special_tokens": special,
        "quantization": {"quant": quant_name, "group_size": group_size, "embedding": embedding,
                         "dtypes": {d: sum(t["dtype"] == d for t in tensors)
                                    for d in sorted({t["dtype"] for t in tensors})}},
        "tensors": tensors,
        "files": files,
        "totals": {"files": len(files), "bytes": total_bytes, "params": params,
                   "bits_per_weight": round(8 * weight_bytes / params, 3) if params else 0.0},
    }
    data = json.dumps(manifest, ensure_ascii=False, sort_keys=True, indent=1).encode("utf-8")
    (folder / "manifest.json").write_bytes(data)
    Package.open(folder).validate()  # the reader's validation is the final check of what we wrote
    return manifest


def _exit_on_sigterm():
    """Turn SIGTERM into SystemExit while packing, so the temp folder is removed as on Ctrl-C (SIGINT already
    raises KeyboardInterrupt); returns the function that restores the previous handler. Only the main thread can
    install handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    old = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, old)


def pack(source: Path, out: Path, *, quant: str | None = None, group_size: int = 32, asymmetric: bool = False,
         embedding: str | None = None, shard_mb: int = 32, name: str | None = None, force: bool = False,
         progress: bool = True, chat_template: str | None = None) -> Path:
    """Pack SOURCE (GGUF file or HF folder) into the package folder OUT; returns OUT.

    GGUF tensors in Q4_0/Q4_1/Q8_0/Q5_0/Q5_1/Q2_K..Q6_K/IQ4_NL/IQ4_XS are repacked losslessly in their own type;
    the rest (F32/F16/BF16) are requantized to `quant` (QUANT_CHOICES; `asymmetric` is the old spelling
    of quant="q4a"). `group_size` applies to q4/q4a/q8; `embedding` overrides the format of embed / lm_head.
    chat_template: jinja2 source stored instead of the source's own (e.g. for a GGUF that carries none)."""
    source, out = Path(source), Path(out)
    quant_name = quant or ("q4a" if asymmetric else DEFAULT_QUANT)
    if quant_name not in QUANT_CHOICES:
        raise ValueError(f"quant must be one of {', '.join(QUANT_CHOICES)}, got {quant_name!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    if embedding is not None and embedding not in QUANT_DTYPES:
        raise ValueError(f"embedding must be one of {', '.join(QUANT_DTYPES)}, got {embedding!r}")
    if shard_mb < 1:
        raise ValueError(f"shard_mb must be at least 1, got {shard_mb}")
    if chat_template is not None:
        from webinfer.chat_template import compile_template

        compile_template(chat_template)  # ChatTemplateError (with the line) before any work
    if out.exists() and not force:
        raise OutputExistsError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f"{out.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    restore = _exit_on_sigterm()
    try:
        src = open_source(source)
        manifest = _build(src, tmp, quant_name=quant_name, group_size=group_size, embedding=embedding,
                          shard_mb=shard_mb, name=name, progress=progress, chat_template=chat_template)
        if out.exists():  # --force: move the old one aside first so OUT is never half-replaced
            old = out.parent / f"{out.name}.old-{secrets.token_hex(4)}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        restore()
    if progress:
        print_summary(manifest, file=sys.stderr)
    return out


def print_summary(manifest: dict, file=sys.stdout, worst: int = 8) -> None:
    ts = [t for t in manifest["tensors"] if t["dtype"] != "f32"]
    ts.sort(key=lambda t: -t["error"]["rms_rel"])
    print(f"{'tensor':<24} {'dtype':<5} {'source':<6} {'lossless':<8} {'max_rel':>9} {'rms_rel':>9}", file=file)
    for t in ts[:worst]:
        e = t["error"]
        print(f"{t['name']:<24} {t['dtype']:<5} {t['source_type']:<6} {str(t['lossless']):<8} "
              f"{e['max_rel']:9.5f} {e['rms_rel']:9.5f}", file=file)
    n_lossless = sum(t["lossless"] for t in manifest["tensors"])
    dtypes = manifest["quantization"]["dtypes"]
    print("dtypes: " + ", ".join(f"{d} {c}" for d, c in dtypes.items()), file=file)
    tot = manifest["totals"]
    print(f"overall: {len(manifest['tensors'])} tensors ({n_lossless} lossless), {tot['params']:,} params, "
          f"{tot['bytes'] / 2**20:.1f} MiB in {tot['files']} files, {tot['bits_per_weight']} bits/weight; "
          f"worst rms_rel {ts[0]['error']['rms_rel'] if ts else 0.0:.5f}", file=file)


def cli_main(args) -> int:
    from webinfer_packager import paths  # noqa: PLC0415

    source = Path(args.source) if args.source else paths.default_gguf_path()
    if args.output:
        out = Path(args.output)
    elif args.source:  # another model: its own folder beside the default one, never the default model's
        out = paths.named_package_dir(args.name or (source.stem if source.suffix.lower() == ".gguf" else source.name))
    else:
        out = paths.default_package_dir()
    template = None
    if getattr(args, "chat_template", None):
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise FormatError(args.chat_template, "(file)", f"cannot be read: {e}", "a UTF-8 jinja2 chat template")
    try:
        pack(source, out, quant=args.quant, group_size=args.group_size, asymmetric=args.asymmetric,
             embedding=args.embedding, shard_mb=args.shard_mb, name=args.name, force=args.force,
             progress=not args.quiet, chat_template=template)
    except ValueError as e:
        raise WebinferError(str(e)) from None
    print(out)
    return 0
