/* The program's own HIP registrations: hipHostRegister and hipHostUnregister
 * (PyTorch on ROCm, DeepSpeed through torch.cuda.cudart(), which is HIP
 * there). As for CUDA (src/cuda/cuda_interpose.c): a call through the
 * global symbol scope reaches these first; the shim hands over its pages
 * and forwards to the definition the caller would have reached. */
#include "accelerator.h"
#include "interpose_internal.h"
#include "runtime.h"

#include <stdint.h>

#define PINSHIM_EXPORT __attribute__((visibility("default")))

enum { HIP_SUCCESS_CODE = 0, HIP_ERROR_INSUFFICIENT_DRIVER = 35 };

static const char *const hip_sonames[] = {"libamdhip64.so.7", "libamdhip64.so.6",
                                          "libamdhip64.so.5", "libamdhip64.so", NULL};

static const struct program_host_calls hip_calls = {&hip_vendor, "hipHostRegister",
                                                    "hipHostUnregister", HIP_SUCCESS_CODE};

PINSHIM_EXPORT int hipHostRegister(void *ptr, size_t size, unsigned int flags)
{
    program_host_register_fn next = (program_host_register_fn)interpose_next_symbol(
        "hipHostRegister", (void *)hipHostRegister, __builtin_return_address(0), hip_sonames);
    if (next == NULL)
        return HIP_ERROR_INSUFFICIENT_DRIVER; /* no HIP runtime in the process at all */
    return program_host_register(&hip_calls, next, ptr, size, flags);
}

PINSHIM_EXPORT int hipHostUnregister(void *ptr)
{
    program_host_unregister_fn next = (program_host_unregister_fn)interpose_next_symbol(
        "hipHostUnregister", (void *)hipHostUnregister, __builtin_return_address(0), hip_sonames);
    if (next == NULL)
        return HIP_ERROR_INSUFFICIENT_DRIVER;
    return program_host_unregister(&hip_calls, next, ptr);
}
