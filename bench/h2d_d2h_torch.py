#!/usr/bin/env python3
"""Host<->device copy bandwidth through PyTorch, per kind of host tensor.

Arms (each at every size, both directions, copy_(non_blocking=True) on a
non-default stream, timed with CUDA events):
  pageable   torch.empty(n, dtype=uint8)
  pin_memory torch.empty(n).pin_memory()
  mlock      a tensor over a posix_memalign'ed + mlock'ed buffer, no shim
  shim       the same under LD_PRELOAD=libpinshim.so (this script re-executes
             itself; the child prints one RESULT line that the parent parses)
  register   the same buffer with torch.cuda.cudart().cudaHostRegister
For each arm it reports tensor.is_pinned(). posix_memalign and mlock are
called through ctypes.CDLL(None), so that under LD_PRELOAD they are the shim's
(CDLL("libc.so.6").mlock would bypass it).

Exits 2 with a message when torch or a GPU is missing.
"""
import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = ["pageable", "pin_memory", "mlock", "shim", "register"]


def find_shim(explicit):
    if explicit:
        return os.path.abspath(explicit)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    for candidate in [os.environ.get("PINSHIM_LIB", ""),
                      os.path.join(root, "build", "src", "libpinshim.so"),
                      os.path.join(root, "build-gpu", "src", "libpinshim.so")]:
        if candidate and os.path.exists(candidate):
            return os.path.abspath(candidate)
    return None


class LockedBuffer:
    """A page-aligned buffer from posix_memalign, locked with mlock."""

    def __init__(self, nbytes, lock=True):
        self.libc = ctypes.CDLL(None, use_errno=True)  # the shim's symbols when preloaded
        self.libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                             ctypes.c_size_t]
        self.libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.nbytes = nbytes
        pointer = ctypes.c_void_p()
        if self.libc.posix_memalign(ctypes.byref(pointer), 4096, nbytes) != 0:
            raise MemoryError("posix_memalign(%d) failed" % nbytes)
        self.address = pointer.value
        ctypes.memset(self.address, 0x5A, nbytes)
        self.locked = False
        if lock:
            if self.libc.mlock(ctypes.c_void_p(self.address), nbytes) != 0:
                error = ctypes.get_errno()
                self.libc.free(ctypes.c_void_p(self.address))
                raise OSError(error, "mlock(%d): %s" % (nbytes, os.strerror(error)))
            self.locked = True
            # Registration is asynchronous by default: wait until the shim has
            # registered the buffer (nothing to wait for without the shim).
            drain = getattr(self.libc, "pinshim_drain", None)
            if drain is not None:
                drain()

    def tensor(self, torch):
        array = (ctypes.c_uint8 * self.nbytes).from_address(self.address)
        return torch.frombuffer(array, dtype=torch.uint8)

    def release(self):
        if self.locked:
            self.libc.munlock(ctypes.c_void_p(self.address), self.nbytes)
        self.libc.free(ctypes.c_void_p(self.address))


def time_copies(torch, dst, src, stream, warmup, iters):
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            dst.copy_(src, non_blocking=True)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record(stream)
        for i in range(iters):
            dst.copy_(src, non_blocking=True)
            events[i + 1].record(stream)
    stream.synchronize()
    seconds = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(iters)]
    return statistics.median(seconds), min(seconds)


def run_arm(torch, arm, nbytes, device_tensor, stream, warmup, iters):
    row = {"arm": arm, "bytes": nbytes, "ok": False, "error": None, "is_pinned": None,
           "shim_registered": None}
    buffer = None
    registered = False
    cudart = torch.cuda.cudart()
    began = time.perf_counter()
    try:
        if arm == "pageable":
            host = torch.empty(nbytes, dtype=torch.uint8).fill_(0x5A)
        elif arm == "pin_memory":
            host = torch.empty(nbytes, dtype=torch.uint8).fill_(0x5A).pin_memory()
        elif arm in ("mlock", "shim"):
            buffer = LockedBuffer(nbytes)
            host = buffer.tensor(torch)
        elif arm == "register":
            buffer = LockedBuffer(nbytes, lock=False)
            host = buffer.tensor(torch)
            error = cudart.cudaHostRegister(buffer.address, nbytes, 0)
            if int(error) != 0:
                raise RuntimeError("cudaHostRegister: %s" % error)
            registered = True
        row["setup_s"] = time.perf_counter() - began
        row["is_pinned"] = bool(host.is_pinned())
        try:
            libc = ctypes.CDLL(None)
            is_registered = libc.pinshim_is_registered
            is_registered.argtypes = [ctypes.c_void_p]
            row["shim_registered"] = int(is_registered(ctypes.c_void_p(host.data_ptr())))
        except AttributeError:
            pass
        device = device_tensor[:nbytes]
        row["h2d_median_s"], row["h2d_min_s"] = time_copies(torch, device, host, stream, warmup,
                                                            iters)
        row["d2h_median_s"], row["d2h_min_s"] = time_copies(torch, host, device, stream, warmup,
                                                            iters)
        for key in ("h2d", "d2h"):
            row[key + "_gbps"] = nbytes / row[key + "_median_s"] / 1e9
            row[key + "_best_gbps"] = nbytes / row[key + "_min_s"] / 1e9
        row["ok"] = True
        del host
    except Exception as error:  # one arm failing must not stop the others
        row["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        torch.cuda.synchronize()
        if registered:
            cudart.cudaHostUnregister(buffer.address)
        if buffer is not None:
            buffer.release()
    print("h2d_d2h_torch: %-10s %6d MiB %s" % (arm, nbytes >> 20, "done" if row["ok"]
                                                else row["error"]), file=sys.stderr)
    return row


def run_here(torch, arms, sizes, warmup, iters):
    device_tensor = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    rows = []
    for arm in arms:
        for nbytes in sizes:
            rows.append(run_arm(torch, arm, nbytes, device_tensor, stream, warmup, iters))
    return rows


def run_shim_child(args, sizes, shim):
    """Re-executes this script under the shim for the shim arm."""
    stats = tempfile.NamedTemporaryFile(prefix="pinshim-torch-stats-", suffix=".json",
                                        delete=False)
    stats.close()
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("PINSHIM_")}
    env["LD_PRELOAD"] = shim
    env["PINSHIM_STATS"] = stats.name
    command = [sys.executable, os.path.abspath(__file__), "--child-shim",
               "--sizes", ",".join(str(s >> 20) for s in sizes),
               "--warmup", str(args.warmup), "--iters", str(args.iters)]
    rows, shim_stats = [], None
    try:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True,
                              timeout=args.child_timeout)
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                rows = json.loads(line[len("RESULT "):])
        if not rows:
            raise RuntimeError("child under the shim exited with %d and printed no result"
                               % done.returncode)
    except (subprocess.TimeoutExpired, RuntimeError, ValueError) as error:
        rows = [{"arm": "shim", "bytes": s, "ok": False, "error": str(error)} for s in sizes]
    try:
        with open(stats.name) as handle:
            shim_stats = json.load(handle)
    except (OSError, ValueError):
        shim_stats = None
    os.unlink(stats.name)
    return rows, shim_stats


def print_table(rows, shim_stats, warmup, iters):
    print("\n%-10s %8s %7s %4s %10s %10s %10s %10s %10s" % (
        "arm", "MiB", "pinned", "reg", "setup ms", "H2D GB/s", "H2D best", "D2H GB/s",
        "D2H best"))
    for row in rows:
        if not row.get("ok"):
            print("%-10s %8d  failed: %s" % (row["arm"], row["bytes"] >> 20, row.get("error")))
            continue
        registered = row.get("shim_registered")
        print("%-10s %8d %7s %4s %10.2f %10.2f %10.2f %10.2f %10.2f" % (
            row["arm"], row["bytes"] >> 20, row["is_pinned"],
            "-" if registered is None else registered, row["setup_s"] * 1e3, row["h2d_gbps"],
            row["h2d_best_gbps"], row["d2h_gbps"], row["d2h_best_gbps"]))
    print("  pinned: tensor.is_pinned(); reg: pinshim_is_registered (- = shim absent)")
    print("  GB/s from the median (and best) of %d timed copies after %d warm-up copies"
          % (iters, warmup))
    # The seed's question: does the shim's arm copy at pin_memory()'s speed?
    by_arm = {(row["arm"], row["bytes"]): row for row in rows if row.get("ok")}
    ratios = []
    for (arm, nbytes), row in sorted(by_arm.items(), key=lambda item: item[0][1]):
        pinned = by_arm.get(("pin_memory", nbytes))
        if arm == "shim" and pinned:
            ratios.append("%d MiB H2D %.2f D2H %.2f" % (
                nbytes >> 20, row["h2d_gbps"] / pinned["h2d_gbps"],
                row["d2h_gbps"] / pinned["d2h_gbps"]))
    if ratios:
        print("  shim / pin_memory (median GB/s, this run): " + "; ".join(ratios))
    if shim_stats:
        print("  shim (PINSHIM_STATS): %d registrations took %.3f s in cudaHostRegister"
              % (shim_stats["register"]["ok"], shim_stats["register"]["seconds"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4,64,256,1024", help="MiB, comma separated")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--shim", help="libpinshim.so (default: build/src next to the source)")
    parser.add_argument("--child-timeout", type=int, default=600, help=argparse.SUPPRESS)
    parser.add_argument("--child-shim", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) << 20 for s in args.sizes.split(",") if s]

    try:
        import torch
    except ImportError as error:
        print("h2d_d2h_torch: PyTorch is not installed (%s); nothing measured." % error,
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("h2d_d2h_torch: torch %s sees no usable CUDA device; nothing measured."
              % torch.__version__, file=sys.stderr)
        return 2
    torch.cuda.init()

    if args.child_shim:
        rows = run_here(torch, ["shim"], sizes, args.warmup, args.iters)
        print("RESULT " + json.dumps(rows), flush=True)
        return 0

    try:
        import resource
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY,
                                                     resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass  # not allowed: mlock of large sizes may fail, and says so
    rows = run_here(torch, ["pageable", "pin_memory", "mlock", "register"], sizes, args.warmup,
                    args.iters)
    shim = find_shim(args.shim)
    shim_stats = None
    if shim:
        shim_rows, shim_stats = run_shim_child(args, sizes, shim)
    else:
        shim_rows = [{"arm": "shim", "bytes": s, "ok": False,
                      "error": "libpinshim.so not found (pass --shim PATH)"} for s in sizes]
    rows = rows[:3 * len(sizes)] + shim_rows + rows[3 * len(sizes):]
    device = torch.cuda.get_device_name(0)
    print("device: %s, torch %s, CUDA %s" % (device, torch.__version__, torch.version.cuda))
    print_table(rows, shim_stats, args.warmup, args.iters)
    if args.json:
        document = {
            "benchmark": "h2d_d2h_torch", "date": time.strftime("%Y-%m-%d"),
            "host": socket.gethostname(), "device": device, "torch": torch.__version__,
            "cuda": torch.version.cuda, "shim": shim, "warmup": args.warmup,
            "iters": args.iters,
            "shim_stats": None if not shim_stats else {
                "register_ok": shim_stats["register"]["ok"],
                "register_seconds": shim_stats["register"]["seconds"],
                "unregister_seconds": shim_stats["unregister"]["seconds"],
                "cudart": shim_stats.get("cudart")},
            "results": rows,
        }
        with open(args.json, "w") as handle:
            json.dump(document, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
