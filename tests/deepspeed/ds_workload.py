#!/usr/bin/env python3
"""DeepSpeed's own native locked tensors, through DeepSpeed's own code.

  ds_workload.py aio    --result FILE --report FILE --workdir DIR [--cycles N]
  ds_workload.py native --result FILE --report FILE [--cycles N]

aio: ZeRO-Infinity's swap buffers. DeepSpeed's SwapBufferManager
(deepspeed/runtime/swap_tensor/utils.py) gets them from
aio_handle.new_cpu_locked_tensor (csrc/pin_memory: posix_memalign(page) +
mlock) and releases them with aio_handle.free_cpu_locked_tensor (munlock +
free). DeepSpeed never registers these with CUDA itself, whatever the
accelerator. 59 buffers of 4 MiB to 256 MiB (1112 MiB) are held together, one
manager per size; each cycle releases and remakes every manager in turn while
the others stay held, then moves data through one size class with aio
sync_pwrite, sync_pread, async_pread and ZeRO's swap_out_tensors /
swap_in_tensors (async_pwrite / async_pread + wait), checking every byte.

native: DS_PIN_MEMORY_BACKEND=native with a CUDA-like accelerator
(cuda_like_accelerator.py): get_accelerator().pin_memory / pin_empty lock a
buffer (the same csrc/pin_memory allocator) and DeepSpeed registers it itself
right after, through torch._C._cudart.cudaHostRegister and so the global symbol
scope; unpin_memory, or DeepSpeed's weakref finalizer once the last reference
is gone, unregisters it and frees it. The same 59 sizes (a third of them 4004
and a third 8008 bytes short, as tensors of any length are pinned) and three
under the shim's 64 KiB threshold, released and pinned again each cycle,
alternately by unpin_memory and by dropping the last reference; a third of the
pins are pin_empty (no copy), the rest pin_memory (a copy of the source).

The result file holds only what must be the same with and without pinshim
(what DeepSpeed returned, the data checks, DeepSpeed's warnings, the CUDA
last-error slot after each DeepSpeed call). The report (JSON) holds what may
differ: times, what the shim held, where the global scope resolves.

Environment: PINSHIM_DS_FAKE_CUDART (the test double, loaded with RTLD_GLOBAL
before torch so that torch's binding reaches it), FAKE_CUDART_LOG (the double's
log; this program appends "mark" lines to it so that the checker can put
DeepSpeed's calls and the runtime's calls in one order).
"""

import argparse
import ctypes
import gc
import json
import logging
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_like_accelerator  # noqa: E402

MiB = 1 << 20
# (MiB, how many): 59 buffers, 1112 MiB held together.
SIZE_CLASSES = [(4, 30), (8, 12), (16, 8), (32, 4), (64, 2), (128, 2), (256, 1)]


class Marks:
    """Appends 'mark <pid> <event> 0x<ptr> <size> <tag>' to the double's log
    (each line one write(2) on an O_APPEND descriptor, as the double's own)."""

    def __init__(self):
        path = os.environ.get("FAKE_CUDART_LOG")
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self.pid = os.getpid()

    def __call__(self, event, ptr=0, size=0, tag="-"):
        if self.fd is not None:
            os.write(self.fd, f"mark {self.pid} {event} 0x{ptr:x} {size} {tag}\n".encode())


class Runtime:
    """The CUDA runtime as the program sees it through the global scope, and the
    shim's query functions when it is loaded."""

    def __init__(self, fake):
        self.scope = ctypes.CDLL(None)
        self.fake = fake
        self.peeks = 0
        self.peek_errors = {}
        self.shim_is_registered = getattr(self.scope, "pinshim_is_registered", None)
        self.shim_drain = getattr(self.scope, "pinshim_drain", None)
        if self.shim_is_registered is not None:
            self.shim_is_registered.argtypes = [ctypes.c_void_p]
            self.shim_drain.restype = ctypes.c_size_t
        self.scope.cudaPointerGetAttributes.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.fake.fake_cudart_live_count.restype = ctypes.c_size_t

    def peek(self, after):
        """cudaPeekAtLastError after a DeepSpeed call: what the program's next
        CUDA error check would see."""
        self.peeks += 1
        error = self.scope.cudaPeekAtLastError()
        if error:
            key = f"{after}: {error}"
            self.peek_errors[key] = self.peek_errors.get(key, 0) + 1
        return error

    def pointer_type(self, ptr):
        attributes = ctypes.create_string_buffer(64)
        error = self.scope.cudaPointerGetAttributes(attributes, ctypes.c_void_p(ptr))
        # The query itself may fail; clear what it left so peek() reports
        # DeepSpeed's errors only.
        if error:
            self.scope.cudaGetLastError()
            return -error
        return int.from_bytes(attributes.raw[:4], "little", signed=True)

    def shim_holds(self, ptr):
        if self.shim_is_registered is None:
            return None
        return bool(self.shim_is_registered(ctypes.c_void_p(ptr)))


class WarningCounter(logging.Handler):
    """DeepSpeed's warnings and errors (its logger), for the result."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Timer:

    def __init__(self):
        self.seconds = {}
        self.calls = {}

    def add(self, name, seconds):
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def as_dict(self):
        return {name: {"calls": self.calls[name], "seconds": round(self.seconds[name], 6)} for name in self.seconds}


def fill(torch, buffer, base, seed):
    ints = buffer.view(torch.int32)
    ints.copy_(base[:ints.numel()])
    ints.add_(seed)


def holds_pattern(torch, buffer, base, seed):
    ints = buffer.view(torch.int32)
    return torch.equal(ints, base[:ints.numel()] + seed)


def aio_path(args, torch, out, report, marks, runtime):
    import deepspeed
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    deepspeed.init_distributed(dist_backend="gloo")
    from deepspeed.ops.op_builder import AsyncIOBuilder
    from deepspeed.runtime.swap_tensor.utils import SwapBufferManager, swap_in_tensors, swap_out_tensors

    aio = AsyncIOBuilder().load(verbose=False)
    # ZeRO's aio defaults (deepspeed/runtime/swap_tensor/aio_config.py).
    handle = aio.aio_handle(1 * MiB, 8, False, True, 1)
    timer = Timer()
    managers = [None] * len(SIZE_CLASSES)
    pointers = [[] for _ in SIZE_CLASSES]
    base = torch.arange(max(size for size, _ in SIZE_CLASSES) * MiB // 4, dtype=torch.int32)
    held_at_use = {"held": 0, "not_yet": 0}
    held_at_cycle_end = []
    counts = {"buffers": 0, "bytes": 0, "sync_pwrite": 0, "sync_pread": 0, "async_pread": 0,
              "swap_out": 0, "swap_in": 0, "bytes_verified": 0, "bad": 0}
    files = {}

    def make(k):
        size_mib, count = SIZE_CLASSES[k]
        marks("alloc-begin", 0, size_mib * MiB, f"class{k}")
        start = time.perf_counter()
        manager = SwapBufferManager(num_elems=size_mib * MiB // 4, count=count, dtype=torch.float32,
                                    aio_handle=handle)
        timer.add("SwapBufferManager() (new_cpu_locked_tensor + zero_)", time.perf_counter() - start)
        pointers[k] = [buffer.data_ptr() for buffer in manager.all_buffers]
        for ptr in pointers[k]:
            marks("alloc-end", ptr, size_mib * MiB, f"class{k}")
        runtime.peek("new_cpu_locked_tensor")
        counts["buffers"] += count
        counts["bytes"] += count * size_mib * MiB
        managers[k] = manager

    def release(k):
        size_mib, _ = SIZE_CLASSES[k]
        for ptr in pointers[k]:
            marks("free-begin", ptr, size_mib * MiB, f"class{k}")
        start = time.perf_counter()
        managers[k] = None  # SwapBufferManager.__del__: free_cpu_locked_tensor each
        timer.add("SwapBufferManager.__del__ (free_cpu_locked_tensor)", time.perf_counter() - start)
        for ptr in pointers[k]:
            marks("free-end", ptr, size_mib * MiB, f"class{k}")
        runtime.peek("free_cpu_locked_tensor")
        pointers[k] = []

    def timed(name, function, *call_args):
        start = time.perf_counter()
        value = function(*call_args)
        timer.add(name, time.perf_counter() - start)
        return value

    def check(buffer, seed):
        good = holds_pattern(torch, buffer, base, seed)
        counts["bytes_verified"] += buffer.numel() * 4
        if not good:
            counts["bad"] += 1
        return good

    def exercise(cycle, k):
        size_mib, count = SIZE_CLASSES[k]
        manager = managers[k]
        num_elems = size_mib * MiB // 4
        use = min(count, 2)
        buffers = manager.allocate(num_elems=num_elems, count=use, dtype=torch.float32)
        for buffer in buffers:
            held = runtime.shim_holds(buffer.data_ptr())
            if held is not None:
                held_at_use["held" if held else "not_yet"] += 1
        path_a = os.path.join(args.workdir, f"swap-{k}-a.bin")
        path_b = os.path.join(args.workdir, f"swap-{k}-b.bin")
        files[path_a] = True
        seed_a, seed_b = cycle * 7919 + k, cycle * 104729 + k
        first = buffers[0]
        fill(torch, first, base, seed_a)
        assert timed("sync_pwrite", handle.sync_pwrite, first, path_a) == 1
        runtime.peek("sync_pwrite")
        counts["sync_pwrite"] += 1
        if use == 2:
            files[path_b] = True
            fill(torch, buffers[1], base, seed_b)
            start = time.perf_counter()
            swap_out_tensors(handle, [buffers[1]], [path_b])
            assert handle.wait() == 1
            timer.add("swap_out_tensors + wait", time.perf_counter() - start)
            runtime.peek("swap_out_tensors")
            counts["swap_out"] += 1
        first.view(torch.int32).fill_(-7)
        assert timed("sync_pread", handle.sync_pread, first, path_a) == 1
        runtime.peek("sync_pread")
        counts["sync_pread"] += 1
        check(first, seed_a)
        first.view(torch.int32).fill_(-7)
        start = time.perf_counter()
        assert handle.async_pread(first, path_a) == 0
        assert handle.wait() == 1
        timer.add("async_pread + wait", time.perf_counter() - start)
        runtime.peek("async_pread")
        counts["async_pread"] += 1
        check(first, seed_a)
        if use == 2:
            first.view(torch.int32).fill_(-7)
            start = time.perf_counter()
            swap_in_tensors(handle, [first], [path_b])
            assert handle.wait() == 1
            timer.add("swap_in_tensors + wait", time.perf_counter() - start)
            runtime.peek("swap_in_tensors")
            counts["swap_in"] += 1
            check(first, seed_b)
        manager.free(buffers)
        del buffers, first

    started = time.perf_counter()
    n = len(SIZE_CLASSES)
    for cycle in range(args.cycles):
        order = [(cycle + i) % n for i in range(n)]
        for k in order:
            if managers[k] is not None:
                release(k)
            make(k)
        exercise(cycle, cycle % n)
        if runtime.shim_is_registered is not None:
            held_at_cycle_end.append(
                sum(1 for k in range(n) for ptr in pointers[k] if runtime.shim_holds(ptr)))
    for k in range(n):
        release(k)
    elapsed = time.perf_counter() - started
    for path in files:
        os.unlink(path)

    total_buffers = sum(count for _, count in SIZE_CLASSES)
    total_mib = sum(size * count for size, count in SIZE_CLASSES)
    out.append(f"aio path: {total_buffers} buffers held together "
               f"({', '.join(f'{c} x {s} MiB' for s, c in SIZE_CLASSES)}; {total_mib} MiB), "
               f"{args.cycles} cycles")
    out.append(f"locked tensors made by aio_handle.new_cpu_locked_tensor and released by "
               f"free_cpu_locked_tensor: {counts['buffers']} ({counts['bytes'] / MiB:.0f} MiB in all)")
    out.append(f"aio operations: sync_pwrite {counts['sync_pwrite']}, sync_pread {counts['sync_pread']}, "
               f"async_pread {counts['async_pread']}, swap_out_tensors {counts['swap_out']}, "
               f"swap_in_tensors {counts['swap_in']}")
    out.append(f"data verified: {counts['bytes_verified'] / MiB:.0f} MiB, "
               f"{counts['bad']} buffers with wrong data")
    report.update(path="aio", seconds=round(elapsed, 3), timers=timer.as_dict(), counts=counts,
                  shim_held_at_first_use=held_at_use if runtime.shim_is_registered else None,
                  shim_held_at_cycle_end=held_at_cycle_end or None, buffers_per_cycle=total_buffers)


def native_path(args, torch, out, report, marks, runtime, accelerator):
    from deepspeed.utils.pin_memory import get_active_native_pinned_memory

    pins = get_active_native_pinned_memory()
    if pins is None:
        raise SystemExit("DS_PIN_MEMORY_BACKEND=native is not in effect")
    timer = Timer()
    # (class MiB, bytes): the 59 sizes, a third of them 4004 and a third 8008
    # bytes short (tensors of any numel are pinned: the end is not page-aligned),
    # and 3 buffers under the shim's 64 KiB threshold, which only DeepSpeed registers.
    classes = [size for size, count in SIZE_CLASSES for _ in range(count)]
    sizes = [(size, size * MiB - (i % 3) * 4004) for i, size in enumerate(classes)]
    sizes += [(4, 4096), (4, 16396), (4, 61436)]
    base = torch.arange(max(classes) * MiB // 4, dtype=torch.int32)
    sources = {}
    for size in set(classes):
        source = torch.empty(size * MiB // 4, dtype=torch.float32)
        fill(torch, source, base, size)
        sources[size] = source
    held = [None] * len(sizes)
    counts = {"pins": 0, "pin_memory": 0, "pin_empty": 0, "unpin_memory": 0, "released_by_gc": 0,
              "deepspeed_registered": 0, "pointer_type_host_after_pin": 0,
              "pointer_type_unregistered_after_release": 0, "is_pinned": 0, "bad": 0, "bytes": 0,
              "needed_gc_collect": 0}
    shim_held_after_pin = {"yes": 0, "no": 0}

    def pin(i, cycle):
        size, nbytes = sizes[i]
        source = sources[size][:nbytes // 4]
        marks("alloc-begin", 0, nbytes, f"slot{i}")
        start = time.perf_counter()
        if (i + cycle) % 3 == 0:
            tensor = accelerator.pin_empty(source.shape, dtype=torch.float32)
            timer.add("pin_empty", time.perf_counter() - start)
            counts["pin_empty"] += 1
            ptr = tensor.data_ptr()
            marks("alloc-end", ptr, nbytes, f"slot{i}")
            runtime.peek("pin_empty")
            tensor.copy_(source)
        else:
            tensor = accelerator.pin_memory(source)
            timer.add("pin_memory", time.perf_counter() - start)
            counts["pin_memory"] += 1
            ptr = tensor.data_ptr()
            marks("alloc-end", ptr, nbytes, f"slot{i}")
            runtime.peek("pin_memory")
        counts["pins"] += 1
        counts["bytes"] += nbytes
        if ptr in pins._device_registered:
            counts["deepspeed_registered"] += 1
        if runtime.pointer_type(ptr) == 1:
            counts["pointer_type_host_after_pin"] += 1
        if accelerator.is_pinned(tensor):
            counts["is_pinned"] += 1
        holds = runtime.shim_holds(ptr)
        if holds is not None:
            shim_held_after_pin["yes" if holds else "no"] += 1
        if not holds_pattern(torch, tensor, base, size):
            counts["bad"] += 1
        held[i] = tensor

    def release(i, cycle):
        tensor = held[i]
        ptr = tensor.data_ptr()
        nbytes = sizes[i][1]
        marks("free-begin", ptr, nbytes, f"slot{i}")
        start = time.perf_counter()
        if (i + cycle) % 2 == 0:
            accelerator.unpin_memory(tensor)
            held[i] = None
            del tensor
            timer.add("unpin_memory", time.perf_counter() - start)
            counts["unpin_memory"] += 1
            what = "unpin_memory"
        else:
            held[i] = None
            del tensor  # the last reference: DeepSpeed's weakref.finalize releases it
            if ptr in pins._ranges:  # only if a reference cycle kept it
                gc.collect()
                counts["needed_gc_collect"] += 1
            timer.add("release by dropping the last reference", time.perf_counter() - start)
            counts["released_by_gc"] += 1
            what = "finalizer"
        marks("free-end", ptr, nbytes, f"slot{i}")
        runtime.peek(what)
        if runtime.pointer_type(ptr) == 0:
            counts["pointer_type_unregistered_after_release"] += 1

    started = time.perf_counter()
    for cycle in range(args.cycles):
        for i in range(len(sizes)):
            if held[i] is not None:
                release(i, cycle)
            pin(i, cycle)
    for i in range(len(sizes)):
        release(i, args.cycles)
    elapsed = time.perf_counter() - started

    total_bytes = sum(nbytes for _, nbytes in sizes)
    out.append(f"native path: DS_PIN_MEMORY_BACKEND=native, DS_PIN_MEMORY_REGISTER_DEVICE="
               f"{os.environ.get('DS_PIN_MEMORY_REGISTER_DEVICE', '(unset: 1)')}, accelerator "
               f"{type(accelerator).__name__} (register_host_memory is CUDA_Accelerator's)")
    out.append(f"{len(sizes)} buffers held together ({', '.join(f'{c} x {s} MiB' for s, c in SIZE_CLASSES)}, "
               f"a third of them 4004 and a third 8008 bytes short; and 4096, 16396 and 61436 bytes; "
               f"{total_bytes} bytes), {args.cycles} cycles")
    out.append(f"pins: {counts['pins']} ({counts['pin_memory']} pin_memory, {counts['pin_empty']} pin_empty; "
               f"{counts['bytes'] / MiB:.0f} MiB in all); releases: {counts['unpin_memory']} unpin_memory, "
               f"{counts['released_by_gc']} by dropping the last reference (DeepSpeed's weakref finalizer)")
    out.append(f"registered by DeepSpeed itself (register_host_memory returned True): "
               f"{counts['deepspeed_registered']} of {counts['pins']}")
    out.append(f"runtime says registered host memory right after the pin: "
               f"{counts['pointer_type_host_after_pin']} of {counts['pins']}; unregistered after the "
               f"release: {counts['pointer_type_unregistered_after_release']} of {counts['pins']}")
    out.append(f"accelerator.is_pinned: {counts['is_pinned']} of {counts['pins']}; "
               f"data wrong in {counts['bad']}")
    out.append(f"left in DeepSpeed's tables at the end: {len(pins._ranges)} ranges, "
               f"{len(pins._device_registered)} device registrations, {len(pins._finalizers)} finalizers")
    report.update(path="native", seconds=round(elapsed, 3), timers=timer.as_dict(), counts=counts,
                  shim_held_right_after_pin=shim_held_after_pin if runtime.shim_is_registered else None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("path", choices=["aio", "native"])
    parser.add_argument("--result", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--local_rank", type=int, default=0, help="passed by DeepSpeed's launcher")
    args = parser.parse_args()

    started = time.perf_counter()
    fake = cuda_like_accelerator.load_fake_cudart(os.environ["PINSHIM_DS_FAKE_CUDART"])
    # A GPU process initialises CUDA early (torch.cuda.init, its first tensor
    # on the GPU): here the double's cudaFree(NULL) makes device 0's primary
    # context, into which the shim's default mode registers.
    fake.cudaFree.argtypes = [ctypes.c_void_p]
    cuda_initialised = fake.cudaFree(None)
    import torch
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    warnings = WarningCounter()
    ds_logger.addHandler(warnings)
    accelerator = cuda_like_accelerator.install()
    runtime = Runtime(fake)
    marks = Marks()
    out, report = [], {}
    report["global_scope"] = {name: cuda_like_accelerator.global_scope_symbol_owner(name)
                              for name in ("cudaHostRegister", "cudaHostUnregister", "cudaPeekAtLastError")}
    report["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                          "python": sys.version.split()[0]}
    report["startup_seconds"] = round(time.perf_counter() - started, 3)
    report["cuda_initialised"] = cuda_initialised
    marks("start")
    if args.path == "aio":
        aio_path(args, torch, out, report, marks, runtime)
    else:
        native_path(args, torch, out, report, marks, runtime, accelerator)
    marks("end")
    if runtime.shim_drain is not None:
        runtime.shim_drain()
    report["fake_live_at_end"] = runtime.fake.fake_cudart_live_count()

    out.append(f"CUDA last-error slot after {runtime.peeks} DeepSpeed calls: "
               f"{sum(runtime.peek_errors.values())} not cudaSuccess"
               + (f" ({runtime.peek_errors})" if runtime.peek_errors else ""))
    out.append(f"DeepSpeed warnings and errors: {len(warnings.lines)}")
    out.extend(f"  {line}" for line in warnings.lines)
    with open(args.result, "w") as f:
        f.write("\n".join(out) + "\n")
    report["total_seconds"] = round(time.perf_counter() - started, 3)
    with open(args.report, "w") as f:
        json.dump(report, f, indent=1)
    print("\n".join(out))


if __name__ == "__main__":
    main()
