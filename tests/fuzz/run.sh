#!/usr/bin/env bash
# Builds the fuzz targets of tests/fuzz with clang's libFuzzer, ASan and UBSan, and fuzzes
# each for a bounded time from the committed seed corpus (tests/fuzz/corpus/<target>).
#   bash tests/fuzz/run.sh [SECONDS_PER_TARGET [TARGET...]]     default: 60, all targets
# Work goes to build/fuzz/: the binaries, the inputs found (corpus/<target>, not committed)
# and, on a failure, the crashing input (artifacts/), whose path the log names. Installs
# clang when missing (as root; .ci/common.sh lists the packages). Exits non-zero on a crash,
# a leak, undefined behaviour, a FUZZ_CHECK failure or a timeout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/common.sh

seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(attend index layout)

ensure_packages "${CERTATTN_FUZZ_PACKAGES[@]}"
cxx="${CXX_FUZZ:-clang++}"
out=build/fuzz
mkdir -p "$out/artifacts"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -fno-omit-frame-pointer -Iinclude -isystem /usr/include/eigen3)

# Two compilers at a time (the machines have 2 cores).
pids=()
for t in "${targets[@]}"; do
  echo "building fuzz_$t"
  "$cxx" "${flags[@]}" "tests/fuzz/fuzz_$t.cpp" -o "$out/fuzz_$t" &
  pids+=($!)
  if ((${#pids[@]} == 2)); then wait "${pids[0]}"; pids=("${pids[1]}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t"
  echo "fuzzing $t for ${seconds}s"
  # -len_control=0: full-length inputs from the start (the decoders read ~100 bytes of
  # shape and options before the values); -timeout: one input may take at most 30 s.
  rc=0
  "$out/fuzz_$t" -max_total_time="$seconds" -max_len=1024 -len_control=0 -timeout=30 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
    "$out/corpus/$t" "tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    tail -n 80 "$out/$t.log"
    echo "fuzz_$t failed (exit $rc); the input is in $out/artifacts/, the log in $out/$t.log" >&2
    exit "$rc"
  fi
  grep -E '^(Done|stat::)' "$out/$t.log" || true
done
echo "fuzzing: ${#targets[@]} targets, ${seconds}s each: no failure"
