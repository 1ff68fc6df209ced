# shellcheck shell=bash
# tests/gpu/lib.sh: the step runner that the device check scripts share
# (tests/gpu/run.sh, run2.sh and run3.sh source it; it does nothing alone).
#
# A device call is one command of at most 540 s wall clock. A check killed
# from outside at that point loses its summary, so every step runs under a
# timeout of its own, and a global deadline (GPU_DEADLINE, 530 s: 10 s left
# for one kill grace and the summary) skips any step whose timeout could
# carry the script past it. The script then always ends by itself, and
# says what it left out.
#
# Usage in a script:
#   gpu_init "$@"                 [--dry-run] [output-dir]
#   build_loom target...          configure and build; stops the script on failure
#   step NAME SECONDS 'command'   run one step (bash -c) under its timeout
#   skip_step NAME 'why'          record a step that cannot run here
#   finish                        summary, final status line, exit status

GPU_DEADLINE=${LOOM_GPU_DEADLINE:-530}
GPU_KILL_GRACE=5 # timeout -k: SIGKILL this long after SIGTERM
# Lines of each log printed after its step: the device call returns only
# the last 12,000 characters of output, and the summary at the end must be
# among them; the full logs come back in the output folder anyway.
GPU_TAIL_OK=8
GPU_TAIL_FAIL=30

gpu_init() { # the script's "$@"
  DRY=0
  if [ "${1:-}" = --dry-run ]; then
    DRY=1
    shift
  fi
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  OUTDIR=${1:-${OUT:-gpu-out}}
  # A build folder of its own: build/ may hold a host-only build, and a
  # carried or kept one must not be reconfigured under its owner's feet.
  B=${LOOM_GPU_BUILD:-build-gpu}
  JOBS=$(nproc 2>/dev/null || echo 4)
  # A -R that matches nothing (a test family not written yet) is an error to
  # ctest in some modes; --no-tests=ignore says it is fine, where this ctest
  # knows the option.
  # (Its help is read whole first: grep -q leaving the pipe early would
  # kill ctest with SIGPIPE, and pipefail make that a "no".)
  local help
  help=$(ctest --help 2>/dev/null)
  # shellcheck disable=SC2034 # used by the scripts that source this
  NO_TESTS=$(grep -q -- '--no-tests' <<<"$help" && echo --no-tests=ignore)
  NSTEP=0 PLANNED=0 FAILED=0 SKIPPED=0
  if [ "$DRY" = 1 ]; then
    echo "dry run: nothing runs. repository $ROOT, build folder $B, $JOBS jobs, deadline $GPU_DEADLINE s"
    echo " #  step                   timeout  (worst case by)  command"
  else
    # The output folder is taken relative to where the script was started.
    if ! mkdir -p "$OUTDIR" || ! OUTDIR=$(cd "$OUTDIR" && pwd); then
      echo "cannot create $OUTDIR" >&2
      exit 2
    fi
    printf '%-24s %-5s %7s  %s\n' step rc seconds result >"$OUTDIR/summary.txt"
  fi
  cd "$ROOT" || exit 2
  SECONDS=0 # the deadline counts from here
}

# One line of summary.txt: name, rc, seconds, result in words.
record() { # name rc seconds result
  printf '%-24s %-5s %7s  %s\n' "$1" "$2" "$3" "$4" >>"$OUTDIR/summary.txt"
}

skip_step() { # name why
  NSTEP=$((NSTEP + 1))
  if [ "$DRY" = 1 ]; then
    printf '%2d. %-22s   skipped here: %s\n' "$NSTEP" "$1" "$2"
    return 0
  fi
  echo "== $1: skipped: $2"
  record "$1" - 0 "skipped: $2"
  SKIPPED=$((SKIPPED + 1))
}

# Runs `bash -c command` under `timeout -k 5 seconds`, its output in
# OUTDIR/name.log. Exit 77 is this project's "skipped" (as CTest's
# SKIP_RETURN_CODE), not a failure. Returns the command's status.
step() { # name seconds command
  local name=$1 secs=$2 cmd=$3
  NSTEP=$((NSTEP + 1))
  if [ "$DRY" = 1 ]; then
    PLANNED=$((PLANNED + secs))
    printf '%2d. %-22s %4d s   (by %3d s)  %s\n' "$NSTEP" "$name" "$secs" "$PLANNED" "$cmd"
    return 0
  fi
  if [ $((SECONDS + secs)) -gt "$GPU_DEADLINE" ]; then
    echo "== $name: skipped: out of time ($SECONDS s gone, it may take $secs s, deadline $GPU_DEADLINE s)"
    record "$name" - 0 "skipped: out of time"
    SKIPPED=$((SKIPPED + 1))
    return 0
  fi
  local log="$OUTDIR/$name.log" t0=$SECONDS rc result
  echo "== $name (timeout $secs s, at $SECONDS s): $cmd"
  echo "\$ $cmd" >"$log"
  timeout -k "$GPU_KILL_GRACE" "$secs" bash -c "$cmd" >>"$log" 2>&1 </dev/null
  rc=$?
  case $rc in
    0) result=ok ;;
    77) result="skipped (77)"; SKIPPED=$((SKIPPED + 1)) ;;
    124 | 137) result="FAILED: timed out after $secs s"; FAILED=$((FAILED + 1)) ;;
    *) result=FAILED; FAILED=$((FAILED + 1)) ;;
  esac
  # A GPU test that skips on the GPU machine says the device was not seen:
  # worth a word next to an otherwise green line.
  local nskip
  nskip=$(grep -c '\*\*\*Skipped' "$log")
  [ "$nskip" -gt 0 ] && result="$result, $nskip test(s) skipped"
  record "$name" "$rc" $((SECONDS - t0)) "$result"
  echo "   $result (rc $rc) in $((SECONDS - t0)) s; log $log"
  if [ "$rc" = 0 ] || [ "$rc" = 77 ]; then
    tail -n "$GPU_TAIL_OK" "$log" | sed 's/^/   | /'
  else
    tail -n "$GPU_TAIL_FAIL" "$log" | sed 's/^/   | /'
  fi
  return "$rc"
}

# One ctest run in the build folder; a test's own output only when it fails.
ctest_cmd() { # include-regex [exclude-regex]
  local c="cd $B && ctest --output-on-failure -R '$1'"
  [ -n "${2:-}" ] && c="$c -E '$2'"
  echo "$c"
}

# Configure and build only the named targets. Nothing later can run
# without them, so a failure here ends the script.
build_loom() { # target...
  # LOOM_CUDA_ARCHS=90: sm_90 only (the H200), half the device code to compile.
  # LOOM_EMU=OFF: the CPU emulation of the kernel (issue 22) is for machines
  # without a GPU; CMake only warns that it does not know it yet.
  # LOOM_WITH_TORCH=OFF: configure would import torch to build the CPU
  # backend, which no step here uses (gpu_torch_* need no build of theirs).
  step configure 20 "cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA_ARCHS=90 -DLOOM_EMU=OFF -DLOOM_WITH_TORCH=OFF" ||
    stop_build configure
  step build 120 "cmake --build $B -j $JOBS --target $*" || stop_build build
}

stop_build() { # step
  echo "== $1 failed: stopping, every later step needs the build"
  grep -m 20 -E 'error|Error|\*\*\*' "$OUTDIR/$1.log" | sed 's/^/   ! /'
  finish
}

finish() {
  if [ "$DRY" = 1 ]; then
    echo "planned total: $PLANNED s (every step at its timeout); deadline $GPU_DEADLINE s, one device call 540 s"
    if [ "$PLANNED" -gt "$GPU_DEADLINE" ]; then
      echo "too long: the last steps would be skipped for time even if nothing hangs" >&2
      exit 1
    fi
    exit 0
  fi
  local status=PASSED code=0
  if [ "$FAILED" -gt 0 ]; then
    status=FAILED
    code=1
  fi
  echo "== summary ($OUTDIR/summary.txt)"
  cat "$OUTDIR/summary.txt"
  local line="== device check $status: $FAILED failed, $SKIPPED skipped, of $NSTEP steps, in $SECONDS s"
  echo "$line" >>"$OUTDIR/summary.txt"
  echo "$line"
  exit "$code"
}
