#!/usr/bin/env python3
"""What the program's cudaHostUnregister costs under the shim: DeepSpeed's
native pin sequence (DS_PIN_MEMORY_BACKEND=native) without DeepSpeed or torch.

  posix_memalign(page) + mlock, cudaHostRegister (the program's, through the
  global scope), cudaHostUnregister, munlock + free

While the pages are still locked when the program unregisters, the shim takes
them back (src/engine.c, engine_program_unregister): it asks which parts are
still locked, which reads /proc/self/smaps (src/memory_map.c), inside the
program's call. The kernel builds smaps by walking the page tables of every
mapping, so the call costs time in proportion to the process's resident
memory, and DeepSpeed unmaps the buffer microseconds later anyway.

  FAKE=build/tests/fake_cudart/libfake_cudart.so FAKE_CUDART_CHECK=0 \
    python3 tests/deepspeed/take_back_cost.py 64 20 [RESIDENT_MIB]
  ... and the same under build/src/pinshim --context create --async off|on --cudart $FAKE --

RESIDENT_MIB (default 0) of other memory is touched first, as a torch
process has. FAKE_CUDART_CHECK=0 turns off the double's own smaps checks so
that only the shim's cost is measured.
"""
import ctypes
import os
import sys
import time

fake = ctypes.CDLL(os.environ["FAKE"], mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
g.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
for f in (g.mlock, g.munlock):
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
g.free.argtypes = [ctypes.c_void_p]
g.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
g.cudaHostUnregister.argtypes = [ctypes.c_void_p]
n = int(sys.argv[1]) << 20
reps = int(sys.argv[2])
resident = bytearray(int(sys.argv[3]) << 20 if len(sys.argv) > 3 else 0)
for i in range(0, len(resident), 4096):
    resident[i] = 1
t = dict(alloc_lock=0.0, register=0.0, unregister=0.0, unlock_free=0.0)
for _ in range(reps):
    p = ctypes.c_void_p()
    a = time.perf_counter()
    assert g.posix_memalign(ctypes.byref(p), 4096, n) == 0
    assert g.mlock(p, n) == 0
    b = time.perf_counter()
    assert g.cudaHostRegister(p, n, 0) == 0
    c = time.perf_counter()
    assert g.cudaHostUnregister(p) == 0
    d = time.perf_counter()
    g.munlock(p, n)
    g.free(p)
    e = time.perf_counter()
    for key, value in (("alloc_lock", b - a), ("register", c - b), ("unregister", d - c), ("unlock_free", e - d)):
        t[key] += value
print(f"{sys.argv[1]} MiB, {len(resident) >> 20} MiB resident besides:",
      ", ".join(f"{k} {1000 * v / reps:.2f} ms" for k, v in t.items()),
      f"; last error {g.cudaPeekAtLastError()}")
