#!/usr/bin/env python3
"""gpu_check's questions through PyTorch, run under LD_PRELOAD=libpinshim.so by
bench/gpu-check.sh. Two orders, each in a process of its own (--order):

  context  the program has a CUDA context before it locks (a tensor on the
           GPU first, as a training job has): the buffer must be registered
           when mlock returns, with no pinshim_drain, and is_pinned() True.
  none     the program locks before it has a context (torch.cuda.init() alone
           makes none): the shim must not make one for it, so the buffer is
           not registered when mlock returns; it is once the program's first
           CUDA work made the context (after pinshim_drain).

Both then check a round trip through the device and that munlock undoes the
registration. Prints PASS/FAIL lines; exits 0 when all passed, 1 when one
failed, 2 without torch or a GPU. With no --order it runs both, each in a
child process, and exits with the worse status.
"""
import argparse
import ctypes
import os
import subprocess
import sys

failures = 0


def check(ok, what):
    global failures
    print("%s %s" % ("PASS" if ok else "FAIL", what), flush=True)
    failures += 0 if ok else 1


def context_active(device=0):
    """Whether the device's primary context is active, from the driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) != 0:
        return None
    return bool(active.value)


def run(order):
    try:
        import torch
    except ImportError as error:
        print("SKIP torch not importable:", error)
        return 2
    if not torch.cuda.is_available():
        print("SKIP torch sees no GPU")
        return 2
    libc = ctypes.CDLL(None)  # the shim's posix_memalign/mlock/free
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_size_t]
    for name in ("mlock", "munlock"):
        getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    if not hasattr(libc, "pinshim_is_registered"):
        print("FAIL not running under LD_PRELOAD=libpinshim.so")
        return 1
    libc.pinshim_is_registered.argtypes = [ctypes.c_void_p]
    label = "torch (%s)" % ("context first" if order == "context" else "no context yet")
    torch.cuda.init()
    if order == "context":
        torch.zeros(1, device="cuda")
    check(context_active() == (order == "context"),
          "%s: primary context active before the lock: %s" % (label, context_active()))
    n = 64 << 20
    pointer = ctypes.c_void_p()
    assert libc.posix_memalign(ctypes.byref(pointer), 4096, n) == 0
    host = torch.frombuffer((ctypes.c_uint8 * n).from_address(pointer.value), dtype=torch.uint8)
    host.copy_(torch.arange(n, dtype=torch.int64).to(torch.uint8))
    check(not host.is_pinned(), "%s: not pinned before mlock" % label)
    check(libc.mlock(pointer, n) == 0, "%s: mlock of 64 MiB" % label)
    registered = libc.pinshim_is_registered(pointer)
    if order == "context":
        check(registered == 1, "%s: registered when mlock returned (no drain)" % label)
        check(host.is_pinned(), "%s: is_pinned() True when mlock returned" % label)
    else:
        check(registered == 0, "%s: not registered when mlock returned (deferred)" % label)
        check(context_active() is False, "%s: the shim made no context" % label)
        torch.zeros(1, device="cuda")  # the program's first CUDA work
        libc.pinshim_drain()
        check(libc.pinshim_is_registered(pointer) == 1,
              "%s: registered once the program had a context (after pinshim_drain)" % label)
        check(host.is_pinned(), "%s: is_pinned() True then" % label)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        device = host.to("cuda", non_blocking=True)
        back = torch.empty_like(host)
        back.copy_(device, non_blocking=True)
    stream.synchronize()
    check(torch.equal(back, host), "%s: round trip keeps the data" % label)
    libc.munlock(pointer, n)
    check(not host.is_pinned(), "%s: is_pinned() False after munlock" % label)
    check(libc.pinshim_is_registered(pointer) == 0,
          "%s: pinshim_is_registered 0 after munlock" % label)
    del host
    libc.free(pointer)
    print("%s: %s: %d check(s) failed" % ("FAIL" if failures else "PASS", label, failures))
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--order", choices=["context", "none"])
    args = parser.parse_args()
    if args.order:
        return run(args.order)
    worst = 0
    for order in ("context", "none"):
        status = subprocess.call([sys.executable, os.path.abspath(__file__), "--order", order])
        worst = status if status not in (0, 2) or worst == 0 else worst
    return worst


if __name__ == "__main__":
    sys.exit(main())
