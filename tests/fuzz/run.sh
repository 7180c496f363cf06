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

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

build_one() {
  echo "building fuzz_$1"
  "$cxx" "${flags[@]}" "tests/fuzz/fuzz_$1.cpp" -o "$out/fuzz_$1"
}
fuzz_one() {
  local t=$1
  mkdir -p "$out/corpus/$t"
  echo "fuzzing $t for ${seconds}s"
  # -len_control=0: full-length inputs from the start (the decoders read ~100 bytes of
  # shape and options before the values); -timeout: one input may take at most 30 s.
  "$out/fuzz_$t" -max_total_time="$seconds" -max_len=1024 -len_control=0 -timeout=30 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
    "$out/corpus/$t" "tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1
}

# Two jobs at a time (the machines have 2 cores), each a compiler or a fuzzer on one core:
# the builds go first, and a fuzzer starts as soon as its binary exists and a core is free,
# so the last build overlaps the first fuzzer and the fuzzers run two by two. Every fuzzer
# still has a whole core for its SECONDS.
builds=("${targets[@]}")
ready=()
declare -A job=()
while ((${#builds[@]} + ${#ready[@]} + ${#job[@]})); do
  while ((${#job[@]} < 2 && ${#builds[@]} + ${#ready[@]})); do
    if ((${#builds[@]})); then
      t=${builds[0]}; builds=("${builds[@]:1}")
      build_one "$t" & job[$!]="build $t"
    else
      t=${ready[0]}; ready=("${ready[@]:1}")
      fuzz_one "$t" & job[$!]="fuzz $t"
    fi
  done
  rc=0
  wait -n -p done_pid "${!job[@]}" || rc=$?
  read -r kind t <<<"${job[$done_pid]}"
  unset "job[$done_pid]"
  if ((rc != 0)); then
    ((${#job[@]})) && kill "${!job[@]}" 2>/dev/null || true
    if [[ $kind == build ]]; then
      echo "building fuzz_$t failed (exit $rc)" >&2
    else
      tail -n 80 "$out/$t.log"
      echo "fuzz_$t failed (exit $rc); the input is in $out/artifacts/, the log in $out/$t.log" >&2
    fi
    exit "$rc"
  fi
  if [[ $kind == build ]]; then
    ready+=("$t")
  else
    echo "fuzz_$t:"
    grep -E '^(Done|stat::)' "$out/$t.log" || true
  fi
done
echo "fuzzing: ${#targets[@]} targets, ${seconds}s each: no failure"
