/* Level Zero (Intel) behind the vendor seam (vendor.h).
 *
 * Registration is the driver's host-pointer import,
 * zexDriverImportExternalPointer(driver, ptr, size) and
 * zexDriverReleaseImportedPointer(driver, ptr) (intel/compute-runtime,
 * driver_experimental/zex_driver.h), the route SYCL's
 * prepare_for_device_copy takes through unified-runtime's urUSMImportExp.
 * The loader does not export them: they come from
 * zeDriverGetExtensionFunctionAddress, and take the driver's own handle,
 * which zelLoaderTranslateHandle gives for the loader's. An import covers
 * every device and context of its driver, so its place is
 * RANGE_PLACE_ANY_CONTEXT, with the driver as its context.
 *
 * Why the import and not ZE_extension_external_memmap_sysmem (zeMemAllocHost
 * with a chained ze_external_memmap_sysmem_ext_desc_t, loader 1.25 on): the
 * memmap extension registers into one context, and a program's command
 * lists copy in their own context, which the shim does not know (Level Zero
 * has no "current context"); a registration in a context of the shim's
 * would not make the program's copies faster. The import is per driver, as
 * CUDA's portable registration is per process, and it is what SYCL, and so
 * DeepSpeed's XPU path, uses: the shim and such a program then speak of the
 * same registrations.
 *
 * Never starting Level Zero for the program, and never calling it after a
 * start that failed: no driver entry point is safe to ask before a
 * successful start. Before zeInit, loaders from 1.15.7 dereference a NULL
 * table (1.15.7's zeDriverGet too); after a zeInit that failed (the driver
 * found no device), loaders up to 1.17.28 have unloaded the driver and keep
 * its table, so zeDriverGet jumps into unmapped code (Debian 12's 1.8.12
 * with Intel's driver: SIGSEGV), and later loaders with Intel's drivers
 * before 23.48 answer one driver whose handle is NULL, which crashes the
 * driver's next call. So the backend knows a start's outcome one way only:
 * the program's zeInit (or zeInitDrivers), seen by the shim's definition of
 * it (ze_interpose.c). A start it does not see (SYCL's Level Zero adapter
 * links the loader's front end statically and reaches the loader through
 * dlsym) cannot be asked about: a zeInit of the shim's through the loader's
 * own front end is no cached answer there (loader 1.8.12 loads the driver
 * again; SYCL on Intel's driver with no device then crashed at exit when
 * the shim asked from its thread), and every driver call may crash. Such a
 * program's locks stay locked only in program mode; create mode starts
 * Level Zero for the shim. The driver starts again in a fork child, which
 * calls nothing its parent started. A start that failed
 * is final: the backend calls nothing more. The import has traps the backend avoids:
 * an import wholly inside another succeeds without a reference count, and
 * releasing any pointer inside an import drops the whole import, so the
 * backend asks zexDriverGetHostPointerBaseAddress first and leaves memory
 * that is already imported (the program's) alone. */
#include "ze_backend.h"

#include "loaded_objects.h"
#include "log.h"
#include "vendor.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ze_result_t values (level_zero/ze_api.h; checked against the header by
 * the tests' fake_ze_abi_check.c). */
enum {
    ZE_SUCCESS = 0,
    ZE_ERROR_DEVICE_LOST = 0x70000001,
    ZE_ERROR_UNINITIALIZED = 0x78000001,
    ZE_ERROR_INVALID_ARGUMENT = 0x78000004,
    ZE_ERROR_HANDLE_OBJECT_IN_USE = 0x78000006,
    ZE_ERROR_INVALID_SIZE = 0x78000008,
    ZE_ERROR_OVERLAPPING_REGIONS = 0x7800001a,
};
enum { ZE_INIT_GPU_ONLY = 1, ZEL_HANDLE_TYPE_DRIVER = 0 };

#define MAX_DRIVERS 8

static const char *const loader_sonames[] = {"libze_loader.so.1", "libze_loader.so", NULL};

struct ze_api {
    int (*init)(unsigned flags);
    int (*get_versions)(size_t *count, void *versions); /* zelLoaderGetVersions */
    int (*driver_get)(uint32_t *count, void **drivers);
    int (*extension_address)(void *driver, const char *name, void **function);
    int (*translate_handle)(int type, void *handle, void **translated);
    int (*import_pointer)(void *driver, void *pointer, size_t bytes);
    int (*release_pointer)(void *driver, void *pointer);
    int (*base_address)(void *driver, void *pointer, void **base);
    void *driver; /* the driver's own handle (translated) */
    char path[512];
};

static struct vendor_settings settings;
static struct ze_api ze;
static bool loader_found;
enum driver_state { DRIVER_NOT_LOOKED = 0, DRIVER_READY, DRIVER_NONE };
static int driver_state;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static bool seen_started_flag, created, exiting;
/* The program's zeInit failed: no call from here on. */
static bool start_failed;
/* In a fork child: only the child's own zeInit starts Level Zero for it. */
static bool fork_child;
static char why_none[256];

static void configure(const struct vendor_settings *given)
{
    settings = *given;
}

/* The loader's entry points; called with mutex held. */
static bool resolve_loader_locked(void *handle)
{
    struct ze_api api = {0};
    *(void **)&api.init = dlsym(handle, "zeInit");
    *(void **)&api.driver_get = dlsym(handle, "zeDriverGet");
    *(void **)&api.extension_address = dlsym(handle, "zeDriverGetExtensionFunctionAddress");
    *(void **)&api.translate_handle = dlsym(handle, "zelLoaderTranslateHandle");
    *(void **)&api.get_versions = dlsym(handle, "zelLoaderGetVersions");
    if (api.init == NULL || api.driver_get == NULL || api.extension_address == NULL)
        return false;
    Dl_info info;
    if (dladdr((void *)api.driver_get, &info) && info.dli_fname != NULL)
        snprintf(api.path, sizeof(api.path), "%s", info.dli_fname);
    ze = api;
    __atomic_store_n(&loader_found, true, __ATOMIC_RELEASE);
    return true;
}

static bool find_loaded(void)
{
    if (__atomic_load_n(&loader_found, __ATOMIC_ACQUIRE))
        return true;
    char path[512];
    if (!loaded_objects_find(LOADED_ZE_LOADER, path, sizeof(path)))
        return false;
    pthread_mutex_lock(&mutex);
    bool ok = loader_found;
    if (!ok) {
        void *handle = dlopen(path[0] != '\0' ? path : "libze_loader.so.1", RTLD_NOW | RTLD_NOLOAD);
        ok = handle != NULL && resolve_loader_locked(handle);
    }
    pthread_mutex_unlock(&mutex);
    return ok;
}

/* The first driver whose extension functions include the import, with its
 * own handle; once. Called with mutex held, after the program's zeInit. */
static void look_for_driver_locked(bool warn_if_none)
{
    if (driver_state != DRIVER_NOT_LOOKED)
        return;
    uint32_t count = MAX_DRIVERS;
    void *drivers[MAX_DRIVERS] = {0};
    int result = ze.driver_get(&count, drivers);
    if (result != ZE_SUCCESS) {
        if (result == ZE_ERROR_UNINITIALIZED)
            return; /* not yet */
        snprintf(why_none, sizeof(why_none), "zeDriverGet failed (%#x)", (unsigned)result);
    }
    for (uint32_t i = 0; result == ZE_SUCCESS && i < count && i < MAX_DRIVERS; i++) {
        void *import = NULL, *release = NULL, *base = NULL;
        if (ze.extension_address(drivers[i], "zexDriverImportExternalPointer", &import) !=
                ZE_SUCCESS ||
            ze.extension_address(drivers[i], "zexDriverReleaseImportedPointer", &release) !=
                ZE_SUCCESS ||
            import == NULL || release == NULL)
            continue;
        ze.extension_address(drivers[i], "zexDriverGetHostPointerBaseAddress", &base);
        void *own = drivers[i];
        if (ze.translate_handle != NULL &&
            ze.translate_handle(ZEL_HANDLE_TYPE_DRIVER, drivers[i], &own) != ZE_SUCCESS) {
            snprintf(why_none, sizeof(why_none),
                     "zelLoaderTranslateHandle refused driver %u's handle", (unsigned)i);
            continue;
        }
        *(void **)&ze.import_pointer = import;
        *(void **)&ze.release_pointer = release;
        *(void **)&ze.base_address = base;
        ze.driver = own;
        driver_state = DRIVER_READY;
        log_info("registering through Level Zero's zexDriverImportExternalPointer (driver %u of "
                 "%u, loader %s)",
                 (unsigned)i, (unsigned)count, ze.path);
        return;
    }
    if (why_none[0] == '\0')
        snprintf(why_none, sizeof(why_none),
                 "no Level Zero driver offers zexDriverImportExternalPointer");
    if (warn_if_none) /* create mode says it with every vendor's reason */
        log_warn("%s; locked memory stays mlocked only", why_none);
    driver_state = DRIVER_NONE;
}

/* Asks nothing of the loader: what the backend has seen of the start. */
static enum vendor_state state(void)
{
    if (!find_loaded())
        return VENDOR_ABSENT;
    if (__atomic_load_n(&exiting, __ATOMIC_RELAXED))
        return VENDOR_GONE;
    return __atomic_load_n(&seen_started_flag, __ATOMIC_RELAXED) ? VENDOR_STARTED
                                                                 : VENDOR_NOT_STARTED;
}

void ze_backend_note_started(void)
{
    __atomic_store_n(&start_failed, false, __ATOMIC_RELAXED);
    __atomic_store_n(&seen_started_flag, true, __ATOMIC_RELAXED);
}

bool ze_backend_is_shim_driver(const void *driver)
{
    if (driver == NULL || !find_loaded())
        return false;
    pthread_mutex_lock(&mutex);
    if (!settings.create_mode && __atomic_load_n(&seen_started_flag, __ATOMIC_RELAXED) &&
        !__atomic_load_n(&start_failed, __ATOMIC_RELAXED) && !fork_child)
        look_for_driver_locked(false);
    bool same = driver_state == DRIVER_READY && driver == ze.driver;
    pthread_mutex_unlock(&mutex);
    return same;
}

void ze_backend_note_start_failed(int code)
{
    if (__atomic_load_n(&seen_started_flag, __ATOMIC_RELAXED) ||
        __atomic_exchange_n(&start_failed, true, __ATOMIC_RELAXED))
        return;
    log_info("Level Zero: zeInit failed (%#x): the shim calls Level Zero no more", (unsigned)code);
}

/* Whether a sanitizer's runtime is in the process: its dlopen ends the
 * process when asked for RTLD_DEEPBIND (sanitizers issue 611), which Intel's
 * driver asks for libdxcore as it starts (compute-runtime 22.43, Debian 12).
 * A program under ASan that never starts Level Zero would die of the shim's
 * start in create mode when PINSHIM_VENDOR=auto came to it (after CUDA found
 * no driver); PINSHIM_VENDOR=ze, a user's own choice, starts it all the
 * same. */
static bool sanitizer_refuses_deepbind(void)
{
    static const char *const runtimes[] = {"__asan_init", "__tsan_init", "__msan_init",
                                           "__hwasan_init"};
    for (size_t i = 0; i < sizeof(runtimes) / sizeof(*runtimes); i++)
        if (dlsym(RTLD_DEFAULT, runtimes[i]) != NULL)
            return true;
    return false;
}

/* In a fork child: whether a zeInit ran before the fork (the loader's
 * state is the parent's), from its component list, which
 * zelLoaderGetVersions reads without a lock. A child that started again
 * would get the parent's answer from the loader while the driver starts
 * anew. A loader never resolved, or without the question: taken as
 * started. */
static bool started_before_fork(void)
{
    size_t components = 0;
    return !__atomic_load_n(&loader_found, __ATOMIC_ACQUIRE) || ze.get_versions == NULL ||
           (ze.get_versions(&components, NULL) == ZE_SUCCESS && components > 0);
}

static bool create(char *why, size_t why_size)
{
    pthread_mutex_lock(&mutex);
    if (!created && why_none[0] == '\0' && __atomic_load_n(&start_failed, __ATOMIC_RELAXED))
        snprintf(why_none, sizeof(why_none), "the program's zeInit had failed");
    if (!created && why_none[0] == '\0') {
        void *handle = NULL;
        for (int i = 0; handle == NULL && loader_sonames[i] != NULL; i++)
            handle = dlopen(loader_sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL)
            snprintf(why_none, sizeof(why_none),
                     "no Level Zero loader (libze_loader) could be "
                     "loaded");
        else if (!loader_found && !resolve_loader_locked(handle))
            snprintf(why_none, sizeof(why_none), "libze_loader lacks zeDriverGet");
        else if (!settings.chosen && sanitizer_refuses_deepbind())
            snprintf(why_none, sizeof(why_none),
                     "a sanitizer's runtime is in the process, and it ends a process whose "
                     "driver asks dlopen for RTLD_DEEPBIND (Intel's does as it starts): Level "
                     "Zero not started");
        else if (fork_child && started_before_fork())
            snprintf(why_none, sizeof(why_none),
                     "a fork child: Level Zero was started before the fork");
        else if (ze.init(ZE_INIT_GPU_ONLY) != ZE_SUCCESS)
            snprintf(why_none, sizeof(why_none), "zeInit found no GPU driver");
        else
            look_for_driver_locked(false);
        created = driver_state == DRIVER_READY;
    }
    bool ok = created;
    if (!ok && why_size > 0)
        snprintf(why, why_size, "%s", why_none);
    pthread_mutex_unlock(&mutex);
    return ok;
}

static enum engine_choice choose_place(bool from_worker, const struct range_place *hint,
                                       struct range_place *place)
{
    (void)from_worker;
    (void)hint;
    *place = (struct range_place){.device = -1, .flags = RANGE_PLACE_ANY_CONTEXT};
    if (!settings.create_mode) {
        enum vendor_state now = state();
        if (now == VENDOR_GONE)
            return ENGINE_PLACE_DISABLED;
        if (now != VENDOR_STARTED)
            return ENGINE_PLACE_DEFER;
        pthread_mutex_lock(&mutex);
        look_for_driver_locked(true);
        pthread_mutex_unlock(&mutex);
    }
    int ready = __atomic_load_n(&driver_state, __ATOMIC_RELAXED);
    if (ready == DRIVER_NONE || (settings.create_mode && !created))
        return ENGINE_PLACE_DISABLED;
    if (ready != DRIVER_READY)
        return ENGINE_PLACE_DEFER;
    place->context = (uintptr_t)ze.driver;
    return ENGINE_PLACE_READY;
}

static bool thread_place(struct range_place *place)
{
    *place = (struct range_place){.device = -1, .flags = RANGE_PLACE_ANY_CONTEXT};
    if (__atomic_load_n(&driver_state, __ATOMIC_RELAXED) != DRIVER_READY)
        return false;
    place->context = (uintptr_t)ze.driver;
    return true;
}

static struct engine_result outcome_of(int code)
{
    switch (code) {
    case ZE_SUCCESS:
        return engine_result_of(ENGINE_OK, 0);
    case ZE_ERROR_HANDLE_OBJECT_IN_USE: /* starts inside an import, ends outside */
    case ZE_ERROR_INVALID_SIZE:         /* ends inside an import */
    case ZE_ERROR_OVERLAPPING_REGIONS:  /* spans imports */
        return engine_result_of(ENGINE_ALREADY_REGISTERED, code);
    case ZE_ERROR_UNINITIALIZED:
        return engine_result_of(ENGINE_NO_CONTEXT, code);
    default:
        return engine_result_of(ENGINE_FAILED, code);
    }
}

/* The base of the import that holds pointer, or NULL: none, or the driver
 * cannot tell (no zexDriverGetHostPointerBaseAddress). The base is preset:
 * a driver that answers success without writing it leaves NULL. */
static void *import_base_at(void *pointer)
{
    void *base = NULL;
    if (ze.base_address == NULL || ze.base_address(ze.driver, pointer, &base) != ZE_SUCCESS)
        return NULL;
    return base;
}

static bool imported_at(void *pointer)
{
    return import_base_at(pointer) != NULL;
}

static struct engine_result register_range(struct range_place *place, void *base, size_t length)
{
    if (__atomic_load_n(&exiting, __ATOMIC_RELAXED))
        return engine_result_of(ENGINE_UNLOADING, ZE_ERROR_UNINITIALIZED);
    if ((void *)place->context != ze.driver)
        return engine_result_of(ENGINE_NO_CONTEXT, 0);
    /* An import wholly inside another would succeed uncounted, and releasing
     * it would drop the other: leave imported memory to its owner. */
    if (imported_at(base) || imported_at((char *)base + length - 1))
        return engine_result_of(ENGINE_ALREADY_REGISTERED, ZE_ERROR_HANDLE_OBJECT_IN_USE);
    return outcome_of(ze.import_pointer(ze.driver, base, length));
}

static struct engine_result unregister_range(const struct range_place *place, void *base,
                                             size_t length)
{
    if (__atomic_load_n(&exiting, __ATOMIC_RELAXED))
        return engine_result_of(ENGINE_UNLOADING, ZE_ERROR_UNINITIALIZED);
    if ((void *)place->context != ze.driver)
        return engine_result_of(ENGINE_NOT_REGISTERED, 0);
    /* The import may be gone without a word: SYCL's Level Zero adapter
     * reaches the driver through a loader front end of its own (intel/llvm
     * #17699), so its release_from_device_copy of a pointer inside the
     * shim's import drops the whole import (compute-runtime's
     * host_pointer_manager.cpp) without passing through ze_interpose.c, and
     * its next prepare_for_device_copy may import there for itself. So the
     * driver is asked first: an import that no longer spans what the shim
     * imported is not the shim's to release (counted as gone). */
    if (ze.base_address != NULL &&
        (import_base_at(base) != base || import_base_at((char *)base + length - 1) != base)) {
        log_info("Level Zero: the import at %p is gone (released through a path the shim does "
                 "not see, as SYCL's release_from_device_copy does): not released",
                 base);
        return engine_result_of(ENGINE_NOT_REGISTERED, 0);
    }
    int code = ze.release_pointer(ze.driver, base);
    /* A pointer no import holds: gone, released by the program. */
    if (code == ZE_ERROR_INVALID_ARGUMENT)
        return engine_result_of(ENGINE_NOT_REGISTERED, code);
    return outcome_of(code);
}

/* The import takes no flags: read-only memory is not imported. */
static bool read_only_supported(const struct range_place *place)
{
    (void)place;
    return false;
}

static const struct {
    int code;
    const char *name;
} known_codes[] = {
    {ZE_SUCCESS, "ZE_RESULT_SUCCESS"},
    {ZE_ERROR_DEVICE_LOST, "ZE_RESULT_ERROR_DEVICE_LOST"},
    {0x70000002, "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY"},
    {0x70000003, "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY"},
    {ZE_ERROR_UNINITIALIZED, "ZE_RESULT_ERROR_UNINITIALIZED"},
    {0x78000002, "ZE_RESULT_ERROR_UNSUPPORTED_VERSION"},
    {0x78000003, "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"},
    {ZE_ERROR_INVALID_ARGUMENT, "ZE_RESULT_ERROR_INVALID_ARGUMENT"},
    {0x78000005, "ZE_RESULT_ERROR_INVALID_NULL_HANDLE"},
    {ZE_ERROR_HANDLE_OBJECT_IN_USE, "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE"},
    {0x78000007, "ZE_RESULT_ERROR_INVALID_NULL_POINTER"},
    {ZE_ERROR_INVALID_SIZE, "ZE_RESULT_ERROR_INVALID_SIZE"},
    {ZE_ERROR_OVERLAPPING_REGIONS, "ZE_RESULT_ERROR_OVERLAPPING_REGIONS"},
    {0x7ffffffe, "ZE_RESULT_ERROR_UNKNOWN"},
};

static const char *code_name(int code)
{
    for (size_t i = 0; i < sizeof(known_codes) / sizeof(*known_codes); i++)
        if (known_codes[i].code == code)
            return known_codes[i].name;
    return "ZE_RESULT_ERROR_UNRECOGNIZED";
}

static const char *call_name(bool unregister)
{
    return unregister ? "zexDriverReleaseImportedPointer" : "zexDriverImportExternalPointer";
}

static bool seen_started(void)
{
    return __atomic_load_n(&seen_started_flag, __ATOMIC_RELAXED) || created;
}

/* A child calls no runtime it did not start itself: what the parent saw
 * and found is forgotten, the driver's handle with it. */
static void after_fork_child(void)
{
    pthread_mutex_init(&mutex, NULL);
    seen_started_flag = created = start_failed = false;
    fork_child = true;
    driver_state = DRIVER_NOT_LOOKED;
    ze.import_pointer = NULL;
    ze.release_pointer = NULL;
    ze.base_address = NULL;
    ze.driver = NULL;
    why_none[0] = '\0';
}

/* The loader and the driver tear themselves down in their destructors,
 * before the shim's, and cannot say so: no call from here on. */
static void process_exiting(void)
{
    __atomic_store_n(&exiting, true, __ATOMIC_RELAXED);
}

static void describe(struct vendor_description *out)
{
    memset(out, 0, sizeof(*out));
    out->library = __atomic_load_n(&loader_found, __ATOMIC_ACQUIRE) ? ze.path : NULL;
    out->error = why_none[0] != '\0' ? why_none : NULL;
}

const struct vendor ze_vendor = {
    .name = "ze",
    .title = "Level Zero",
    .configure = configure,
    .state = state,
    .create = create,
    .choose_place = choose_place,
    .thread_place = thread_place,
    .register_range = register_range,
    .unregister_range = unregister_range,
    .read_only_supported = read_only_supported,
    .code_name = code_name,
    .call_name = call_name,
    .seen_started = seen_started,
    .fork_library = LOADED_ZE_LOADER,
    .started_before_fork = started_before_fork,
    .after_fork_child = after_fork_child,
    .process_exiting = process_exiting,
    .describe = describe,
};
