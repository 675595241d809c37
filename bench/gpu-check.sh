#!/usr/bin/env bash
# One-shot GPU check (issue 30) for a machine with an NVIDIA GPU, the CUDA
# Toolkit and PyTorch, and possibly no network, no Criterion and no compiler
# flags of ours that its gcc accepts (-Dwerror=false):
#   0. the machine as it reports itself: GPU, driver, kernel (4.4.0 = gVisor),
#      THP, NUMA; in the background, DeepSpeed from its sdist (when
#      .gpu-carry/ holds it and the wheels it needs) and its JIT-built op;
#   1. build libpinshim.so and the bench programs (Meson, else plain cc);
#   2. correctness under LD_PRELOAD: gpu_check; bench/gpu_runs (issue 34)
#      without and with the shim: two adjacent locks, a lock grown over its
#      neighbour, two buffers sharing a page and half a buffer locked, each
#      buffer copied whole, every copy's result side by side in summary.txt;
#      gpu_contexts with PINSHIM_ASYNC on and off, the same questions through
#      PyTorch (bench/gpu_check_torch.py: is_pinned() when mlock returns, with
#      a context first and with none yet);
#   3. the seed's table: bench/h2d_d2h and bench/h2d_d2h_torch.py (pageable,
#      pin_memory, mlock without and with the shim, explicit registration);
#      DeepSpeed's own benchmarks/pin_memory/h2d_d2h_bench.py, its three arms
#      and, under the shim, native-unregistered (DS_PIN_MEMORY_REGISTER_DEVICE=0)
#      and native-registered (both register);
#   4. bench/lock_latency --real: mlock as the program sees it, 1 and 4 GiB;
#   5. bench/gpu_register: cuMemHostRegister by size, threads and page size, a
#      small copy's wait during a registration, a copy across two
#      registrations; last, as its own process, unregistering under an
#      in-flight copy (the one step that might upset the device).
# Every step has its own timeout, capped so the whole run stays within
# GPU_CHECK_BUDGET seconds (default 470: under 8 minutes); a failed step never
# stops the next. Results land in $OUT when it is set, else in
# bench/results/gpu-<date>-<host>/: at most 8 files (the device tool brings
# back 8), with a summary printed at the end.
# Exit status: 0 all passed, 1 something failed, 2 no usable GPU (nothing
# measured; the build is still tried and every step says why it skipped).
#   bench/gpu-check.sh [--quick]
# Environment: CUDA_HOME (default /usr/local/cuda, else nvcc's), PYTHON
# (default python3), GPU_CHECK_BUILD=cc to skip Meson, OUT, GPU_CHECK_BUDGET,
# GPU_CHECK_SIZES (gpu_register's GiB, default 1,4,16), GPU_CHECK_CARRY
# (default .gpu-carry: the DeepSpeed sdist and wheels; absent = no DeepSpeed),
# GPU_CHECK_RUNS_CUDART (the runtime gpu_runs loads; default the toolkit's
# lib64/libcudart.so: a dry run without a GPU may name the fake one that the
# Meson build makes, build-gpu/bench/libbench_fake_cudart.so, to try the table).
set -u

cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
quick=0
[ "${1:-}" = "--quick" ] && quick=1
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda_home/include/cuda.h" ] && command -v nvcc >/dev/null; then
  cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
fi
python=${PYTHON:-python3}
host=$(hostname 2>/dev/null | tr -c 'A-Za-z0-9._\n-' '_' | head -c 40)
out=${OUT:-bench/results/gpu-$(date +%Y-%m-%d)-${host:-host}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
build="$root/build-gpu"
# The files (8 at most):
summary="$out/summary.txt"             # 1 what ran, what passed, the tables
log="$out/build.log"                   # 2 machine, environment, builds, DeepSpeed setup
check="$out/correctness.txt"           # 3 gpu_check, gpu_runs, gpu_contexts, PyTorch
tables="$out/tables.txt"               # 4 every benchmark's own output
h2d_json="$out/h2d_d2h.json"           # 5
torch_json="$out/torch.json"           # 6
latency_json="$out/lock_latency.json"  # 7
register_json="$out/gpu_register.json" # 8 (both gpu_register runs)
scratch=$(mktemp -d /tmp/pinshim-gpu-check.XXXXXX)
: >"$log"
: >"$check"
: >"$tables"
started=$(date +%s)
budget=${GPU_CHECK_BUDGET:-470}
declare -a results=()

note() { echo "gpu-check: $*" | tee -a "$log" >&2; }
result() { results+=("$1"); echo "gpu-check: $1" >&2; }
elapsed() { echo $(($(date +%s) - started)); }
# A heading in tables.txt before each benchmark's output.
heading() { printf '\n== %s (at %d s)\n' "$*" "$(elapsed)" >>"$tables"; }

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

# One result line per exit status of the usual kind (0 done/PASS, 2 skipped).
verdict() {
  local what=$1 rc=$2 file=$3 done_word=${4:-done}
  case $rc in
    0) result "$what: $done_word" ;;
    2) result "$what: skipped (no usable GPU, or what it needs is missing; see $file)" ;;
    124) result "$what: TIMEOUT (timed out, or not started: time budget; see $file)" ;;
    *) result "$what: FAIL (exit $rc; see $file)" ;;
  esac
}

# ---- the machine, as it reports itself ----
kernel=$(uname -r)
case $kernel in
  4.4.0*) sandbox="gVisor (kernel 4.4.0: its memory handling is not Linux's)" ;;
  *) sandbox="a Linux kernel (Firecracker or bare metal)" ;;
esac
{
  echo "== $(date -u +%FT%TZ) on $(hostname)"
  echo "== git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --short 2>/dev/null | wc -l) changed file(s)"
  echo "== kernel: $kernel: $sandbox"
  echo "== nvidia-smi"
  timeout 30 nvidia-smi 2>&1 | head -25
  echo "== GPU: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>&1)"
  bus=$(timeout 20 nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | head -1 |
    tr 'A-F' 'a-f' | sed 's/^0000\(....\)/\1/')
  echo "== GPU's NUMA node (sysfs): $(cat "/sys/bus/pci/devices/$bus/numa_node" 2>/dev/null || echo '?') ($bus)"
  echo "== NUMA nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
  echo "== CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
  echo "== memory: $(grep -E '^(MemTotal|MemAvailable)' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
  echo "== THP: enabled $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo '?'), defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null || echo '?')"
  echo "== CUDA_HOME: $cuda_home; nvcc: $(timeout 10 "$cuda_home/bin/nvcc" --version 2>/dev/null | tail -1)"
  echo "== cc: $(cc --version 2>/dev/null | head -1)"
  echo "== meson: $(meson --version 2>/dev/null || echo absent), ninja: $(ninja --version 2>/dev/null || echo absent)"
  echo "== python: $($python --version 2>&1)"
  echo "== torch: $(timeout 60 "$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  echo "== RLIMIT_MEMLOCK: $(ulimit -l), uid $(id -u)"
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

# ---- DeepSpeed, set up in the background (nothing is fetched: .gpu-carry) ----
carry=${GPU_CHECK_CARRY:-$root/.gpu-carry}
ds_site="$scratch/site"
ds_log="$scratch/deepspeed-setup.log"
ds_pid=""
ds_sdist=$(ls "$carry"/deepspeed-*.tar.gz 2>/dev/null | head -1)
if [ -n "$ds_sdist" ]; then
  (
    set -e
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$ds_site" "$carry"/*.whl
    tar xzf "$ds_sdist" -C "$scratch"
    source_dir=$(ls -d "$scratch"/deepspeed-*/ | head -1)
    # DeepSpeed's source tree imports as is; its pin_memory op is JIT-built
    # once here, so that each benchmark arm only loads it.
    cd "$source_dir"
    PYTHONPATH="$source_dir:$ds_site" TORCH_EXTENSIONS_DIR="$scratch/torch_extensions" \
      MAX_JOBS=4 timeout 240 "$python" -c \
      'from deepspeed.ops.op_builder import PinMemoryBuilder; PinMemoryBuilder().load(); print("pin_memory op built")'
  ) >"$ds_log" 2>&1 &
  ds_pid=$!
  note "DeepSpeed: setting up $(basename "$ds_sdist") in the background"
else
  note "DeepSpeed: no sdist in $carry: its benchmark is skipped"
fi

# ---- build ----
shim=""
h2d=""
gpu_check=""
gpu_runs=""
gpu_contexts=""
lock_latency=""
gpu_register=""
built_with=""
if [ "${GPU_CHECK_BUILD:-meson}" = meson ] && command -v meson >/dev/null &&
  command -v ninja >/dev/null; then
  note "building with meson in build-gpu"
  # -Dwerror=false: this machine's compiler may warn where ours does not.
  if [ -f "$build/build.ninja" ] ||
    step 90 "$log" meson setup "$build" -Dtests=false -Dfuzz=false -Dbench=true -Dwerror=false \
      -Dcudatoolkit="$cuda_home" --buildtype=debugoptimized; then
    if step 150 "$log" meson compile -C "$build"; then
      built_with=meson
      shim="$build/src/libpinshim.so"
      h2d="$build/bench/h2d_d2h"
      gpu_check="$build/bench/gpu_check"
      gpu_runs="$build/bench/gpu_runs"
      gpu_contexts="$build/bench/gpu_contexts"
      lock_latency="$build/bench/lock_latency"
      gpu_register="$build/bench/gpu_register"
    fi
  fi
fi
if [ -z "$built_with" ] || [ ! -x "$h2d" ] || [ ! -x "$gpu_check" ] || [ ! -x "$gpu_runs" ] ||
  [ ! -x "$gpu_contexts" ] || [ ! -x "$lock_latency" ] || [ ! -x "$gpu_register" ]; then
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
  for file in src/*.c src/*/*.c; do
    [ "$file" = src/cli.c ] || sources+=("$file")
  done
  step 120 "$log" cc "${flags[@]}" -shared -fPIC -fvisibility=hidden -Wl,-z,nodelete \
    -I"$build" -Isrc -Iinclude -isystem "$cuda_home/include" -isystem third_party/nvtx3 \
    "${sources[@]}" \
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
  # lock_latency and gpu_register dlopen the runtime: headers only.
  step 120 "$log" cc "${flags[@]}" -Iinclude -DBENCH_SHIM_PATH="\"$build/libpinshim.so\"" \
    bench/lock_latency.c bench/bench_util.c -o "$build/lock_latency" -ldl &&
    lock_latency="$build/lock_latency"
  step 120 "$log" cc "${flags[@]}" -Iinclude -isystem "$cuda_home/include" \
    bench/gpu_register.c bench/bench_util.c -o "$build/gpu_register" -ldl -lpthread &&
    gpu_register="$build/gpu_register"
  step 120 "$log" cc "${flags[@]}" -Iinclude -isystem "$cuda_home/include" \
    bench/gpu_runs.c bench/bench_util.c -o "$build/gpu_runs" -ldl -lpthread &&
    gpu_runs="$build/gpu_runs"
  built_with=cc
fi
[ -n "$shim" ] && [ -f "$shim" ] && result "build ($built_with): libpinshim.so OK" ||
  { result "build ($built_with): libpinshim.so FAILED (see build.log)"; shim=""; }
for program in h2d gpu_check gpu_runs gpu_contexts lock_latency gpu_register; do
  path=${!program}
  if [ -z "$path" ] || [ ! -x "$path" ]; then
    result "build: $program FAILED (see build.log)"
    printf -v "$program" '%s' ""
  fi
done

# ---- correctness ----
if [ -n "$shim" ] && [ -n "$gpu_check" ]; then
  echo "== gpu_check under LD_PRELOAD=$shim (PINSHIM_STATS=stderr)" >>"$check"
  LD_PRELOAD="$shim" PINSHIM_STATS=stderr PINSHIM_LOG=info step 90 "$check" "$gpu_check"
  verdict "correctness (C)" $? correctness.txt PASS
else
  result "correctness (C): not run (build failed)"
fi
# Issue 34: buffers locked in pieces, each copied whole, once without the shim
# and once under it with its default settings (PINSHIM_STATS only reports);
# each run's lines are kept apart for summary.txt's table, then appended to
# correctness.txt.
runs_plain="$scratch/runs-plain.txt"
runs_shim="$scratch/runs-shim.txt"
: >"$runs_plain"
: >"$runs_shim"
runs_cudart=${GPU_CHECK_RUNS_CUDART:-}
if [ -z "$runs_cudart" ]; then
  for candidate in "$cuda_home"/lib64/libcudart.so "$cuda_home"/lib64/libcudart.so.[0-9]*; do
    [ -f "$candidate" ] && runs_cudart=$candidate && break
  done
fi
# Runs gpu_runs with no PINSHIM_* variable of the caller's, LD_PRELOAD as given.
runs_step() {
  local preload=$1 file=$2 name
  (
    for name in $(compgen -e); do
      case $name in PINSHIM_* | LD_PRELOAD) unset "$name" ;; esac
    done
    if [ -n "$preload" ]; then
      LD_PRELOAD="$preload" PINSHIM_STATS=stderr step 60 "$file" "$gpu_runs" \
        ${runs_cudart:+--cudart "$runs_cudart"}
    else
      step 60 "$file" "$gpu_runs" ${runs_cudart:+--cudart "$runs_cudart"}
    fi
  )
}
if [ -n "$gpu_runs" ]; then
  echo "== gpu_runs without the shim (issue 34; runtime ${runs_cudart:-searched})" >>"$check"
  runs_step "" "$runs_plain"
  rc=$?
  cat "$runs_plain" >>"$check"
  verdict "runs (issue 34, without the shim)" $rc correctness.txt PASS
  if [ -n "$shim" ]; then
    echo "== gpu_runs under LD_PRELOAD=$shim (default settings, PINSHIM_STATS=stderr)" >>"$check"
    runs_step "$shim" "$runs_shim"
    rc=$?
    cat "$runs_shim" >>"$check"
    verdict "runs (issue 34, under the shim)" $rc correctness.txt PASS
  else
    result "runs (issue 34, under the shim): not run (libpinshim.so did not build)"
  fi
else
  result "runs (issue 34): not run (build failed)"
fi
# Contexts: registration from the registration thread (async) and from the
# locking worker (sync).
if [ -n "$shim" ] && [ -n "$gpu_contexts" ]; then
  for async in on off; do
    echo "== gpu_contexts under LD_PRELOAD=$shim, PINSHIM_ASYNC=$async (PINSHIM_STATS=stderr)" >>"$check"
    LD_PRELOAD="$shim" PINSHIM_ASYNC=$async PINSHIM_STATS=stderr step 90 "$check" "$gpu_contexts"
    verdict "contexts (PINSHIM_ASYNC=$async)" $? correctness.txt PASS
  done
else
  result "contexts: not run (build failed)"
fi
if [ -n "$shim" ]; then
  echo "== PyTorch under LD_PRELOAD=$shim" >>"$check"
  LD_PRELOAD="$shim" PINSHIM_STATS=stderr step 120 "$check" "$python" bench/gpu_check_torch.py
  verdict "correctness (torch)" $? correctness.txt PASS
fi

# The DeepSpeed setup had the build's and the correctness steps' time; the
# timed steps wait for it a while (so that a compiler does not share their
# cores), DeepSpeed's arms until it ends.
ds_ready=0
ds_wait() {
  [ -n "$ds_pid" ] || return 0
  local limit=$1 waited=0
  while kill -0 "$ds_pid" 2>/dev/null && [ $waited -lt "$limit" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  kill -0 "$ds_pid" 2>/dev/null && {
    note "DeepSpeed: setup still running at $(elapsed) s (waited $waited s)"
    return 0
  }
  if wait "$ds_pid"; then
    ds_ready=1
    note "DeepSpeed: set up, at $(elapsed) s (waited $waited s)"
  else
    note "DeepSpeed: setup failed, at $(elapsed) s (its log is in build.log)"
  fi
  { echo "== DeepSpeed setup log"; tail -40 "$ds_log"; } >>"$log"
  ds_pid=""
}
ds_wait 45

# ---- the seed's table: bandwidth per kind of host memory ----
sizes=4,64,256,1024
iters=50
[ $quick -eq 1 ] && sizes=4,64 && iters=20
if [ -n "$h2d" ]; then
  heading "bench/h2d_d2h --sizes $sizes --iters 20"
  step 90 "$tables" "$h2d" --sizes "$sizes" --iters 20 --shim "$shim" --json "$h2d_json"
  verdict h2d_d2h $? tables.txt
else
  result "h2d_d2h: not run (build failed)"
fi
heading "bench/h2d_d2h_torch.py --sizes $sizes --iters $iters"
step 150 "$tables" "$python" bench/h2d_d2h_torch.py --sizes "$sizes" --iters "$iters" \
  ${shim:+--shim "$shim"} --json "$torch_json" --child-timeout 100
verdict h2d_d2h_torch $? tables.txt

# ---- what the program waits for inside mlock: sync vs async registration ----
latency_sizes=1,4
latency_rounds=2 # each round: one process per arm, the order alternating
[ $quick -eq 1 ] && latency_sizes=1 && latency_rounds=1
if [ -n "$lock_latency" ] && [ -n "$shim" ]; then
  heading "bench/lock_latency --real --sizes $latency_sizes --reps 2 --rounds $latency_rounds"
  (unset PINSHIM_CUDART; step 120 "$tables" "$lock_latency" --real --shim "$shim" \
    --sizes "$latency_sizes" --reps 2 --rounds "$latency_rounds" --json "$latency_json")
  verdict lock_latency $? tables.txt
else
  result "lock_latency: not run (build failed)"
fi

# ---- how registration should be made fast: the driver itself ----
register_sizes=${GPU_CHECK_SIZES:-1,4,16}
[ $quick -eq 1 ] && register_sizes=1
if [ -n "$gpu_register" ]; then
  heading "bench/gpu_register --only rwsm --sizes $register_sizes"
  step 150 "$tables" "$gpu_register" --only rwsm --sizes "$register_sizes" \
    --json "$scratch/register.json"
  verdict "gpu_register (r, w, s, m)" $? tables.txt
  # m again under the shim: a program's two adjacent locks, one copy across
  # both (one registration since issue 34; gpu_runs asks more).
  heading "bench/gpu_register --only m under LD_PRELOAD=libpinshim.so"
  LD_PRELOAD="$shim" PINSHIM_STATS=stderr step 40 "$tables" "$gpu_register" --only m \
    --json "$scratch/adjacent-shim.json"
  verdict "gpu_register (m under the shim)" $? tables.txt
fi

# DeepSpeed's own benchmark: each arm in its own process, as its driver runs
# them; the shim's arms are the same script under LD_PRELOAD.
ds_wait $((started + budget - 120 - $(date +%s)))
if [ $ds_ready -eq 1 ]; then
  ds_dir=$(ls -d "$scratch"/deepspeed-*/ | head -1)
  ds_sizes="4 64 256 1024"
  [ $quick -eq 1 ] && ds_sizes="4 64"
  for arm in torch native-unregistered native-registered shim:native-unregistered \
    shim:native-registered; do
    # gpu_register's last run keeps its 40 s
    if [ $((started + budget - 10 - $(date +%s))) -lt 80 ]; then
      result "deepspeed $arm: not started (time budget)"
      continue
    fi
    preload=""
    case $arm in shim:*) preload=$shim ;; esac
    heading "DeepSpeed benchmarks/pin_memory/h2d_d2h_bench.py --arm ${arm#shim:}${preload:+ under LD_PRELOAD=libpinshim.so}"
    # shellcheck disable=SC2086
    (cd "$ds_dir" && export PYTHONPATH="$ds_dir:$ds_site" \
      TORCH_EXTENSIONS_DIR="$scratch/torch_extensions" && if [ -n "$preload" ]; then
      export LD_PRELOAD="$preload" PINSHIM_STATS=stderr; fi &&
      step 50 "$tables" "$python" benchmarks/pin_memory/h2d_d2h_bench.py --arm "${arm#shim:}" \
        --sizes-mib $ds_sizes --warmup 10 --iters "$iters")
    verdict "deepspeed $arm" $? tables.txt
  done
else
  result "deepspeed: not run (no sdist carried, or its setup failed: see build.log)"
fi

if [ -n "$gpu_register" ]; then
  # Last: unregistering under an in-flight copy, in a process of its own.
  heading "bench/gpu_register --only u --inflight-mib 1024"
  step 40 "$tables" "$gpu_register" --only u --inflight-mib 1024 --json "$scratch/inflight.json"
  verdict "gpu_register (u)" $? tables.txt
  "$python" - "$scratch/register.json" "$scratch/adjacent-shim.json" "$scratch/inflight.json" \
    "$register_json" <<'PYTHON'
import json, sys
merged = {}
for name, path in (("main", sys.argv[1]), ("adjacent_under_shim", sys.argv[2]),
                   ("in_flight", sys.argv[3])):
    try:
        with open(path) as handle:
            merged[name] = json.load(handle)
    except (OSError, ValueError) as error:
        merged[name] = {"error": str(error)}
with open(sys.argv[4], "w") as handle:
    json.dump(merged, handle, indent=1)
PYTHON
else
  result "gpu_register: not run (build failed)"
fi

# ---- summary ----
# Issue 34's table: each copy gpu_runs made, as it reported it, without the
# shim and with it side by side (a cell is "no result" where that run printed
# no line for it); FAIL marks a line gpu_runs found not as expected.
runs_table() {
  if ! grep -q '^COPY ' "$1" "$2" 2>/dev/null; then
    echo "issue 34's copies (bench/gpu_runs): no result (not run, or no usable GPU: see correctness.txt)"
    return
  fi
  echo "issue 34's copies (bench/gpu_runs), as observed: each buffer copied whole; GB/s the median"
  echo "of 5 copies; type: cudaPointerGetAttributes of its first byte (1 pinned, 0 pageable)."
  echo "Expected: without the shim every copy succeeds, pageable; under it every copy of locked"
  echo "memory succeeds pinned, each scenario is 1 registration, and half-locked's whole copy fails"
  echo "with cudaErrorInvalidValue (a limit: registered and unregistered memory in one copy)."
  awk '
    function value(line, key,   n, f, i) {
      n = split(line, f, " ")
      for (i = 1; i <= n; i++)
        if (index(f[i], key "=") == 1)
          return substr(f[i], length(key) + 2)
      return ""
    }
    function copy_cell(line,   f, text) {
      split(line, f, " ")
      text = f[7]
      if (value(line, "gbps") != "-") text = text ", " value(line, "gbps") " GB/s"
      text = text ", type " value(line, "type")
      if (value(line, "bytes") != "intact" && value(line, "bytes") != "-")
        text = text ", bytes " value(line, "bytes")
      if (value(line, "verdict") != "ok") text = text " FAIL (expected " value(line, "expected") ")"
      return text
    }
    function regs_cell(line,   text) {
      text = "first/last byte " value(line, "first_byte") "/" value(line, "last_byte") ", " \
             value(line, "registrations") " made"
      if (value(line, "verdict") != "ok") text = text " FAIL"
      return text
    }
    function add(scenario, copy, run, text,   key) {
      # Each scenario opens with its registrations row (from the run under the shim).
      if (copy != "registrations" && !((scenario "|registrations") in row))
        add(scenario, "registrations", 0, "")
      key = scenario "|" copy
      if (!(key in row)) { row[key] = ++rows; scenarios[rows] = scenario; copies[rows] = copy }
      cell[row[key], run] = text
    }
    { run = (FILENAME == ARGV[1]) ? 1 : 2; scenario = $2; sub(/:$/, "", scenario) }
    $1 == "COPY" { add(scenario, $3 " " $4 " " $5, run, copy_cell($0)) }
    $1 == "REGS" { add(scenario, "registrations", run, regs_cell($0)) }
    $1 == "FAIL" && scenario != "gpu_runs" { add(scenario, "setup", run, substr($0, 6)) }
    END {
      printf "%-13s %-27s %-36s %s\n", "scenario", "copy", "without the shim", "with the shim"
      for (i = 1; i <= rows; i++) {
        plain = ((i, 1) in cell) ? cell[i, 1] : "no result"
        shim = ((i, 2) in cell) ? cell[i, 2] : "no result"
        if (copies[i] == "registrations") plain = "-"
        printf "%-13s %-27s %-36s %s\n", scenarios[i], copies[i], plain, shim
      }
    }' "$1" "$2"
}
{
  echo "pinshim GPU check, $(date -u +%FT%TZ), $(hostname), $(elapsed) s"
  echo "kernel: $kernel: $sandbox"
  if [ "${gpu_count:-0}" -eq 0 ]; then
    echo "device: none (no usable NVIDIA GPU)"
  else
    printf '%s\n' "$gpu_list" | sed 's/^/device: /'
    grep -E '^== (GPU|THP|CPU|NUMA|memory)' "$log" | sed 's/^== //'
  fi
  printf '%s\n' "${results[@]}"
  echo
  grep -E '^(PASS|FAIL|SKIP|NOTE|INFO)|^[0-9]+ device' "$check"
  echo
  runs_table "$runs_plain" "$runs_shim"
  echo
  # Each benchmark's heading and closing tables, without its progress lines.
  awk '/^== /{print; table=0; next}
       /^(device:|\| size|buffers|cuMemHostRegister|another thread|one copy|RESULT=|runtime:)/{table=1}
       table' "$tables" | grep -v '^$'
} >"$summary" 2>&1
cat "$summary"
[ -n "$ds_pid" ] && kill "$ds_pid" 2>/dev/null
rm -rf "$scratch"
files=$(find "$out" -maxdepth 1 -type f | wc -l)
echo "gpu-check: results in $out/ ($files files)"
if [ "${gpu_count:-0}" -eq 0 ]; then
  echo "gpu-check: NO GPU: no usable NVIDIA GPU on this machine, nothing was measured (exit 2)" >&2
  exit 2
fi
if printf '%s\n' "${results[@]}" | grep -qE 'FAIL|TIMEOUT'; then
  exit 1
fi
exit 0
