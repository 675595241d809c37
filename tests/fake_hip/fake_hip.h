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
 *  - hipMalloc(ptr, 0) gives NULL and success (ihipMalloc); other sizes get
 *    addresses that no host mapping has (non-canonical), with backing from a
 *    raw mmap (fake_pins.h's device blocks), recorded for
 *    hipPointerGetAttributes and the copies; hipFree forgets them (given the
 *    base; else hipErrorInvalidValue).
 *  - Copies: hipMemcpy(dst, src, size, kind) and hipMemcpyAsync(dst, src,
 *    size, kind, stream), as ihipMemcpy and ihipMemcpy_validate have them
 *    (hipamd/src/hip_memory.cpp: ROCm/hipamd rocm-5.2.0 to rocm-5.5.0, ROCm/clr
 *    rocm-5.6.0 to rocm-6.2.2 and f9f995c6, ROCm/rocm-systems projects/clr
 *    003af007). An end of the copy is what getMemoryObject finds at its
 *    address: MemObjMap::FindMemObj (rocclr/device/device.cpp) takes the
 *    registration or hipMalloc block with the greatest base at or below the
 *    address and checks only that one; nothing found is pageable host memory
 *    (GetArenaMemObj, rocclr/device/rocm/rocdevice.cpp, gives no object for
 *    memory hsa_amd_pointer_info calls unknown). In this order:
 *    size 0: success, nothing checked; NULL dst or src: hipErrorInvalidValue
 *    (1); from 6.1 a kind above hipMemcpyDefault other than 1024
 *    (DeviceToDeviceNoCU): hipErrorInvalidMemcpyDirection (21); an end found
 *    whose object holds fewer than size bytes from the address: 1 ("Size
 *    validation", src then dst: a range that leaves the registration its
 *    start is in, also into an adjacent registration, which is never looked
 *    at); neither end found and the kind neither HostToHost nor Default: 1
 *    (IsHtoHMemcpyValid; 5.2 in ihipMemcpy; allowed from 6.3 with XNACK,
 *    which the double has off); from 5.3 src == dst with Default: success
 *    and nothing done. Then neither end found: the CPU copies (ihipHtoHMemcpy:
 *    outcome HOST); one end pageable: WriteMemoryCommand or ReadMemoryCommand
 *    with the host pointer, staged (STAGED), also when its range runs into a
 *    registration further on (the lookup sees only the start); both found:
 *    CopyMemoryCommand (PINNED; DEVICE for two hipMalloc blocks). The kind
 *    decides nothing else. hipMemcpyAsync (hipMemcpyAsync_common): from 6.1
 *    the direction check first; a stream other than NULL, hipStreamPerThread
 *    or a live one: hipErrorContextIsDestroyed (709, hip::isValid; 5.x
 *    casts it without a check: the double answers 709 there too); then as
 *    hipMemcpy, its errors the call's own. The double moves the bytes before
 *    either call returns (device blocks in their backing) and counts the
 *    outcome (fake_gpu_copy_count, fake_pins.h). A registration still
 *    sleeping its simulated latency is not found yet (AddMemObj comes last).
 *  - Streams (hip_stream.cpp, 5.2 and 6.2 alike): hipStreamCreate (NULL: 1;
 *    64 live at most, then hipErrorOutOfMemory), hipStreamDestroy (NULL:
 *    hipErrorInvalidHandle, 400; hipStreamPerThread:
 *    hipErrorInvalidResourceHandle, 400; not live: 709) and
 *    hipStreamSynchronize (not live: 709; else success: nothing is pending).
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
    FAKE_HIP_CALL_MEMCPY, /* hipMemcpy, hipMemcpyAsync */
    FAKE_HIP_CALL_KIND_COUNT
};

#endif
