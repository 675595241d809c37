"""Multiprocessing pools whose workers lock a 4 MiB buffer per task and keep
it, as a cache does, ended by Pool.__exit__ (which terminates the workers
with SIGTERM): issue 19's reproduction. Arguments: METHOD:TASKS ..., each a
pool of 2 workers in that start method mapping that many tasks, one after
the other. Prints the workers' pids.

    pinshim --context create --stats DIR/stats.%h.%p.json -- \\
        python3 tests/jobs/pool_workers.py fork:4 spawn:6
    pinshim report DIR
"""
import multiprocessing
import os
import sys

from mp_workers import lock_buffer

SIZE = 4 << 20
cache = {}


def work(task):
    """Locks a buffer for the task and keeps it, as a cache does."""
    cache[task] = lock_buffer(SIZE)
    return os.getpid()


def main():
    pids = set()
    for argument in sys.argv[1:]:
        method, tasks = argument.split(":")
        with multiprocessing.get_context(method).Pool(2) as pool:
            pids |= set(pool.map(work, range(int(tasks))))
    print(" ".join(str(pid) for pid in sorted(pids)))


if __name__ == "__main__":
    main()
