/* CUDA driver: the program's CUDA contexts, seen through the driver API of
 * the libcuda.so.1 the program already loaded (found with RTLD_NOLOAD; the
 * shim never loads or initialises the driver itself), and registrations made
 * through it into those contexts.
 *
 * Why the driver API and not the runtime: a registration pushed into a
 * context with cuCtxPushCurrent and popped afterwards leaves the thread's CUDA
 * state exactly as it was (a thread with no current context still has none),
 * never touches the runtime's per-thread last-error slot or current device,
 * works for programs with a static or another version of the runtime, and is
 * the same driver every runtime copy of the process shares. Callers hold the
 * reentrancy guard: the driver may allocate and map memory. */
#ifndef PINSHIM_CUDA_DRIVER_H
#define PINSHIM_CUDA_DRIVER_H

#include "engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CUresult values the shim interprets (cuda.h). */
enum {
    CUDA_DRIVER_SUCCESS = 0,
    CUDA_DRIVER_NOT_INITIALIZED = 3,
    CUDA_DRIVER_DEINITIALIZED = 4,
    CUDA_DRIVER_INVALID_CONTEXT = 201,
    CUDA_DRIVER_CONTEXT_IS_DESTROYED = 709,
    CUDA_DRIVER_NOT_REGISTERED = 713,
    /* CUstreamCaptureMode: the calling thread's mode that lets it make
     * "potentially unsafe" calls while a program's thread captures. */
    CUDA_DRIVER_CAPTURE_MODE_RELAXED = 2,
    /* Not a CUresult: the place chosen has no live context (any more). */
    CUDA_DRIVER_NO_CONTEXT = -1,
};

typedef int (*cu_result_fn)(void);
struct cuda_driver {
    void *handle;
    int (*ctx_get_current)(uintptr_t *context);
    int (*ctx_get_device)(int *device);
    int (*ctx_push)(uintptr_t context);
    int (*ctx_pop)(uintptr_t *context);
    int (*device_get_count)(int *count);
    int (*device_get)(int *device, int ordinal);
    int (*primary_get_state)(int device, unsigned *flags, int *active);
    int (*primary_retain)(uintptr_t *context, int device);
    int (*primary_release)(int device);
    int (*host_register)(void *pointer, size_t bytes, unsigned flags);
    int (*host_unregister)(void *pointer);
    int (*get_error_name)(int error, const char **name);
    int (*driver_get_version)(int *version);
    int (*device_get_attribute)(int *value, int attribute, int device); /* optional */
    int (*device_get_pci_bus_id)(char *bus_id, int length, int device); /* optional */
    int (*exchange_capture_mode)(int *mode);                            /* optional: CUDA 10.1 on */
    bool found;
    bool seen_initialized; /* a call answered anything but NOT_INITIALIZED */
    char path[512];
};

/* Stream capture (cuda_driver.c says why): sets the calling thread's
 * capture mode to relaxed through exchange (the driver's
 * cuThreadExchangeStreamCaptureMode or the runtime's
 * cudaThreadExchangeStreamCaptureMode; NULL: there is none) and returns the
 * mode to give back with cuda_capture_relaxed_leave, or -1. */
int cuda_capture_relaxed_enter(int (*exchange)(int *mode));
void cuda_capture_relaxed_leave(int (*exchange)(int *mode), int previous);

/* Looks for a libcuda.so.1 the process has loaded; cheap when it is absent
 * (the loader's list, no system call: loaded_objects.h). True when it is
 * there with every entry point the shim uses. Safe to call again: a found
 * driver stays found. */
bool cuda_driver_find(struct cuda_driver *driver);
/* Only whether libcuda.so.1 is loaded now, without resolving anything. */
bool cuda_driver_is_loaded(void);

/* Where a registration of memory locked by the calling thread should go
 * (see engine_backend.choose_place). preferred_device: the device the
 * program's threads were last seen using, or -1; updated when the calling
 * thread has a current context. */
enum engine_choice cuda_driver_choose_place(struct cuda_driver *driver, bool from_worker,
                                            const struct range_place *hint, int *preferred_device,
                                            struct range_place *place);

/* The context current on the calling thread as a place: its device, and the
 * context itself unless it is that device's primary context. False when the
 * driver is not there or the thread has no live context. Never creates one. */
bool cuda_driver_thread_place(struct cuda_driver *driver, struct range_place *place);

/* Registers or unregisters in place's context, entered for the call and left
 * afterwards. CUDA_DRIVER_NO_CONTEXT when that context is not there (any
 * more) to register into; CUDA_DRIVER_NOT_REGISTERED when a registration's
 * context is gone (the driver dropped its registrations with it). */
int cuda_driver_register(struct cuda_driver *driver, const struct range_place *place, void *base,
                         size_t length, unsigned flags);
int cuda_driver_unregister(struct cuda_driver *driver, const struct range_place *place, void *base);

/* Whether the program initialised the driver (cuInit), asked with
 * cuCtxGetCurrent, which initialises nothing. */
enum cuda_driver_initialization {
    CUDA_DRIVER_NOT_YET,
    CUDA_DRIVER_INITIALIZED,
    CUDA_DRIVER_TORN_DOWN,
};
enum cuda_driver_initialization cuda_driver_initialization(struct cuda_driver *driver);

/* Whether the shim has seen the driver initialised (cuInit) in this process:
 * noted whenever the shim asks it anything, so that a fork handler can tell
 * without calling into the driver (whose own fork handlers may hold its
 * locks by then). */
bool cuda_driver_seen_initialized(const struct cuda_driver *driver);

const char *cuda_driver_error_name(struct cuda_driver *driver, int error);

/* CU_DEVICE_ATTRIBUTE_* values the shim asks (cuda.h). */
enum {
    CUDA_DRIVER_ATTRIBUTE_PAGEABLE_USES_HOST_PAGE_TABLES = 100,
    CUDA_DRIVER_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113,
    CUDA_DRIVER_ATTRIBUTE_HOST_NUMA_ID = 134, /* CUDA 12.2 on; cudaDevAttrHostNumaId too */
};

/* cuDeviceGetAttribute: 0 and *value, else the error (-1: not exported). */
int cuda_driver_device_attribute(struct cuda_driver *driver, int attribute, int device, int *value);
/* cuDeviceGetPCIBusId ("0000:17:00.0"): 0, else the error (-1: not exported). */
int cuda_driver_pci_bus_id(struct cuda_driver *driver, int device, char *out, int out_size);

/* In a fork child: the lock a parent's thread held is free again. */
void cuda_driver_after_fork(void);

#endif
