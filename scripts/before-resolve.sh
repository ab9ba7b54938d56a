#!/usr/bin/env bash
# The checks too heavy for every CI run, run before an issue is resolved (CONTRIBUTING.md › CI):
#   1. the CUDA build (`npm run build:cuda`, 15–25 minutes on 2 cores from a clean target
#      folder), so the `cuda` feature and src/model/cuda_decode* cannot rot;
#   2. the package test with the CUDA tarball beside the CPU one: `auto` falls back, `cuda`
#      explains, nothing aborts (CI runs the same test without the CUDA tarball, which it skips);
#   3. a longer fuzzing run than CI's 20 s per parser (FUZZ_SECONDS, default 120).
# Cross-platform builds are separate (scripts/cross/build.sh <platform>): each needs its own
# toolchain and emulator. Exit status 0 when every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp() { printf '\n== [%s] %s\n' "$(date +%T)" "$*"; }
stamp "CUDA build"
npm run build:cuda
stamp "package test with the CUDA package"
npm run build
node --test --test-concurrency=1 __test__/package.test.mjs
stamp "fuzzing, ${FUZZ_SECONDS:-120} s per parser"
FUZZ_SECONDS="${FUZZ_SECONDS:-120}" bash scripts/fuzz.sh
stamp "all passed"
