#!/usr/bin/env bash
# Builds the CPU engine's WebAssembly modules from wasm/kernels.c with Debian's clang-19 + lld-19 (no Emscripten,
# no libc): webinfer/cpu/kernels.wasm (SIMD128) and webinfer/cpu/kernels-relaxed.wasm (+ relaxed SIMD), and each
# again as a threads build (kernels-threads.wasm, kernels-relaxed-threads.wasm: -DTHREADS, atomics, an imported
# shared memory; docs/cpu-backend.md "Threads").
# The outputs are committed (small, and byte-identical for the same compiler: tests/cpu/test_build.py rebuilds and
# compares when clang-19 is present), so the wheel and the site carry them without a compiler on every machine.
# Usage: scripts/build-wasm.sh [OUT_DIR]   (default webinfer/cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-webinfer/cpu}"
# clang-19 must find its own wasm-ld (lld-19), not /usr/bin/wasm-ld of another version
[ -d /usr/lib/llvm-19/bin ] && export PATH=/usr/lib/llvm-19/bin:$PATH
CC="${WEBINFER_CLANG:-clang-19}"
command -v "$CC" >/dev/null || { echo "build-wasm: $CC not found (apt-get install clang-19 lld-19)" >&2; exit 1; }
# 4 GiB is the wasm32 ceiling; the runner grows memory as it places weights and reports what it took
# -ffp-contract=off: no fused multiply-adds (the relaxed build would emit relaxed_madd), so both builds round alike
flags=(--target=wasm32 -O3 -ffp-contract=off -msimd128 -mbulk-memory -mnontrapping-fptoint -nostdlib -ffreestanding
       -fno-builtin-memcpy -Wall -Wextra -Werror -Wno-unused-parameter
       -Wl,--no-entry -Wl,--export=__heap_base -Wl,--initial-memory=1048576 -Wl,--max-memory=4294967296
       -Wl,-z,stack-size=262144 -Wl,--strip-all -fdebug-prefix-map="$PWD"=.)
# threads: the memory is shared and imported (the host hands the same one to each thread's instance; lld makes the
# data segments passive and initialises them once), __stack_pointer exported so the host gives thread 1 its own stack
threads=(-matomics -DTHREADS -Wl,--shared-memory -Wl,--import-memory -Wl,--export=__stack_pointer)
"$CC" "${flags[@]}" -o "$out/kernels.wasm" wasm/kernels.c
"$CC" "${flags[@]}" -mrelaxed-simd -DRELAXED -o "$out/kernels-relaxed.wasm" wasm/kernels.c
"$CC" "${flags[@]}" "${threads[@]}" -o "$out/kernels-threads.wasm" wasm/kernels.c
"$CC" "${flags[@]}" "${threads[@]}" -mrelaxed-simd -DRELAXED -o "$out/kernels-relaxed-threads.wasm" wasm/kernels.c
ls -l "$out"/kernels*.wasm | awk '{print "build-wasm:", $NF, $5, "bytes"}'
