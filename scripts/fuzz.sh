#!/usr/bin/env bash
# Fuzzes the parsers of untrusted files (cargo-fuzz targets in fuzz/, see fuzz/README.md):
# builds every target, runs each for FUZZ_SECONDS, prints executions and outcome per target,
# and exits non-zero when any target crashed (panic, abort, out-of-memory, timeout).
#
#   scripts/fuzz.sh                        # CI: 20 s per target
#   FUZZ_SECONDS=480 scripts/fuzz.sh       # a long run
#   FUZZ_TARGETS="gguf chat_template" scripts/fuzz.sh
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 20)
#   FUZZ_TARGETS    space-separated targets (default: all of them)
#   FUZZ_SANITIZER  address (default) or none
#   FUZZ_TOOLCHAIN  a rustup toolchain to use, e.g. "stable" (default: whatever `cargo` is)
#
# Works on a stable toolchain: cargo-fuzz needs -Z flags, which RUSTC_BOOTSTRAP=1 unlocks.
# New inputs go to fuzz/corpus-run/<target>/ (kept between runs, not committed); the committed
# seeds in fuzz/corpus/<target>/ are only read. Crashing inputs land in fuzz/artifacts/<target>/
# and logs in fuzz/artifacts/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-20}"
all_targets="gguf config_json safetensors_header peft_config chat_template structured_format tool_stream session_file"
read -r -a targets <<<"${FUZZ_TARGETS:-$all_targets}"
sanitizer="${FUZZ_SANITIZER:-address}"
cargo=(cargo)
rustc=(rustc)
if [[ -n "${FUZZ_TOOLCHAIN:-}" ]]; then
  cargo=(cargo "+${FUZZ_TOOLCHAIN}")
  rustc=(rustc "+${FUZZ_TOOLCHAIN}")
fi
export RUSTC_BOOTSTRAP=1

# Largest input per target: above its largest seed, small enough to keep runs fast.
max_len() {
  case "$1" in
    gguf) echo 65536 ;;
    structured_format) echo 24576 ;;
    safetensors_header | chat_template) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

if ! "${cargo[@]}" fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  "${cargo[@]}" install cargo-fuzz --locked
fi

# Built once, then the binaries are run directly (`cargo fuzz run` would rebuild whenever a
# source file changed in between).
build_flags=(--fuzz-dir fuzz --sanitizer "$sanitizer" --release --debug-assertions)
host="$("${rustc[@]}" -vV | sed -n 's/^host: //p')"
echo "fuzz: building ${targets[*]} (sanitizer: $sanitizer)"
start=$SECONDS
if [[ "${targets[*]}" == "$all_targets" ]]; then
  "${cargo[@]}" fuzz build "${build_flags[@]}"
else
  for t in "${targets[@]}"; do "${cargo[@]}" fuzz build "${build_flags[@]}" "$t"; done
fi
echo "fuzz: built in $((SECONDS - start)) s"
bin="fuzz/target/$host/release"
# What `cargo fuzz run` sets for an AddressSanitizer build.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"

logs=fuzz/artifacts/logs
mkdir -p "$logs"
failed=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus-run/$t" "fuzz/artifacts/$t"
  log="$logs/$t.log"
  echo "fuzz: $t for $seconds s"
  status=0
  # -timeout: one input running past 10 s is a hang; -rss_limit_mb also caps any single
  # allocation (malloc_limit_mb defaults to it); -print_final_stats for the execution count.
  "$bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
    -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" "fuzz/corpus-run/$t" "fuzz/corpus/$t" >"$log" 2>&1 ||
    status=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  corpus="$(find "fuzz/corpus-run/$t" -type f | wc -l | tr -d ' ')"
  if [[ $status -eq 0 ]]; then
    outcome="ok"
  else
    failed=1
    kind="$(grep -m 1 -oE 'ERROR: libFuzzer: [a-z -]+|panicked at [^ ]+|deadly signal' "$log" || true)"
    artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
    outcome="FAILED (exit $status${kind:+: $kind}${artifact:+; input $artifact})"
    echo "fuzz: $t failed; the end of $log:"
    tail -n 40 "$log"
  fi
  summary+=("$(printf '%-20s %10s execs  %6s corpus  %s' "$t" "${execs:-?}" "$corpus" "$outcome")")
done

echo
echo "fuzz: $seconds s per target"
printf '%s\n' "${summary[@]}"
exit "$failed"
