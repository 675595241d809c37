/* Helpers for the benchmarks that use the CUDA runtime. */
#ifndef PINSHIM_BENCH_CUDA_H
#define PINSHIM_BENCH_CUDA_H

#include <cuda_runtime_api.h>
#include <string.h>

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
