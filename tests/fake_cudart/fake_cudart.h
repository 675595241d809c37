/* fake_cudart: a test double for the part of the CUDA runtime that pinshim
 * uses (host-memory registration and error reporting). It is never shipped.
 *
 * It is a layer over the fake CUDA driver (fake_cuda.h, libcuda.so.1) and
 * behaves towards it as the real libcudart behaves towards libcuda:
 *
 *  - The driver is loaded lazily, at the first call that needs it
 *    (dlopen(RTLD_NOW | RTLD_LOCAL) of FAKE_CUDA_DRIVER if set, else of the
 *    fake driver's absolute path that meson compiles in as
 *    FAKE_CUDA_DRIVER_PATH), and initialised with cuInit(0) by every such call
 *    (cheap, and it keeps working across fake_cuda_reset). A library that does
 *    not export fake_cuda_reset is not the fake and is never used: a real
 *    libcuda is never called. Without a path, or with FAKE_CUDART_NO_DRIVER=1,
 *    the driver is "missing": every call returns cudaErrorInsufficientDriver
 *    (35) and the driver is never loaded. cudaGetLastError, cudaPeekAtLastError
 *    and cudaGetErrorName/String need no driver.
 *  - Per thread, a selected device (0 until cudaSetDevice). Every call that
 *    needs a context (cudaHostRegister, cudaHostUnregister, cudaFree,
 *    cudaMalloc, cudaMemcpy, cudaMemcpyAsync, cudaStreamSynchronize,
 *    cudaPointerGetAttributes, cudaDeviceSynchronize) uses the context current
 *    on the thread in the driver, if any; else it retains the primary context
 *    of the thread's device -- which CREATES it when inactive, attributed to
 *    the runtime's caller -- and makes it current on the thread. So a thread
 *    that never chose a device registers on device 0, creating its context if
 *    needed, whatever other threads chose. cudaSetDevice(d) does the same for
 *    d (CUDA 12+: it initialises d's primary context). The runtime holds one
 *    reference per device it used (as the real one does until exit).
 *    cudaGetDevice reports the device of the current context if there is one,
 *    else the thread's device, and creates nothing. cudaDeviceReset resets
 *    that device's primary context (cuDevicePrimaryCtxReset_v2: registrations
 *    made in it go with it); the runtime keeps its reference and brings the
 *    context back (a new creation) at the next call that needs it, on any
 *    thread where the old handle is still current. Any other destroyed
 *    context current on the thread gives cudaErrorContextIsDestroyed (709).
 *  - cudaHostRegister calls cuMemHostRegister_v2 with cudaHostRegisterDefault
 *    (0) turned into PORTABLE|DEVICEMAP (documented for systems with unified
 *    addressing, i.e. every 64-bit Linux one) and other flags unchanged.
 *    cudaHostUnregister calls cuMemHostUnregister. Driver errors keep their
 *    numbers (1, 2, 712, 713, 3 InitializationError, 4 DEINITIALIZED ->
 *    CudartUnloading, 100, 101, 709, 800, 801, injected ones; 201
 *    INVALID_CONTEXT -> 201 cudaErrorDeviceUninitialized, the runtime's name
 *    for that number). Every registration lives in the driver's table: one
 *    made through the runtime can be unregistered through the driver and vice
 *    versa, and fake_cudart_live_count/snapshot/violation_count read it.
 *  - cudaDeviceGetAttribute, cudaHostGetDevicePointer, cudaHostAlloc,
 *    cudaMallocHost and cudaFreeHost are the driver's cuDeviceGetAttribute,
 *    cuMemHostGetDevicePointer_v2, cuMemHostAlloc (cudaHostAllocDefault and
 *    cudaMallocHost: PORTABLE|DEVICEMAP, as on every UVA system) and
 *    cuMemFreeHost, in the thread's context.
 *  - Device memory and copies are the driver's (fake_cuda.h), in the
 *    thread's context. cudaMalloc is cuMemAlloc_v2 (size 0: cudaSuccess and
 *    NULL without asking the driver, chosen; NULL: cudaErrorInvalidValue);
 *    cudaFree(NULL) does nothing but initialise (documented: "If devPtr is
 *    0, no operation is performed"), any other pointer is cuMemFree_v2 (1
 *    unless cudaMalloc returned it). cudaMemcpy(dst, src, count, kind) and
 *    cudaMemcpyAsync(..., stream): a kind beyond 4 is
 *    cudaErrorInvalidMemcpyDirection (21, documented); HostToHost (0) is the
 *    runtime's own memmove, never the driver's, with no memcpy rule (chosen;
 *    NULL with a count: 1); HostToDevice (1), DeviceToHost (2) and
 *    DeviceToDevice (3) are cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoD_v2
 *    (their Async_v2 forms with the stream, which is never looked at);
 *    Default (4) is cuMemcpy / cuMemcpyAsync, which infer each side from its
 *    address. So the memcpy rule is the driver's (documented and measured,
 *    see fake_cuda.h): a host range that spans two registrations (adjacent
 *    or not) or mixes registered and unregistered bytes fails with
 *    cudaErrorInvalidValue (1) and copies nothing; measured on an H200
 *    (driver 580) for cudaMemcpy and cudaMemcpyAsync in both directions.
 *    Copies are done when the call returns; cudaStreamSynchronize is
 *    cuStreamSynchronize. No copy writes a FAKE_CUDART_LOG line.
 *  - cudaGetDeviceCount initialises the driver and reports its count (0 and
 *    cudaErrorNoDevice with no device). cudaPointerGetAttributes reports type 1
 *    (cudaMemoryTypeHost) inside a live registration of any context, else 0.
 *  - Failures set the calling thread's last error: cudaGetLastError returns
 *    and clears it, cudaPeekAtLastError does not clear it. With no driver,
 *    after teardown or in a poisoned fork child they report that state.
 *  - fork: a child of a process in which the runtime had initialised gets
 *    cudaErrorInitializationError (3) from every call (the driver double
 *    refuses such a child too); a child of a process that never initialised
 *    can initialise normally.
 *  - Teardown happens, like the real runtime's, in an exit handler registered
 *    at load (and, as a backstop, in the library destructor): exit handlers
 *    registered before the load and library destructors run after it. Note
 *    that a library loaded from a constructor (before main) has its exit
 *    handler run after all destructors, so then only the destructor counts.
 *
 * Environment variables of the runtime, read at load time and again by
 * fake_cudart_reset() and fake_cudart_reload_config() (which also make the
 * driver, if loaded, re-read its own):
 *
 *   FAKE_CUDART_NO_DRIVER=1            the driver is missing: every call fails with 35
 *   FAKE_CUDART_UNLOAD_AT_EXIT=1       once torn down, every call returns 4 (CudartUnloading)
 *   FAKE_CUDART_UNLOAD_AT_EXIT=late    the same, with the teardown's exit handler registered
 *                                      at the first cudaHostRegister (after one the shim
 *                                      registered before, so that it runs first)
 *   FAKE_CUDA_DRIVER=path              the fake driver to load instead of the built one
 *   FAKE_CUDART_LOG=path               append one line per event to path
 *
 * and, read by the driver (see fake_cuda.h), with the meaning they always had:
 *
 *   FAKE_CUDART_DEVICES=N              device count when FAKE_CUDA_DEVICES is unset
 *   FAKE_CUDART_FAIL_REGISTER_EVERY=N  register calls N, 2N, ... fail without effect
 *   FAKE_CUDART_FAIL_UNREGISTER_EVERY=N
 *   FAKE_CUDART_FAIL_ERROR=E           the error those injected failures return (default 2)
 *   FAKE_CUDART_CHECK=0                skip the /proc/self/smaps invariant checks
 *
 * Log lines (each one write(2) on an O_APPEND descriptor); the driver writes
 * the register/unregister line of every call that reaches it (flags as the
 * driver got them: 3 for cudaHostRegisterDefault) and the violation lines;
 * the runtime writes the register/unregister line of a call that fails before
 * reaching the driver (35, 4, 3, 100, ...) and the getlasterror lines, so
 * each runtime call leaves exactly one line:
 *   register <pid> 0x<ptr> <size> <flags> <err>
 *   unregister <pid> 0x<ptr> <err>
 *   violation <pid> <kind> 0x<ptr> <size>
 *   getlasterror <pid> <err>
 *
 * The variant built with FAKE_CUDART_MINIMAL exports only cudaHostRegister and
 * cudaHostUnregister; everything else below is hidden in it. Copies of the
 * runtime loaded into one process (the full and the minimal one) keep their
 * own runtime state and share the one driver.
 */
#ifndef FAKE_CUDART_H
#define FAKE_CUDART_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaError_t values the double can return (same numbers as the real enum). */
enum fake_cudart_error {
    FAKE_CUDA_SUCCESS = 0,
    FAKE_CUDA_ERROR_INVALID_VALUE = 1,
    FAKE_CUDA_ERROR_MEMORY_ALLOCATION = 2,
    FAKE_CUDA_ERROR_INITIALIZATION = 3,
    FAKE_CUDA_ERROR_CUDART_UNLOADING = 4,
    FAKE_CUDA_ERROR_INVALID_MEMCPY_DIRECTION = 21,
    FAKE_CUDA_ERROR_STUB_LIBRARY = 34,
    FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    FAKE_CUDA_ERROR_NO_DEVICE = 100,
    FAKE_CUDA_ERROR_INVALID_DEVICE = 101,
    FAKE_CUDA_ERROR_DEVICE_UNINITIALIZED = 201,
    FAKE_CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    FAKE_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    FAKE_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    FAKE_CUDA_ERROR_NOT_PERMITTED = 800,
    FAKE_CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* The flag bits cudaHostRegister accepts (Portable, Mapped, IoMemory, ReadOnly). */
#define FAKE_CUDA_HOST_REGISTER_VALID_FLAGS 0x0Fu

/* Which entry point fake_cudart_call_count() reports. */
enum fake_cudart_call {
    FAKE_CALL_REGISTER,
    FAKE_CALL_UNREGISTER,
    FAKE_CALL_GET_LAST_ERROR,
    FAKE_CALL_PEEK_AT_LAST_ERROR,
    FAKE_CALL_GET_DEVICE_COUNT,
    FAKE_CALL_POINTER_GET_ATTRIBUTES,
    FAKE_CALL_SET_DEVICE,
    FAKE_CALL_GET_DEVICE,
    FAKE_CALL_FREE,
    FAKE_CALL_DEVICE_SYNCHRONIZE,
    FAKE_CALL_DEVICE_RESET,
    FAKE_CALL_DEVICE_GET_ATTRIBUTE,
    FAKE_CALL_HOST_GET_DEVICE_POINTER,
    FAKE_CALL_HOST_ALLOC, /* cudaHostAlloc and cudaMallocHost */
    FAKE_CALL_FREE_HOST,
    FAKE_CALL_MALLOC,
    FAKE_CALL_MEMCPY,
    FAKE_CALL_MEMCPY_ASYNC,
    FAKE_CALL_STREAM_SYNCHRONIZE,
    FAKE_CALL_KIND_COUNT
};

/* cudaMemcpyKind (the real enum's numbers). */
enum fake_cuda_memcpy_kind {
    FAKE_CUDA_MEMCPY_HOST_TO_HOST = 0,
    FAKE_CUDA_MEMCPY_HOST_TO_DEVICE = 1,
    FAKE_CUDA_MEMCPY_DEVICE_TO_HOST = 2,
    FAKE_CUDA_MEMCPY_DEVICE_TO_DEVICE = 3,
    FAKE_CUDA_MEMCPY_DEFAULT = 4,
};

/* Broken invariants the double records (they never change a return value).
 * The log names them as quoted below. */
enum fake_cudart_violation {
    /* "register_unmapped": a page of the new range is not mapped */
    FAKE_VIOLATION_REGISTER_UNMAPPED,
    /* "register_not_locked": a VMA under the new range lacks VmFlags "lo" */
    FAKE_VIOLATION_REGISTER_NOT_LOCKED,
    /* "page_shared": the new range shares a page with another registration */
    FAKE_VIOLATION_PAGE_SHARED,
    /* "unregister_unmapped": a page of the range went away while registered */
    FAKE_VIOLATION_UNREGISTER_UNMAPPED,
    /* "unregister_not_locked": it was unlocked while registered */
    FAKE_VIOLATION_UNREGISTER_NOT_LOCKED,
    FAKE_VIOLATION_KIND_COUNT
};

struct fake_cudart_range {
    uintptr_t base;
    size_t size;
    unsigned flags;
};

/* The CUDA runtime entry points (cudaError_t is int here). Define
 * FAKE_CUDART_NO_CUDA_PROTOTYPES when the real cuda_runtime_api.h is in scope. */
#ifndef FAKE_CUDART_NO_CUDA_PROTOTYPES
int cudaHostRegister(void *ptr, size_t size, unsigned int flags);
int cudaHostUnregister(void *ptr);
int cudaGetLastError(void);
int cudaPeekAtLastError(void);
const char *cudaGetErrorName(int error);
const char *cudaGetErrorString(int error);
int cudaGetDeviceCount(int *count);
int cudaPointerGetAttributes(void *attributes, const void *ptr);
int cudaSetDevice(int device);
int cudaGetDevice(int *device);
int cudaFree(void *device_pointer);
int cudaDeviceSynchronize(void);
int cudaDeviceReset(void);
int cudaDeviceGetAttribute(int *value, int attribute, int device);
int cudaHostGetDevicePointer(void **device_pointer, void *host_pointer, unsigned int flags);
int cudaHostAlloc(void **pointer, size_t size, unsigned int flags);
int cudaMallocHost(void **pointer, size_t size);
int cudaFreeHost(void *pointer);
int cudaMalloc(void **device_pointer, size_t size);
int cudaMemcpy(void *destination, const void *source, size_t count, int kind);
int cudaMemcpyAsync(void *destination, const void *source, size_t count, int kind, void *stream);
int cudaStreamSynchronize(void *stream);
#endif

/* Number of live registrations (in the driver's table, all contexts; 0 while
 * the driver is not loaded). */
size_t fake_cudart_live_count(void);

/* Copies up to max live registrations, sorted by base, into out; returns how
 * many it copied. */
size_t fake_cudart_snapshot(struct fake_cudart_range *out, size_t max);

/* Violations recorded since load or the last reset: all of them, or one kind. */
size_t fake_cudart_violation_count(void);
size_t fake_cudart_violation_count_of(enum fake_cudart_violation kind);

/* The driver's fake_cuda_copy_count (enum fake_cuda_copy_kind of fake_cuda.h):
 * 0 while the driver is not loaded. */
uint64_t fake_cudart_copy_count(int kind);

/* Calls made to one entry point since load or the last reset. */
uint64_t fake_cudart_call_count(int which);

/* Drops the runtime's counters and state (unloading, fork, the primary
 * contexts it holds), clears the calling thread's last error and selected
 * device, re-reads the environment, and resets the driver if it is loaded
 * (fake_cuda_reset: registrations, contexts, violations). */
void fake_cudart_reset(void);

/* Re-reads the environment without dropping registrations or counters. */
void fake_cudart_reload_config(void);

/* Overrides FAKE_CUDART_FAIL_* in the driver (loading it unless missing): register calls reg,
 * 2*reg, ... and unregister calls unreg, 2*unreg, ... (counted from now) fail with error; 0
 * disables. An error <= 0 means cudaErrorMemoryAllocation. */
void fake_cudart_set_fail_every(unsigned reg, unsigned unreg, int error);

/* Overrides FAKE_CUDART_CHECK in the driver (loading it unless missing). */
void fake_cudart_set_check(int on);

/* Does what the library destructor does (enter the "unloading" state when
 * FAKE_CUDART_UNLOAD_AT_EXIT=1), so a test can observe it in-process. */
void fake_cudart_simulate_exit(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKE_CUDART_H */
