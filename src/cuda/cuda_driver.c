#include "cuda_driver.h"

#include "loaded_objects.h"
#include "pinshim_config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if PINSHIM_HAVE_CUDA_HEADERS
#include <cuda.h>
/* The entry points are called through int/uintptr_t-typed pointers: check
 * the sizes and numbers the shim relies on against the Toolkit's header. */
_Static_assert(sizeof(CUresult) == sizeof(int), "CUresult must be int-sized");
_Static_assert(sizeof(CUcontext) == sizeof(uintptr_t), "CUcontext must be pointer-sized");
_Static_assert(sizeof(CUdevice) == sizeof(int), "CUdevice must be int-sized");
_Static_assert((int)CUDA_ERROR_NOT_INITIALIZED == (int)CUDA_DRIVER_NOT_INITIALIZED &&
                   (int)CUDA_ERROR_DEINITIALIZED == (int)CUDA_DRIVER_DEINITIALIZED &&
                   (int)CUDA_ERROR_INVALID_CONTEXT == (int)CUDA_DRIVER_INVALID_CONTEXT &&
                   (int)CUDA_ERROR_CONTEXT_IS_DESTROYED == (int)CUDA_DRIVER_CONTEXT_IS_DESTROYED &&
                   (int)CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED == 712 &&
                   (int)CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED == (int)CUDA_DRIVER_NOT_REGISTERED,
               "CUresult values changed");
_Static_assert((int)CU_STREAM_CAPTURE_MODE_RELAXED == CUDA_DRIVER_CAPTURE_MODE_RELAXED,
               "CUstreamCaptureMode values changed");
_Static_assert(CU_MEMHOSTREGISTER_PORTABLE == ENGINE_REGISTER_PORTABLE &&
                   CU_MEMHOSTREGISTER_DEVICEMAP == ENGINE_REGISTER_DEVICEMAP &&
                   CU_MEMHOSTREGISTER_IOMEMORY == ENGINE_REGISTER_IOMEMORY &&
                   CU_MEMHOSTREGISTER_READ_ONLY == ENGINE_REGISTER_READ_ONLY,
               "cuMemHostRegister flag values changed");
_Static_assert((int)CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES ==
                       CUDA_DRIVER_ATTRIBUTE_PAGEABLE_USES_HOST_PAGE_TABLES &&
                   (int)CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED ==
                       CUDA_DRIVER_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
               "device attribute values changed");
#if CUDA_VERSION >= 12020
_Static_assert((int)CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID == CUDA_DRIVER_ATTRIBUTE_HOST_NUMA_ID,
               "device attribute values changed");
#endif
#endif

#define DRIVER_SONAME "libcuda.so.1"

bool cuda_driver_is_loaded(void)
{
    return loaded_objects_find(LOADED_CUDA_DRIVER, NULL, 0);
}

static void *driver_symbol(void *handle, const char *versioned, const char *plain)
{
    void *symbol = versioned != NULL ? dlsym(handle, versioned) : NULL;
    return symbol != NULL ? symbol : dlsym(handle, plain);
}

static pthread_mutex_t find_mutex = PTHREAD_MUTEX_INITIALIZER;

static bool find_locked(struct cuda_driver *driver);

bool cuda_driver_find(struct cuda_driver *driver)
{
    if (__atomic_load_n(&driver->found, __ATOMIC_ACQUIRE))
        return true;
    pthread_mutex_lock(&find_mutex);
    bool found = find_locked(driver);
    pthread_mutex_unlock(&find_mutex);
    return found;
}

static bool find_locked(struct cuda_driver *driver)
{
    if (driver->found)
        return true;
    /* The loader's list says whether it is there (no system call); then its
     * own name finds it without a search of the library directories. */
    char path[sizeof(driver->path)];
    if (!loaded_objects_find(LOADED_CUDA_DRIVER, path, sizeof(path)))
        return false;
    void *handle = dlopen(path[0] != '\0' ? path : DRIVER_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        return false;
    struct cuda_driver found = {.handle = handle};
    *(void **)&found.ctx_get_current = driver_symbol(handle, NULL, "cuCtxGetCurrent");
    *(void **)&found.ctx_get_device = driver_symbol(handle, NULL, "cuCtxGetDevice");
    *(void **)&found.ctx_push = driver_symbol(handle, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
    *(void **)&found.ctx_pop = driver_symbol(handle, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
    *(void **)&found.device_get_count = driver_symbol(handle, NULL, "cuDeviceGetCount");
    *(void **)&found.device_get = driver_symbol(handle, NULL, "cuDeviceGet");
    *(void **)&found.primary_get_state = driver_symbol(handle, NULL, "cuDevicePrimaryCtxGetState");
    *(void **)&found.primary_retain = driver_symbol(handle, NULL, "cuDevicePrimaryCtxRetain");
    *(void **)&found.primary_release =
        driver_symbol(handle, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
    *(void **)&found.host_register =
        driver_symbol(handle, "cuMemHostRegister_v2", "cuMemHostRegister");
    *(void **)&found.host_unregister = driver_symbol(handle, NULL, "cuMemHostUnregister");
    *(void **)&found.get_error_name = driver_symbol(handle, NULL, "cuGetErrorName");
    *(void **)&found.driver_get_version = driver_symbol(handle, NULL, "cuDriverGetVersion");
    *(void **)&found.device_get_attribute = driver_symbol(handle, NULL, "cuDeviceGetAttribute");
    *(void **)&found.device_get_pci_bus_id = driver_symbol(handle, NULL, "cuDeviceGetPCIBusId");
    *(void **)&found.exchange_capture_mode =
        driver_symbol(handle, NULL, "cuThreadExchangeStreamCaptureMode");
    if (found.ctx_get_current == NULL || found.ctx_get_device == NULL || found.ctx_push == NULL ||
        found.ctx_pop == NULL || found.device_get_count == NULL || found.device_get == NULL ||
        found.primary_get_state == NULL || found.primary_retain == NULL ||
        found.primary_release == NULL || found.host_register == NULL ||
        found.host_unregister == NULL) {
        dlclose(handle);
        return false;
    }
    Dl_info info;
    if (dladdr((void *)found.host_register, &info) && info.dli_fname != NULL)
        snprintf(found.path, sizeof(found.path), "%s", info.dli_fname);
    else
        snprintf(found.path, sizeof(found.path), "%s", DRIVER_SONAME);
    /* Keeps the handle: the driver is never unloaded under us. Published
     * last, for the lock-free check above. */
    *driver = found;
    __atomic_store_n(&driver->found, true, __ATOMIC_RELEASE);
    return true;
}

void cuda_driver_after_fork(void)
{
    pthread_mutex_init(&find_mutex, NULL);
}

bool cuda_driver_seen_initialized(const struct cuda_driver *driver)
{
    return __atomic_load_n(&driver->seen_initialized, __ATOMIC_RELAXED);
}

/* cuCtxGetCurrent, noting whether the driver is initialised. */
static int current_context(struct cuda_driver *driver, uintptr_t *current)
{
    int error = driver->ctx_get_current(current);
    if (error != CUDA_DRIVER_NOT_INITIALIZED && !driver->seen_initialized)
        __atomic_store_n(&driver->seen_initialized, true, __ATOMIC_RELAXED);
    return error;
}

enum cuda_driver_initialization cuda_driver_initialization(struct cuda_driver *driver)
{
    uintptr_t current = 0;
    if (!cuda_driver_find(driver))
        return CUDA_DRIVER_NOT_YET;
    int error = current_context(driver, &current);
    if (error == CUDA_DRIVER_NOT_INITIALIZED)
        return CUDA_DRIVER_NOT_YET;
    return error == CUDA_DRIVER_DEINITIALIZED ? CUDA_DRIVER_TORN_DOWN : CUDA_DRIVER_INITIALIZED;
}

/* Whether device's primary context is active: the program (or its runtime)
 * retained it. Never creates it. */
static bool primary_active(struct cuda_driver *driver, int device)
{
    unsigned flags = 0;
    int active = 0;
    return driver->primary_get_state(device, &flags, &active) == CUDA_DRIVER_SUCCESS && active;
}

/* The calling thread's current context as a place (see the header); *device
 * gets its device. */
static bool current_place(struct cuda_driver *driver, uintptr_t current, struct range_place *place)
{
    int device = -1;
    if (current == 0 || driver->ctx_get_device(&device) != CUDA_DRIVER_SUCCESS)
        return false;
    place->device = device;
    /* A primary context can be entered from any thread later; a context the
     * program created itself is used as it is. */
    uintptr_t primary = 0;
    if (primary_active(driver, device) &&
        driver->primary_retain(&primary, device) == CUDA_DRIVER_SUCCESS) {
        driver->primary_release(device);
        if (primary != current) {
            place->context = current;
            place->flags = RANGE_PLACE_THREAD_CONTEXT;
        }
    } else {
        place->context = current;
        place->flags = RANGE_PLACE_THREAD_CONTEXT;
    }
    return true;
}

bool cuda_driver_thread_place(struct cuda_driver *driver, struct range_place *place)
{
    *place = (struct range_place){.device = -1};
    uintptr_t current = 0;
    return cuda_driver_find(driver) && current_context(driver, &current) == CUDA_DRIVER_SUCCESS &&
           current_place(driver, current, place);
}

enum engine_choice cuda_driver_choose_place(struct cuda_driver *driver, bool from_worker,
                                            const struct range_place *hint, int *preferred_device,
                                            struct range_place *place)
{
    *place = (struct range_place){.device = -1};
    if (!cuda_driver_find(driver))
        return ENGINE_PLACE_DEFER; /* no driver: CUDA is not initialised here */
    uintptr_t current = 0;
    int error = current_context(driver, &current);
    if (error == CUDA_DRIVER_NOT_INITIALIZED)
        return ENGINE_PLACE_DEFER; /* loaded, not initialised (yet) */
    if (error == CUDA_DRIVER_DEINITIALIZED)
        return ENGINE_PLACE_DISABLED;
    if (!from_worker && error == CUDA_DRIVER_SUCCESS && current_place(driver, current, place)) {
        /* The locking thread's own context: the one its copies will use. */
        __atomic_store_n(preferred_device, place->device, __ATOMIC_RELAXED);
        return ENGINE_PLACE_READY;
    }
    /* No context on this thread: a device whose primary context the program
     * already made active, preferring the one it asked for, then the one its
     * threads use, then the lowest. */
    int count = 0;
    if (driver->device_get_count(&count) != CUDA_DRIVER_SUCCESS || count <= 0)
        return ENGINE_PLACE_DEFER;
    const int candidates[2] = {hint != NULL ? hint->device : -1,
                               __atomic_load_n(preferred_device, __ATOMIC_RELAXED)};
    for (int i = 0; i < 2; i++) {
        int device = candidates[i];
        if (device >= 0 && device < count && primary_active(driver, device)) {
            place->device = device;
            return ENGINE_PLACE_READY;
        }
    }
    for (int ordinal = 0; ordinal < count; ordinal++) {
        int device = -1;
        if (driver->device_get(&device, ordinal) == CUDA_DRIVER_SUCCESS &&
            primary_active(driver, device)) {
            place->device = device;
            return ENGINE_PLACE_READY;
        }
    }
    return ENGINE_PLACE_DEFER;
}

/* Enters the context place names (when it is not current already); *entered
 * tells the caller to leave it, *retained to release the primary context. */
static int enter_place(struct cuda_driver *driver, const struct range_place *place, bool *entered,
                       bool *retained)
{
    *entered = *retained = false;
    uintptr_t current = 0;
    int error = driver->ctx_get_current(&current);
    if (error != CUDA_DRIVER_SUCCESS)
        return error;
    uintptr_t target = place->context;
    if (target == 0) {
        /* The device's primary context, only while the program keeps it
         * active: retaining an inactive one would create it. */
        if (place->device < 0 || !primary_active(driver, place->device))
            return CUDA_DRIVER_NO_CONTEXT;
        error = driver->primary_retain(&target, place->device);
        if (error != CUDA_DRIVER_SUCCESS)
            return error;
        *retained = true;
    }
    if (current == target)
        return CUDA_DRIVER_SUCCESS;
    error = driver->ctx_push(target);
    if (error == CUDA_DRIVER_SUCCESS)
        *entered = true;
    return error;
}

static void leave_place(struct cuda_driver *driver, const struct range_place *place, bool entered,
                        bool retained)
{
    if (entered) {
        uintptr_t popped = 0;
        driver->ctx_pop(&popped);
    }
    if (retained)
        driver->primary_release(place->device);
}

static bool context_gone(int error)
{
    return error == CUDA_DRIVER_NO_CONTEXT || error == CUDA_DRIVER_INVALID_CONTEXT ||
           error == CUDA_DRIVER_CONTEXT_IS_DESTROYED;
}

/* Stream capture: while a thread of the program captures a graph in the
 * global mode (the default), a "potentially unsafe" call from any thread in
 * the global mode fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)
 * and invalidates the program's capture (its cuStreamEndCapture then fails:
 * 901). cuMemHostRegister is such a call (vLLM #46933); PyTorch makes its
 * own cudaHostRegister and cudaHostAlloc in the relaxed mode for that
 * reason (CUDAStreamCaptureModeGuard). The shim's calls run in the relaxed
 * mode, the thread's own mode given back after: a capture never sees them,
 * nor they it. */
int cuda_capture_relaxed_enter(int (*exchange)(int *mode))
{
    int mode = CUDA_DRIVER_CAPTURE_MODE_RELAXED;
    if (exchange == NULL || exchange(&mode) != CUDA_DRIVER_SUCCESS)
        return -1;
    return mode;
}

void cuda_capture_relaxed_leave(int (*exchange)(int *mode), int previous)
{
    if (previous >= 0 && previous != CUDA_DRIVER_CAPTURE_MODE_RELAXED)
        exchange(&previous);
}

int cuda_driver_register(struct cuda_driver *driver, const struct range_place *place, void *base,
                         size_t length, unsigned flags)
{
    if (!cuda_driver_find(driver))
        return CUDA_DRIVER_NO_CONTEXT;
    int capture_mode = cuda_capture_relaxed_enter(driver->exchange_capture_mode);
    bool entered, retained;
    int error = enter_place(driver, place, &entered, &retained);
    if (error == CUDA_DRIVER_SUCCESS)
        error = driver->host_register(base, length, flags);
    leave_place(driver, place, entered, retained);
    cuda_capture_relaxed_leave(driver->exchange_capture_mode, capture_mode);
    return context_gone(error) ? CUDA_DRIVER_NO_CONTEXT : error;
}

int cuda_driver_unregister(struct cuda_driver *driver, const struct range_place *place, void *base)
{
    if (!cuda_driver_find(driver))
        return CUDA_DRIVER_NOT_REGISTERED;
    int capture_mode = cuda_capture_relaxed_enter(driver->exchange_capture_mode);
    bool entered, retained;
    int error = enter_place(driver, place, &entered, &retained);
    if (error == CUDA_DRIVER_SUCCESS)
        error = driver->host_unregister(base);
    leave_place(driver, place, entered, retained);
    cuda_capture_relaxed_leave(driver->exchange_capture_mode, capture_mode);
    /* A context that is gone took its registrations with it. */
    return context_gone(error) ? CUDA_DRIVER_NOT_REGISTERED : error;
}

int cuda_driver_device_attribute(struct cuda_driver *driver, int attribute, int device, int *value)
{
    if (!cuda_driver_find(driver) || driver->device_get_attribute == NULL)
        return -1;
    return driver->device_get_attribute(value, attribute, device);
}

int cuda_driver_pci_bus_id(struct cuda_driver *driver, int device, char *out, int out_size)
{
    if (!cuda_driver_find(driver) || driver->device_get_pci_bus_id == NULL)
        return -1;
    return driver->device_get_pci_bus_id(out, out_size, device);
}

const char *cuda_driver_error_name(struct cuda_driver *driver, int error)
{
    const char *name = NULL;
    if (driver->found && driver->get_error_name != NULL &&
        driver->get_error_name(error, &name) == CUDA_DRIVER_SUCCESS && name != NULL)
        return name;
    return NULL;
}
