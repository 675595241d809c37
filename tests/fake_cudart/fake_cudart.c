/* fake_cudart: the fake CUDA runtime, a layer over the fake driver
 * (fake_cuda.c, libcuda.so.1) the way the real libcudart sits on libcuda. See
 * fake_cudart.h for what it models and how it is configured.
 *
 * The shim under test interposes the allocator and the mapping functions, so
 * nothing here calls malloc/free (dlopen of the driver does, once, as the real
 * runtime's does). No lock of ours is held across a driver call or dlopen:
 * the driver sleeps in simulated latency with its own lock released, and
 * concurrent registrations through the runtime must overlap as well.
 */
#define FAKE_CUDA_NO_CUDA_PROTOTYPES /* the driver is reached through dlsym only */
#include "fake_cuda.h"
#include "fake_cudart.h"
#include "fake_line.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(sizeof(struct fake_cudart_range) == sizeof(struct fake_cuda_range) &&
                   offsetof(struct fake_cudart_range, size) ==
                       offsetof(struct fake_cuda_range, size) &&
                   offsetof(struct fake_cudart_range, flags) ==
                       offsetof(struct fake_cuda_range, flags),
               "fake_cudart_snapshot copies the driver's ranges as they are");
_Static_assert(
    (int)FAKE_VIOLATION_REGISTER_UNMAPPED == (int)FAKE_CU_VIOLATION_REGISTER_UNMAPPED &&
        (int)FAKE_VIOLATION_REGISTER_NOT_LOCKED == (int)FAKE_CU_VIOLATION_REGISTER_NOT_LOCKED &&
        (int)FAKE_VIOLATION_PAGE_SHARED == (int)FAKE_CU_VIOLATION_PAGE_SHARED &&
        (int)FAKE_VIOLATION_UNREGISTER_UNMAPPED == (int)FAKE_CU_VIOLATION_UNREGISTER_UNMAPPED &&
        (int)FAKE_VIOLATION_UNREGISTER_NOT_LOCKED == (int)FAKE_CU_VIOLATION_UNREGISTER_NOT_LOCKED &&
        (int)FAKE_VIOLATION_KIND_COUNT == (int)FAKE_CU_VIOLATION_KIND_COUNT,
    "the runtime's violation kinds are the driver's");

/* Built with -fvisibility=hidden: only what is marked here is exported.
 * noinline keeps __builtin_return_address(0) the caller's. */
#define FAKE_EXPORT __attribute__((visibility("default"), noinline))
#ifdef FAKE_CUDART_MINIMAL
#define FAKE_EXPORT_EXTRA __attribute__((noinline))
#else
#define FAKE_EXPORT_EXTRA __attribute__((visibility("default"), noinline))
#endif
#define CALLER() __builtin_extract_return_addr(__builtin_return_address(0))

/* Where meson built the fake driver; FAKE_CUDA_DRIVER overrides it. */
#ifndef FAKE_CUDA_DRIVER_PATH
#define FAKE_CUDA_DRIVER_PATH ""
#endif

/* ------------------------------------------------------------------------ */
/* Configuration and global state (all guarded by state_lock).              */

struct fake_config {
    bool no_driver;
    bool unload_at_exit;
    /* FAKE_CUDART_UNLOAD_AT_EXIT=late: the teardown's exit handler is
     * registered at the first cudaHostRegister, after any the shim
     * registered when it chose CUDA, so that it runs before the shim's. */
    bool unload_late;
    char driver_path[4096];
};

/* The driver entry points the runtime uses, resolved with dlsym. */
struct driver_api {
    int (*init)(unsigned);
    int (*device_get_count)(int *);
    int (*ctx_get_current)(void **);
    int (*ctx_set_current)(void *);
    int (*ctx_get_device)(int *);
    int (*primary_release)(int);
    int (*primary_reset)(int);
    int (*mem_host_register)(void *, size_t, unsigned);
    int (*mem_host_unregister)(void *);
    int (*device_get_attribute)(int *, int, int);
    int (*mem_host_get_device_pointer)(unsigned long long *, void *, unsigned);
    int (*mem_host_alloc)(void **, size_t, unsigned);
    int (*mem_free_host)(void *);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*mem_free)(unsigned long long);
    int (*memcpy_htod)(unsigned long long, const void *, size_t);
    int (*memcpy_dtoh)(void *, unsigned long long, size_t);
    int (*memcpy_dtod)(unsigned long long, unsigned long long, size_t);
    int (*memcpy_unified)(unsigned long long, unsigned long long, size_t);
    int (*memcpy_htod_async)(unsigned long long, const void *, size_t, void *);
    int (*memcpy_dtoh_async)(void *, unsigned long long, size_t, void *);
    int (*memcpy_dtod_async)(unsigned long long, unsigned long long, size_t, void *);
    int (*memcpy_unified_async)(unsigned long long, unsigned long long, size_t, void *);
    int (*stream_synchronize)(void *);
    int (*exchange_capture_mode)(int *);
    int (*stream_begin_capture)(void *, int);
    int (*stream_end_capture)(void *, void **);
    int (*primary_retain_for)(void **, int, const void *);
    size_t (*live_count)(void);
    size_t (*snapshot_live)(struct fake_cuda_range *, size_t);
    int (*lookup)(const void *, struct fake_cuda_registration *);
    size_t (*violation_count)(void);
    size_t (*violation_count_of)(int);
    void (*reset)(void);
    void (*reload_config)(void);
    void (*set_fail_every)(unsigned, unsigned, int);
    void (*set_check)(int);
    uint64_t (*copy_count)(int);
};

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static bool config_loaded;
static struct fake_config config;
static bool unloading;
static bool fork_poisoned;       /* a fork child of a process where we had initialised */
static bool runtime_initialised; /* cuInit succeeded through us */
static int log_fd = -1;

static struct driver_api driver;
static bool driver_ready; /* driver is filled in; read with acquire */

/* The primary contexts the runtime holds one reference to, and the handle it
 * last got for each (to recognise it after cudaDeviceReset). */
static bool retained[FAKE_CUDA_MAX_DEVICES];
static void *primary_handle[FAKE_CUDA_MAX_DEVICES];

static uint64_t call_counts[FAKE_CALL_KIND_COUNT];

/* initial-exec: a dlopen'ed library's dynamic TLS is allocated with malloc on
 * a thread's first access, which the shim intercepts; static TLS is not. */
static _Thread_local int thread_last_error __attribute__((tls_model("initial-exec")));
static _Thread_local int thread_device __attribute__((tls_model("initial-exec")));

static unsigned env_unsigned(const char *name, unsigned fallback)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return fallback;
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno || *end || text[0] == '-' || value > UINT32_MAX)
        return fallback;
    return (unsigned)value;
}

static void load_config_locked(void)
{
    config.no_driver = env_unsigned("FAKE_CUDART_NO_DRIVER", 0) != 0;
    const char *unload = getenv("FAKE_CUDART_UNLOAD_AT_EXIT");
    config.unload_at_exit =
        unload != NULL && (strcmp(unload, "1") == 0 || strcmp(unload, "late") == 0);
    config.unload_late = unload != NULL && strcmp(unload, "late") == 0;
    const char *path = getenv("FAKE_CUDA_DRIVER");
    if (!path || !*path)
        path = FAKE_CUDA_DRIVER_PATH;
    size_t length = strlen(path);
    if (length >= sizeof config.driver_path)
        length = 0; /* too long to be ours: no driver */
    memcpy(config.driver_path, path, length);
    config.driver_path[length] = '\0';

    if (log_fd >= 0)
        close(log_fd);
    log_fd = -1;
    const char *log_path = getenv("FAKE_CUDART_LOG");
    if (log_path && *log_path)
        log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    config_loaded = true;
}

static void lock_state(void)
{
    pthread_mutex_lock(&state_lock);
    if (!config_loaded)
        load_config_locked();
}

static void unlock_state(void)
{
    pthread_mutex_unlock(&state_lock);
}

static void forget_contexts_locked(void)
{
    memset(retained, 0, sizeof retained);
    memset(primary_handle, 0, sizeof primary_handle);
}

/* A fork while another thread holds state_lock would leave it locked forever
 * in the child; the shim's tests fork. */
static void before_fork(void)
{
    pthread_mutex_lock(&state_lock);
}

static void after_fork_in_parent(void)
{
    pthread_mutex_unlock(&state_lock);
}

/* The child of a process where the runtime had initialised gets
 * cudaErrorInitializationError from every call; it holds no context. */
static void after_fork_in_child(void)
{
    fork_poisoned = fork_poisoned || runtime_initialised;
    runtime_initialised = false;
    forget_contexts_locked();
    pthread_mutex_unlock(&state_lock);
}

static void enter_unloading_if_configured(void)
{
    lock_state();
    if (config.unload_at_exit)
        unloading = true;
    unlock_state();
}

/* The real runtime tears itself down from an exit handler registered when it
 * starts, so exit handlers registered before that and every library
 * destructor (the shim's included) see cudaErrorCudartUnloading. We do the
 * same, with the destructor as a backstop for dlclose. */
static void at_exit_teardown(void)
{
    enter_unloading_if_configured();
}

__attribute__((constructor)) static void fake_cudart_load(void)
{
    lock_state();
    unlock_state();
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    atexit(at_exit_teardown);
}

__attribute__((destructor)) static void fake_cudart_unload(void)
{
    enter_unloading_if_configured();
}

/* ------------------------------------------------------------------------ */
/* Log lines: the driver writes the register/unregister line of every call  */
/* that reaches it; the runtime writes those of calls that fail before.     */

static void log_register(uintptr_t base, size_t size, unsigned flags, int error)
{
    if (log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "register");
    fake_line_pointer(&line, base);
    fake_line_decimal(&line, size);
    fake_line_decimal(&line, flags);
    fake_line_signed(&line, error);
    fake_line_emit(&line, log_fd);
}

static void log_unregister(uintptr_t base, int error)
{
    if (log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "unregister");
    fake_line_pointer(&line, base);
    fake_line_signed(&line, error);
    fake_line_emit(&line, log_fd);
}

static void log_get_last_error(int error)
{
    if (log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "getlasterror");
    fake_line_signed(&line, error);
    fake_line_emit(&line, log_fd);
}

/* ------------------------------------------------------------------------ */
/* The driver, loaded at the first call that needs it.                      */

static bool resolve(void *library, const char *name, void *slot)
{
    void *symbol = dlsym(library, name);
    memcpy(slot, &symbol, sizeof symbol);
    return symbol != NULL;
}

/* The driver, or NULL when it is "missing" (FAKE_CUDART_NO_DRIVER, no path,
 * a library that cannot be loaded or is not the fake). With load false, only
 * a driver the process has loaded already (by us or otherwise). */
static const struct driver_api *driver_get(bool load)
{
    if (__atomic_load_n(&driver_ready, __ATOMIC_ACQUIRE))
        return &driver;
    char path[sizeof config.driver_path];
    lock_state();
    bool missing = config.no_driver || !config.driver_path[0];
    memcpy(path, config.driver_path, sizeof path);
    unlock_state();
    if (missing)
        return NULL;

    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
    if (!library)
        return NULL;
    struct driver_api api;
    bool complete =
        resolve(library, "fake_cuda_reset", &api.reset) && /* the fake, never a real one */
        resolve(library, "cuInit", &api.init) &&
        resolve(library, "cuDeviceGetCount", &api.device_get_count) &&
        resolve(library, "cuCtxGetCurrent", &api.ctx_get_current) &&
        resolve(library, "cuCtxSetCurrent", &api.ctx_set_current) &&
        resolve(library, "cuCtxGetDevice", &api.ctx_get_device) &&
        resolve(library, "cuDevicePrimaryCtxRelease_v2", &api.primary_release) &&
        resolve(library, "cuDevicePrimaryCtxReset_v2", &api.primary_reset) &&
        resolve(library, "cuMemHostRegister_v2", &api.mem_host_register) &&
        resolve(library, "cuMemHostUnregister", &api.mem_host_unregister) &&
        resolve(library, "cuDeviceGetAttribute", &api.device_get_attribute) &&
        resolve(library, "cuMemHostGetDevicePointer_v2", &api.mem_host_get_device_pointer) &&
        resolve(library, "cuMemHostAlloc", &api.mem_host_alloc) &&
        resolve(library, "cuMemFreeHost", &api.mem_free_host) &&
        resolve(library, "cuMemAlloc_v2", &api.mem_alloc) &&
        resolve(library, "cuMemFree_v2", &api.mem_free) &&
        resolve(library, "cuMemcpyHtoD_v2", &api.memcpy_htod) &&
        resolve(library, "cuMemcpyDtoH_v2", &api.memcpy_dtoh) &&
        resolve(library, "cuMemcpyDtoD_v2", &api.memcpy_dtod) &&
        resolve(library, "cuMemcpy", &api.memcpy_unified) &&
        resolve(library, "cuMemcpyHtoDAsync_v2", &api.memcpy_htod_async) &&
        resolve(library, "cuMemcpyDtoHAsync_v2", &api.memcpy_dtoh_async) &&
        resolve(library, "cuMemcpyDtoDAsync_v2", &api.memcpy_dtod_async) &&
        resolve(library, "cuMemcpyAsync", &api.memcpy_unified_async) &&
        resolve(library, "cuStreamSynchronize", &api.stream_synchronize) &&
        resolve(library, "cuThreadExchangeStreamCaptureMode", &api.exchange_capture_mode) &&
        resolve(library, "cuStreamBeginCapture_v2", &api.stream_begin_capture) &&
        resolve(library, "cuStreamEndCapture", &api.stream_end_capture) &&
        resolve(library, "fake_cuda_internal_primary_ctx_retain", &api.primary_retain_for) &&
        resolve(library, "fake_cuda_live_count", &api.live_count) &&
        resolve(library, "fake_cuda_snapshot_live", &api.snapshot_live) &&
        resolve(library, "fake_cuda_lookup", &api.lookup) &&
        resolve(library, "fake_cuda_violation_count", &api.violation_count) &&
        resolve(library, "fake_cuda_violation_count_of", &api.violation_count_of) &&
        resolve(library, "fake_cuda_reload_config", &api.reload_config) &&
        resolve(library, "fake_cuda_set_fail_every", &api.set_fail_every) &&
        resolve(library, "fake_cuda_set_check", &api.set_check) &&
        resolve(library, "fake_cuda_copy_count", &api.copy_count);
    if (!complete) {
        dlclose(library);
        return NULL;
    }
    lock_state();
    if (!driver_ready) {
        driver = api;
        __atomic_store_n(&driver_ready, true, __ATOMIC_RELEASE);
    }
    unlock_state();
    return &driver;
}

/* Driver errors as the runtime reports them. Every code the fake driver
 * returns keeps its number: 1 InvalidValue, 2 MemoryAllocation, 3
 * InitializationError, 4 (DEINITIALIZED) CudartUnloading, 100 NoDevice, 101
 * InvalidDevice, 201 (INVALID_CONTEXT) DeviceUninitialized, 709
 * ContextIsDestroyed, 712, 713, 800, 801; injected errors pass through. */
static int runtime_error_of(int driver_error)
{
    return driver_error;
}

/* The error every entry point returns before anything else. */
static int runtime_state_error_locked(void)
{
    if (unloading)
        return FAKE_CUDA_ERROR_CUDART_UNLOADING;
    if (config.no_driver)
        return FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER;
    if (fork_poisoned)
        return FAKE_CUDA_ERROR_INITIALIZATION;
    return FAKE_CUDA_SUCCESS;
}

/* What every call that needs the driver does first: load it, cuInit(0). */
static int runtime_enter(const struct driver_api **api)
{
    lock_state();
    int error = runtime_state_error_locked();
    unlock_state();
    if (error)
        return error;
    *api = driver_get(true);
    if (!*api)
        return FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER;
    error = runtime_error_of((*api)->init(0));
    if (!error) {
        lock_state();
        runtime_initialised = true;
        unlock_state();
    }
    return error;
}

/* Makes the primary context of device current on the calling thread,
 * retaining it (and so creating it when inactive, attributed to caller). The
 * runtime keeps one reference per device; extra ones are given back. */
static int acquire_primary(const struct driver_api *api, int device, const void *caller)
{
    void *context = NULL;
    int error = api->primary_retain_for(&context, device, caller);
    if (error)
        return runtime_error_of(error);
    lock_state();
    bool first = !retained[device];
    retained[device] = true;
    primary_handle[device] = context;
    unlock_state();
    if (!first)
        api->primary_release(device);
    return runtime_error_of(api->ctx_set_current(context));
}

/* The device whose primary context the runtime last got as handle, or -1. */
static int runtime_primary_device(void *handle)
{
    int device = -1;
    lock_state();
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES && device < 0; d++) {
        if (retained[d] && primary_handle[d] == handle)
            device = d;
    }
    unlock_state();
    return device;
}

/* Makes sure a context is current on the calling thread: the one already
 * current, else the primary context of the thread's device. A primary context
 * of the runtime's that was reset (cudaDeviceReset) is brought back, as the
 * real runtime does; any other destroyed context is the caller's problem
 * (cudaErrorContextIsDestroyed). */
static int ensure_context(const struct driver_api *api, const void *caller)
{
    void *current = NULL;
    int error = api->ctx_get_current(&current);
    if (error)
        return runtime_error_of(error);
    if (!current)
        return acquire_primary(api, thread_device, caller);
    int device;
    error = api->ctx_get_device(&device);
    if (error == FAKE_CU_ERROR_CONTEXT_IS_DESTROYED) {
        int primary_device = runtime_primary_device(current);
        if (primary_device >= 0)
            return acquire_primary(api, primary_device, caller);
    }
    return runtime_error_of(error);
}

/* cudaHostRegisterDefault (0) means mapped and portable on a system with
 * unified addressing (64-bit Linux); the other bits are the driver's. */
static unsigned driver_register_flags(unsigned flags)
{
    return flags ? flags : FAKE_CU_MEMHOSTREGISTER_PORTABLE | FAKE_CU_MEMHOSTREGISTER_DEVICEMAP;
}

static void count_call(int which)
{
    lock_state();
    call_counts[which]++;
    unlock_state();
}

/* Failures stay in the calling thread's last error until cudaGetLastError. */
static int finish_call(int error)
{
    if (error)
        thread_last_error = error;
    return error;
}

/* ------------------------------------------------------------------------ */
/* The CUDA runtime entry points.                                           */

FAKE_EXPORT int cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_REGISTER);
    static int late_handler_registered;
    if (config.unload_late && !__atomic_exchange_n(&late_handler_registered, 1, __ATOMIC_RELAXED))
        atexit(at_exit_teardown);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (error)
        log_register((uintptr_t)ptr, size, flags, error);
    else
        error = runtime_error_of(api->mem_host_register(ptr, size, driver_register_flags(flags)));
    return finish_call(error);
}

FAKE_EXPORT int cudaHostUnregister(void *ptr)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_UNREGISTER);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (error)
        log_unregister((uintptr_t)ptr, error);
    else
        error = runtime_error_of(api->mem_host_unregister(ptr));
    return finish_call(error);
}

/* With no driver (or after teardown, or in a poisoned fork child) the runtime
 * reports that state instead of the thread's error; reading it still clears
 * the thread's error. */
FAKE_EXPORT_EXTRA int cudaGetLastError(void)
{
    lock_state();
    call_counts[FAKE_CALL_GET_LAST_ERROR]++;
    int error = runtime_state_error_locked();
    if (!error)
        error = thread_last_error;
    thread_last_error = FAKE_CUDA_SUCCESS;
    log_get_last_error(error);
    unlock_state();
    return error;
}

FAKE_EXPORT_EXTRA int cudaPeekAtLastError(void)
{
    lock_state();
    call_counts[FAKE_CALL_PEEK_AT_LAST_ERROR]++;
    int error = runtime_state_error_locked();
    unlock_state();
    if (error)
        return finish_call(error);
    return thread_last_error;
}

/* Initialises the driver (as the real one does) and reports its count; with
 * no device, *count is 0. */
FAKE_EXPORT_EXTRA int cudaGetDeviceCount(int *count)
{
    lock_state();
    call_counts[FAKE_CALL_GET_DEVICE_COUNT]++;
    int error = runtime_state_error_locked();
    unlock_state();
    if (!error && !count)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    const struct driver_api *api = NULL;
    if (!error) {
        error = runtime_enter(&api);
        if (error == FAKE_CUDA_ERROR_NO_DEVICE)
            *count = 0;
    }
    if (!error)
        error = runtime_error_of(api->device_get_count(count));
    return finish_call(error);
}

/* CUDA 12+: selects the device for the calling thread and initialises its
 * primary context, making it current. */
FAKE_EXPORT_EXTRA int cudaSetDevice(int device)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_SET_DEVICE);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    int count = 0;
    if (!error)
        error = runtime_error_of(api->device_get_count(&count));
    if (!error && (device < 0 || device >= count))
        error = FAKE_CUDA_ERROR_INVALID_DEVICE;
    if (!error) {
        thread_device = device;
        error = acquire_primary(api, device, caller);
    }
    return finish_call(error);
}

/* The device of the context current on the thread, else the thread's
 * selected device (0 until cudaSetDevice). Creates no context. */
static int current_device(const struct driver_api *api, int *device)
{
    void *current = NULL;
    int error = runtime_error_of(api->ctx_get_current(&current));
    if (error)
        return error;
    int found = thread_device;
    if (current && api->ctx_get_device(&found) != FAKE_CU_SUCCESS)
        found = thread_device;
    *device = found;
    return FAKE_CUDA_SUCCESS;
}

FAKE_EXPORT_EXTRA int cudaGetDevice(int *device)
{
    count_call(FAKE_CALL_GET_DEVICE);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error && !device)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    if (!error)
        error = current_device(api, device);
    return finish_call(error);
}

/* cudaFree(NULL) is the usual way to initialise (no operation, documented);
 * any other pointer is the driver's cuMemFree_v2 (not cudaMalloc's base:
 * cudaErrorInvalidValue). */
FAKE_EXPORT_EXTRA int cudaFree(void *device_pointer)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_FREE);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error && device_pointer)
        error = runtime_error_of(api->mem_free((unsigned long long)(uintptr_t)device_pointer));
    return finish_call(error);
}

/* cuMemAlloc_v2 in the thread's context. Size 0: success and NULL without
 * asking the driver (whose cuMemAlloc refuses 0). */
FAKE_EXPORT_EXTRA int cudaMalloc(void **device_pointer, size_t size)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_MALLOC);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error && !device_pointer)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    unsigned long long address = 0;
    if (!error && size)
        error = runtime_error_of(api->mem_alloc(&address, size));
    if (!error)
        *device_pointer = (void *)(uintptr_t)address;
    return finish_call(error);
}

/* cudaMemcpy / cudaMemcpyAsync: a direction beyond Default is
 * cudaErrorInvalidMemcpyDirection; HostToHost is the runtime's own memcpy
 * (no rule, no driver); the others are the driver's copies (HtoD, DtoH,
 * DtoD; Default: cuMemcpy, which infers each side from its address), whose
 * errors keep their numbers (the memcpy rule's INVALID_VALUE is 1). */
static int runtime_copy(void *destination, const void *source, size_t count, int kind, bool async,
                        void *stream, const void *caller)
{
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error && (kind < FAKE_CUDA_MEMCPY_HOST_TO_HOST || kind > FAKE_CUDA_MEMCPY_DEFAULT))
        error = FAKE_CUDA_ERROR_INVALID_MEMCPY_DIRECTION;
    if (error)
        return finish_call(error);
    unsigned long long to = (uintptr_t)destination, from = (uintptr_t)source;
    switch (kind) {
    case FAKE_CUDA_MEMCPY_HOST_TO_HOST:
        if (count && (!destination || !source))
            error = FAKE_CUDA_ERROR_INVALID_VALUE;
        else if (count)
            memmove(destination, source, count);
        break;
    case FAKE_CUDA_MEMCPY_HOST_TO_DEVICE:
        error = async ? api->memcpy_htod_async(to, source, count, stream)
                      : api->memcpy_htod(to, source, count);
        break;
    case FAKE_CUDA_MEMCPY_DEVICE_TO_HOST:
        error = async ? api->memcpy_dtoh_async(destination, from, count, stream)
                      : api->memcpy_dtoh(destination, from, count);
        break;
    case FAKE_CUDA_MEMCPY_DEVICE_TO_DEVICE:
        error = async ? api->memcpy_dtod_async(to, from, count, stream)
                      : api->memcpy_dtod(to, from, count);
        break;
    default:
        error = async ? api->memcpy_unified_async(to, from, count, stream)
                      : api->memcpy_unified(to, from, count);
        break;
    }
    return finish_call(runtime_error_of(error));
}

FAKE_EXPORT_EXTRA int cudaMemcpy(void *destination, const void *source, size_t count, int kind)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_MEMCPY);
    return runtime_copy(destination, source, count, kind, false, NULL, caller);
}

FAKE_EXPORT_EXTRA int cudaMemcpyAsync(void *destination, const void *source, size_t count, int kind,
                                      void *stream)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_MEMCPY_ASYNC);
    return runtime_copy(destination, source, count, kind, true, stream, caller);
}

/* The driver's cuStreamSynchronize (every copy is done when it returns). */
FAKE_EXPORT_EXTRA int cudaStreamSynchronize(void *stream)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_STREAM_SYNCHRONIZE);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error)
        error = runtime_error_of(api->stream_synchronize(stream));
    return finish_call(error);
}

/* Stream capture: the driver's (fake_cuda.h models its rules); the
 * runtime's modes and codes have the driver's numbers. */
FAKE_EXPORT_EXTRA int cudaThreadExchangeStreamCaptureMode(int *mode)
{
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = runtime_error_of(api->exchange_capture_mode(mode));
    return finish_call(error);
}

FAKE_EXPORT_EXTRA int cudaStreamBeginCapture(void *stream, int mode)
{
    const void *caller = CALLER();
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error)
        error = runtime_error_of(api->stream_begin_capture(stream, mode));
    return finish_call(error);
}

FAKE_EXPORT_EXTRA int cudaStreamEndCapture(void *stream, void **graph)
{
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = runtime_error_of(api->stream_end_capture(stream, graph));
    return finish_call(error);
}

FAKE_EXPORT_EXTRA int cudaDeviceSynchronize(void)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_DEVICE_SYNCHRONIZE);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    return finish_call(error);
}

/* Resets the primary context of the current device (its registrations go
 * with it). The runtime keeps its reference and brings the context back at
 * the next call that needs one. */
FAKE_EXPORT_EXTRA int cudaDeviceReset(void)
{
    count_call(FAKE_CALL_DEVICE_RESET);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    int device = 0;
    if (!error)
        error = current_device(api, &device);
    if (!error)
        error = runtime_error_of(api->primary_reset(device));
    return finish_call(error);
}

/* Writes only the leading `type` member of struct cudaPointerAttributes:
 * 1 (cudaMemoryTypeHost) inside a live registration of any context (read
 * from the driver's table), else 0 (unregistered). */
FAKE_EXPORT_EXTRA int cudaPointerGetAttributes(void *attributes, const void *ptr)
{
    const void *caller = CALLER();
    lock_state();
    call_counts[FAKE_CALL_POINTER_GET_ATTRIBUTES]++;
    int error = runtime_state_error_locked();
    unlock_state();
    if (!error && !attributes)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    const struct driver_api *api = NULL;
    if (!error)
        error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error) {
        int type = api->lookup(ptr, NULL) ? 1 : 0;
        memcpy(attributes, &type, sizeof type);
    }
    return finish_call(error);
}

FAKE_EXPORT_EXTRA int cudaDeviceGetAttribute(int *value, int attribute, int device)
{
    count_call(FAKE_CALL_DEVICE_GET_ATTRIBUTE);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = runtime_error_of(api->device_get_attribute(value, attribute, device));
    return finish_call(error);
}

FAKE_EXPORT_EXTRA int cudaHostGetDevicePointer(void **device_pointer, void *host_pointer,
                                               unsigned int flags)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_HOST_GET_DEVICE_POINTER);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    unsigned long long address = 0;
    if (!error && !device_pointer)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    if (!error)
        error = runtime_error_of(api->mem_host_get_device_pointer(&address, host_pointer, flags));
    if (!error)
        *device_pointer = (void *)(uintptr_t)address;
    return finish_call(error);
}

/* cudaHostAllocDefault (0) is portable and mapped on a UVA system. */
static int host_alloc(void **pointer, size_t size, unsigned flags, const void *caller)
{
    count_call(FAKE_CALL_HOST_ALLOC);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error)
        error = runtime_error_of(api->mem_host_alloc(
            pointer, size,
            flags ? flags : FAKE_CU_MEMHOSTALLOC_PORTABLE | FAKE_CU_MEMHOSTALLOC_DEVICEMAP));
    return finish_call(error);
}

FAKE_EXPORT_EXTRA int cudaHostAlloc(void **pointer, size_t size, unsigned int flags)
{
    return host_alloc(pointer, size, flags, CALLER());
}

FAKE_EXPORT_EXTRA int cudaMallocHost(void **pointer, size_t size)
{
    return host_alloc(pointer, size, 0, CALLER());
}

FAKE_EXPORT_EXTRA int cudaFreeHost(void *pointer)
{
    const void *caller = CALLER();
    count_call(FAKE_CALL_FREE_HOST);
    const struct driver_api *api = NULL;
    int error = runtime_enter(&api);
    if (!error)
        error = ensure_context(api, caller);
    if (!error)
        error = runtime_error_of(api->mem_free_host(pointer));
    return finish_call(error);
}

struct error_description {
    int code;
    const char *name;
    const char *text;
};

static const struct error_description error_descriptions[] = {
    {FAKE_CUDA_SUCCESS, "cudaSuccess", "no error"},
    {FAKE_CUDA_ERROR_INVALID_VALUE, "cudaErrorInvalidValue", "invalid argument"},
    {FAKE_CUDA_ERROR_MEMORY_ALLOCATION, "cudaErrorMemoryAllocation", "out of memory"},
    {FAKE_CUDA_ERROR_INITIALIZATION, "cudaErrorInitializationError", "initialization error"},
    {FAKE_CUDA_ERROR_CUDART_UNLOADING, "cudaErrorCudartUnloading", "driver shutting down"},
    {FAKE_CUDA_ERROR_INVALID_MEMCPY_DIRECTION, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {FAKE_CUDA_ERROR_STUB_LIBRARY, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {FAKE_CUDA_ERROR_NO_DEVICE, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {FAKE_CUDA_ERROR_INVALID_DEVICE, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {FAKE_CUDA_ERROR_DEVICE_UNINITIALIZED, "cudaErrorDeviceUninitialized",
     "invalid device context"},
    {FAKE_CUDA_ERROR_CONTEXT_IS_DESTROYED, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {FAKE_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {FAKE_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {FAKE_CUDA_ERROR_NOT_PERMITTED, "cudaErrorNotPermitted", "operation not permitted"},
    {FAKE_CUDA_ERROR_NOT_SUPPORTED, "cudaErrorNotSupported", "operation not supported"},
};

static const struct error_description *error_description_find(int error)
{
    static const struct error_description unknown = {-1, "cudaErrorUnknown", "unknown error"};
    for (size_t i = 0; i < sizeof error_descriptions / sizeof error_descriptions[0]; i++) {
        if (error_descriptions[i].code == error)
            return &error_descriptions[i];
    }
    return &unknown;
}

FAKE_EXPORT_EXTRA const char *cudaGetErrorName(int error)
{
    return error_description_find(error)->name;
}

FAKE_EXPORT_EXTRA const char *cudaGetErrorString(int error)
{
    return error_description_find(error)->text;
}

/* ------------------------------------------------------------------------ */
/* The query and control API for tests (registrations and violations are    */
/* the driver's: none while no driver is loaded; these never load it).      */

FAKE_EXPORT_EXTRA size_t fake_cudart_live_count(void)
{
    const struct driver_api *api = driver_get(false);
    return api ? api->live_count() : 0;
}

/* One atomic copy in the driver: other threads may change the table meanwhile. */
FAKE_EXPORT_EXTRA size_t fake_cudart_snapshot(struct fake_cudart_range *out, size_t max)
{
    const struct driver_api *api = driver_get(false);
    return api ? api->snapshot_live((struct fake_cuda_range *)out, max) : 0;
}

FAKE_EXPORT_EXTRA size_t fake_cudart_violation_count(void)
{
    const struct driver_api *api = driver_get(false);
    return api ? api->violation_count() : 0;
}

FAKE_EXPORT_EXTRA size_t fake_cudart_violation_count_of(enum fake_cudart_violation kind)
{
    const struct driver_api *api = driver_get(false);
    return api ? api->violation_count_of((int)kind) : 0;
}

FAKE_EXPORT_EXTRA uint64_t fake_cudart_copy_count(int kind)
{
    const struct driver_api *api = driver_get(false);
    return api ? api->copy_count(kind) : 0;
}

FAKE_EXPORT_EXTRA uint64_t fake_cudart_call_count(int which)
{
    if (which < 0 || which >= FAKE_CALL_KIND_COUNT)
        return 0;
    lock_state();
    uint64_t count = call_counts[which];
    unlock_state();
    return count;
}

FAKE_EXPORT_EXTRA void fake_cudart_reset(void)
{
    lock_state();
    memset(call_counts, 0, sizeof call_counts);
    unloading = false;
    fork_poisoned = false;
    runtime_initialised = false;
    forget_contexts_locked();
    load_config_locked();
    unlock_state();
    thread_last_error = FAKE_CUDA_SUCCESS;
    thread_device = 0;
    const struct driver_api *api = driver_get(false);
    if (api)
        api->reset();
}

FAKE_EXPORT_EXTRA void fake_cudart_reload_config(void)
{
    lock_state();
    load_config_locked();
    unlock_state();
    const struct driver_api *api = driver_get(false);
    if (api)
        api->reload_config();
}

FAKE_EXPORT_EXTRA void fake_cudart_set_fail_every(unsigned reg, unsigned unreg, int error)
{
    const struct driver_api *api = driver_get(true);
    if (api)
        api->set_fail_every(reg, unreg, error);
}

FAKE_EXPORT_EXTRA void fake_cudart_set_check(int on)
{
    const struct driver_api *api = driver_get(true);
    if (api)
        api->set_check(on);
}

FAKE_EXPORT_EXTRA void fake_cudart_simulate_exit(void)
{
    enter_unloading_if_configured();
}
