/* The numbers src/hip/hip_backend.c uses without ROCm's headers (the shim
 * builds without them), checked here against the headers the fakes are
 * built with (Debian's HIP 5.2 and HSA). Compiles to nothing. */
#define __HIP_PLATFORM_AMD__
#include <hip/hip_runtime_api.h>
#include <hsa/hsa.h>

#define SAME(a, b) ((long long)(a) == (long long)(b))

_Static_assert(SAME(hipSuccess, 0) && SAME(hipErrorInvalidValue, 1) &&
                   SAME(hipErrorNotInitialized, 3) && SAME(hipErrorDeinitialized, 4) &&
                   SAME(hipErrorHostMemoryAlreadyRegistered, 712) &&
                   SAME(hipErrorHostMemoryNotRegistered, 713),
               "hipError_t values of hip_backend.c");
_Static_assert(SAME(hipHostRegisterPortable, 0x1) && SAME(hipHostRegisterMapped, 0x2) &&
                   SAME(hipHostRegisterIoMemory, 0x4),
               "hipHostRegister flags of hip_backend.c");
_Static_assert(SAME(hipStreamCaptureModeRelaxed, 2), "hipStreamCaptureMode of hip_backend.c");
_Static_assert(SAME(hipMemoryTypeHost, 0), "HIP 5's hipMemoryTypeHost (1 from ROCm 6)");
_Static_assert(SAME(HSA_STATUS_SUCCESS, 0) && SAME(HSA_STATUS_ERROR_NOT_INITIALIZED, 0x100B) &&
                   SAME(HSA_SYSTEM_INFO_VERSION_MAJOR, 0) && SAME(HSA_AGENT_INFO_DEVICE, 17) &&
                   SAME(HSA_DEVICE_TYPE_GPU, 1),
               "HSA values of hip_backend.c");
