/* HIP (AMD ROCm) behind the vendor seam (vendor.h).
 *
 * Registration is hipHostRegister / hipHostUnregister of the libamdhip64 the
 * program loaded (program mode) or the shim loads (create mode). A HIP host
 * registration holds in every context and on every device (ROCm's CLR maps
 * it on all of them; no current device is needed), so its place is
 * RANGE_PLACE_ANY_CONTEXT, with no device.
 *
 * Never starting HIP for the program: every HIP call starts the runtime
 * (CLR's HIP_INIT_API), even hipRuntimeGetVersion. Underneath, HIP starts
 * the HSA runtime (hsa_init), and HSA's hsa_system_get_info answers
 * HSA_STATUS_ERROR_NOT_INITIALIZED until then (ROCr's IS_OPEN check): that
 * is the question asked, and HIP is called only once HSA is open.
 *
 * Every HIP call the shim makes runs on a thread of the backend's own: HIP
 * keeps a last-error slot per thread that its calls overwrite (before ROCm
 * 7 even a successful call sets it), so a call on the program's thread would
 * change what the program's next hipGetLastError says.
 *
 * Read-only memory: HIP has none to offer. The bit 0x8 is named both
 * hipHostRegisterReadOnly ("ignored on AMD devices") and
 * hipExtHostRegisterCoarseGrained, which CLR honours since rocm-systems
 * #6278; CLR reports hostRegisterReadOnlySupported 0; and KFD pins every
 * userptr for writing. So the bit is never passed (it would change
 * coherence, not access) and read-only memory stays locked only.
 *
 * A second registration of registered memory: up to ROCm 5.1 one at the
 * same base aborts the process (MemObjMap::AddMemObj's guarantee), from 5.2
 * to 7.2 it is taken silently (the first kept; one at another base is
 * added, and lookups between the two then fail), and rocm-systems #7498
 * (merged 2026-06, in no release number the sources pin down) refuses any
 * overlap with hipErrorHostMemoryAlreadyRegistered. So in every version the
 * backend asks hipPointerGetAttributes about the whole range first (its
 * structure and memory-type numbers changed in ROCm 6: hipMemoryTypeHost 0
 * before, 1 from 6). */
#include "loaded_objects.h"
#include "log.h"
#include "reentry_guard.h"
#include "vendor.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* hipError_t values (hip/hip_runtime_api.h; checked against the header by
 * the tests' fake_hip_abi_check.c). */
enum {
    HIP_SUCCESS = 0,
    HIP_ERROR_INVALID_VALUE = 1,
    HIP_ERROR_NOT_INITIALIZED = 3,
    HIP_ERROR_DEINITIALIZED = 4,
    HIP_ERROR_ALREADY_REGISTERED = 712,
    HIP_ERROR_NOT_REGISTERED = 713,
};
/* hipHostRegister flags: the engine's values (engine.h) are HIP's. */
enum {
    HIP_REGISTER_PORTABLE = 0x1,
    HIP_REGISTER_MAPPED = 0x2,
    HIP_REGISTER_IO_MEMORY = 0x4,
    HIP_REGISTER_READ_ONLY = 0x8, /* also CoarseGrained: never passed */
};
_Static_assert(ENGINE_REGISTER_PORTABLE == HIP_REGISTER_PORTABLE &&
                   ENGINE_REGISTER_DEVICEMAP == HIP_REGISTER_MAPPED &&
                   ENGINE_REGISTER_IOMEMORY == HIP_REGISTER_IO_MEMORY &&
                   ENGINE_REGISTER_READ_ONLY == HIP_REGISTER_READ_ONLY,
               "the engine's register flags are HIP's");
/* hsa_status_t and hsa_system_info_t values (hsa/hsa.h). */
enum {
    HSA_SUCCESS = 0,
    HSA_NOT_INITIALIZED = 0x100B,
    HSA_INFO_VERSION_MAJOR = 0,
    HSA_AGENT_INFO_DEVICE = 17,
    HSA_DEVICE_TYPE_GPU = 1,
};
/* hipStreamCaptureMode: the relaxed mode (hip_runtime_api.h). */
enum { HIP_CAPTURE_MODE_RELAXED = 2 };
/* hipMemoryType of host (pinned or registered) memory: ROCm 5 and 6 on. */
enum { HIP5_MEMORY_TYPE_HOST = 0, HIP6_MEMORY_TYPE_HOST = 1 };

static const char *const runtime_sonames[] = {"libamdhip64.so.7", "libamdhip64.so.6",
                                              "libamdhip64.so.5", "libamdhip64.so", NULL};

struct hip_api {
    int (*host_register)(void *pointer, size_t bytes, unsigned flags);
    int (*host_unregister)(void *pointer);
    int (*get_last_error)(void);
    const char *(*get_error_name)(int error);
    int (*runtime_get_version)(int *version);
    int (*get_device_count)(int *count);
    int (*pointer_get_attributes)(void *attributes, const void *pointer);
    int (*hsa_system_get_info)(int attribute, void *value);
    int (*hsa_iterate_agents)(int (*callback)(uint64_t agent, void *data), void *data);
    int (*hsa_agent_get_info)(uint64_t agent, int attribute, void *value);
    int (*exchange_capture_mode)(int *mode); /* optional: ROCm 5.2 on */
    void *handle;
    int major; /* HIP's major version, from hipRuntimeGetVersion (0: not asked yet) */
    char path[512];
};

static struct vendor_settings settings;
static struct hip_api hip;
static bool found;
static pthread_mutex_t find_mutex = PTHREAD_MUTEX_INITIALIZER;
static bool seen_open; /* HSA answered open once: HIP was started */
/* HSA open with no GPU agent: HIP's start failed (its device list is
 * empty), which is final: the shim calls HIP no more. */
static bool start_failed;
static bool created; /* create mode: the shim loaded and started HIP */
static bool exiting;
static char create_why[256];

static void configure(const struct vendor_settings *given)
{
    settings = *given;
}

static void *symbol(void *handle, const char *name)
{
    return handle != NULL ? dlsym(handle, name) : NULL;
}

/* Resolves the entry points from an open libamdhip64 (and the HSA runtime
 * it brought, found by its own name). Called with find_mutex held. */
static bool resolve_locked(void *handle)
{
    struct hip_api api = {.handle = handle};
    *(void **)&api.host_register = symbol(handle, "hipHostRegister");
    *(void **)&api.host_unregister = symbol(handle, "hipHostUnregister");
    *(void **)&api.get_last_error = symbol(handle, "hipGetLastError");
    *(void **)&api.get_error_name = symbol(handle, "hipGetErrorName");
    *(void **)&api.runtime_get_version = symbol(handle, "hipRuntimeGetVersion");
    *(void **)&api.get_device_count = symbol(handle, "hipGetDeviceCount");
    *(void **)&api.pointer_get_attributes = symbol(handle, "hipPointerGetAttributes");
    char hsa_path[512];
    if (loaded_objects_find(LOADED_HSA_RUNTIME, hsa_path, sizeof(hsa_path))) {
        void *hsa = dlopen(hsa_path[0] != '\0' ? hsa_path : "libhsa-runtime64.so.1",
                           RTLD_NOW | RTLD_NOLOAD);
        *(void **)&api.hsa_system_get_info = symbol(hsa, "hsa_system_get_info");
        *(void **)&api.hsa_iterate_agents = symbol(hsa, "hsa_iterate_agents");
        *(void **)&api.hsa_agent_get_info = symbol(hsa, "hsa_agent_get_info");
    }
    *(void **)&api.exchange_capture_mode = symbol(handle, "hipThreadExchangeStreamCaptureMode");
    if (api.host_register == NULL || api.host_unregister == NULL || api.get_last_error == NULL ||
        api.hsa_system_get_info == NULL)
        return false;
    Dl_info info;
    if (dladdr((void *)api.host_register, &info) && info.dli_fname != NULL)
        snprintf(api.path, sizeof(api.path), "%s", info.dli_fname);
    hip = api;
    __atomic_store_n(&found, true, __ATOMIC_RELEASE);
    return true;
}

/* The program's libamdhip64, found without loading anything. */
static bool find_loaded(void)
{
    if (__atomic_load_n(&found, __ATOMIC_ACQUIRE))
        return true;
    char path[512];
    if (!loaded_objects_find(LOADED_HIP_RUNTIME, path, sizeof(path)))
        return false;
    pthread_mutex_lock(&find_mutex);
    bool ok = found;
    if (!ok) {
        void *handle = dlopen(path[0] != '\0' ? path : "libamdhip64.so", RTLD_NOW | RTLD_NOLOAD);
        ok = handle != NULL && resolve_locked(handle);
    }
    pthread_mutex_unlock(&find_mutex);
    return ok;
}

/* Whether the HSA runtime under HIP is open: the one question that starts
 * nothing. */
static bool hsa_open(void)
{
    unsigned short major = 0;
    int status = hip.hsa_system_get_info(HSA_INFO_VERSION_MAJOR, &major);
    if (status == HSA_SUCCESS && !seen_open)
        __atomic_store_n(&seen_open, true, __ATOMIC_RELAXED);
    return status == HSA_SUCCESS;
}

static int count_gpu_agent(uint64_t agent, void *data)
{
    int type = -1;
    if (hip.hsa_agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &type) == HSA_SUCCESS &&
        type == HSA_DEVICE_TYPE_GPU)
        ++*(int *)data;
    return HSA_SUCCESS;
}

/* Once HSA is open: whether it has a GPU agent, asked once (HSA's calls
 * start nothing once it is open). None: HIP's start failed. */
static bool has_gpu_agent(void)
{
    static int answer; /* 0 not asked, 1 yes, 2 no */
    int known = __atomic_load_n(&answer, __ATOMIC_ACQUIRE);
    if (known == 0) {
        int gpus = 0;
        bool asked = hip.hsa_iterate_agents != NULL && hip.hsa_agent_get_info != NULL &&
                     hip.hsa_iterate_agents(count_gpu_agent, &gpus) == HSA_SUCCESS;
        known = !asked || gpus > 0 ? 1 : 2;
        __atomic_store_n(&answer, known, __ATOMIC_RELEASE);
    }
    return known == 1;
}

/* What the shim may do with HIP. Not started: HSA is closed (with no AMD
 * GPU, ROCm 5.2.3's hsa_init fails with HSA_STATUS_ERROR_OUT_OF_RESOURCES
 * and HSA stays closed: HIP's start failed, and every HIP call answers
 * that failure; the shim makes none). HSA open without a GPU agent: HIP's
 * start failed too; final. */
static enum vendor_state state(void)
{
    if (!find_loaded())
        return loaded_objects_find(LOADED_HIP_RUNTIME, NULL, 0) ? VENDOR_NOT_STARTED
                                                                : VENDOR_ABSENT;
    if (__atomic_load_n(&exiting, __ATOMIC_RELAXED))
        return VENDOR_GONE;
    if (__atomic_load_n(&start_failed, __ATOMIC_RELAXED) || !hsa_open())
        return VENDOR_NOT_STARTED;
    if (!has_gpu_agent()) {
        if (!__atomic_exchange_n(&start_failed, true, __ATOMIC_RELAXED))
            log_info("HIP: HSA is open with no GPU agent, so HIP's start failed: the shim calls "
                     "HIP no more");
        return VENDOR_NOT_STARTED;
    }
    return VENDOR_STARTED;
}

/* ---- the backend's own thread for HIP calls ---- */

enum call_kind { CALL_REGISTER, CALL_UNREGISTER, CALL_ANY_REGISTERED, CALL_VERSION, CALL_START };

struct call {
    enum call_kind kind;
    void *base;
    size_t length;
    unsigned flags;
    int result;
    bool done;
};

static pthread_mutex_t call_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t call_posted = PTHREAD_COND_INITIALIZER;
static pthread_cond_t call_done = PTHREAD_COND_INITIALIZER;
static struct call *posted; /* the call waiting for the thread, or NULL */
static bool thread_started, thread_failed;

/* What the pointer attributes say of base: 1 registered (or pinned) host
 * memory, 0 not, -1 cannot tell. The structure is read as a block large
 * enough for every version's; its first field is the memory type in each. */
static int is_registered_now(const void *base)
{
    if (hip.pointer_get_attributes == NULL)
        return -1;
    _Alignas(8) unsigned char attributes[256];
    memset(attributes, 0, sizeof(attributes));
    int error = hip.pointer_get_attributes(attributes, base);
    if (error != HIP_SUCCESS) {
        hip.get_last_error();
        return 0; /* HIP 5 answers unregistered memory with an error */
    }
    int host = hip.major >= 6 ? HIP6_MEMORY_TYPE_HOST : HIP5_MEMORY_TYPE_HOST;
    int type;
    memcpy(&type, attributes, sizeof(type));
    return type == host ? 1 : 0;
}

/* Whether any byte of [base, base + length) is registered: one question
 * per page and one for the last byte. hipPointerGetAttributes finds the
 * registration with the greatest base at or below the address that holds it
 * (MemObjMap::FindMemObj), so a registration strictly inside the range is
 * found at the first page boundary within it; one smaller than a page that
 * begins and ends between two boundaries is not (the shim's hipHostRegister
 * sees the program's own calls; only one through libamdhip64's own handle
 * could be such). 1 yes, 0 no, -1 cannot tell. */
static int any_registered_now(const void *base, size_t length)
{
    uintptr_t start = (uintptr_t)base, last = start + length - 1;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    int answer = is_registered_now(base);
    for (uintptr_t at = (start | (page - 1)) + 1; answer == 0 && at <= last && at > start;
         at += page)
        answer = is_registered_now((const void *)at);
    if (answer == 0 && last != start)
        answer = is_registered_now((const void *)last);
    return answer;
}

/* Stream capture: while a thread of the program captures a graph, CLR
 * refuses hipHostRegister and hipHostUnregister (CHECK_STREAM_CAPTURE_
 * SUPPORTED, hip_memory.cpp) from a thread in the global or thread-local
 * mode with hipErrorStreamCaptureUnsupported, and from ROCm 6.2 marks the
 * program's capture invalidated. A thread in the relaxed mode is never
 * refused (ROCm 5.2 on; before, only a thread's own captures counted, and
 * hipThreadExchangeStreamCaptureMode did not exist). The backend's thread
 * takes the relaxed mode once; a program's thread (no backend thread) for
 * the call only. */
static _Thread_local bool thread_relaxed;

static int relaxed_enter(bool own_thread)
{
    if (thread_relaxed || hip.exchange_capture_mode == NULL)
        return -1;
    int mode = HIP_CAPTURE_MODE_RELAXED;
    if (hip.exchange_capture_mode(&mode) != HIP_SUCCESS) {
        hip.get_last_error();
        return -1;
    }
    thread_relaxed = own_thread;
    return own_thread ? -1 : mode;
}

static void relaxed_leave(int previous)
{
    if (previous >= 0 && previous != HIP_CAPTURE_MODE_RELAXED)
        hip.exchange_capture_mode(&previous);
}

static int perform(struct call *call, bool own_thread)
{
    int result = HIP_SUCCESS;
    int previous_mode = -1;
    if (call->kind == CALL_REGISTER || call->kind == CALL_UNREGISTER)
        previous_mode = relaxed_enter(own_thread);
    switch (call->kind) {
    case CALL_START: {
        int count = 0;
        result = hip.get_device_count != NULL ? hip.get_device_count(&count) : HIP_SUCCESS;
        if (result == HIP_SUCCESS && count <= 0)
            result = HIP_ERROR_NOT_INITIALIZED;
        break;
    }
    case CALL_VERSION: {
        int version = 0;
        if (hip.runtime_get_version != NULL && hip.runtime_get_version(&version) == HIP_SUCCESS)
            result = version / 10000000; /* major * 10^7 + minor * 10^5 + patch */
        else
            result = 5;
        break;
    }
    case CALL_ANY_REGISTERED:
        result = any_registered_now(call->base, call->length);
        break;
    case CALL_REGISTER:
        result = hip.host_register(call->base, call->length, call->flags);
        break;
    case CALL_UNREGISTER:
        result = hip.host_unregister(call->base);
        break;
    }
    if (call->kind != CALL_VERSION && call->kind != CALL_ANY_REGISTERED && result != HIP_SUCCESS)
        hip.get_last_error(); /* this thread's slot only */
    relaxed_leave(previous_mode);
    return result;
}

static void *call_thread(void *unused)
{
    (void)unused;
    prctl(PR_SET_NAME, "pinshim-hip", 0, 0, 0);
    /* What HIP does on this thread for itself (free, mmap, mlock) goes
     * straight to the real calls, as on a thread inside a backend call. */
    reentry_guard_enter();
    pthread_mutex_lock(&call_mutex);
    for (;;) {
        while (posted == NULL)
            pthread_cond_wait(&call_posted, &call_mutex);
        struct call *call = posted;
        pthread_mutex_unlock(&call_mutex);
        call->result = perform(call, true);
        pthread_mutex_lock(&call_mutex);
        call->done = true;
        posted = NULL;
        pthread_cond_broadcast(&call_done);
    }
    return NULL;
}

/* Runs call on the backend's thread (started at the first call, all signals
 * blocked) and waits for it; one call at a time. Where no thread can be
 * started, on the calling thread instead (warned once). */
static int run_call(struct call *call)
{
    pthread_mutex_lock(&call_mutex);
    if (!thread_started && !thread_failed) {
        pthread_t thread;
        sigset_t all, previous;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &previous);
        thread_failed = pthread_create(&thread, NULL, call_thread, NULL) != 0;
        pthread_sigmask(SIG_SETMASK, &previous, NULL);
        if (!thread_failed)
            pthread_detach(thread);
        else
            log_warn("cannot start the thread for HIP calls; calling HIP on the program's "
                     "threads (their hipGetLastError may change)");
        thread_started = !thread_failed;
    }
    if (thread_failed) {
        pthread_mutex_unlock(&call_mutex);
        return perform(call, false);
    }
    while (posted != NULL)
        pthread_cond_wait(&call_done, &call_mutex);
    call->done = false;
    posted = call;
    pthread_cond_signal(&call_posted);
    while (!call->done)
        pthread_cond_wait(&call_done, &call_mutex);
    pthread_mutex_unlock(&call_mutex);
    return call->result;
}

static int version_major(void)
{
    int major = __atomic_load_n(&hip.major, __ATOMIC_RELAXED);
    if (major == 0) {
        struct call call = {.kind = CALL_VERSION};
        major = run_call(&call);
        if (major <= 0)
            major = 5;
        __atomic_store_n(&hip.major, major, __ATOMIC_RELAXED);
        log_info("HIP runtime %s, major version %d", hip.path, major);
    }
    return major;
}

/* ---- the vendor's calls ---- */

static bool create(char *why, size_t why_size)
{
    pthread_mutex_lock(&find_mutex);
    bool ok = created;
    if (!ok && create_why[0] == '\0') {
        void *handle = NULL;
        const char *tried = settings.library;
        if (tried != NULL)
            handle = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
        for (int i = 0; handle == NULL && tried == NULL && runtime_sonames[i] != NULL; i++)
            handle = dlopen(runtime_sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL)
            snprintf(create_why, sizeof(create_why),
                     "no HIP runtime (libamdhip64) could be loaded");
        else if (!found && !resolve_locked(handle))
            snprintf(create_why, sizeof(create_why),
                     "%s lacks hipHostRegister, hipHostUnregister, hipGetLastError or the HSA "
                     "runtime's hsa_system_get_info",
                     tried != NULL ? tried : "libamdhip64");
        ok = create_why[0] == '\0';
    }
    pthread_mutex_unlock(&find_mutex);
    if (ok && !created) {
        struct call call = {.kind = CALL_START};
        int result = run_call(&call);
        pthread_mutex_lock(&find_mutex);
        if (result == HIP_SUCCESS) {
            created = true;
            log_info("using HIP runtime %s", hip.path);
        } else {
            snprintf(create_why, sizeof(create_why),
                     "%.200s: hipGetDeviceCount found no usable device (%d)", hip.path, result);
        }
        ok = created;
        pthread_mutex_unlock(&find_mutex);
    }
    if (!ok && why_size > 0)
        snprintf(why, why_size, "%s", create_why);
    return ok;
}

static enum engine_choice choose_place(bool from_worker, const struct range_place *hint,
                                       struct range_place *place)
{
    (void)from_worker;
    (void)hint;
    *place = (struct range_place){.device = -1, .flags = RANGE_PLACE_ANY_CONTEXT};
    if (settings.create_mode)
        return created ? ENGINE_PLACE_READY : ENGINE_PLACE_DISABLED;
    switch (state()) {
    case VENDOR_STARTED:
        return ENGINE_PLACE_READY;
    case VENDOR_GONE:
        return ENGINE_PLACE_DISABLED;
    default:
        return ENGINE_PLACE_DEFER;
    }
}

static bool thread_place(struct range_place *place)
{
    *place = (struct range_place){.device = -1, .flags = RANGE_PLACE_ANY_CONTEXT};
    return __atomic_load_n(&found, __ATOMIC_ACQUIRE);
}

static struct engine_result outcome_of(int code)
{
    switch (code) {
    case HIP_SUCCESS:
        return engine_result_of(ENGINE_OK, 0);
    case HIP_ERROR_ALREADY_REGISTERED:
        return engine_result_of(ENGINE_ALREADY_REGISTERED, code);
    case HIP_ERROR_NOT_REGISTERED:
        return engine_result_of(ENGINE_NOT_REGISTERED, code);
    case HIP_ERROR_DEINITIALIZED:
        return engine_result_of(ENGINE_UNLOADING, code);
    case HIP_ERROR_NOT_INITIALIZED:
        return engine_result_of(ENGINE_NO_CONTEXT, code);
    default:
        return engine_result_of(ENGINE_FAILED, code);
    }
}

static struct engine_result register_range(struct range_place *place, void *base, size_t length)
{
    if (__atomic_load_n(&exiting, __ATOMIC_RELAXED))
        return engine_result_of(ENGINE_UNLOADING, HIP_ERROR_DEINITIALIZED);
    unsigned flags = place->register_flags & ~(unsigned)HIP_REGISTER_READ_ONLY;
    /* Asked first in every version (the top of the file says why); the
     * answer's memory type is read by the version, known before the ask. */
    version_major();
    struct call ask = {.kind = CALL_ANY_REGISTERED, .base = base, .length = length};
    if (run_call(&ask) == 1)
        return engine_result_of(ENGINE_ALREADY_REGISTERED, HIP_ERROR_ALREADY_REGISTERED);
    struct call call = {.kind = CALL_REGISTER, .base = base, .length = length, .flags = flags};
    return outcome_of(run_call(&call));
}

static struct engine_result unregister_range(const struct range_place *place, void *base,
                                             size_t length)
{
    (void)length;
    (void)place;
    if (__atomic_load_n(&exiting, __ATOMIC_RELAXED))
        return engine_result_of(ENGINE_UNLOADING, HIP_ERROR_DEINITIALIZED);
    struct call call = {.kind = CALL_UNREGISTER, .base = base};
    return outcome_of(run_call(&call));
}

/* See the top of the file: no version of HIP registers read-only memory. */
static bool read_only_supported(const struct range_place *place)
{
    (void)place;
    return false;
}

static const struct {
    int code;
    const char *name;
} known_codes[] = {
    {HIP_SUCCESS, "hipSuccess"},
    {HIP_ERROR_INVALID_VALUE, "hipErrorInvalidValue"},
    {2, "hipErrorOutOfMemory"},
    {HIP_ERROR_NOT_INITIALIZED, "hipErrorNotInitialized"},
    {HIP_ERROR_DEINITIALIZED, "hipErrorDeinitialized"},
    {35, "hipErrorInsufficientDriver"},
    {100, "hipErrorNoDevice"},
    {101, "hipErrorInvalidDevice"},
    {201, "hipErrorInvalidContext"},
    {HIP_ERROR_ALREADY_REGISTERED, "hipErrorHostMemoryAlreadyRegistered"},
    {HIP_ERROR_NOT_REGISTERED, "hipErrorHostMemoryNotRegistered"},
    {801, "hipErrorNotSupported"},
    {999, "hipErrorUnknown"},
};

/* A table first: hipGetErrorName starts nothing, but its strings are HIP's
 * to free at unload. */
static const char *code_name(int code)
{
    for (size_t i = 0; i < sizeof(known_codes) / sizeof(*known_codes); i++)
        if (known_codes[i].code == code)
            return known_codes[i].name;
    return "hipErrorUnrecognized";
}

static const char *call_name(bool unregister)
{
    return unregister ? "hipHostUnregister" : "hipHostRegister";
}

static bool seen_started(void)
{
    return __atomic_load_n(&seen_open, __ATOMIC_RELAXED) || created;
}

/* In a fork child: whether HSA was open in the parent. hsa_system_get_info's
 * IS_OPEN check reads ROCr's runtime pointer and reference count, and the
 * version is a constant: no lock, no system call (ROCr's hsa.cpp). */
static bool started_before_fork(void)
{
    if (!__atomic_load_n(&found, __ATOMIC_ACQUIRE))
        return true; /* loaded, never asked: taken as started */
    unsigned short major = 0;
    return hip.hsa_system_get_info(HSA_INFO_VERSION_MAJOR, &major) == HSA_SUCCESS;
}

static void after_fork_child(void)
{
    /* The backend's thread is not in the child; HIP is unusable there. */
    pthread_mutex_init(&find_mutex, NULL);
    pthread_mutex_init(&call_mutex, NULL);
    pthread_cond_init(&call_posted, NULL);
    pthread_cond_init(&call_done, NULL);
    posted = NULL;
    thread_started = thread_failed = false;
    seen_open = created = start_failed = false;
}

/* HIP's teardown (its static destructors, then HSA's) runs before the
 * shim's, and HIP cannot say whether it is done: no call from here on. */
static void process_exiting(void)
{
    __atomic_store_n(&exiting, true, __ATOMIC_RELAXED);
}

static void describe(struct vendor_description *out)
{
    memset(out, 0, sizeof(*out));
    out->library = __atomic_load_n(&found, __ATOMIC_ACQUIRE) ? hip.path : NULL;
    out->error = create_why[0] != '\0' ? create_why : NULL;
}

const struct vendor hip_vendor = {
    .name = "hip",
    .title = "HIP",
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
    .fork_library = LOADED_HSA_RUNTIME,
    .started_before_fork = started_before_fork,
    .after_fork_child = after_fork_child,
    .process_exiting = process_exiting,
    .describe = describe,
};
