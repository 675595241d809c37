/* fake_hip: a test double for the part of the HIP runtime
 * (libamdhip64.so.N) that pinshim and the test programs use. Never shipped.
 *
 * Built against ROCm's own hip/hip_runtime_api.h (HIP 5.2, the Debian
 * package the tests fetch and unpack, with -D__HIP_PLATFORM_AMD__), as a
 * library named libamdhip64.so.5 (file name and DT_SONAME) that needs the
 * fake HSA runtime (libhsa-runtime64.so.1, fake_hsa.c), as the real one
 * does. The registration table, invariant checks, failures, latency, log and
 * query API are tests/fake_gpu/fake_pins.h's (FAKE_GPU_*, fake_gpu_*).
 *
 * What is modelled, from ROCm's CLR (hipamd/src/hip_memory.cpp,
 * hip_internal.hpp, rocclr/device/device.cpp) as of the version set by
 * FAKE_HIP_VERSION=major.minor (default 6.2; 5.2, 5.3, 5.6, 6.x and 7.x
 * differ where said):
 *  - Start: every call but hipGetErrorName and hipGetErrorString starts the
 *    runtime at its first call (HIP_INIT_API: std::call_once(hip::init)),
 *    which calls the HSA runtime's hsa_init (roc::Device::init). With
 *    FAKE_HIP_DEVICES=0 a started runtime answers hipErrorNoDevice (100)
 *    (HIP_INIT_API's check, from 6), hipRuntimeGetVersion apart
 *    (HIP_INIT_API_NO_RETURN).
 *  - The last error, per thread: up to 6.x every call sets it to its result,
 *    success included (HIP_RETURN: hip::tls.last_error_ = ret); from 7 only
 *    an error sets it and it stays until hipGetLastError reads it
 *    (HIP_UPDATE_ERROR_STATE). hipGetLastError returns it and resets it,
 *    hipPeekAtLastError returns it.
 *  - hipHostRegister(ptr, size, flags): 5.2 refuses NULL only
 *    (hipErrorInvalidValue, 1) and a failed pin is hipErrorOutOfMemory (2);
 *    5.3 also size 0 and a failed pin is 1; 5.4 to 6.x also flags > 15; 7
 *    flags outside 0x1|0x2|0x4|0x8|0x80000000, and a start inside an existing
 *    registration is hipErrorHostMemoryAlreadyRegistered (712:
 *    rocm-systems #7498, the check reviewed: FindMemObj(hostPtr)). Before 7 a
 *    registration over registered memory succeeds: at the same base the new
 *    one is lost (MemObjMap::AddMemObj keeps the first), elsewhere it is
 *    added; the double records "register_overlap" either way. No alignment
 *    is needed (the thunk aligns). The "pin" fails on a hole, PROT_NONE
 *    and read-only memory: KFD pins a user pointer for writing whatever the
 *    flags (amdgpu_amdkfd_gpuvm.c init_user_pages sets no
 *    AMDGPU_GEM_USERPTR_READONLY), and 0x8 is no read-only flag (ignored;
 *    coarse-grained from rocm-systems #6278).
 *  - Lookups (FindMemObj) take the registration with the greatest base at
 *    or below the address and check only that one.
 *  - hipHostUnregister(ptr): NULL is 1 from 5.6 (713 in 5.2: no check); not
 *    inside a registration: hipErrorHostMemoryNotRegistered (713); inside one
 *    but not at its base: the process ABORTS (RemoveMemObj's guarantee(), as
 *    ROCm does: "Memobj map does not have ptr"); else the registration goes.
 *  - hipPointerGetAttributes(attributes, ptr): registered memory is
 *    hipMemoryTypeHost (0 in ROCm 5, 1 from 6) at any address inside; memory
 *    from hipMalloc hipMemoryTypeDevice (1 in 5, 2 from 6); anything else is
 *    hipErrorInvalidValue in 5 and success with hipMemoryTypeUnregistered (0)
 *    and device -2 from 6 (a NULL ptr: 1 in 5 and 6, success in 7).
 *  - Devices: FAKE_HIP_DEVICES (default 1); hipSetDevice of a bad ordinal:
 *    hipErrorInvalidDevice (101); a thread's device is 0 until it sets one.
 *  - hipMalloc hands out addresses that no host mapping has (non-canonical),
 *    recorded for hipPointerGetAttributes; hipFree forgets them.
 *
 * Environment: FAKE_HIP_VERSION=major.minor, FAKE_HIP_DEVICES=N, and
 * fake_pins.h's FAKE_GPU_* (injected failures default to hipErrorOutOfMemory).
 *
 * The double's own exports, besides fake_gpu_*: fake_hip_started() (whether
 * the runtime was started in this process) and the call kinds below for
 * fake_gpu_call_count(_by). */
#ifndef FAKE_HIP_H
#define FAKE_HIP_H

enum fake_hip_call {
    FAKE_HIP_CALL_HOST_REGISTER,
    FAKE_HIP_CALL_HOST_UNREGISTER,
    FAKE_HIP_CALL_POINTER_GET_ATTRIBUTES,
    FAKE_HIP_CALL_GET_LAST_ERROR,
    FAKE_HIP_CALL_RUNTIME_GET_VERSION,
    FAKE_HIP_CALL_GET_DEVICE_COUNT,
    FAKE_HIP_CALL_OTHER,
    FAKE_HIP_CALL_KIND_COUNT
};

#endif
