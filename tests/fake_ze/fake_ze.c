/* fake_ze: see fake_ze.h for what it models and where each rule comes
 * from. No allocation (the shim under test interposes the allocator). */
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#include "fake_pins.h"
#include "fake_ze.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* driver_experimental/zex_driver.h (intel/compute-runtime), in no package. */
typedef ze_result_t (*zex_import_fn)(ze_driver_handle_t, void *, size_t);
typedef ze_result_t (*zex_release_fn)(ze_driver_handle_t, void *);
typedef ze_result_t (*zex_base_fn)(ze_driver_handle_t, void *, void **);

/* Core API 1.6 (loaders from 1.9): not in the 1.8 headers the double is
 * built against; declared as ze_api.h has it since. */
ze_result_t zeCommandListHostSynchronize(ze_command_list_handle_t list, uint64_t timeout);

enum {
    MAX_DRIVERS = 4,
    MAX_COMMAND_LISTS = 64,
    LOADER_MAGIC = 0x4c6f61646572u,
    DRIVER_MAGIC = 0x447276u
};

struct driver {
    uint64_t magic;
    unsigned index;
    bool imports; /* offers zexDriverImportExternalPointer */
};

struct loader_driver {
    uint64_t magic;
    struct driver *driver;
};

static struct driver drivers[MAX_DRIVERS];
static struct loader_driver loader_drivers[MAX_DRIVERS];
static unsigned driver_count = 1;
static unsigned import_driver_count = 1; /* the first ones offer the import */
static bool import_enabled = true;

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool initialized;
/* FAKE_ZE_START=fail: the drivers are there but find no device. */
static bool start_fails;
/* FAKE_ZE_LOADER_KEEPS_DRIVERS=1: a loader from 1.17.39 over an Intel
 * driver before 23.48 (else: a loader up to 1.17.28, the double's 1.17.0). */
static bool keeps_failed_drivers;
/* The first zeInit's answer, which the loader keeps (call_once). */
static bool init_attempted;
static ze_result_t init_result;

static void load_config(void)
{
    const char *count = getenv("FAKE_ZE_DRIVERS");
    if (count != NULL && *count)
        driver_count = (unsigned)atoi(count);
    if (driver_count > MAX_DRIVERS)
        driver_count = MAX_DRIVERS;
    const char *importers = getenv("FAKE_ZE_IMPORT_DRIVERS");
    if (importers != NULL && *importers)
        import_driver_count = (unsigned)atoi(importers);
    if (import_driver_count > driver_count)
        driver_count = import_driver_count;
    const char *import = getenv("FAKE_ZE_IMPORT");
    import_enabled = import == NULL || strcmp(import, "0") != 0;
    const char *start = getenv("FAKE_ZE_START");
    start_fails = start != NULL && strcmp(start, "fail") == 0;
    const char *keeps = getenv("FAKE_ZE_LOADER_KEEPS_DRIVERS");
    keeps_failed_drivers = keeps != NULL && strcmp(keeps, "1") == 0;
    for (unsigned i = 0; i < MAX_DRIVERS; i++) {
        drivers[i] = (struct driver){DRIVER_MAGIC, i, i < import_driver_count};
        loader_drivers[i] = (struct loader_driver){LOADER_MAGIC, &drivers[i]};
    }
    fake_pins_configure(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
}

static void enter(enum fake_ze_call kind, const void *caller)
{
    pthread_once(&config_once, load_config);
    fake_pins_count_call(kind, caller);
}

static bool is_initialized(void)
{
    pthread_mutex_lock(&init_lock);
    bool done = initialized;
    pthread_mutex_unlock(&init_lock);
    return done;
}

/* Whether a driver's start failed after the loader had loaded it. */
static bool start_failed(void)
{
    pthread_mutex_lock(&init_lock);
    bool failed = init_attempted && init_result != ZE_RESULT_SUCCESS && driver_count > 0;
    pthread_mutex_unlock(&init_lock);
    return failed;
}

/* An entry point reached through the loader's table after the drivers'
 * start failed: loaders up to 1.17.28 unloaded the driver and kept its
 * functions in the table (ze_loader.cpp check_drivers, FREE_DRIVER_LIBRARY;
 * ze_lib.cpp fills the table first), so the call jumps into unmapped code. */
static void after_failed_start(void)
{
    if (start_failed() && !keeps_failed_drivers)
        raise(SIGSEGV);
}

/* The driver of a loader's handle, or NULL. */
static struct driver *driver_of_loader_handle(const void *handle)
{
    for (unsigned i = 0; i < driver_count; i++)
        if (handle == &loader_drivers[i])
            return loader_drivers[i].driver;
    return NULL;
}

/* The driver of a driver's own handle, or NULL. */
static struct driver *driver_of_own_handle(const void *handle)
{
    for (unsigned i = 0; i < driver_count; i++)
        if (handle == &drivers[i])
            return &drivers[i];
    return NULL;
}

/* ---- the loader ---- */

/* The loader starts once (ze_libapi.cpp: std::call_once, a static result):
 * every later zeInit, whatever its flags, gets the first one's answer and
 * reaches no driver. */
FAKE_EXPORT ze_result_t zeInit(ze_init_flags_t flags)
{
    enter(FAKE_ZE_CALL_INIT, FAKE_CALLER());
    if (flags & ~(ze_init_flags_t)(ZE_INIT_FLAG_GPU_ONLY | ZE_INIT_FLAG_VPU_ONLY))
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    pthread_mutex_lock(&init_lock);
    if (!init_attempted) {
        init_attempted = true;
        init_result =
            driver_count == 0 || start_fails ? ZE_RESULT_ERROR_UNINITIALIZED : ZE_RESULT_SUCCESS;
        initialized = init_result == ZE_RESULT_SUCCESS;
    }
    ze_result_t result = init_result;
    pthread_mutex_unlock(&init_lock);
    return result;
}

/* The loader's components once a zeInit has loaded a driver (1.8.12: none
 * before, none when no driver library is found): asks no driver. */
FAKE_EXPORT ze_result_t zelLoaderGetVersions(size_t *count, zel_component_version_t *versions)
{
    /* Not counted: the count takes a lock, and the shim asks this in a fork
     * child, where another thread of the parent may have held it. */
    pthread_once(&config_once, load_config);
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    /* The real one reads its vector without a lock (the shim asks in a
     * fork child): so does the double. */
    size_t components =
        __atomic_load_n(&init_attempted, __ATOMIC_ACQUIRE) && driver_count > 0 ? 1 : 0;
    if (versions != NULL && *count > 0 && components > 0) {
        memset(&versions[0], 0, sizeof(versions[0]));
        strcpy(versions[0].component_name, "loader");
        versions[0].component_lib_version = (zel_version_t){1, 17, 0};
    }
    if (versions == NULL || *count > components)
        *count = components;
    return ZE_RESULT_SUCCESS;
}

FAKE_EXPORT ze_result_t zeDriverGet(uint32_t *count, ze_driver_handle_t *handles)
{
    enter(FAKE_ZE_CALL_DRIVER_GET, FAKE_CALLER());
    after_failed_start();
    if (start_failed()) {
        /* The driver's own zeDriverGet, passed through with one driver: a
         * count of 1 and a NULL handle (driver.cpp before 78b01e25d3). */
        if (count == NULL)
            return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
        if (*count > 0 && handles != NULL)
            handles[0] = NULL;
        *count = 1;
        return ZE_RESULT_SUCCESS;
    }
#ifdef FAKE_ZE_LOADER_1_15_7
    /* 1.15.7 dereferences its table before checking it (fixed in 1.15.8). */
    if (!is_initialized())
        raise(SIGSEGV);
#endif
    if (!is_initialized())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || handles == NULL) {
        *count = driver_count;
        return ZE_RESULT_SUCCESS;
    }
    if (*count > driver_count)
        *count = driver_count;
    for (uint32_t i = 0; i < *count; i++)
        handles[i] = (ze_driver_handle_t)&loader_drivers[i];
    return ZE_RESULT_SUCCESS;
}

/* Before zeInit: UNINITIALIZED as the 1.8 loader answers, recorded because
 * loaders from 1.15.7 crash there. */
static bool too_early(void)
{
    after_failed_start();
    if (is_initialized())
        return false;
#ifdef FAKE_ZE_LOADER_1_15_7
    raise(SIGSEGV);
#endif
    fake_pins_lock();
    fake_pins_violation(FAKE_GPU_VIOLATION_TOO_EARLY, 0, 0);
    fake_pins_unlock();
    return true;
}

FAKE_EXPORT ze_result_t zelLoaderTranslateHandle(zel_handle_type_t type, void *handle_in,
                                                 void **handle_out)
{
    enter(FAKE_ZE_CALL_TRANSLATE_HANDLE, FAKE_CALLER());
    if (handle_in == NULL || handle_out == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct driver *driver = type == ZEL_HANDLE_DRIVER ? driver_of_loader_handle(handle_in) : NULL;
    *handle_out = driver != NULL ? (void *)driver : handle_in;
    return ZE_RESULT_SUCCESS;
}

/* ---- the driver's import (reached through the loader only) ---- */

/* The driver a zex call was given, or NULL after recording what it was. */
static struct driver *called_driver(ze_driver_handle_t handle)
{
    struct driver *driver = driver_of_own_handle(handle);
    if (driver == NULL && driver_of_loader_handle(handle) != NULL) {
        fake_pins_lock();
        fake_pins_violation(FAKE_GPU_VIOLATION_LOADER_HANDLE, (uintptr_t)handle, 0);
        fake_pins_unlock();
    }
    return driver;
}

/* MapBasedAllocationTracker::get: the greatest base at or below, checked;
 * each driver has its own tracker (one table here, entries tagged by
 * driver: a scan when several drivers import). */
static long import_at(struct driver *driver, uintptr_t address)
{
    if (import_driver_count <= 1) {
        long at = fake_pins_containing(address);
        return at >= 0 && fake_pins_at(at)->tag == (uintptr_t)driver &&
                       fake_pins_at(at)->state != FAKE_PINS_REGISTERING
                   ? at
                   : -1;
    }
    long floor = -1;
    for (size_t i = 0; i < fake_pins_count() && fake_pins_at((long)i)->base <= address; i++)
        if (fake_pins_at((long)i)->tag == (uintptr_t)driver)
            floor = (long)i;
    if (floor < 0 || fake_pins_at(floor)->state == FAKE_PINS_REGISTERING)
        return -1;
    const struct fake_pins_entry *entry = fake_pins_at(floor);
    return address - entry->base < entry->size ? floor : -1;
}

/* How many of driver's imports overlap [base, base + size). */
static size_t imports_overlapping(struct driver *driver, uintptr_t base, size_t size)
{
    size_t covered = 0;
    if (import_driver_count <= 1) {
        fake_pins_overlapping(base, size, &covered);
        return covered;
    }
    for (size_t i = 0; i < fake_pins_count(); i++) {
        const struct fake_pins_entry *entry = fake_pins_at((long)i);
        if (entry->tag == (uintptr_t)driver && entry->base < base + size &&
            base < entry->base + entry->size)
            covered++;
    }
    return covered;
}

__attribute__((noinline)) static ze_result_t zex_import(ze_driver_handle_t handle, void *pointer,
                                                        size_t size)
{
    enter(FAKE_ZE_CALL_IMPORT, FAKE_CALLER());
    struct driver *driver = called_driver(handle);
    if (driver == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!import_enabled)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    uintptr_t base = (uintptr_t)pointer;
    if (pointer == NULL || size == 0)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    /* compute-runtime's userptr (DrmMemoryManager::allocUserptr) asks for no
     * read-only flag, so the kernel pins it for writing. */
    bool pinnable = fake_pins_pinnable(base, size, true);
    ze_result_t result = ZE_RESULT_SUCCESS;
    fake_pins_lock();
    long begin = import_at(driver, base), end = import_at(driver, base + size - 1);
    struct fake_pins_timed timed = {0, 0, 0};
    if (begin >= 0 && begin == end) {
        result = ZE_RESULT_SUCCESS; /* wholly inside: no change, no count */
    } else if (begin >= 0) {
        result =
            end >= 0 ? ZE_RESULT_ERROR_OVERLAPPING_REGIONS : ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
    } else if (end >= 0) {
        result = ZE_RESULT_ERROR_INVALID_SIZE;
    } else if (fake_pins_injected_failure(false, (int *)&result)) {
        /* injected */
    } else if (!pinnable) {
        result = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    } else {
        if (imports_overlapping(driver, base, size) != 0)
            fake_pins_violation(FAKE_GPU_VIOLATION_REGISTER_OVERLAP, base, size);
        fake_pins_check_register(base, size);
        long at;
        timed = fake_pins_insert_timed(base, size, 0, (uintptr_t)driver, &at);
        if (at < 0)
            result = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    fake_pins_unlock();
    fake_pins_finish_timed(timed, false);
    fake_pins_lock();
    fake_pins_log_register(base, size, 0, (int)result);
    fake_pins_unlock();
    return result;
}

__attribute__((noinline)) static ze_result_t zex_release(ze_driver_handle_t handle, void *pointer)
{
    enter(FAKE_ZE_CALL_RELEASE, FAKE_CALLER());
    struct driver *driver = called_driver(handle);
    if (driver == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!import_enabled)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    uintptr_t address = (uintptr_t)pointer;
    ze_result_t result = ZE_RESULT_SUCCESS;
    fake_pins_lock();
    long at = pointer != NULL ? import_at(driver, address) : -1;
    struct fake_pins_timed timed = {0, 0, 0};
    if (at < 0) {
        result = ZE_RESULT_ERROR_INVALID_ARGUMENT;
    } else if (fake_pins_injected_failure(true, (int *)&result)) {
        /* injected */
    } else {
        /* Any address inside drops the whole import. */
        timed = fake_pins_remove_timed(at);
    }
    fake_pins_unlock();
    fake_pins_finish_timed(timed, true);
    fake_pins_lock();
    fake_pins_log_unregister(address, (int)result);
    fake_pins_unlock();
    return result;
}

__attribute__((noinline)) static ze_result_t zex_base_address(ze_driver_handle_t handle,
                                                              void *pointer, void **base)
{
    enter(FAKE_ZE_CALL_BASE_ADDRESS, FAKE_CALLER());
    struct driver *driver = called_driver(handle);
    if (driver == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!import_enabled)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    fake_pins_lock();
    long at = pointer != NULL ? import_at(driver, (uintptr_t)pointer) : -1;
    uintptr_t found = at >= 0 ? fake_pins_at(at)->base : 0;
    fake_pins_unlock();
    if (at < 0)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* *base untouched */
    if (base != NULL)
        *base = (void *)found;
    return ZE_RESULT_SUCCESS;
}

FAKE_EXPORT ze_result_t zeDriverGetExtensionFunctionAddress(ze_driver_handle_t handle,
                                                            const char *name, void **function)
{
    enter(FAKE_ZE_CALL_EXTENSION_ADDRESS, FAKE_CALLER());
    /* The NULL handle of a driver whose start failed: a virtual call on it
     * (BaseDriver::fromHandle(hDriver)->getExtensionFunctionAddress). */
    if (handle == NULL && start_failed())
        raise(SIGSEGV);
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    struct driver *driver = driver_of_loader_handle(handle);
    if (driver == NULL) {
        /* The loader unwraps its own object: anything else is garbage to it. */
        if (driver_of_own_handle(handle) != NULL) {
            fake_pins_lock();
            fake_pins_violation(FAKE_GPU_VIOLATION_LOADER_HANDLE, (uintptr_t)handle, 0);
            fake_pins_unlock();
        }
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    if (name == NULL || function == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    void *found = NULL;
    if (driver->imports && strcmp(name, "zexDriverImportExternalPointer") == 0)
        found = (void *)zex_import;
    else if (driver->imports && strcmp(name, "zexDriverReleaseImportedPointer") == 0)
        found = (void *)zex_release;
    else if (driver->imports && strcmp(name, "zexDriverGetHostPointerBaseAddress") == 0)
        found = (void *)zex_base_address;
    if (found == NULL)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    *function = found;
    return ZE_RESULT_SUCCESS;
}

/* ---- what test programs need besides ---- */

static char context_object, device_object;

FAKE_EXPORT ze_result_t zeDeviceGet(ze_driver_handle_t handle, uint32_t *count,
                                    ze_device_handle_t *devices)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (driver_of_loader_handle(handle) == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || devices == NULL) {
        *count = 1;
        return ZE_RESULT_SUCCESS;
    }
    *count = 1;
    devices[0] = (ze_device_handle_t)&device_object;
    return ZE_RESULT_SUCCESS;
}

FAKE_EXPORT ze_result_t zeContextCreate(ze_driver_handle_t handle, const ze_context_desc_t *desc,
                                        ze_context_handle_t *context)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (driver_of_loader_handle(handle) == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (desc == NULL || context == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *context = (ze_context_handle_t)&context_object;
    return ZE_RESULT_SUCCESS;
}

FAKE_EXPORT ze_result_t zeContextDestroy(ze_context_handle_t context)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    return context == (ze_context_handle_t)&context_object ? ZE_RESULT_SUCCESS
                                                           : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

/* Imports are not in the USM registry: UNKNOWN, as for any host memory;
 * zeMemAllocDevice's blocks are DEVICE memory of the one device. */
FAKE_EXPORT ze_result_t zeMemGetAllocProperties(ze_context_handle_t context, const void *pointer,
                                                ze_memory_allocation_properties_t *properties,
                                                ze_device_handle_t *device)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (context != (ze_context_handle_t)&context_object)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (pointer == NULL || properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct fake_device_block block;
    fake_pins_lock();
    bool on_device = fake_device_find((uintptr_t)pointer, &block);
    fake_pins_unlock();
    properties->type = on_device ? ZE_MEMORY_TYPE_DEVICE : ZE_MEMORY_TYPE_UNKNOWN;
    properties->id = on_device ? (uint64_t)block.base : 0;
    properties->pageSize = on_device ? 4096 : 0;
    if (device != NULL)
        *device = on_device ? (ze_device_handle_t)&device_object : NULL;
    return ZE_RESULT_SUCCESS;
}

/* ---- device memory (context.cpp: Context::allocDeviceMem, freeMem) ---- */

FAKE_EXPORT ze_result_t zeMemAllocDevice(ze_context_handle_t context,
                                         const ze_device_mem_alloc_desc_t *desc, size_t size,
                                         size_t alignment, ze_device_handle_t device,
                                         void **pointer)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (context != (ze_context_handle_t)&context_object ||
        device != (ze_device_handle_t)&device_object)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (desc == NULL || pointer == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (size == 0) { /* checkMemSizeLimit */
        *pointer = NULL;
        return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    }
    if (alignment & (alignment - 1))
        return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
    fake_pins_lock();
    uintptr_t base = fake_device_alloc(size);
    fake_pins_unlock();
    if (base == 0)
        return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    *pointer = (void *)base;
    return ZE_RESULT_SUCCESS;
}

FAKE_EXPORT ze_result_t zeMemFree(ze_context_handle_t context, void *pointer)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (context != (ze_context_handle_t)&context_object)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (pointer == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    fake_pins_lock();
    bool freed = fake_device_free((uintptr_t)pointer);
    fake_pins_unlock();
    return freed ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

/* ---- immediate command lists and their copies (fake_ze.h) ---- */

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static bool list_used[MAX_COMMAND_LISTS];
static char list_objects[MAX_COMMAND_LISTS];

static bool list_valid(ze_command_list_handle_t list)
{
    bool valid = false;
    pthread_mutex_lock(&list_lock);
    for (size_t i = 0; i < MAX_COMMAND_LISTS && !valid; i++)
        valid = list_used[i] && (void *)list == (void *)&list_objects[i];
    pthread_mutex_unlock(&list_lock);
    return valid;
}

FAKE_EXPORT ze_result_t zeCommandListCreateImmediate(ze_context_handle_t context,
                                                     ze_device_handle_t device,
                                                     const ze_command_queue_desc_t *desc,
                                                     ze_command_list_handle_t *list)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (context != (ze_context_handle_t)&context_object ||
        device != (ze_device_handle_t)&device_object)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (desc == NULL || list == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->mode > ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS)
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    ze_result_t result = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY; /* the double's limit */
    pthread_mutex_lock(&list_lock);
    for (size_t i = 0; i < MAX_COMMAND_LISTS && result != ZE_RESULT_SUCCESS; i++) {
        if (list_used[i])
            continue;
        list_used[i] = true;
        *list = (ze_command_list_handle_t)(void *)&list_objects[i];
        result = ZE_RESULT_SUCCESS;
    }
    pthread_mutex_unlock(&list_lock);
    return result;
}

FAKE_EXPORT ze_result_t zeCommandListDestroy(ze_command_list_handle_t list)
{
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (!list_valid(list))
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    pthread_mutex_lock(&list_lock);
    for (size_t i = 0; i < MAX_COMMAND_LISTS; i++)
        if ((void *)list == (void *)&list_objects[i])
            list_used[i] = false;
    pthread_mutex_unlock(&list_lock);
    return ZE_RESULT_SUCCESS;
}

/* Every copy is done when its append returns: nothing to wait for. */
FAKE_EXPORT ze_result_t zeCommandListHostSynchronize(ze_command_list_handle_t list,
                                                     uint64_t timeout)
{
    (void)timeout;
    enter(FAKE_ZE_CALL_OTHER, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    return list_valid(list) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

/* How resolveAlignedAllocation takes one end of a copy of size bytes. */
struct copy_end {
    enum { END_PAGEABLE, END_IMPORTED, END_DEVICE, END_NONE } kind;
    unsigned char *bytes; /* where the double reads or writes them */
};

static struct copy_end copy_end_at(const void *pointer, size_t size)
{
    uintptr_t address = (uintptr_t)pointer;
    struct fake_device_block block;
    /* findAllocationDataForRange: the USM block holding the start, used
     * when it holds the end too (any range of 1 byte or less). */
    if (fake_device_find(address, &block)) {
        if (size <= 1 || size <= block.size - (address - block.base))
            return (struct copy_end){END_DEVICE, block.backing + (address - block.base)};
        /* Else the address is taken for host memory: no import holds it and
         * no host pointer allocation can be made of an address that no host
         * mapping has (the double's device addresses). */
        return (struct copy_end){END_NONE, NULL};
    }
    /* findHostPointerAllocation: the import with the greatest base at or
     * below the start (GPU driver's), used when it holds the end too. */
    long at = import_at(&drivers[0], address);
    if (at >= 0 && size <= fake_pins_at(at)->size - (address - fake_pins_at(at)->base))
        return (struct copy_end){END_IMPORTED, (unsigned char *)pointer};
    /* getHostPtrAlloc: a temporary allocation of the range, or (immediate
     * lists) the staging buffer. */
    return (struct copy_end){END_PAGEABLE, (unsigned char *)pointer};
}

FAKE_EXPORT ze_result_t zeCommandListAppendMemoryCopy(ze_command_list_handle_t list, void *dst,
                                                      const void *src, size_t size,
                                                      ze_event_handle_t signal_event,
                                                      uint32_t wait_count,
                                                      ze_event_handle_t *wait_events)
{
    (void)signal_event;
    enter(FAKE_ZE_CALL_MEMORY_COPY, FAKE_CALLER());
    if (too_early())
        return ZE_RESULT_ERROR_UNINITIALIZED;
    ze_result_t result = ZE_RESULT_SUCCESS;
    if (!list_valid(list))
        result = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    else if (dst == NULL || src == NULL)
        result = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    else if (wait_events == NULL && wait_count > 0)
        result = ZE_RESULT_ERROR_INVALID_SIZE;
    fake_pins_lock();
    if (result == ZE_RESULT_SUCCESS && size != 0) {
        struct copy_end to = copy_end_at(dst, size), from = copy_end_at(src, size);
        if (to.kind == END_NONE || from.kind == END_NONE) {
            result = ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY; /* an end without an allocation */
        } else {
            memmove(to.bytes, from.bytes, size);
            enum fake_gpu_copy_outcome outcome = FAKE_GPU_COPY_PINNED;
            if (to.kind == END_PAGEABLE || from.kind == END_PAGEABLE)
                outcome = FAKE_GPU_COPY_STAGED;
            else if (to.kind == END_DEVICE && from.kind == END_DEVICE)
                outcome = FAKE_GPU_COPY_DEVICE;
            fake_pins_count_copy(outcome, size);
        }
    }
    if (result != ZE_RESULT_SUCCESS)
        fake_pins_count_copy(FAKE_GPU_COPY_REFUSED, size);
    fake_pins_unlock();
    return result;
}

FAKE_EXPORT int fake_ze_initialized(void)
{
    return is_initialized();
}
