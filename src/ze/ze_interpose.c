/* The program's own Level Zero imports: zexDriverImportExternalPointer and
 * zexDriverReleaseImportedPointer, as SYCL's prepare_for_device_copy and
 * release_from_device_copy make them (through unified-runtime's Level Zero
 * adapter, urUSMImportExp and urUSMReleaseExp).
 *
 * The loader exports neither: a program gets them from
 * zeDriverGetExtensionFunctionAddress, which the shim defines (a call
 * through the global scope, as the adapter's, reaches it first). It forwards
 * to the loader and, for those two names, hands back functions of its own
 * that route the call through the engine as cudaHostRegister's is: without
 * that, the program's release of any pointer inside an import of the shim's
 * would drop the whole import, and the shim's later release would fail.
 *
 * It defines zeInit too, to see the program's start succeed or fail: no
 * other question is safe before a start, nor after a failed one
 * (ze_backend.c). Not zeInitDrivers: loaders
 * before 1.18 have none, and a definition of the shim's would tell a
 * program looking for it that they do; 1.15.7 is among them. */
#include "accelerator.h"
#include "interpose_internal.h"
#include "runtime.h"
#include "ze_backend.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define PINSHIM_EXPORT __attribute__((visibility("default")))

typedef int (*extension_address_fn)(void *driver, const char *name, void **function);
typedef int (*import_fn)(void *driver, void *pointer, size_t bytes);
typedef int (*release_fn)(void *driver, void *pointer);
typedef int (*translate_fn)(int type, void *handle, void **translated);

enum { ZE_SUCCESS_CODE = 0, ZE_ERROR_UNINITIALIZED_CODE = 0x78000001, ZEL_DRIVER_HANDLE = 0 };

static const char *const loader_sonames[] = {"libze_loader.so.1", "libze_loader.so", NULL};

#define MAX_DRIVERS 8
/* The real functions each driver gave, by the driver's own handle. */
static struct {
    void *driver;
    import_fn import_pointer;
    release_fn release_pointer;
} drivers[MAX_DRIVERS];
static unsigned driver_count;
static pthread_mutex_t drivers_mutex = PTHREAD_MUTEX_INITIALIZER;

/* An address no one imports: the program's release of a pointer only the
 * shim imported is answered for this instead (as without the shim). */
static char never_imported;

static unsigned slot_of(const void *driver)
{
    for (unsigned i = 0; i < driver_count; i++)
        if (drivers[i].driver == driver)
            return i;
    return driver_count < MAX_DRIVERS ? driver_count : MAX_DRIVERS - 1;
}

static void remember(void *driver, const char *name, void *function)
{
    pthread_mutex_lock(&drivers_mutex);
    unsigned slot = slot_of(driver);
    if (slot == driver_count && driver_count < MAX_DRIVERS)
        driver_count++;
    drivers[slot].driver = driver;
    if (strcmp(name, "zexDriverImportExternalPointer") == 0)
        *(void **)&drivers[slot].import_pointer = function;
    else
        *(void **)&drivers[slot].release_pointer = function;
    pthread_mutex_unlock(&drivers_mutex);
}

/* The driver's real function for the handle the program passes (its own,
 * translated, as the functions expect); the only one known when the
 * program passes another. */
static void real_functions(void *driver, import_fn *import_pointer, release_fn *release_pointer)
{
    pthread_mutex_lock(&drivers_mutex);
    unsigned slot = slot_of(driver);
    if (slot >= driver_count)
        slot = 0;
    *import_pointer = drivers[slot].import_pointer;
    *release_pointer = drivers[slot].release_pointer;
    pthread_mutex_unlock(&drivers_mutex);
}

static bool shim_handles(void)
{
    if (reentry_guarded() || !runtime_is_initialized())
        return false;
    reentry_guard_enter();
    bool handles = accelerator_claim_vendor(&ze_vendor);
    reentry_guard_leave();
    return handles;
}

/* Ownership follows the driver: an import on a driver that is not the
 * shim's never touches the shim's imports, nor they it. */
static bool shim_driver(void *driver)
{
    reentry_guard_enter();
    bool same = ze_backend_is_shim_driver(driver);
    reentry_guard_leave();
    return same;
}

struct import_call {
    import_fn next;
    void *driver, *pointer;
    size_t bytes;
};

static long run_import(void *arguments)
{
    struct import_call *call = arguments;
    return call->next(call->driver, call->pointer, call->bytes);
}

struct release_call {
    release_fn next;
    void *driver, *pointer;
};

static long run_release(void *arguments)
{
    struct release_call *call = arguments;
    return call->next(call->driver, call->pointer);
}

static int shim_import_pointer(void *driver, void *pointer, size_t bytes)
{
    import_fn next;
    release_fn unused;
    real_functions(driver, &next, &unused);
    if (next == NULL)
        return ZE_ERROR_UNINITIALIZED_CODE;
    if (!shim_handles() || !shim_driver(driver))
        return next(driver, pointer, bytes);
    runtime_notice_gpu();
    struct import_call arguments = {next, driver, pointer, bytes};
    /* The import takes no flags: the engine's default stands for it. */
    struct engine_program_call call = {{run_import, &arguments, "zexDriverImportExternalPointer"},
                                       ZE_SUCCESS_CODE};
    reentry_guard_enter();
    int result = (int)engine_program_register(&runtime_engine, (uintptr_t)pointer, bytes, 0, &call);
    reentry_guard_leave();
    return result;
}

static int shim_release_pointer(void *driver, void *pointer)
{
    import_fn unused;
    release_fn next;
    real_functions(driver, &unused, &next);
    if (next == NULL)
        return ZE_ERROR_UNINITIALIZED_CODE;
    if (!shim_handles() || !shim_driver(driver))
        return next(driver, pointer);
    if (engine_is_shim_registration(&runtime_engine, (uintptr_t)pointer))
        return next(driver, &never_imported); /* not the program's: as without the shim */
    struct release_call arguments = {next, driver, pointer};
    struct engine_program_call call = {{run_release, &arguments, "zexDriverReleaseImportedPointer"},
                                       ZE_SUCCESS_CODE};
    reentry_guard_enter();
    int result = (int)engine_program_unregister(&runtime_engine, (uintptr_t)pointer, &call);
    reentry_guard_leave();
    return result;
}

PINSHIM_EXPORT int zeDriverGetExtensionFunctionAddress(void *driver, const char *name,
                                                       void **function)
{
    extension_address_fn next = (extension_address_fn)interpose_next_symbol(
        "zeDriverGetExtensionFunctionAddress", (void *)zeDriverGetExtensionFunctionAddress,
        __builtin_return_address(0), loader_sonames);
    if (next == NULL)
        return ZE_ERROR_UNINITIALIZED_CODE; /* no loader in the process */
    /* A driver that knows no such function may answer success and write
     * nothing (the loader's null driver does): then no function is given. */
    if (function != NULL)
        *function = NULL;
    int result = next(driver, name, function);
    bool import = name != NULL && strcmp(name, "zexDriverImportExternalPointer") == 0;
    bool release = name != NULL && strcmp(name, "zexDriverReleaseImportedPointer") == 0;
    if (result != ZE_SUCCESS_CODE || function == NULL || *function == NULL || !(import || release))
        return result;
    /* The functions take the driver's own handle: remember them by it. */
    void *own = driver;
    translate_fn translate = (translate_fn)interpose_next_symbol(
        "zelLoaderTranslateHandle", NULL, __builtin_return_address(0), loader_sonames);
    if (translate != NULL && translate(ZEL_DRIVER_HANDLE, driver, &own) != ZE_SUCCESS_CODE)
        own = driver;
    remember(own, name, *function);
    *function = import ? (void *)shim_import_pointer : (void *)shim_release_pointer;
    return result;
}

typedef int (*init_fn)(unsigned flags);

PINSHIM_EXPORT int zeInit(unsigned flags)
{
    init_fn next = (init_fn)interpose_next_symbol("zeInit", (void *)zeInit,
                                                  __builtin_return_address(0), loader_sonames);
    if (next == NULL)
        return ZE_ERROR_UNINITIALIZED_CODE;
    int result = next(flags);
    if (result == ZE_SUCCESS_CODE) {
        ze_backend_note_started();
        runtime_notice_gpu();
    } else {
        ze_backend_note_start_failed(result);
    }
    return result;
}
