/* Helpers for the benchmarks that use the CUDA runtime. */
#ifndef PINSHIM_BENCH_CUDA_H
#define PINSHIM_BENCH_CUDA_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The GPU checks print one PASS or FAIL line per check and exit 1 when one
 * failed. */
static int bench_failures;

static inline void bench_check(bool condition, const char *what, const char *detail)
{
    printf("%s %s%s%s\n", condition ? "PASS" : "FAIL", what, detail[0] ? ": " : "", detail);
    if (!condition)
        bench_failures++;
}

/* The number of CUDA devices; 0 after printing a SKIP line when there is no
 * usable one (the caller exits 2). */
static inline int bench_device_count(void)
{
    int devices = 0;
    cudaError_t error = cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || devices == 0) {
        printf("SKIP no usable CUDA device (%s)\n",
               error != cudaSuccess ? cudaGetErrorName(error) : "0 devices");
        return 0;
    }
    return devices;
}

/* What cudaPointerGetAttributes says of pointer (1: registered or pinned host
 * memory, what torch.Tensor.is_pinned() asks), or -1 on error (cleared). */
static inline int bench_pointer_type(const void *pointer)
{
    struct cudaPointerAttributes attributes;
    memset(&attributes, 0, sizeof(attributes));
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return (int)attributes.type;
}

#endif
