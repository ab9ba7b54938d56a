#!/usr/bin/env bash
# The CUDA parity tests and the GPU benchmark, in one command, on a machine with an NVIDIA GPU,
# its driver, and Python with PyTorch (cu13 wheels), transformers and peft, but no Rust and no
# Node. Everything built comes from `target/gpu-bundle/` (made on a build machine by
# `npm run build && npm run build:cuda && node scripts/gpu-bundle.mjs`).
#
#   bash scripts/gpu-check.sh [--quick] [--tests-only | --bench-only] [--cuda-suites-only] [--no-hf] [--no-loras]
#                             [--profile] [--decode-paths] [--timing] [--kernels | --kernels-only]
#
# Tests: the CUDA suites (cuda.test.mjs; cuda-prefill.test.mjs, the prefill path against the
# generic one; cuda-families.test.mjs, every family against HF in f32 and bf16), then the
# HF-parity, expert and batching suites on the GPU in f32 (--cuda-suites-only skips those three).
# Benchmark: benches/gpu.mjs (load, decode, prefill 512, sessions, LoRAs; --no-loras skips the
# LoRA rows on both sides) and benches/gpu-prefill.mjs (prefill at 512, 2,048 and 8,192 tokens
# on the prefill path, on the generic path and in HF with sdpa and eager attention:
# prefill.md, prefill.json), each next to HF transformers run on the same model first.
#
# --no-hf skips the HF transformers side of the benchmark (ours alone, faster); --profile runs
# ours with EXPERT_RUNTIME_PROFILE=1 and writes the engine's per-step phase times to profile.log.
# --decode-paths then times ours (--quick) with decode on the generic candle path, on the CUDA decode
# path launching its kernels directly, and on that path replayed as CUDA graphs with its small-batch
# products on cuBLAS, without programmatic dependent launch, and as shipped (paths.md). --timing
# then runs ours (--quick) with EXPERT_RUNTIME_CUDA_TIMING=1: device µs per kind of decode kernel
# (timing.log). --kernels first
# builds and runs benches/cuda/kernels.cu with the machine's nvcc: each decode kernel alone on the
# Qwen3-0.6B shape, in variants, and the kernels of benches/cuda/experiments.cuh checked against
# the ones they would replace (kernels.md); before it, benches/cuda/prefill.cu checks the prefill
# attention kernel against a plain f32 reference and times it (prefill-kernel.md); --kernels-only
# runs those two and nothing else.
#
# With this project's `device` tool: run it with carry ["target/gpu-bundle"]; the results come
# back through $OUT, which that tool sets. Otherwise they go to ./gpu-results: tests.log,
# hf.json, gpu.json and summary.md.
# The exit status is the test run's (the benchmark reports, it does not judge).
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=""; TESTS=1; BENCH=1; HF=1; PROFILE=0; PATHS=0; TIMING=0; KERNELS=0; F32_SUITES=1; LORAS=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK=--quick ;;
    --tests-only) BENCH=0 ;;
    --bench-only) TESTS=0 ;;
    --no-hf) HF=0 ;;
    --no-loras) LORAS=0 ;;
    --cuda-suites-only) F32_SUITES=0 ;;
    --profile) PROFILE=1 ;;
    --decode-paths) PATHS=1 ;;
    --timing) TIMING=1 ;;
    --kernels) KERNELS=1 ;;
    --kernels-only) KERNELS=1; TESTS=0; BENCH=0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
B=target/gpu-bundle
OUT=${OUT:-$PWD/gpu-results}
WORK=${GPU_CHECK_WORK:-/tmp/expert-runtime-gpu}
mkdir -p "$OUT" "$WORK"
if [ "$KERNELS" = 1 ]; then
  nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/prefill.cu -o "$WORK/prefill" && "$WORK/prefill" | tee "$OUT/prefill-kernel.md"
  nvcc -O3 -arch=sm_90 -std=c++17 benches/cuda/kernels.cu -o "$WORK/kernels" && "$WORK/kernels" | tee "$OUT/kernels.md"
  [ "$TESTS$BENCH" = 00 ] && exit 0
fi
[ -d "$B" ] || { echo "missing $B: build it with scripts/gpu-bundle.mjs on a build machine" >&2; exit 2; }

# 1. The Node binary, the CUDA addon and the JS layer from the bundle.
NODE="$WORK/node"
[ -x "$NODE" ] || { xz -dc "$B/node.xz" > "$NODE.tmp" && chmod +x "$NODE.tmp" && mv "$NODE.tmp" "$NODE"; }
xz -dc "$B/expert-runtime.linux-x64-gnu-cuda.node.xz" > expert-runtime.linux-x64-gnu-cuda.node
[ -f dist/index.js ] || cp -r "$B/dist" dist
for f in native.js native.d.ts; do [ -f "$f" ] || cp "$B/$f" "$f"; done
mkdir -p "$WORK/tokenizer"
for f in tokenizer.json tokenizer_config.json; do xz -dc "$B/tokenizer/$f.xz" > "$WORK/tokenizer/$f"; done

# 2. The CUDA 13 libraries the addon links: PyTorch's nvidia wheels, else a system toolkit.
PY=${PYTHON:-python3}
LIBS=$("$PY" - <<'EOF'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
want = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libnvrtc.so.13"]
dirs = []
for w in want:
    hits = [h for r in roots for h in glob.glob(os.path.join(r, "nvidia", "**", w), recursive=True)]
    hits += glob.glob(os.path.join("/usr/local/cuda*", "lib*", w)) + glob.glob(os.path.join("/usr/local/cuda*", "targets", "*", "lib", w))
    if hits and os.path.dirname(hits[0]) not in dirs:
        dirs.append(os.path.dirname(hits[0]))
print(":".join(dirs))
EOF
)
# The driver's own folder, where a container mounts it outside the loader's default paths.
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [ -e "$d/libcuda.so.1" ] && LIBS="$LIBS:$d"; done
export LD_LIBRARY_PATH="${LIBS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "## $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "node $("$NODE" --version), torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
} | tee "$OUT/summary.md"
"$NODE" -e "
  const { Runtime } = require('./dist/index.js');
  Runtime.load('__test__/fixtures/qwen3-tiny', { device: 'cuda' })
    .then(async (rt) => { console.log('CUDA addon:', JSON.stringify(rt.info)); await rt.dispose() })
    .catch((e) => { console.log('CUDA addon unusable:', e.code, e.message); process.exitCode = 1 })
" 2>&1 | tee -a "$OUT/summary.md"

# 3. Tests: the CUDA suite, then the HF-parity, expert and batching suites on the GPU in f32
#    (their HF references and the 1e-4 bound are f32).
STATUS=0
if [ "$TESTS" = 1 ]; then
  "$NODE" --test --test-concurrency=1 __test__/cuda.test.mjs __test__/cuda-prefill.test.mjs __test__/cuda-families.test.mjs \
    2>&1 | tee "$OUT/tests.log"
  STATUS=${PIPESTATUS[0]}
  if [ "$F32_SUITES" = 1 ]; then
    EXPERT_RUNTIME_DEVICE=cuda EXPERT_RUNTIME_DTYPE=f32 "$NODE" --test --test-concurrency=1 \
      __test__/generate.test.mjs __test__/experts.test.mjs __test__/batching.test.mjs 2>&1 | tee -a "$OUT/tests.log"
    S2=${PIPESTATUS[0]}; [ "$S2" = 0 ] || STATUS=$S2
  fi
  echo "tests: $(grep -E '^# (pass|fail|skipped)' "$OUT/tests.log" | tr '\n' ' ') (exit $STATUS)" | tee -a "$OUT/summary.md"
fi

# 4. Benchmark: the same Qwen3-0.6B-shaped random bf16 weights and LoRAs for HF and for us.
if [ "$BENCH" = 1 ]; then
  MODEL="$WORK/qwen3-0.6b-random-bf16"
  "$PY" scripts/gpu_reference.py make-model --out "$MODEL" --dtype bfloat16 --tokenizer-dir "$WORK/tokenizer"
  LORA_DIRS=""
  if [ "$LORAS" = 1 ]; then
    "$NODE" benches/gpu.mjs --model "$MODEL" --write-loras "$WORK/loras" --lora-count 4 > "$WORK/loras.txt"
    LORA_DIRS=$(cat "$WORK/loras.txt")
  fi
  LORAS=$LORA_DIRS
  HF_ARGS=()
  if [ "$HF" = 1 ]; then
    "$PY" scripts/gpu_reference.py bench --model "$MODEL" --device cuda --dtype bfloat16 --lora-dirs "$LORAS" $QUICK \
      --prefill-lengths 512,2048,8192 --out "$OUT/hf.json" 2>&1 | tail -20
    HF_ARGS=(--hf "$OUT/hf.json")
  fi
  "$NODE" benches/gpu-prefill.mjs --model "$MODEL" "${HF_ARGS[@]}" --out "$OUT/prefill.json" 2>&1 | tee "$OUT/prefill.md" | tee -a "$OUT/summary.md"
  if [ "$PROFILE" = 1 ]; then
    EXPERT_RUNTIME_PROFILE=1 "$NODE" benches/gpu.mjs --model "$MODEL" "${HF_ARGS[@]}" --loras "$LORAS" $QUICK --out "$OUT/gpu.json" \
      2> >(tee "$OUT/profile.log" | grep -v '^expert-runtime profile' >&2) | tee -a "$OUT/summary.md"
    sleep 1
    echo "profile (ms per step; every 64 steps):"; grep '^expert-runtime profile' "$OUT/profile.log" | sed 's/^expert-runtime profile: //' | head -40
  else
    "$NODE" benches/gpu.mjs --model "$MODEL" "${HF_ARGS[@]}" --loras "$LORAS" $QUICK --out "$OUT/gpu.json" 2>&1 | tee -a "$OUT/summary.md"
  fi
  if [ "$PATHS" = 1 ]; then
    echo "| decode path | batch 1 (tok/s) | prefill (tok/s) | sessions (tok/s) | mixed LoRAs (tok/s) |" > "$OUT/paths.md"
    echo "|---|---:|---:|---:|---:|" >> "$OUT/paths.md"
    for mode in generic:EXPERT_RUNTIME_CUDA_DECODE=0 eager:EXPERT_RUNTIME_CUDA_GRAPHS=0 graphs-cublas:EXPERT_RUNTIME_CUDA_GEMV=0 graphs-no-pdl:EXPERT_RUNTIME_CUDA_PDL=0 graphs:EXPERT_RUNTIME_CUDA_GRAPHS=1; do
      env "${mode#*:}" "$NODE" benches/gpu.mjs --model "$MODEL" --loras "$LORAS" --quick --out "$WORK/paths-${mode%%:*}.json" > /dev/null 2>&1
      "$NODE" -e "const o = require('$WORK/paths-${mode%%:*}.json').ours; const f = (x) => x == null ? '—' : x.toFixed(0);
        console.log('| ${mode%%:*} | ' + [o.decode_tok_s_batch1, o.prefill_tok_s, o.sessions_tok_s, o.sessions_mixed_tok_s].map(f).join(' | ') + ' |')" >> "$OUT/paths.md"
    done
    cat "$OUT/paths.md"
  fi
  if [ "$TIMING" = 1 ]; then
    EXPERT_RUNTIME_CUDA_TIMING=1 "$NODE" benches/gpu.mjs --model "$MODEL" --loras "$LORAS" --quick --out "$WORK/timing.json" 2>&1 \
      | grep 'CUDA decode timing' > "$OUT/timing.log"
    echo "decode kernel timing (first reports):"; head -6 "$OUT/timing.log"
  fi
fi
exit "$STATUS"
