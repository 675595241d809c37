"""Ask libpinshim.so about the process it is loaded in, and find the library.

pinshim makes memory that a program locks with ``mlock`` DMA-pinned for CUDA
(``cudaHostRegister``) without changing the program. The shim has to be in the
process from its start: run the program under the ``pinshim`` command that
comes with this package (``pinshim --stats -- python train.py``, or
``python -m pinshim --stats -- python train.py``), or preload
:func:`library_path` yourself. Inside the program::

    import pinshim

    if pinshim.is_loaded():
        print(pinshim.counters().register_ok, "registrations so far")
        print(pinshim.is_registered(tensor))  # a torch.Tensor's storage, or an address

Nothing here loads the shim into the process, and ``torch`` is never imported:
a tensor is recognised by its methods. The functions look the shim's C API
(``include/pinshim.h``) up in the process's global scope, as
``dlsym(RTLD_DEFAULT, ...)`` would.
"""

import ctypes
import os
from typing import Any, Dict, Optional, Tuple

__all__ = [
    "Counters",
    "NotLoadedError",
    "counters",
    "drain",
    "is_loaded",
    "is_registered",
    "library_path",
    "version",
]

#: This package's version (that of the pinshim it was built from).
__version__ = "0.3.0"

# Where meson-python puts what the build installs to libdir: the library, the
# pinshim command, pinshim-report and pinshim-top, side by side (see meson.build).
_PRIVATE_DIR = ".pinshim.mesonpy.libs"
_LIBRARY = "libpinshim.so"


class NotLoadedError(RuntimeError):
    """The shim is not loaded in this process, so it cannot be asked anything."""


class Counters(ctypes.Structure):
    """A copy of the shim's counters: ``struct pinshim_counters`` of ``pinshim.h``.

    One annotation per field of the C struct, in its order; every field is a
    ``uint64_t``. Fields are only ever appended to the C struct, and
    :func:`counters` passes the size of this one, so an older or newer shim
    fills what both know. ``filled`` (set by :func:`counters`) is the number of
    bytes the shim filled; fields past it read 0.
    """

    register_ok: int  #: cudaHostRegister calls that succeeded
    register_failed: int  #: ... that failed (712, already registered, excluded)
    register_already_registered: int  #: answered 712: not the shim's range
    register_skipped_small: int  #: locks below PINSHIM_MIN_BYTES
    register_bytes: int  #: bytes successfully registered
    register_nanoseconds: int  #: time spent inside cudaHostRegister
    unregister_ok: int  #: cudaHostUnregister calls that succeeded
    unregister_failed: int
    unregister_munlock: int  #: unregistrations caused by munlock/munlockall
    unregister_free: int  #: ... by free
    unregister_realloc: int  #: ... by realloc/reallocarray
    unregister_munmap: int  #: ... by munmap
    unregister_mremap: int  #: ... by mremap
    unregister_mmap_fixed: int  #: ... by mmap(MAP_FIXED) over a registration
    unregister_exit: int  #: ... at process exit
    unregister_nanoseconds: int  #: time spent inside cudaHostUnregister
    live_ranges: int  #: registrations held right now
    live_bytes: int
    peak_bytes: int
    mlockall_calls: int  #: passed through, never registered
    lock_calls: int  #: mlock/mlock2/mmap(MAP_LOCKED) seen
    unlock_calls: int  #: munlock/munlockall seen
    # Since 0.2.0:
    unregister_program: int  #: given up because the program registered the pages itself
    program_registrations: int  #: the program's own cudaHostRegister calls that succeeded
    pending_ranges: int  #: locked ranges waiting for the program's CUDA context now
    pending_bytes: int
    queued_ranges: int  #: locked ranges waiting for the registration thread now
    # Since 0.3.0:
    unregister_mprotect: int  #: read-only registrations made again writable by mprotect
    # Since 0.4.0:
    unregister_join: int  #: undone to register a run again whole (it grew or joined)
    held_ranges: int  #: locked ranges tracked and not registered now
    held_bytes: int

    def as_dict(self) -> Dict[str, int]:
        """The fields the shim filled, by name."""
        filled = getattr(self, "filled", ctypes.sizeof(self))
        names = [field[0] for field in self._fields_]
        return {
            name: getattr(self, name)
            for name in names
            if getattr(Counters, name).offset + getattr(Counters, name).size <= filled
        }


# The C field list, made from the annotations above (tests/pip/test_module.py
# checks it against include/pinshim.h).
Counters._fields_ = [(name, ctypes.c_uint64) for name in Counters.__annotations__]

_Api = Tuple[Any, Any, Any]
_api: Optional[_Api] = None


def _shim_api() -> Optional[_Api]:
    """pinshim_version, pinshim_is_registered and pinshim_get_counters of the
    loaded shim, or None when the process has no shim."""
    global _api
    if _api is None:
        scope = ctypes.CDLL(None)  # dlopen(NULL): the global scope, preloads included
        try:
            get_version = scope.pinshim_version
            is_registered_ = scope.pinshim_is_registered
            get_counters = scope.pinshim_get_counters
        except AttributeError:
            return None  # not cached: nothing to keep
        get_version.restype = ctypes.c_char_p
        get_version.argtypes = []
        is_registered_.restype = ctypes.c_int
        is_registered_.argtypes = [ctypes.c_void_p]
        get_counters.restype = ctypes.c_size_t
        get_counters.argtypes = [ctypes.POINTER(Counters), ctypes.c_size_t]
        _api = (get_version, is_registered_, get_counters)
    return _api


def _require_api() -> _Api:
    api = _shim_api()
    if api is None:
        try:
            how = f"LD_PRELOAD={library_path()}"
        except FileNotFoundError:
            how = "LD_PRELOAD=/path/to/libpinshim.so"
        raise NotLoadedError(
            "libpinshim.so is not loaded in this process; start the program under the shim "
            f"(pinshim -- python program.py, or {how})"
        )
    return api


def drain() -> int:
    """Waits until the shim's registration thread has registered every range
    locked so far that can be registered now (``pinshim_drain()``; with
    ``PINSHIM_ASYNC=on``, the default, lock calls return before their memory
    is registered). Returns the number of locked ranges still waiting for the
    program's CUDA context, which it does not wait for.

    Raises :class:`NotLoadedError` when the shim is not loaded, and
    :class:`RuntimeError` when the loaded shim predates ``pinshim_drain``
    (0.1.x registers inside the lock call: nothing to wait for).
    """
    _require_api()
    try:
        function = ctypes.CDLL(None).pinshim_drain
    except AttributeError:
        raise RuntimeError("the loaded libpinshim.so has no pinshim_drain (older than 0.2.0)")
    function.restype = ctypes.c_size_t
    function.argtypes = []
    return int(function())


def is_loaded() -> bool:
    """Whether libpinshim.so is loaded in this process (preloaded at its start)."""
    return _shim_api() is not None


def version() -> Optional[str]:
    """The loaded shim's version (``pinshim_version()``), or None when it is not loaded."""
    api = _shim_api()
    if api is None:
        return None
    raw = api[0]()
    return raw.decode("utf-8", "replace") if raw is not None else None


def counters() -> Counters:
    """The shim's counters now (``pinshim_get_counters``).

    The same counters the shim's statistics report at exit, while the program
    runs (``live_ranges``/``live_bytes`` are what is registered right now).
    ``result.filled`` is the number of bytes the shim copied: a shim older than
    this module leaves the fields it does not know at 0.

    Raises :class:`NotLoadedError` when the shim is not loaded.
    """
    result = Counters()
    filled = _require_api()[2](ctypes.byref(result), ctypes.sizeof(result))
    result.filled = int(filled)
    return result


def _address(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} is {type(value).__name__}, not an int address")
    if not 0 <= value < 1 << 64:
        raise ValueError(f"{what} {value:#x} is not an address")
    return value


def _extent(obj: Any) -> Tuple[int, int]:
    """(address, length in bytes) of what is asked about; length 1 for a bare address."""
    if isinstance(obj, bool):
        raise TypeError("is_registered takes an address, a tensor or a storage, not a bool")
    if isinstance(obj, int):
        return _address(obj, "the address"), 1
    if isinstance(obj, ctypes.c_void_p):
        return _address(obj.value or 0, "the pointer"), 1
    try:  # any other ctypes object: its own bytes
        return ctypes.addressof(obj), max(ctypes.sizeof(obj), 1)
    except TypeError:
        pass
    storage_of = getattr(obj, "untyped_storage", None)
    if callable(storage_of):  # torch.Tensor (torch >= 2.0): ask about its whole storage
        obj = storage_of()
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):  # torch.UntypedStorage, or a tensor-like without a storage
        start = _address(data_ptr(), f"{type(obj).__name__}.data_ptr()")
        length = getattr(obj, "nbytes", 1)
        if callable(length):
            length = length()
        return start, _address(length, f"{type(obj).__name__}.nbytes")
    raise TypeError(
        f"is_registered takes an int address, a torch.Tensor or storage (anything with "
        f"untyped_storage() or data_ptr()), or a ctypes object, not {type(obj).__name__}"
    )


def is_registered(obj: Any) -> bool:
    """Whether memory lies inside ranges the shim registered with CUDA.

    ``obj`` is an address (int or ``ctypes.c_void_p``), a ctypes object (its
    own bytes), a ``torch.Tensor`` (its whole storage, through
    ``untyped_storage()``), or a storage or anything else with ``data_ptr()``
    (and ``nbytes``). For more than one byte, the first and the last byte are
    asked about (``pinshim_is_registered``): the shim registers whole locked
    ranges. Empty storage is never registered. ``torch`` is not imported.

    Raises :class:`NotLoadedError` when the shim is not loaded, TypeError for
    anything else.
    """
    start, length = _extent(obj)
    check = _require_api()[1]
    if length == 0 or start == 0:
        return False
    last = start + length - 1
    if last >= 1 << 64:
        raise ValueError(f"{length} bytes from {start:#x} run past the address space")
    return bool(check(start)) and (last == start or bool(check(last)))


def _private_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(os.path.dirname(here), _PRIVATE_DIR)
    if os.path.isdir(candidate):
        return os.path.realpath(candidate)
    # Where pure and platform-specific packages go to different directories
    # (lib and lib64), the wheel's record says where its files went.
    try:
        from importlib import metadata

        located = str(metadata.distribution("pinshim").locate_file(_PRIVATE_DIR))
    except Exception:  # not installed from the wheel (a source checkout)
        located = ""
    if located and os.path.isdir(located):
        return os.path.realpath(located)
    raise FileNotFoundError(
        f"{_PRIVATE_DIR} is not next to {here}: this pinshim module is not installed from "
        "the pinshim wheel (pip install pinshim, or pip install . in a clone)"
    )


def _private_file(name: str) -> str:
    path = os.path.join(_private_dir(), name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing from the pinshim installation")
    return path


def library_path() -> str:
    """The absolute path of the libpinshim.so installed with this package.

    For launchers that build the workers' environment themselves:
    ``LD_PRELOAD=<library_path()>`` in torchrun's or Slurm's environment
    (``srun --export=ALL,LD_PRELOAD=...``) or in DeepSpeed's ``.deepspeed_env``
    (``pinshim --print-env`` prints such lines). It is the library the
    ``pinshim`` command of this installation preloads.

    Raises FileNotFoundError when the module was not installed from the wheel.
    """
    return _private_file(_LIBRARY)
