/* A CUDA runtime as one built for a newer driver than the machine has (a CUDA
 * 13 runtime on a pre-580 driver): it loads, and every call answers
 * cudaErrorInsufficientDriver (35), as the real libcudart.so.13 does here. The
 * runtime search must pass over it to a usable one (issue 9 item 5). */
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))
#define INSUFFICIENT_DRIVER 35

EXPORT int cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    (void)ptr;
    (void)size;
    (void)flags;
    return INSUFFICIENT_DRIVER;
}

EXPORT int cudaHostUnregister(void *ptr)
{
    (void)ptr;
    return INSUFFICIENT_DRIVER;
}

EXPORT int cudaGetDeviceCount(int *count)
{
    (void)count; /* left unwritten, as the real runtime does */
    return INSUFFICIENT_DRIVER;
}

EXPORT int cudaGetLastError(void)
{
    return INSUFFICIENT_DRIVER;
}

EXPORT const char *cudaGetErrorName(int error)
{
    return error == INSUFFICIENT_DRIVER ? "cudaErrorInsufficientDriver" : "cudaErrorUnknown";
}
