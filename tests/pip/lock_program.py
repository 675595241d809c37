"""A Python program that locks memory, run under the shim by test_wheel.py (the
installed pinshim command) and test_module.py (LD_PRELOAD from the build tree).

It locks a 4 MiB buffer from posix_memalign with mlock through the global scope
(ctypes.CDLL(None).mlock: the shim's mlock, not libc's own), asks the pinshim
module what the shim did, unlocks it, and locks it again for the exit, so the
shim's statistics count two registrations, one of them live at exit. It prints
one JSON object of what it saw and exits 1 at the first check that fails.

  python lock_program.py [--installed]
--installed: the module comes from the wheel, so library_path() must name the
library that LD_PRELOAD names.
"""

import ctypes
import json
import os
import sys

import pinshim

SIZE = 4 << 20


class FakeStorage:
    """Quacks like torch.UntypedStorage."""

    def __init__(self, address, nbytes):
        self.address, self.size = address, nbytes

    def data_ptr(self):
        return self.address

    def nbytes(self):
        return self.size


class FakeTensor:
    """Quacks like a torch.Tensor viewing part of a storage."""

    def __init__(self, storage):
        self.storage = storage

    def untyped_storage(self):
        return self.storage

    def data_ptr(self):
        return self.storage.address + 4096


def check(condition, what, **details):
    if not condition:
        print(f"lock_program: FAILED: {what} {details}", file=sys.stderr)
        sys.exit(1)


def main():
    installed = "--installed" in sys.argv[1:]
    seen = {}
    check(pinshim.is_loaded(), "pinshim.is_loaded() under the shim")
    seen["version"] = pinshim.version()
    check(seen["version"] == pinshim.__version__, "the shim's version is the module's",
          shim=seen["version"], module=pinshim.__version__)
    if installed:
        preloaded = os.environ.get("LD_PRELOAD", "").split(":")[0]
        seen["library_path"] = pinshim.library_path()
        check(os.path.samefile(preloaded, seen["library_path"]),
              "LD_PRELOAD names pinshim.library_path()", preload=preloaded,
              library_path=seen["library_path"])

    # The C struct is as large as the Python one: the shim copies at most its
    # own size into a larger buffer.
    raw = ctypes.CDLL(None).pinshim_get_counters
    raw.restype = ctypes.c_size_t
    raw.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    scratch = ctypes.create_string_buffer(4096)
    seen["c_struct_size"] = raw(scratch, 4096)
    check(seen["c_struct_size"] == ctypes.sizeof(pinshim.Counters),
          "sizeof(struct pinshim_counters) is sizeof(pinshim.Counters)",
          c=seen["c_struct_size"], python=ctypes.sizeof(pinshim.Counters))

    # As DeepSpeed's "native pinned" buffers: posix_memalign + mlock, never freed.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mlock.argtypes = libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_size_t]
    pointer = ctypes.c_void_p()
    check(libc.posix_memalign(ctypes.byref(pointer), 4096, SIZE) == 0, "posix_memalign")
    address = pointer.value
    view = (ctypes.c_char * SIZE).from_address(address)

    before = pinshim.counters()
    check(before.filled == ctypes.sizeof(pinshim.Counters), "counters() fills every field",
          filled=before.filled)
    check(not pinshim.is_registered(address), "nothing registered before the lock")
    check(libc.mlock(address, SIZE) == 0, "mlock", errno=os.strerror(ctypes.get_errno()))
    check(pinshim.drain() == 0, "nothing waits for a context")
    locked = pinshim.counters()
    seen["after_lock"] = locked.as_dict()
    check(locked.register_ok == before.register_ok + 1, "one registration", counters=seen)
    check(locked.register_bytes - before.register_bytes == SIZE, "4 MiB registered",
          counters=seen)
    check(locked.lock_calls >= before.lock_calls + 1, "the lock is counted", counters=seen)
    check(locked.live_ranges == 1 and locked.live_bytes == SIZE, "one live range",
          counters=seen)
    for what, obj in (("the first byte", address), ("the last byte", address + SIZE - 1),
                      ("a ctypes view", view), ("a pointer", ctypes.c_void_p(address)),
                      ("a storage", FakeStorage(address, SIZE)),
                      ("a tensor's storage", FakeTensor(FakeStorage(address, SIZE)))):
        check(pinshim.is_registered(obj), f"is_registered({what})")
    check(not pinshim.is_registered(FakeStorage(address, SIZE + 4096)),
          "a storage that runs past the registration is not registered")
    check("torch" not in sys.modules, "torch is not imported")

    check(libc.munlock(address, SIZE) == 0, "munlock", errno=os.strerror(ctypes.get_errno()))
    unlocked = pinshim.counters()
    seen["after_unlock"] = unlocked.as_dict()
    check(not pinshim.is_registered(address), "unregistered by munlock")
    check(unlocked.unregister_munlock == locked.unregister_munlock + 1,
          "the unregistration is counted as munlock's", counters=seen)
    check(unlocked.live_ranges == 0, "nothing live after munlock", counters=seen)

    # Locked again and left so: the shim unregisters it at exit.
    check(libc.mlock(address, SIZE) == 0, "mlock again", errno=os.strerror(ctypes.get_errno()))
    pinshim.drain()
    check(pinshim.is_registered(address), "registered again")
    seen["register_ok"] = pinshim.counters().register_ok
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
