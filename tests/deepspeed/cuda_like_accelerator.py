"""A "CUDA-like" DeepSpeed accelerator for a machine without a GPU.

DeepSpeed's CUDA accelerator (deepspeed/accelerator/cuda_accelerator.py in
0.19.8) registers native pinned memory with

    result = int(torch.cuda.cudart().cudaHostRegister(address, num_bytes, 0))
    torch.cuda.check_error(result)

torch.cuda.cudart() is torch._C._cudart, a pybind11 module compiled into
libtorch_python.so, whose cudaHostRegister calls the runtime's
cudaHostRegister@libcudart.so.13: a dynamically linked call, resolved through
the process's global symbol scope (a preloaded pinshim first, then the
libraries loaded with RTLD_GLOBAL in load order).

This accelerator is DeepSpeed's CPU accelerator (so ops build for the CPU and
tensors live in host memory) whose register_host_memory and
unregister_host_memory ARE the CUDA accelerator's own methods, not copies. The
one stand-in: torch.cuda.cudart() first runs torch's lazy CUDA initialisation,
which needs a driver, so install() makes it return torch._C._cudart without
it. The calls then go, through the global scope, to the test double
(tests/fake_cudart) when install() has loaded it with RTLD_GLOBAL before torch
was imported; without that, to the real libcudart.so.13 that torch loads
(which answers 35 without a driver).

It is selected through DeepSpeed's own mechanism, set_accelerator().
"""

import ctypes
import os
import sys

_fake = None


def load_fake_cudart(path):
    """Loads the test double with RTLD_GLOBAL. Must run before `import torch`,
    so that it comes before torch's libcudart.so.13 in the global scope."""
    global _fake
    if "torch" in sys.modules:
        raise RuntimeError("load the fake CUDA runtime before importing torch")
    _fake = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return _fake


def global_scope_symbol_owner(name):
    """Which loaded object a dlsym(RTLD_DEFAULT, name) lookup finds (dladdr)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    libc = ctypes.CDLL(None)
    address = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
    info = DlInfo()
    libdl = ctypes.CDLL("libc.so.6")
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    if not libdl.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return "?"
    return os.path.basename(info.dli_fname.decode())


def make_accelerator():
    import torch
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    class CudaLikeAccelerator(CPU_Accelerator):
        # DeepSpeed's CUDA accelerator's own registration hooks and alignment.
        register_host_memory = CUDA_Accelerator.register_host_memory
        unregister_host_memory = CUDA_Accelerator.unregister_host_memory
        pin_memory_alignment = CUDA_Accelerator.pin_memory_alignment

    # torch.cuda.cudart() without torch.cuda._lazy_init() (which needs a driver).
    torch.cuda.cudart = lambda: torch._C._cudart
    return CudaLikeAccelerator()


def install():
    """Makes the CUDA-like accelerator DeepSpeed's current one."""
    from deepspeed.accelerator import set_accelerator
    accelerator = make_accelerator()
    set_accelerator(accelerator)
    return accelerator
