#!/usr/bin/env bash
# Builds the CPU engine's WebAssembly modules from wasm/kernels.c with Debian's clang-19 + lld-19 (no Emscripten,
# no libc): webinfer/cpu/kernels.wasm (SIMD128) and webinfer/cpu/kernels-relaxed.wasm (+ relaxed SIMD).
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
"$CC" "${flags[@]}" -o "$out/kernels.wasm" wasm/kernels.c
"$CC" "${flags[@]}" -mrelaxed-simd -DRELAXED -o "$out/kernels-relaxed.wasm" wasm/kernels.c
ls -l "$out"/kernels*.wasm | awk '{print "build-wasm:", $NF, $5, "bytes"}'
