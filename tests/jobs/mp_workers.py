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


def lock_four_mib(_=None):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_size_t]
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    if not _held:
        pointer = ctypes.c_void_p()
        if libc.posix_memalign(ctypes.byref(pointer), 4096, SIZE) != 0:
            raise MemoryError("posix_memalign")
        ctypes.memset(pointer, 1, SIZE)
        if libc.mlock(pointer, SIZE) != 0:
            raise OSError(ctypes.get_errno(), "mlock")
        _held.append(pointer.value)
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
