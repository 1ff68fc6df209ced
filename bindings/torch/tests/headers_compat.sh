#!/usr/bin/env bash
# The loom backend compiles against every torch whose headers are given, not
# only the one torch the build found: loom_torch.cpp is compiled (syntax
# and templates, no object) with the flags bindings/torch/CMakeLists.txt
# uses, once per headers directory. The directories come from the
# arguments after SOURCE_DIR, else from LOOM_TORCH_HEADERS_DIRS
# (colon-separated); each is either an extracted torch/include/ tree
# (fetch_torch_headers.py makes DIR/torch/include and DIR/VERSION; .ci/run
# fetches 2.13 and 2.14) or an installed torch package (DIR/include).
#   usage: headers_compat.sh SOURCE_DIR [DIR...]
# Exit 77 (skipped) where no directory is given or there is no C++ compiler
# or Python.h; 1 when any torch fails, with the compiler's first errors.
set -u
src=$1
shift
dirs=("$@")
if [ ${#dirs[@]} -eq 0 ] && [ -n "${LOOM_TORCH_HEADERS_DIRS:-}" ]; then
  IFS=: read -r -a dirs <<<"$LOOM_TORCH_HEADERS_DIRS"
fi
if [ ${#dirs[@]} -eq 0 ]; then
  echo "SKIP: no torch headers given (set LOOM_TORCH_HEADERS_DIRS; .ci/run fetches 2.13 and 2.14)"
  exit 77
fi
cxx=${CXX:-c++}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIP: no C++ compiler ($cxx)"
  exit 77
fi
py_inc=$(${LOOM_TORCH_COMPAT_PYTHON:-python3} -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
if [ ! -f "$py_inc/Python.h" ]; then
  echo "SKIP: no Python.h (Debian: python3-dev)"
  exit 77
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0 checked=0
for d in "${dirs[@]}"; do
  [ -n "$d" ] || continue
  if [ -d "$d/torch/include/torch/csrc/distributed/c10d" ]; then
    inc=$d/torch/include
  elif [ -d "$d/include/torch/csrc/distributed/c10d" ]; then
    inc=$d/include
  else
    echo "FAIL: $d holds no torch headers with c10d (torch/include/torch/csrc/distributed/c10d)"
    failed=1
    continue
  fi
  ver=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
        "$inc/torch/headeronly/version.h" "$inc/torch/csrc/api/include/torch/version.h" 2>/dev/null | head -3 | paste -sd.)
  checked=$((checked + 1))
  if "$cxx" -fsyntax-only -std=c++20 -fPIC -fvisibility=hidden -Wall -Wno-unused-parameter \
       -D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
       -DLOOM_TORCH_LIB_PATH='"/nonexistent/libnccl.so.2"' \
       -I"$src/include" -isystem "$inc" -isystem "$inc/torch/csrc/api/include" -isystem "$py_inc" \
       "$src/bindings/torch/loom_torch.cpp" >"$log" 2>&1; then
    if grep -q 'warning:' "$log"; then
      echo "ok:   torch ${ver:-?} ($inc), with warnings:"
      grep 'warning:' "$log" | head -5
    else
      echo "ok:   torch ${ver:-?} ($inc)"
    fi
  else
    echo "FAIL: torch ${ver:-?} ($inc):"
    grep -E 'error' "$log" | head -15
    failed=1
  fi
done
[ "$checked" -gt 0 ] || exit 1
[ "$failed" -eq 0 ] && echo PASS
exit "$failed"
