/* The program's own CUDA registrations: cudaHostRegister and
 * cudaHostUnregister.
 *
 * A program (or its framework: PyTorch, DeepSpeed, vLLM) that registers
 * memory itself reaches these definitions first, when its call goes through
 * the global symbol scope (a library linked against libcudart, or
 * dlsym(RTLD_DEFAULT)). The shim hands over the pages (its own registrations
 * there go first) and forwards to the definition the caller would have
 * reached without it. */
#include "accelerator.h"
#include "cuda_loader.h"
#include "interpose_internal.h"
#include "runtime.h"

#include <stdint.h>

#define PINSHIM_EXPORT __attribute__((visibility("default")))

enum { CUDA_SUCCESS_CODE = 0, CUDA_ERROR_INSUFFICIENT_DRIVER = 35 };

static const struct program_host_calls cuda_calls = {&cuda_vendor, "cudaHostRegister",
                                                     "cudaHostUnregister", CUDA_SUCCESS_CODE};

PINSHIM_EXPORT int cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    program_host_register_fn next = (program_host_register_fn)interpose_next_symbol(
        "cudaHostRegister", (void *)cudaHostRegister, __builtin_return_address(0),
        cuda_runtime_sonames);
    if (next == NULL)
        return CUDA_ERROR_INSUFFICIENT_DRIVER; /* no runtime in the process at all */
    return program_host_register(&cuda_calls, next, ptr, size, flags);
}

PINSHIM_EXPORT int cudaHostUnregister(void *ptr)
{
    program_host_unregister_fn next = (program_host_unregister_fn)interpose_next_symbol(
        "cudaHostUnregister", (void *)cudaHostUnregister, __builtin_return_address(0),
        cuda_runtime_sonames);
    if (next == NULL)
        return CUDA_ERROR_INSUFFICIENT_DRIVER;
    return program_host_unregister(&cuda_calls, next, ptr);
}
