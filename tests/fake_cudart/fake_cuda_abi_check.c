/* Compiled into the fake driver when the CUDA Toolkit's cuda.h is found: the
 * numbers and sizes the double hard-codes must be cuda.h's. A separate
 * translation unit, because cuda.h's CUresult is an enum and its macros
 * rename cuMemHostRegister and friends to their _v2 names. */
#define FAKE_CUDA_NO_CUDA_PROTOTYPES
#include "fake_cuda.h"

#include <cuda.h>

#define SAME(real, fake) ((int)(real) == (int)(fake))

_Static_assert(sizeof(CUresult) == sizeof(int), "CUresult is int-sized");
_Static_assert(sizeof(CUdevice) == sizeof(int), "CUdevice is an int");
_Static_assert(sizeof(CUcontext) == sizeof(void *), "CUcontext is a pointer");
_Static_assert(
    SAME(CUDA_SUCCESS, FAKE_CU_SUCCESS) &&
        SAME(CUDA_ERROR_INVALID_VALUE, FAKE_CU_ERROR_INVALID_VALUE) &&
        SAME(CUDA_ERROR_OUT_OF_MEMORY, FAKE_CU_ERROR_OUT_OF_MEMORY) &&
        SAME(CUDA_ERROR_NOT_INITIALIZED, FAKE_CU_ERROR_NOT_INITIALIZED) &&
        SAME(CUDA_ERROR_DEINITIALIZED, FAKE_CU_ERROR_DEINITIALIZED) &&
        SAME(CUDA_ERROR_STUB_LIBRARY, FAKE_CU_ERROR_STUB_LIBRARY) &&
        SAME(CUDA_ERROR_NO_DEVICE, FAKE_CU_ERROR_NO_DEVICE) &&
        SAME(CUDA_ERROR_INVALID_DEVICE, FAKE_CU_ERROR_INVALID_DEVICE) &&
        SAME(CUDA_ERROR_INVALID_CONTEXT, FAKE_CU_ERROR_INVALID_CONTEXT) &&
        SAME(CUDA_ERROR_CONTEXT_IS_DESTROYED, FAKE_CU_ERROR_CONTEXT_IS_DESTROYED) &&
        SAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
             FAKE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED) &&
        SAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, FAKE_CU_ERROR_HOST_MEMORY_NOT_REGISTERED) &&
        SAME(CUDA_ERROR_NOT_PERMITTED, FAKE_CU_ERROR_NOT_PERMITTED) &&
        SAME(CUDA_ERROR_NOT_SUPPORTED, FAKE_CU_ERROR_NOT_SUPPORTED) &&
        SAME(CUDA_ERROR_ILLEGAL_STATE, FAKE_CU_ERROR_ILLEGAL_STATE) &&
        SAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, FAKE_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED) &&
        SAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, FAKE_CU_ERROR_STREAM_CAPTURE_INVALIDATED) &&
        SAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, FAKE_CU_ERROR_STREAM_CAPTURE_WRONG_THREAD) &&
        SAME(CUDA_ERROR_UNKNOWN, FAKE_CU_ERROR_UNKNOWN),
    "CUresult values match cuda.h");
_Static_assert(SAME(CU_STREAM_CAPTURE_MODE_GLOBAL, FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL) &&
                   SAME(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                        FAKE_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) &&
                   SAME(CU_STREAM_CAPTURE_MODE_RELAXED, FAKE_CU_STREAM_CAPTURE_MODE_RELAXED),
               "CUstreamCaptureMode values");
_Static_assert(SAME(CU_MEMHOSTREGISTER_PORTABLE, FAKE_CU_MEMHOSTREGISTER_PORTABLE) &&
                   SAME(CU_MEMHOSTREGISTER_DEVICEMAP, FAKE_CU_MEMHOSTREGISTER_DEVICEMAP) &&
                   SAME(CU_MEMHOSTREGISTER_IOMEMORY, FAKE_CU_MEMHOSTREGISTER_IOMEMORY) &&
                   SAME(CU_MEMHOSTREGISTER_READ_ONLY, FAKE_CU_MEMHOSTREGISTER_READ_ONLY),
               "cuMemHostRegister flags match cuda.h");
/* The versioned names the double exports are the ones cuda.h maps to. */
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemHostRegister_v2),
                                            CUresult (*)(void *, size_t, unsigned int)),
               "cuMemHostRegister_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuDevicePrimaryCtxRelease_v2),
                                            CUresult (*)(CUdevice)),
               "cuDevicePrimaryCtxRelease_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuCtxPushCurrent_v2),
                                            CUresult (*)(CUcontext)),
               "cuCtxPushCurrent_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuCtxPopCurrent_v2),
                                            CUresult (*)(CUcontext *)),
               "cuCtxPopCurrent_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemHostGetDevicePointer_v2),
                                            CUresult (*)(CUdeviceptr *, void *, unsigned int)),
               "cuMemHostGetDevicePointer_v2");
_Static_assert(sizeof(CUdeviceptr) == sizeof(unsigned long long), "CUdeviceptr is 64-bit");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuDeviceGetPCIBusId),
                                            CUresult (*)(char *, int, CUdevice)),
               "cuDeviceGetPCIBusId");
_Static_assert(SAME(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
                    FAKE_CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED) &&
                   SAME(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
                        FAKE_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES) &&
                   SAME(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                        FAKE_CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED) &&
                   SAME(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, FAKE_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID) &&
                   SAME(CU_MEMHOSTALLOC_PORTABLE, FAKE_CU_MEMHOSTALLOC_PORTABLE) &&
                   SAME(CU_MEMHOSTALLOC_DEVICEMAP, FAKE_CU_MEMHOSTALLOC_DEVICEMAP) &&
                   SAME(CU_MEMHOSTALLOC_WRITECOMBINED, FAKE_CU_MEMHOSTALLOC_WRITECOMBINED),
               "device attributes and cuMemHostAlloc flags match cuda.h");
/* Device memory and copies: the _v2 names cuda.h maps the plain ones to. */
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemAlloc_v2),
                                            CUresult (*)(CUdeviceptr *, size_t)),
               "cuMemAlloc_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemFree_v2), CUresult (*)(CUdeviceptr)),
               "cuMemFree_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyHtoD_v2),
                                            CUresult (*)(CUdeviceptr, const void *, size_t)),
               "cuMemcpyHtoD_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyDtoH_v2),
                                            CUresult (*)(void *, CUdeviceptr, size_t)),
               "cuMemcpyDtoH_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyDtoD_v2),
                                            CUresult (*)(CUdeviceptr, CUdeviceptr, size_t)),
               "cuMemcpyDtoD_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpy),
                                            CUresult (*)(CUdeviceptr, CUdeviceptr, size_t)),
               "cuMemcpy");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyHtoDAsync_v2),
                                            CUresult (*)(CUdeviceptr, const void *, size_t,
                                                         CUstream)),
               "cuMemcpyHtoDAsync_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyDtoHAsync_v2),
                                            CUresult (*)(void *, CUdeviceptr, size_t, CUstream)),
               "cuMemcpyDtoHAsync_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyDtoDAsync_v2),
                                            CUresult (*)(CUdeviceptr, CUdeviceptr, size_t,
                                                         CUstream)),
               "cuMemcpyDtoDAsync_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemcpyAsync),
                                            CUresult (*)(CUdeviceptr, CUdeviceptr, size_t,
                                                         CUstream)),
               "cuMemcpyAsync");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuStreamSynchronize),
                                            CUresult (*)(CUstream)),
               "cuStreamSynchronize");
_Static_assert(sizeof(CUstream) == sizeof(void *), "CUstream is a pointer");
