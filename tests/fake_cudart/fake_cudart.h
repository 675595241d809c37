/* fake_cudart: a test double for the part of the CUDA runtime that pinshim
 * uses (host-memory registration and error reporting). It is never shipped.
 *
 * The double follows the real runtime's rules for cudaHostRegister and
 * cudaHostUnregister, records every call, and checks the invariants the shim
 * promises (a registered range is mapped and locked for as long as it stays
 * registered). Environment variables, read at load time and again by
 * fake_cudart_reset() and fake_cudart_reload_config():
 *
 *   FAKE_CUDART_NO_DRIVER=1            every call fails with 35 (InsufficientDriver)
 *   FAKE_CUDART_DEVICES=N              device count (default 1); 0 means NoDevice (100)
 *   FAKE_CUDART_FAIL_REGISTER_EVERY=N  register calls N, 2N, ... fail without effect
 *   FAKE_CUDART_FAIL_UNREGISTER_EVERY=N
 *   FAKE_CUDART_FAIL_ERROR=E           the error those injected failures return (default 2)
 *   FAKE_CUDART_UNLOAD_AT_EXIT=1       once torn down, every call returns 4 (CudartUnloading)
 *   FAKE_CUDART_CHECK=0                skip the /proc/self/smaps invariant checks
 *   FAKE_CUDART_LOG=path               append one line per event to path
 *
 * Log lines (each one write(2) on an O_APPEND descriptor):
 *   register <pid> 0x<ptr> <size> <flags> <err>
 *   unregister <pid> 0x<ptr> <err>
 *   violation <pid> <kind> 0x<ptr> <size>
 *   getlasterror <pid> <err>
 *
 * Teardown happens, like the real runtime's, in an exit handler registered at
 * load (and, as a backstop, in the library destructor): exit handlers
 * registered before the load and library destructors run after it. Note that
 * a library loaded from a constructor (before main) has its exit handler run
 * after all destructors, so then only the destructor counts.
 *
 * The variant built with FAKE_CUDART_MINIMAL exports only cudaHostRegister and
 * cudaHostUnregister; everything else below is hidden in it.
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
    FAKE_CUDA_ERROR_STUB_LIBRARY = 34,
    FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    FAKE_CUDA_ERROR_NO_DEVICE = 100,
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
    FAKE_CALL_KIND_COUNT
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
#endif

/* Number of live registrations. */
size_t fake_cudart_live_count(void);

/* Copies up to max live registrations, sorted by base, into out; returns how
 * many it copied. */
size_t fake_cudart_snapshot(struct fake_cudart_range *out, size_t max);

/* Violations recorded since load or the last reset: all of them, or one kind. */
size_t fake_cudart_violation_count(void);
size_t fake_cudart_violation_count_of(enum fake_cudart_violation kind);

/* Calls made to one entry point since load or the last reset. */
uint64_t fake_cudart_call_count(int which);

/* Drops every registration, counter and violation, clears the calling
 * thread's last error, leaves the "unloading" state, and re-reads the
 * environment. */
void fake_cudart_reset(void);

/* Re-reads the environment without dropping registrations or counters. */
void fake_cudart_reload_config(void);

/* Overrides FAKE_CUDART_FAIL_*: register calls reg, 2*reg, ... and unregister
 * calls unreg, 2*unreg, ... (counted from now) fail with error; 0 disables.
 * An error <= 0 means cudaErrorMemoryAllocation. */
void fake_cudart_set_fail_every(unsigned reg, unsigned unreg, int error);

/* Overrides FAKE_CUDART_CHECK. */
void fake_cudart_set_check(int on);

/* Does what the library destructor does (enter the "unloading" state when
 * FAKE_CUDART_UNLOAD_AT_EXIT=1), so a test can observe it in-process. */
void fake_cudart_simulate_exit(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKE_CUDART_H */
