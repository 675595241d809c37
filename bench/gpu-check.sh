#!/usr/bin/env bash
# One-shot GPU check for a machine with an NVIDIA GPU, the CUDA Toolkit and
# PyTorch, and possibly no network, no Meson and no Criterion:
#   1. build libpinshim.so, bench/h2d_d2h, bench/gpu_check, bench/gpu_contexts
#      and bench/lock_latency (Meson when it works, else plain cc commands);
#   2. correctness under LD_PRELOAD: gpu_check (pinshim_is_registered,
#      cudaPointerGetAttributes type 1, round trip, munlock/free);
#      gpu_contexts with PINSHIM_ASYNC on and off (main uses the last GPU, a
#      worker that never chose a device locks: only that GPU's primary context
#      may be active, and nvidia-smi must list this pid on that GPU only); the
#      same questions as gpu_check through PyTorch (is_pinned() True);
#   3. bench/lock_latency --real (the real libcudart, PINSHIM_CUDART unset):
#      mlock as the program sees it with PINSHIM_ASYNC off and on, 1 and 4 GiB;
#   4. bench/h2d_d2h and bench/h2d_d2h_torch.py.
# Every step has its own timeout, capped so the whole run stays within
# GPU_CHECK_BUDGET seconds (default 470: under 8 minutes); a failed step never
# stops the next. Results land in $OUT when it is set, else in
# bench/results/gpu-<date>-<host>/, with a summary printed at the end.
# Exit status: 0 all passed, 1 something failed, 2 no usable GPU (nothing
# measured; the build is still tried and every step says why it skipped).
#   bench/gpu-check.sh [--quick]
# Environment: CUDA_HOME (default /usr/local/cuda), PYTHON (default python3),
# GPU_CHECK_BUILD=cc to skip Meson, OUT, GPU_CHECK_BUDGET.
set -u

cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
quick=0
[ "${1:-}" = "--quick" ] && quick=1
cuda_home=${CUDA_HOME:-/usr/local/cuda}
python=${PYTHON:-python3}
host=$(hostname 2>/dev/null | tr -c 'A-Za-z0-9._\n-' '_' | head -c 40)
out=${OUT:-bench/results/gpu-$(date +%Y-%m-%d)-${host:-host}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
build="$root/build-gpu"
log="$out/build.log"          # 1: environment and build
check="$out/correctness.txt"  # 2
h2d_txt="$out/h2d_d2h.txt"    # 3
h2d_json="$out/h2d_d2h.json"  # 4
torch_txt="$out/torch.txt"    # 5
torch_json="$out/torch.json"  # 6
summary="$out/summary.txt"    # 7
contexts="$out/contexts.txt"  # 8
latency_txt="$out/lock_latency.txt"   # 9
latency_json="$out/lock_latency.json" # 10
: >"$log"
: >"$check"
: >"$contexts"
started=$(date +%s)
budget=${GPU_CHECK_BUDGET:-470}
declare -a results=()

note() { echo "gpu-check: $*" | tee -a "$log" >&2; }
result() { results+=("$1"); echo "gpu-check: $1" >&2; }

# Runs a step with a time limit, cut to what is left of the budget (10 s kept
# for the summary); its output goes to the file given. A step with less than
# 20 s left is not started (status 124, as if it had timed out).
step() {
  local limit=$1 file=$2
  shift 2
  local left=$((started + budget - 10 - $(date +%s)))
  if [ "$left" -lt 20 ]; then
    echo "gpu-check: not started, the ${budget} s budget is spent: $*" >>"$file"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout --kill-after=10 "$limit" "$@" >>"$file" 2>&1
}

# ---- environment ----
{
  echo "== $(date -u +%FT%TZ) on $(hostname)"
  echo "== git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --short 2>/dev/null | wc -l) changed file(s)"
  echo "== nvidia-smi"
  timeout 30 nvidia-smi 2>&1 | head -25
  echo "== nvcc: $(timeout 10 "$cuda_home/bin/nvcc" --version 2>/dev/null | tail -1)"
  echo "== cc: $(cc --version 2>/dev/null | head -1)"
  echo "== meson: $(meson --version 2>/dev/null || echo absent)"
  echo "== python: $($python --version 2>&1)"
  echo "== torch: $(timeout 60 "$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  echo "== RLIMIT_MEMLOCK: $(ulimit -l), uid $(id -u)"
  echo "== memory: $(grep -E '^MemAvailable' /proc/meminfo)"
} >>"$log" 2>&1

# No GPU: everything below still runs (the build is checked, and each GPU
# program says why it skips in a few seconds), and the exit status is 2.
gpu_list=$(timeout 30 nvidia-smi -L 2>/dev/null | grep '^GPU' || true)
gpu_count=$(printf '%s' "$gpu_list" | grep -c '^GPU' || true)
if [ "${gpu_count:-0}" -eq 0 ]; then
  note "no usable NVIDIA GPU here (nvidia-smi -L lists none$(command -v nvidia-smi >/dev/null || echo '; nvidia-smi not found')): building and running the checks only to show that they skip"
else
  note "$gpu_count GPU(s) listed by nvidia-smi -L"
fi

# ---- build ----
shim=""
h2d=""
gpu_check=""
gpu_contexts=""
lock_latency=""
built_with=""
if [ "${GPU_CHECK_BUILD:-meson}" = meson ] && command -v meson >/dev/null &&
  command -v ninja >/dev/null; then
  note "building with meson in build-gpu"
  if [ -f "$build/build.ninja" ] ||
    step 90 "$log" meson setup "$build" -Dtests=false -Dfuzz=false -Dbench=true \
      -Dcudatoolkit="$cuda_home" --buildtype=debugoptimized; then
    if step 150 "$log" meson compile -C "$build"; then
      built_with=meson
      shim="$build/src/libpinshim.so"
      h2d="$build/bench/h2d_d2h"
      gpu_check="$build/bench/gpu_check"
      gpu_contexts="$build/bench/gpu_contexts"
      lock_latency="$build/bench/lock_latency"
    fi
  fi
fi
if [ -z "$built_with" ] || [ ! -x "$h2d" ] || [ ! -x "$gpu_check" ] ||
  [ ! -x "$gpu_contexts" ] || [ ! -x "$lock_latency" ]; then
  note "building with cc in build-gpu-cc"
  build="$root/build-gpu-cc"
  mkdir -p "$build"
  cat >"$build/pinshim_config.h" <<EOF
#pragma once
#define PINSHIM_HAVE_CUDA_HEADERS 1
#define PINSHIM_VERSION "$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -1)"
EOF
  flags=(-std=c11 -O2 -g -D_GNU_SOURCE -fno-strict-aliasing -Wall -Wextra -pthread)
  sources=()
  for file in src/*.c; do
    [ "$file" = src/cli.c ] || sources+=("$file")
  done
  step 120 "$log" cc "${flags[@]}" -shared -fPIC -fvisibility=hidden -Wl,-z,nodelete \
    -I"$build" -Isrc -Iinclude -isystem "$cuda_home/include" "${sources[@]}" \
    -o "$build/libpinshim.so" -ldl -lpthread && shim="$build/libpinshim.so"
  cuda_link=(-isystem "$cuda_home/include" -Iinclude -L"$cuda_home/lib64"
    -Wl,-rpath,"$cuda_home/lib64" -lcudart -ldl -lpthread)
  step 120 "$log" cc "${flags[@]}" -DBENCH_SHIM_PATH="\"$build/libpinshim.so\"" \
    bench/h2d_d2h.c bench/bench_util.c -o "$build/h2d_d2h" "${cuda_link[@]}" &&
    h2d="$build/h2d_d2h"
  step 120 "$log" cc "${flags[@]}" bench/gpu_check.c -o "$build/gpu_check" "${cuda_link[@]}" &&
    gpu_check="$build/gpu_check"
  step 120 "$log" cc "${flags[@]}" bench/gpu_contexts.c -o "$build/gpu_contexts" \
    "${cuda_link[@]}" && gpu_contexts="$build/gpu_contexts"
  # lock_latency dlopens the runtime: no CUDA at build time, --real only here.
  step 120 "$log" cc "${flags[@]}" -Iinclude -DBENCH_SHIM_PATH="\"$build/libpinshim.so\"" \
    bench/lock_latency.c bench/bench_util.c -o "$build/lock_latency" -ldl &&
    lock_latency="$build/lock_latency"
  built_with=cc
fi
[ -n "$shim" ] && [ -f "$shim" ] && result "build ($built_with): libpinshim.so OK" ||
  { result "build ($built_with): libpinshim.so FAILED (see build.log)"; shim=""; }
[ -n "$h2d" ] && [ -x "$h2d" ] || { result "build: h2d_d2h FAILED"; h2d=""; }
[ -n "$gpu_check" ] && [ -x "$gpu_check" ] || { result "build: gpu_check FAILED"; gpu_check=""; }
[ -n "$gpu_contexts" ] && [ -x "$gpu_contexts" ] ||
  { result "build: gpu_contexts FAILED"; gpu_contexts=""; }
[ -n "$lock_latency" ] && [ -x "$lock_latency" ] ||
  { result "build: lock_latency FAILED"; lock_latency=""; }

# ---- correctness ----
if [ -n "$shim" ] && [ -n "$gpu_check" ]; then
  echo "== gpu_check under LD_PRELOAD=$shim (PINSHIM_STATS=stderr)" >>"$check"
  LD_PRELOAD="$shim" PINSHIM_STATS=stderr PINSHIM_LOG=info step 90 "$check" "$gpu_check"
  rc=$?
  case $rc in
    0) result "correctness (C): PASS" ;;
    2) result "correctness (C): skipped (no usable GPU; see correctness.txt)" ;;
    124) result "correctness (C): TIMEOUT (timed out, or not started: time budget; see correctness.txt)" ;;
    *) result "correctness (C): FAIL (exit $rc; see correctness.txt)" ;;
  esac
else
  result "correctness (C): not run (build failed)"
fi
# Contexts on a multi-GPU box: registration from the registration thread
# (async) and from the locking worker (sync).
if [ -n "$shim" ] && [ -n "$gpu_contexts" ]; then
  for async in on off; do
    echo "== gpu_contexts under LD_PRELOAD=$shim, PINSHIM_ASYNC=$async (PINSHIM_STATS=stderr)" >>"$contexts"
    LD_PRELOAD="$shim" PINSHIM_ASYNC=$async PINSHIM_STATS=stderr step 90 "$contexts" "$gpu_contexts"
    rc=$?
    case $rc in
      0) result "contexts (PINSHIM_ASYNC=$async): PASS" ;;
      2) result "contexts (PINSHIM_ASYNC=$async): skipped (no usable GPU; see contexts.txt)" ;;
      124) result "contexts (PINSHIM_ASYNC=$async): TIMEOUT (timed out, or not started: time budget; see contexts.txt)" ;;
      *) result "contexts (PINSHIM_ASYNC=$async): FAIL (exit $rc; see contexts.txt)" ;;
    esac
  done
else
  result "contexts: not run (build failed)"
fi
if [ -n "$shim" ]; then
  echo "== PyTorch under LD_PRELOAD=$shim" >>"$check"
  LD_PRELOAD="$shim" PINSHIM_STATS=stderr step 120 "$check" "$python" - <<'EOF'
import ctypes, sys
try:
    import torch
except ImportError as error:
    print("SKIP torch not importable:", error); sys.exit(2)
if not torch.cuda.is_available():
    print("SKIP torch sees no GPU"); sys.exit(2)
torch.cuda.init()
libc = ctypes.CDLL(None)  # the shim's posix_memalign/mlock/free
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
for name in ("mlock", "munlock"):
    getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.pinshim_is_registered.argtypes = [ctypes.c_void_p]
n = 64 << 20
pointer = ctypes.c_void_p()
assert libc.posix_memalign(ctypes.byref(pointer), 4096, n) == 0
failures = 0
def check(ok, what):
    global failures
    print("PASS" if ok else "FAIL", what); failures += 0 if ok else 1
host = torch.frombuffer((ctypes.c_uint8 * n).from_address(pointer.value), dtype=torch.uint8)
host.copy_(torch.arange(n, dtype=torch.int64).to(torch.uint8))
check(not host.is_pinned(), "torch: not pinned before mlock")
check(libc.mlock(pointer, n) == 0, "torch: mlock of 64 MiB")
check(libc.pinshim_is_registered(pointer) == 1, "torch: pinshim_is_registered after mlock")
check(host.is_pinned(), "torch: tensor.is_pinned() True after mlock")
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    device = host.to("cuda", non_blocking=True)
    back = torch.empty_like(host)
    back.copy_(device, non_blocking=True)
stream.synchronize()
check(torch.equal(back, host), "torch: round trip keeps the data")
libc.munlock(pointer, n)
check(not host.is_pinned(), "torch: is_pinned() False after munlock")
check(libc.pinshim_is_registered(pointer) == 0, "torch: pinshim_is_registered 0 after munlock")
del host
libc.free(pointer)
print("%s: %d torch check(s) failed" % ("FAIL" if failures else "PASS", failures))
sys.exit(1 if failures else 0)
EOF
  rc=$?
  case $rc in
    0) result "correctness (torch): PASS" ;;
    2) result "correctness (torch): skipped (no torch or no GPU; see correctness.txt)" ;;
    124) result "correctness (torch): TIMEOUT (timed out, or not started: time budget; see correctness.txt)" ;;
    *) result "correctness (torch): FAIL (exit $rc; see correctness.txt)" ;;
  esac
fi

# ---- what the program waits for inside mlock: sync vs async registration ----
latency_sizes=1,4
latency_rounds=2 # each round: one process per arm, the order alternating
[ $quick -eq 1 ] && latency_sizes=1 && latency_rounds=1
if [ -n "$lock_latency" ] && [ -n "$shim" ]; then
  (unset PINSHIM_CUDART; step 180 "$latency_txt" "$lock_latency" --real --shim "$shim" \
    --sizes "$latency_sizes" --reps 2 --rounds "$latency_rounds" --json "$latency_json")
  rc=$?
  case $rc in
    0) result "lock_latency: done" ;;
    2) result "lock_latency: skipped (no usable GPU; see lock_latency.txt)" ;;
    124) result "lock_latency: TIMEOUT (timed out, or not started: time budget; see lock_latency.txt)" ;;
    *) result "lock_latency: FAILED (exit $rc; see lock_latency.txt)" ;;
  esac
else
  result "lock_latency: not run (build failed)"
fi

# ---- bandwidth ----
sizes=4,64,256,1024
iters=50
[ $quick -eq 1 ] && sizes=4,64 && iters=20
if [ -n "$h2d" ]; then
  step 180 "$h2d_txt" "$h2d" --sizes "$sizes" --iters "$iters" --shim "$shim" --json "$h2d_json"
  rc=$?
  case $rc in
    0) result "h2d_d2h: done" ;;
    2) result "h2d_d2h: skipped (no usable GPU; see h2d_d2h.txt)" ;;
    124) result "h2d_d2h: TIMEOUT (timed out, or not started: time budget; see h2d_d2h.txt)" ;;
    *) result "h2d_d2h: FAILED (exit $rc; see h2d_d2h.txt)" ;;
  esac
else
  result "h2d_d2h: not run (build failed)"
fi
step 180 "$torch_txt" "$python" bench/h2d_d2h_torch.py --sizes "$sizes" --iters "$iters" \
  ${shim:+--shim "$shim"} --json "$torch_json" --child-timeout 120
rc=$?
case $rc in
  0) result "h2d_d2h_torch: done" ;;
  2) result "h2d_d2h_torch: skipped (no torch or no GPU; see torch.txt)" ;;
  124) result "h2d_d2h_torch: TIMEOUT (timed out, or not started: time budget; see torch.txt)" ;;
  *) result "h2d_d2h_torch: FAILED (exit $rc; see torch.txt)" ;;
esac

# ---- summary ----
{
  echo "pinshim GPU check, $(date -u +%FT%TZ), $(hostname), $(($(date +%s) - started)) s"
  if [ "${gpu_count:-0}" -eq 0 ]; then
    echo "device: none (no usable NVIDIA GPU)"
  else
    printf '%s\n' "$gpu_list" | sed 's/^/device: /'
  fi
  printf '%s\n' "${results[@]}"
  echo
  grep -E '^(PASS|FAIL|SKIP)' "$check"
  grep -E '^(==|PASS|FAIL|SKIP|NOTE|INFO)|^[0-9]+ device' "$contexts"
  if [ -s "$latency_txt" ]; then
    echo
    echo "== lock_latency.txt"
    sed -n '/^| size/,/^$/p;/program waited/p;/no usable GPU/p' "$latency_txt"
  fi
  for table in "$h2d_txt" "$torch_txt"; do
    [ -s "$table" ] || continue
    echo
    echo "== $(basename "$table")"
    if grep -q '^device:' "$table"; then
      sed -n '/^device:/,$p' "$table"
    else
      tail -n 5 "$table"
    fi
  done
} >"$summary" 2>&1
cat "$summary"
echo "gpu-check: results in $out/"
if [ "${gpu_count:-0}" -eq 0 ]; then
  echo "gpu-check: NO GPU: no usable NVIDIA GPU on this machine, nothing was measured (exit 2)" >&2
  exit 2
fi
if printf '%s\n' "${results[@]}" | grep -qE 'FAIL|TIMEOUT'; then
  exit 1
fi
exit 0
