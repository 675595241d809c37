"""Python multiprocessing workers that lock memory, as issue 10 reported them:
a Pool(2) and one Process, in the start method given on the command line
(fork or spawn). Each worker mlocks 4 MiB through ctypes.CDLL(None) (the
global scope, where the shim is) and keeps it until it ends; fork-context
workers end with os._exit, spawn-context ones with sys.exit. The parent
locks nothing and prints one line per worker it started: "worker PID"."""

import ctypes
import multiprocessing
import os
import sys

SIZE = 4 << 20
_held = []


def lock_buffer(size):
    """A buffer of size bytes from posix_memalign, touched and mlocked through
    ctypes.CDLL(None) (the global scope, where the shim is); its address."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_size_t]
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pointer = ctypes.c_void_p()
    if libc.posix_memalign(ctypes.byref(pointer), 4096, size) != 0:
        raise MemoryError("posix_memalign")
    ctypes.memset(pointer, 1, size)
    if libc.mlock(pointer, size) != 0:
        raise OSError(ctypes.get_errno(), "mlock")
    return pointer.value


def lock_four_mib(_=None):
    """One 4 MiB buffer per worker, kept until it ends."""
    if not _held:
        _held.append(lock_buffer(SIZE))
    return os.getpid()


def process_main(queue):
    queue.put(lock_four_mib())


def main():
    context = multiprocessing.get_context(sys.argv[1])
    pool = context.Pool(2, initializer=lock_four_mib)
    pool.map(lock_four_mib, range(8))
    pids = [worker.pid for worker in pool._pool]  # the two workers it started
    pool.close()
    pool.join()
    queue = context.Queue()
    process = context.Process(target=process_main, args=(queue,))
    process.start()
    queue.get(timeout=60)
    process.join(60)
    pids.append(process.pid)
    for pid in pids:
        print(f"worker {pid}")


if __name__ == "__main__":
    main()
