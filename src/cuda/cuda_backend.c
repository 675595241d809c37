/* CUDA behind the vendor seam (vendor.h).
 *
 * Program mode goes through the driver API of the libcuda.so.1 the program
 * loaded (cuda_driver.h): cuMemHostRegister into the program's own context,
 * entered for the call and left after. Create mode loads a runtime
 * (cuda_loader.h) and calls cudaHostRegister on the device asked for,
 * creating its primary context if need be. */
#include "cuda_driver.h"
#include "cuda_loader.h"

#include "loaded_objects.h"
#include "log.h"
#include "numa_placement.h"
#include "vendor.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* CUresult and cudaError_t values the backend translates (cuda.h,
 * driver_types.h; checked against the Toolkit in cuda_driver.c). */
enum {
    CUDA_CODE_DEINITIALIZED = 4, /* CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading */
    CUDA_CODE_ALREADY_REGISTERED = 712,
    CUDA_CODE_NOT_REGISTERED = 713,
};

static struct vendor_settings settings;

enum runtime_state { RUNTIME_NOT_TRIED = 0, RUNTIME_READY, RUNTIME_UNUSABLE };
/* Create mode: the runtime, loaded at the first lock that registers. */
static int runtime_state;
static struct cuda_runtime runtime;
static pthread_mutex_t runtime_load_mutex = PTHREAD_MUTEX_INITIALIZER;
/* Program mode: the program's driver, found, never loaded. */
static struct cuda_driver driver;
static int preferred_device = -1; /* the device the program's threads were last seen using */
static uint64_t contexts_created; /* by the shim's runtime calls (create mode only) */
static bool in_use;               /* a place was chosen: CUDA is in use here */

static void configure(const struct vendor_settings *given)
{
    settings = *given;
}

static enum vendor_state state(void)
{
    if (!cuda_driver_find(&driver))
        return cuda_driver_is_loaded() ? VENDOR_NOT_STARTED : VENDOR_ABSENT;
    switch (cuda_driver_initialization(&driver)) {
    case CUDA_DRIVER_INITIALIZED:
        return VENDOR_STARTED;
    case CUDA_DRIVER_TORN_DOWN:
        return VENDOR_GONE;
    default:
        return VENDOR_NOT_STARTED;
    }
}

static bool create(char *why, size_t why_size)
{
    int current = __atomic_load_n(&runtime_state, __ATOMIC_ACQUIRE);
    if (current == RUNTIME_NOT_TRIED) {
        pthread_mutex_lock(&runtime_load_mutex);
        current = __atomic_load_n(&runtime_state, __ATOMIC_ACQUIRE);
        if (current == RUNTIME_NOT_TRIED) {
            current =
                cuda_runtime_load(&runtime, settings.library) ? RUNTIME_READY : RUNTIME_UNUSABLE;
            if (current == RUNTIME_READY) {
                log_info("using CUDA runtime %s%s", runtime.path,
                         runtime.shared_with_program ? " (already loaded by the program)" : "");
                for (size_t i = 0; i < runtime.try_count; i++)
                    log_info("passed over %s: %s", runtime.tries[i].name, runtime.tries[i].result);
            }
            __atomic_store_n(&runtime_state, current, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&runtime_load_mutex);
    }
    if (current != RUNTIME_READY && why_size > 0)
        snprintf(why, why_size, "%s", runtime.error);
    return current == RUNTIME_READY;
}

static enum engine_choice choose_place(bool from_worker, const struct range_place *hint,
                                       struct range_place *place)
{
    *place = (struct range_place){.device = -1};
    if (settings.create_mode) {
        place->device = settings.device;
        if (hint != NULL && hint->device >= 0)
            place->device = hint->device;
        if (place->device < 0 && !from_worker && runtime.get_device != NULL) {
            /* PINSHIM_DEVICE=thread: the locking thread's device, also when
             * the registration thread makes the call. */
            int device = -1;
            if (runtime.get_device(&device) == 0)
                place->device = device;
            else
                cuda_runtime_clear_last_error(&runtime);
        }
        return ENGINE_PLACE_READY;
    }
    enum engine_choice choice =
        cuda_driver_choose_place(&driver, from_worker, hint, &preferred_device, place);
    if (choice == ENGINE_PLACE_READY && !__atomic_exchange_n(&in_use, true, __ATOMIC_RELAXED))
        log_info("registering into the program's CUDA context (device %d) through %s",
                 place->device, driver.path);
    return choice;
}

/* The calling thread's context, through the driver whichever the mode: the
 * program's runtime registers there. */
static bool thread_place(struct range_place *place)
{
    return cuda_driver_thread_place(&driver, place);
}

/* Create mode: the runtime's call on the calling thread, on the device
 * asked for (switched to and back). Counts the contexts it created, as far
 * as the driver can tell. */
static int create_mode_register(struct range_place *place, void *base, size_t length)
{
    int previous = -1, device = place->device;
    if (runtime.get_device != NULL && runtime.get_device(&previous) != 0) {
        cuda_runtime_clear_last_error(&runtime);
        previous = -1;
    }
    bool switch_device = device >= 0 && previous != device && runtime.set_device != NULL;
    if (device < 0)
        device = previous;
    bool driver_there = cuda_driver_find(&driver);
    unsigned flags = 0;
    int active = 0;
    bool was_active = driver_there && device >= 0 &&
                      driver.primary_get_state(device, &flags, &active) == 0 && active;
    if (switch_device && runtime.set_device(device) != 0) {
        cuda_runtime_clear_last_error(&runtime);
        switch_device = false;
    }
    int error = runtime.host_register(base, length, place->register_flags);
    if (error != 0)
        cuda_runtime_clear_last_error(&runtime);
    active = 0;
    if (!was_active && device >= 0 && cuda_driver_find(&driver) &&
        driver.primary_get_state(device, &flags, &active) == 0 && active)
        __atomic_fetch_add(&contexts_created, 1, __ATOMIC_RELAXED);
    if (switch_device && previous >= 0 && runtime.set_device(previous) != 0)
        cuda_runtime_clear_last_error(&runtime);
    place->device = device;
    return error;
}

/* A code of the driver's or the runtime's in the engine's words (the two
 * share the numbers the backend tells apart). */
static struct engine_result outcome_of(int code)
{
    switch (code) {
    case 0:
        return engine_result_of(ENGINE_OK, 0);
    case CUDA_CODE_ALREADY_REGISTERED:
        return engine_result_of(ENGINE_ALREADY_REGISTERED, code);
    case CUDA_CODE_NOT_REGISTERED:
        return engine_result_of(ENGINE_NOT_REGISTERED, code);
    case CUDA_CODE_DEINITIALIZED:
        return engine_result_of(ENGINE_UNLOADING, code);
    case CUDA_DRIVER_NO_CONTEXT:
        return engine_result_of(ENGINE_NO_CONTEXT, 0);
    default:
        return engine_result_of(ENGINE_FAILED, code);
    }
}

static struct engine_result register_range(struct range_place *place, void *base, size_t length)
{
    if (!settings.create_mode)
        return outcome_of(
            cuda_driver_register(&driver, place, base, length, place->register_flags));
    /* In the relaxed capture mode, as the driver's calls are. */
    int capture_mode = cuda_capture_relaxed_enter(runtime.exchange_capture_mode);
    int error = create_mode_register(place, base, length);
    cuda_capture_relaxed_leave(runtime.exchange_capture_mode, capture_mode);
    return outcome_of(error);
}

static struct engine_result unregister_range(const struct range_place *place, void *base,
                                             size_t length)
{
    (void)length;
    if (!settings.create_mode)
        return outcome_of(cuda_driver_unregister(&driver, place, base));
    int capture_mode = cuda_capture_relaxed_enter(runtime.exchange_capture_mode);
    int error = runtime.host_unregister(base);
    if (error != 0)
        cuda_runtime_clear_last_error(&runtime);
    cuda_capture_relaxed_leave(runtime.exchange_capture_mode, capture_mode);
    return outcome_of(error);
}

/* CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: through the
 * program's driver (program mode) or the runtime the shim loaded (create
 * mode). */
static bool read_only_supported(const struct range_place *place)
{
    int device = place->device >= 0 ? place->device : 0;
    int value = 0, error = -1;
    if (settings.create_mode && runtime.device_get_attribute != NULL) {
        error = runtime.device_get_attribute(
            &value, CUDA_DRIVER_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, device);
        if (error != 0)
            cuda_runtime_clear_last_error(&runtime);
    } else if (!settings.create_mode) {
        error = cuda_driver_device_attribute(
            &driver, CUDA_DRIVER_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, device, &value);
    }
    return error == 0 && value != 0;
}

/* The host NUMA node nearest the device: the driver's attribute (CUDA 12.2
 * on), else, in program mode, the PCI device's node in sysfs. */
static int device_numa_node(const struct range_place *place)
{
    int device = place->device >= 0 ? place->device : 0;
    int value = -1, error = -1;
    if (settings.create_mode && runtime.device_get_attribute != NULL) {
        error = runtime.device_get_attribute(&value, CUDA_DRIVER_ATTRIBUTE_HOST_NUMA_ID, device);
        if (error != 0)
            cuda_runtime_clear_last_error(&runtime);
    } else if (!settings.create_mode) {
        error = cuda_driver_device_attribute(&driver, CUDA_DRIVER_ATTRIBUTE_HOST_NUMA_ID, device,
                                             &value);
        char bus_id[32];
        if (error != 0 && cuda_driver_pci_bus_id(&driver, device, bus_id, sizeof(bus_id)) == 0) {
            bus_id[sizeof(bus_id) - 1] = '\0';
            return numa_placement_pci_node(NULL, bus_id);
        }
    }
    return error == 0 && value >= 0 ? value : -1;
}

static const char *code_name(int code)
{
    if (!settings.create_mode) {
        const char *name = cuda_driver_error_name(&driver, code);
        if (name != NULL)
            return name;
    }
    return cuda_error_name(runtime.loaded ? &runtime : NULL, code);
}

static const char *call_name(bool unregister)
{
    if (!settings.create_mode)
        return unregister ? "cuMemHostUnregister" : "cuMemHostRegister";
    return unregister ? "cudaHostUnregister" : "cudaHostRegister";
}

static bool seen_started(void)
{
    if (settings.create_mode)
        return __atomic_load_n(&runtime_state, __ATOMIC_ACQUIRE) == RUNTIME_READY || runtime.loaded;
    return driver.found && cuda_driver_seen_initialized(&driver);
}

static void after_fork_child(void)
{
    in_use = false;
    if (runtime_state == RUNTIME_READY)
        runtime_state = RUNTIME_NOT_TRIED;
    pthread_mutex_init(&runtime_load_mutex, NULL);
    cuda_driver_after_fork();
}

/* CUDA says itself when it is torn down (CUDA_ERROR_DEINITIALIZED,
 * cudaErrorCudartUnloading): its calls stay safe at exit. */
static void process_exiting(void) {}

static void describe(struct vendor_description *out)
{
    memset(out, 0, sizeof(*out));
    if (settings.create_mode) {
        out->library = runtime.loaded ? runtime.path : NULL;
        out->shared_with_program = runtime.shared_with_program;
        out->error = runtime.error[0] != '\0' ? runtime.error : NULL;
        out->contexts_created = __atomic_load_n(&contexts_created, __ATOMIC_RELAXED);
        out->try_count =
            runtime.try_count < VENDOR_MAX_TRIES ? runtime.try_count : VENDOR_MAX_TRIES;
        for (size_t i = 0; i < out->try_count; i++) {
            out->tries[i].name = runtime.tries[i].name;
            out->tries[i].result = runtime.tries[i].result;
        }
    } else if (__atomic_load_n(&in_use, __ATOMIC_RELAXED) && driver.found) {
        out->library = driver.path;
    }
}

const struct vendor cuda_vendor = {
    .name = "cuda",
    .title = "CUDA",
    .configure = configure,
    .state = state,
    .create = create,
    .choose_place = choose_place,
    .thread_place = thread_place,
    .register_range = register_range,
    .unregister_range = unregister_range,
    .read_only_supported = read_only_supported,
    .device_numa_node = device_numa_node,
    .code_name = code_name,
    .call_name = call_name,
    .seen_started = seen_started,
    .fork_library = LOADED_CUDA_DRIVER, /* the runtime loads the driver as it starts */
    .after_fork_child = after_fork_child,
    .process_exiting = process_exiting,
    .describe = describe,
};
