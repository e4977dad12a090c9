"""A/B timing of the prefill attention kernel: the current one vs an older shaders/attention.wgsl, one process.

    python webinfer_packager/bench/attention_prefill.py [--old-rev fbe5417] [--reps 7] [--ctx 256 512 768] [--queries 256]

The old kernel is compiled from `git show OLD_REV:shaders/attention.wgsl` (default: the last revision with the
one-query-per-invocation prefill) with the defines it expects; it has the same six bindings. Both run on the same
random f32 paged cache (SmolLM2's shape by default: 9 heads, 3 kv heads, head_dim 64, block 16), timed with
timestamp queries, alternating old/new each repetition (the box is shared and noisy); prints per-kernel medians.
It also checks that both kernels give the same output (to 1e-4) so a broken kernel cannot look fast.
Not a pytest test (a measurement tool; lavapipe needs tens of seconds per configuration).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
from pathlib import Path

import numpy as np

from webinfer.gpu.device import COPY_DST, COPY_SRC, STORAGE
from webinfer.gpu.native import request_device_sync
from webinfer.kernels.attention import PagedAttention, SeqStep, pack_step
from webinfer.kernels.library import KernelLibrary, load_source
from webinfer.kernels.preprocess import preprocess

REPO = Path(__file__).resolve().parents[2]


def old_pipeline(lib, rev: str, H: int, Hkv: int, hd: int, bs: int, q_stride: int):
    src = subprocess.run(["git", "show", f"{rev}:shaders/attention.wgsl"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    defs = lib.standard_defines(False)
    defs.update({"N_HEADS": H, "N_KV_HEADS": Hkv, "HEAD_DIM": hd, "BLOCK_SIZE": bs, "Q_STRIDE": q_stride,
                 "Q_OFFSET": 0, "SPLIT": 32, "MAX_SPLITS": 64, "BK": max(1, min(32, 16384 // (8 * hd))),
                 "LANES": 4, "HB": 3, "DWG": 8, "KERNEL": 2})
    code = lib.device.wgsl_enables(False, "SUBGROUPS" in defs) + preprocess(src, defs, load_source, "attention")
    return lib.device.create_pipeline(code, label="attention-old-prefill")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-rev", default="fbe5417")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--ctx", type=int, nargs="+", default=[256, 512, 768], help="KV length incl. the queries")
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--heads", type=int, nargs=3, default=[9, 3, 64], metavar=("H", "HKV", "HD"))
    a = ap.parse_args()
    H, Hkv, hd = a.heads
    bs = 16
    dev = request_device_sync(limits="browser", timestamps=True)
    lib = KernelLibrary(dev)
    old = old_pipeline(lib, a.old_rev, H, Hkv, hd, bs, H * hd)
    rng = np.random.default_rng(0)
    print(f"{dev.info.name}  H={H} Hkv={Hkv} hd={hd} block={bs} queries={a.queries} reps={a.reps}")
    for ctx in a.ctx:
        nq = min(a.queries, ctx)
        nb = -(-ctx // bs)
        step = SeqStep(ctx, list(range(1, nb + 1)), 0, nq)
        info, tables, shape = pack_step([step])
        attn = PagedAttention(lib, n_heads=H, n_kv_heads=Hkv, head_dim=hd, block_size=bs, max_model_len=ctx,
                              max_seqs=1)

        def up(data: bytes, extra=0):
            b = dev.create_buffer(len(data), STORAGE | COPY_DST | COPY_SRC | extra)
            dev.write_buffer(b, 0, data)
            return b

        kv = (nb + 1) * bs * Hkv * hd
        bufs = [up(rng.standard_normal(nq * H * hd).astype(np.float32).tobytes()),
                up(rng.standard_normal(kv).astype(np.float32).tobytes()),
                up(rng.standard_normal(kv).astype(np.float32).tobytes()), up(tables), up(info)]
        outs = [up(b"\0" * 4 * nq * H * hd), up(b"\0" * 4 * nq * H * hd)]
        new_bg = attn.bind(*bufs, outs[1])
        old_bg = dev.create_bind_group(old, [*bufs, outs[0]])
        record = {
            "old": lambda c: c.dispatch(old, old_bg, -(-nq // 64), H, 1, "old.prefill"),
            "new": lambda c: attn.encode(c, new_bg, shape),
        }
        times: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(a.reps + 1):
            for name in (("old", "new") if i % 2 else ("new", "old")):
                cmds = dev.commands(timed=True)
                record[name](cmds)
                dev.submit(cmds)
                ms = sum(t for _, t in asyncio.run(dev.read_timings(cmds)))
                if i:  # the first round compiles and warms up
                    times[name].append(ms)
        o, n = (np.frombuffer(dev.read_buffer_sync(b), np.float32) for b in outs)
        err = float(np.max(np.abs(o - n)))
        mo, mn = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"ctx {ctx:5d} queries {nq:4d}: old {mo:8.2f} ms  new {mn:8.2f} ms  speedup {mo / mn:5.2f}x  "
              f"max|old-new| {err:.1e}", flush=True)
        if not err < 1e-4:
            raise SystemExit(f"old and new prefill disagree at ctx {ctx}: max abs diff {err}")
        for b in bufs + outs:
            dev.destroy_buffer(b)


if __name__ == "__main__":
    main()
