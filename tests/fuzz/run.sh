#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in a build folder of their own
# and runs each for a bounded time from its seed corpus
# (tests/fuzz/corpus/<target>/); fails if any target finds a crash, a
# sanitizer report or a timeout.
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_BUILD     build folder (default build-fuzz at the top of the tree)
#   FUZZ_JOBS      parallel build jobs (default: the CPUs)
#   CC             the clang to use (default clang)
# Crashing inputs are left in $FUZZ_BUILD/findings/<target>/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(cd "$here/../.." && pwd)"
seconds="${FUZZ_SECONDS:-60}"
build="${FUZZ_BUILD:-$top/build-fuzz}"
jobs="${FUZZ_JOBS:-$(nproc)}"
cc="${CC:-clang}"
targets=(fuzz_bootstrap fuzz_socket_msg fuzz_xml)

mkdir -p "$build"
cmake -S "$top" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WITH_CUDA=OFF \
  -DLOOM_WITH_MPI=OFF -DLOOM_FUZZ=ON >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"   # grows as the fuzzer runs; the seeds stay as checked in
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  log="$build/$t.log"
  echo "== $t: ${seconds}s from $(ls "$here/corpus/$t" | wc -l) seeds"
  # -error_exitcode: a finding; -timeout: one input may not take 10 s;
  # -rss_limit_mb: the parsers' own limits must hold memory down.
  if "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$findings/" "$corpus" "$here/corpus/$t" >"$log" 2>&1; then
    grep -E '^#[0-9]+.*DONE|stat::number_of_executed_units' "$log" | tail -2 || true
  else
    status=1
    echo "$t FAILED: the input is in $findings/" >&2
    tail -60 "$log" >&2
  fi
done
exit $status
