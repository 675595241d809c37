#include "runtime.h"

#include "block_extent.h"
#include "cuda_driver.h"
#include "cuda_loader.h"
#include "loaded_objects.h"
#include "log.h"
#include "memory_map.h"
#include "stats.h"

#include "pinshim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_DONTFORK
#define MADV_DONTFORK 10
#define MADV_DOFORK 11
#endif

/* The registration thread looks for a context at most every 10 ms, backing
 * off to once a second while none appears. */
#define WORKER_POLL_MAX_NANOSECONDS (1000ull * 1000 * 1000)

#define PINSHIM_EXPORT __attribute__((visibility("default")))

__thread int runtime_guard_depth __attribute__((tls_model("initial-exec")));

struct engine runtime_engine;
uintptr_t runtime_free_gate;
struct pinshim_config runtime_config;
/* Until the set-up reads the kernel's (sysconf), the smallest page any Linux
 * host has: a check made with it errs towards "not page-aligned", which
 * passes the call through. */
uintptr_t runtime_page_size = 4096;
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

int runtime_block_extent_source = BLOCK_EXTENT_NOT_CHOSEN;
int runtime_block_extent_state;
static int future_mappings_locked;

enum init_state { INIT_NONE = 0, INIT_RUNNING, INIT_DONE };
static int init_state;

enum cuda_state { CUDA_NOT_TRIED = 0, CUDA_READY, CUDA_DISABLED };
/* PINSHIM_CONTEXT=create: the runtime, loaded at the first lock that registers. */
static int cuda_state;
static struct cuda_runtime cuda;
static pthread_mutex_t cuda_load_mutex = PTHREAD_MUTEX_INITIALIZER;
static const char *cuda_disabled_reason; /* for the stats when nothing was loaded */
/* PINSHIM_CONTEXT=program: the program's driver, found, never loaded. */
static struct cuda_driver driver;
static int preferred_device = -1; /* the device the program's threads were last seen using */
static uint64_t contexts_created; /* by the shim's runtime calls (create mode only) */
static bool is_fork_child;
static pid_t process_id; /* this process's, set at start and in fork children */
static bool ended_by_immediate_exit;
static bool parent_used_cuda;
static bool cuda_used_here; /* this process initialised CUDA (seen by the shim) */
static int mlockall_logged;
static int fork_warned;
static uint64_t last_notice_nanoseconds;
/* A copy of stderr taken at start, for the exit summary: programs such as
 * coreutils close fd 2 in their exit handlers, which run before the shim's
 * destructor. Kept at a high number, and written to only while it is still
 * the file it was (a program may close it and reuse the number). */
static int stderr_copy = -1;
static struct stat stderr_copy_identity;

/* ---- CUDA backend for the engine ---- */

/* Loads the runtime for PINSHIM_CONTEXT=create, once. */
static bool create_mode_runtime_ready(void)
{
    int state = __atomic_load_n(&cuda_state, __ATOMIC_ACQUIRE);
    if (state != CUDA_NOT_TRIED)
        return state == CUDA_READY;
    pthread_mutex_lock(&cuda_load_mutex);
    state = __atomic_load_n(&cuda_state, __ATOMIC_ACQUIRE);
    if (state == CUDA_NOT_TRIED) {
        runtime_guard_enter();
        bool ok = cuda_runtime_load(&cuda, runtime_config.cudart);
        runtime_guard_leave();
        if (ok) {
            state = CUDA_READY;
            cuda_used_here = true;
            log_info("using CUDA runtime %s%s", cuda.path,
                     cuda.shared_with_program ? " (already loaded by the program)" : "");
            for (size_t i = 0; i < cuda.try_count; i++)
                log_info("passed over %s: %s", cuda.tries[i].name, cuda.tries[i].result);
        } else {
            state = CUDA_DISABLED;
            log_warn("%s; continuing with mlock only", cuda.error);
        }
        __atomic_store_n(&cuda_state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cuda_load_mutex);
    return state == CUDA_READY;
}

static enum engine_choice backend_choose_place(void *context, bool from_worker,
                                               const struct range_place *hint,
                                               struct range_place *place)
{
    (void)context;
    *place = (struct range_place){.device = -1};
    if (!runtime_config.register_enabled)
        return ENGINE_PLACE_DISABLED;
    if (is_fork_child && parent_used_cuda) {
        /* CUDA cannot be used in a child of a process that initialised it. */
        if (cuda_disabled_reason == NULL) {
            cuda_disabled_reason = "forked from a process that had initialised CUDA";
            log_info("%s: locks in this child stay mlocked only", cuda_disabled_reason);
        }
        return ENGINE_PLACE_DISABLED;
    }
    if (runtime_config.context_mode == CONTEXT_CREATE) {
        if (!create_mode_runtime_ready())
            return ENGINE_PLACE_DISABLED;
        place->device = runtime_config.device;
        if (hint != NULL && hint->device >= 0)
            place->device = hint->device;
        if (place->device < 0 && !from_worker && cuda.get_device != NULL) {
            /* PINSHIM_DEVICE=thread: the locking thread's device, also when
             * the registration thread makes the call. */
            int device = -1;
            runtime_guard_enter();
            if (cuda.get_device(&device) == 0)
                place->device = device;
            else
                cuda_runtime_clear_last_error(&cuda);
            runtime_guard_leave();
        }
        return ENGINE_PLACE_READY;
    }
    runtime_guard_enter();
    enum engine_choice choice =
        cuda_driver_choose_place(&driver, from_worker, hint, &preferred_device, place);
    runtime_guard_leave();
    if (choice == ENGINE_PLACE_READY && !cuda_used_here) {
        cuda_used_here = true;
        log_info("registering into the program's CUDA context (device %d) through %s",
                 place->device, driver.path);
    }
    return choice;
}

/* PINSHIM_CONTEXT=create: the runtime's call on the calling thread, on the
 * device asked for (switched to and back). Counts the contexts it created,
 * as far as the driver can tell. */
static int create_mode_register(struct range_place *place, void *base, size_t length)
{
    int previous = -1, device = place->device;
    if (cuda.get_device != NULL && cuda.get_device(&previous) != 0) {
        cuda_runtime_clear_last_error(&cuda);
        previous = -1;
    }
    bool switch_device = device >= 0 && previous != device && cuda.set_device != NULL;
    if (device < 0)
        device = previous;
    bool driver_there = cuda_driver_find(&driver);
    unsigned flags = 0;
    int active = 0;
    bool was_active = driver_there && device >= 0 &&
                      driver.primary_get_state(device, &flags, &active) == 0 && active;
    if (switch_device && cuda.set_device(device) != 0) {
        cuda_runtime_clear_last_error(&cuda);
        switch_device = false;
    }
    int error = cuda.host_register(base, length, place->register_flags);
    if (error != 0)
        cuda_runtime_clear_last_error(&cuda);
    active = 0;
    if (!was_active && device >= 0 && cuda_driver_find(&driver) &&
        driver.primary_get_state(device, &flags, &active) == 0 && active)
        __atomic_fetch_add(&contexts_created, 1, __ATOMIC_RELAXED);
    if (switch_device && previous >= 0 && cuda.set_device(previous) != 0)
        cuda_runtime_clear_last_error(&cuda);
    place->device = device;
    return error;
}

static int backend_register(void *context, struct range_place *place, void *base, size_t length)
{
    (void)context;
    runtime_guard_enter();
    int error;
    if (runtime_config.context_mode == CONTEXT_CREATE)
        error = create_mode_register(place, base, length);
    else
        error = cuda_driver_register(&driver, place, base, length, place->register_flags);
    runtime_guard_leave();
    return error;
}

static int backend_unregister(void *context, const struct range_place *place, void *base)
{
    (void)context;
    runtime_guard_enter();
    int error;
    if (runtime_config.context_mode == CONTEXT_CREATE) {
        error = cuda.host_unregister(base);
        if (error != 0)
            cuda_runtime_clear_last_error(&cuda);
    } else {
        error = cuda_driver_unregister(&driver, place, base);
    }
    runtime_guard_leave();
    return error;
}

/* The calling thread's context, through the driver whichever the mode: the
 * program's runtime registers there. */
static bool backend_thread_place(void *context, struct range_place *place)
{
    (void)context;
    runtime_guard_enter();
    bool known = cuda_driver_thread_place(&driver, place);
    runtime_guard_leave();
    return known;
}

static const char *backend_error_name(void *context, int error)
{
    (void)context;
    if (runtime_config.context_mode == CONTEXT_PROGRAM) {
        const char *name = cuda_driver_error_name(&driver, error);
        if (name != NULL)
            return name;
    }
    return cuda_error_name(cuda.loaded ? &cuda : NULL, error);
}

static const char *backend_call_name(void *context, bool unregister)
{
    (void)context;
    if (runtime_config.context_mode == CONTEXT_PROGRAM)
        return unregister ? "cuMemHostUnregister" : "cuMemHostRegister";
    return unregister ? "cudaHostUnregister" : "cudaHostRegister";
}

static bool backend_locked_parts(void *context, uintptr_t start, uintptr_t end,
                                 void (*found)(void *found_context, uintptr_t part_start,
                                               uintptr_t part_end),
                                 void *found_context)
{
    (void)context;
    return memory_map_locked_parts(start, end, found, found_context);
}

static bool backend_resident_parts(void *context, uintptr_t start, uintptr_t end,
                                   void (*found)(void *found_context, uintptr_t part_start,
                                                 uintptr_t part_end),
                                   void *found_context)
{
    (void)context;
    return memory_map_resident_parts(start, end, runtime_page_size, found, found_context);
}

_Static_assert((int)MEMORY_MAP_WRITABLE == (int)ENGINE_MAPPING_WRITABLE &&
                   (int)MEMORY_MAP_READ_ONLY == (int)ENGINE_MAPPING_READ_ONLY &&
                   (int)MEMORY_MAP_NO_ACCESS == (int)ENGINE_MAPPING_NO_ACCESS &&
                   (int)MEMORY_MAP_IO == (int)ENGINE_MAPPING_IO &&
                   (int)MEMORY_MAP_SHARED_FILE == (int)ENGINE_MAPPING_SHARED_FILE &&
                   (int)MEMORY_MAP_UNMAPPED == (int)ENGINE_MAPPING_UNMAPPED &&
                   (int)MEMORY_MAP_KIND_COUNT == (int)ENGINE_MAPPING_KIND_COUNT,
               "the engine's mapping kinds are memory_map's");

struct kinds_forward {
    void (*found)(void *found_context, uintptr_t part_start, uintptr_t part_end,
                  enum engine_mapping_kind kind);
    void *found_context;
};

static void forward_kind(void *context, uintptr_t start, uintptr_t end, enum memory_map_kind kind)
{
    struct kinds_forward *forward = context;
    forward->found(forward->found_context, start, end, (enum engine_mapping_kind)kind);
}

static bool backend_mapping_kinds(void *context, uintptr_t start, uintptr_t end,
                                  void (*found)(void *found_context, uintptr_t part_start,
                                                uintptr_t part_end, enum engine_mapping_kind kind),
                                  void *found_context)
{
    (void)context;
    struct kinds_forward forward = {found, found_context};
    return memory_map_kinds(start, end, forward_kind, &forward);
}

/* CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, asked once per
 * device: through the program's driver (program mode) or the runtime the
 * shim loaded (create mode). 0 unknown, 1 no, 2 yes. */
static uint8_t read_only_support[ENGINE_MAX_DEVICES];

static bool backend_read_only_supported(void *context, const struct range_place *place)
{
    (void)context;
    int device = place->device >= 0 ? place->device : 0;
    if (device >= ENGINE_MAX_DEVICES)
        return false;
    uint8_t known = __atomic_load_n(&read_only_support[device], __ATOMIC_RELAXED);
    if (known != 0)
        return known == 2;
    int value = 0, error = -1;
    runtime_guard_enter();
    if (runtime_config.context_mode == CONTEXT_CREATE && cuda.device_get_attribute != NULL) {
        error = cuda.device_get_attribute(
            &value, CUDA_DRIVER_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, device);
        if (error != 0)
            cuda_runtime_clear_last_error(&cuda);
    } else if (runtime_config.context_mode == CONTEXT_PROGRAM) {
        error = cuda_driver_device_attribute(
            &driver, CUDA_DRIVER_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, device, &value);
    }
    runtime_guard_leave();
    bool supported = error == 0 && value != 0;
    __atomic_store_n(&read_only_support[device], supported ? 2 : 1, __ATOMIC_RELAXED);
    log_info("device %d %s READ_ONLY registrations (read-only memory %s)", device,
             supported ? "takes" : "takes no",
             supported ? "is registered so" : "stays mlocked only");
    return supported;
}

static bool backend_is_mapped(void *context, uintptr_t start, uintptr_t end)
{
    (void)context;
    return memory_map_is_mapped(start, end);
}

static bool backend_mapping_bounds(void *context, uintptr_t addr, uintptr_t *start, uintptr_t *end)
{
    (void)context;
    return memory_map_find(addr, start, end);
}

/* The registration thread: started when the engine has work, gone when it
 * has none. All signals blocked, so the program's handlers never run on it. */
static void *registration_thread(void *unused)
{
    (void)unused;
    prctl(PR_SET_NAME, "pinshim-reg", 0, 0, 0);
    runtime_guard_enter();
    engine_worker_run(&runtime_engine, WORKER_POLL_MAX_NANOSECONDS, false);
    runtime_guard_leave();
    return NULL;
}

static void backend_wake_worker(void *context)
{
    (void)context;
    pthread_attr_t attributes;
    sigset_t all, previous;
    sigfillset(&all);
    pthread_t thread;
    runtime_guard_enter();
    int error = pthread_attr_init(&attributes);
    if (error == 0) {
        pthread_sigmask(SIG_SETMASK, &all, &previous);
        error = pthread_create(&thread, &attributes, registration_thread, NULL);
        /* Named before the lock call returns, so that what a program sees
         * in /proc after it is settled (the thread names itself too), then
         * detached: joinable until here so that its handle stays valid. */
        if (error == 0) {
            pthread_setname_np(thread, "pinshim-reg");
            pthread_detach(thread);
        }
        pthread_sigmask(SIG_SETMASK, &previous, NULL);
        pthread_attr_destroy(&attributes);
    }
    if (error != 0) {
        static int warned;
        if (__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED) == 0)
            log_warn("cannot start the registration thread (%s); registering in the calling "
                     "thread instead",
                     strerror(error));
        engine_worker_run(&runtime_engine, 0, true);
    }
    runtime_guard_leave();
}

/* PINSHIM_FORK=dontfork: children do not get registered pages at all. */
static void backend_registered(void *context, uintptr_t start, uintptr_t end, bool added)
{
    (void)context;
    if (runtime_config.fork_mode != FORK_DONTFORK)
        return;
    int saved_errno = errno;
    syscall(SYS_madvise, start, end - start, added ? MADV_DONTFORK : MADV_DOFORK);
    errno = saved_errno;
}

static const struct engine_backend cuda_backend = {
    .context = NULL,
    .choose_place = backend_choose_place,
    .register_range = backend_register,
    .unregister_range = backend_unregister,
    .thread_place = backend_thread_place,
    .error_name = backend_error_name,
    .call_name = backend_call_name,
    .locked_parts = backend_locked_parts,
    .resident_parts = backend_resident_parts,
    .is_mapped = backend_is_mapped,
    .mapping_kinds = backend_mapping_kinds,
    .read_only_supported = backend_read_only_supported,
    .mapping_bounds = backend_mapping_bounds,
    .wake_worker = backend_wake_worker,
    .registered = backend_registered,
};

/* Whether a CUDA driver is loaded in the process (found before, or now with
 * RTLD_NOLOAD: nothing is loaded to find out). */
static bool driver_loaded(void)
{
    runtime_guard_enter();
    bool loaded = driver.found || cuda_driver_is_loaded();
    runtime_guard_leave();
    return loaded;
}

void runtime_notice_cuda_slow(void)
{
    if (runtime_config.context_mode != CONTEXT_PROGRAM || runtime_guarded())
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    uint64_t nanoseconds = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    uint64_t last = __atomic_load_n(&last_notice_nanoseconds, __ATOMIC_RELAXED);
    if (nanoseconds - last < 10ull * 1000 * 1000 ||
        !__atomic_compare_exchange_n(&last_notice_nanoseconds, &last, nanoseconds, false,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    int saved_errno = errno;
    if (driver_loaded()) {
        runtime_guard_enter();
        engine_worker_poke(&runtime_engine);
        runtime_guard_leave();
    }
    errno = saved_errno;
}

/* ---- lifecycle ---- */

static const char *lookup_environment(const char *name, void *context)
{
    (void)context;
    return getenv(name);
}

/* Before fork, in the parent: remembers whether this process initialised
 * CUDA (a child of such a process cannot use it), and warns once when the
 * kernel is about to copy a lot of registered memory into the child. */
static void before_fork(void)
{
    if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != INIT_DONE)
        return;
    /* Never a call into the driver here: its own fork handlers ran first
     * and may hold its locks. What the shim saw of it says enough. */
    if (!cuda_used_here && runtime_config.context_mode == CONTEXT_PROGRAM && driver.found)
        cuda_used_here = cuda_driver_seen_initialized(&driver);
    if (runtime_config.fork_mode == FORK_COPY && runtime_config.fork_warn_bytes != 0 &&
        engine_has_registrations(&runtime_engine)) {
        uint64_t live = engine_live_bytes(&runtime_engine);
        if (live >= runtime_config.fork_warn_bytes &&
            __atomic_exchange_n(&fork_warned, 1, __ATOMIC_RELAXED) == 0)
            log_warn("fork() with %llu MiB registered: since Linux 5.9 the kernel copies "
                     "DMA-pinned pages into the child at fork; PINSHIM_FORK=dontfork keeps them "
                     "out of children that never touch these buffers (warned once)",
                     (unsigned long long)(live >> 20));
    }
    pthread_mutex_lock(&runtime_engine.mutex);
}

static void after_fork_parent(void)
{
    if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) == INIT_DONE)
        pthread_mutex_unlock(&runtime_engine.mutex);
}

static void after_fork_child(void)
{
    if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != INIT_DONE)
        return;
    /* Linux does not pass memory locks to the child, and the parent's
     * registrations are not the child's to undo. */
    engine_reset_after_fork(&runtime_engine);
    runtime_live_record_after_fork_child();
    is_fork_child = true;
    process_id = getpid();
    if (cuda_used_here || cuda_state == CUDA_READY || cuda.loaded)
        parent_used_cuda = true;
    cuda_used_here = false;
    if (cuda_state == CUDA_READY)
        cuda_state = CUDA_NOT_TRIED;
    pthread_mutex_init(&cuda_load_mutex, NULL);
    cuda_driver_after_fork();
    loaded_objects_after_fork();
    fork_warned = 0;
    /* The thread that was choosing is gone: choose again at the next lock. */
    int choosing = 1;
    __atomic_compare_exchange_n(&runtime_block_extent_state, &choosing, 0, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
    /* mlockall(MCL_FUTURE) is not inherited across fork. */
    __atomic_store_n(&future_mappings_locked, 0, __ATOMIC_RELAXED);
}

static void warn_if_allocator_precedes_shim(void)
{
    /* free must reach the shim before the allocator, or freed locked memory
     * stays registered. libc's own free is fine: the shim forwards to it. */
    void *first_free = dlsym(RTLD_DEFAULT, "free");
    Dl_info winner, self;
    const ElfW(Sym) *symbol = NULL;
    if (first_free == NULL || !dladdr1(first_free, &winner, (void **)&symbol, RTLD_DL_SYMENT) ||
        !dladdr((void *)warn_if_allocator_precedes_shim, &self))
        return;
    /* A non-PIE program that takes free's address has a canonical PLT entry
     * for it, an undefined symbol that dlsym returns; its calls still reach
     * the shim. */
    if (symbol != NULL && symbol->st_shndx == SHN_UNDEF)
        return;
    if (winner.dli_fbase == self.dli_fbase || winner.dli_fname == NULL)
        return;
    if (strstr(winner.dli_fname, "libc.so") != NULL)
        return; /* the shim was loaded with dlopen, not preloaded: nothing to say */
    log_warn("free resolves to %s before libpinshim.so; list libpinshim.so first in LD_PRELOAD "
             "or freed locked memory stays registered",
             winner.dli_fname);
}

/* UCX (Open MPI's and others' transport) hooks mmap/munmap/mremap by default by
 * overwriting the first bytes of the mmap it finds by name -- the shim's -- and
 * then calls the system directly, so the shim would never see those calls again.
 * Its relocation mode patches call sites instead and keeps both hooks working.
 * An explicit choice by the user is left alone. */
static void avoid_ucx_code_patching(void)
{
    if (!runtime_config.register_enabled || getenv("UCX_MEM_MMAP_HOOK_MODE") != NULL)
        return;
    if (setenv("UCX_MEM_MMAP_HOOK_MODE", "reloc", 0) == 0)
        log_debug("set UCX_MEM_MMAP_HOOK_MODE=reloc so UCX's memory hooks and the shim's coexist");
}

/* The copy of stderr for the exit summary goes high (programs that reuse low
 * numbers get them first), and its identity is kept to check it later. */
static void keep_stderr_copy(void)
{
    struct rlimit limit;
    int lowest = 3;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur > 1024)
        lowest = 1000;
    else if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur > 64)
        lowest = (int)limit.rlim_cur - 32;
    stderr_copy = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, lowest);
    if (stderr_copy < 0)
        stderr_copy = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    if (stderr_copy >= 0 && fstat(stderr_copy, &stderr_copy_identity) != 0) {
        close(stderr_copy);
        stderr_copy = -1;
    }
}

/* Whether the copy is still the file it was: the program may have closed it
 * and a new file may hold its number. */
static bool stderr_copy_intact(void)
{
    struct stat now;
    int flags = stderr_copy >= 0 ? fcntl(stderr_copy, F_GETFD) : -1;
    return flags >= 0 && (flags & FD_CLOEXEC) && fstat(stderr_copy, &now) == 0 &&
           now.st_dev == stderr_copy_identity.st_dev && now.st_ino == stderr_copy_identity.st_ino &&
           now.st_rdev == stderr_copy_identity.st_rdev &&
           (now.st_mode & S_IFMT) == (stderr_copy_identity.st_mode & S_IFMT);
}

static void initialize(void)
{
    process_id = getpid();
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0)
        runtime_page_size = (uintptr_t)page;
    config_load(&runtime_config, lookup_environment, NULL, config_secure_execution());
    log_set_level(runtime_config.log_level);
    struct engine_options options = {
        .min_bytes = runtime_config.min_bytes,
        .register_flags = runtime_config.register_flags,
        .max_registration_bytes = runtime_config.max_registration_bytes,
        .asynchronous = runtime_config.asynchronous,
        .onfault = (enum engine_onfault)runtime_config.onfault,
        .page_size = runtime_page_size,
    };
    if (!engine_init(&runtime_engine, &cuda_backend, &options))
        log_warn("cannot map memory for the range registry; registration is off");
    engine_keep_gate_at(&runtime_engine, &runtime_free_gate);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    warn_if_allocator_precedes_shim();
    if (runtime_config.stats_mode != STATS_NONE)
        keep_stderr_copy();
    avoid_ucx_code_patching();
}

void runtime_ensure_initialized(void)
{
    if (__builtin_expect(__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) == INIT_DONE, 1))
        return;
    int expected = INIT_NONE;
    if (__atomic_compare_exchange_n(&init_state, &expected, INIT_RUNNING, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        /* Calls the set-up itself makes (pthread_atfork, dlsym) bypass the shim. */
        runtime_guard_enter();
        initialize();
        runtime_guard_leave();
        __atomic_store_n(&init_state, INIT_DONE, __ATOMIC_RELEASE);
        return;
    }
    /* Another thread is initialising: its work is short and takes no shim lock. */
    while (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != INIT_DONE)
        sched_yield();
}

bool runtime_is_fork_child(void)
{
    return is_fork_child;
}

bool runtime_is_initialized(void)
{
    return __atomic_load_n(&init_state, __ATOMIC_ACQUIRE) == INIT_DONE;
}

size_t runtime_rounding_threshold(void)
{
    runtime_ensure_initialized();
    if (!runtime_config.register_enabled || !runtime_engine.registry_ok)
        return SIZE_MAX;
    uint64_t threshold = runtime_config.min_bytes < RUNTIME_SMALLEST_ROUNDING_THRESHOLD
                             ? RUNTIME_SMALLEST_ROUNDING_THRESHOLD
                             : runtime_config.min_bytes;
    return threshold > SIZE_MAX ? SIZE_MAX : (size_t)threshold;
}

bool runtime_future_mappings_locked(void)
{
    return __atomic_load_n(&future_mappings_locked, __ATOMIC_RELAXED) != 0;
}

void runtime_note_munlockall(int result)
{
    if (result == 0)
        __atomic_store_n(&future_mappings_locked, 0, __ATOMIC_RELAXED);
}

void runtime_note_mlockall(int flags, int result)
{
    if (result == 0)
        __atomic_store_n(&future_mappings_locked,
                         (flags & MCL_FUTURE) != 0 && (flags & MCL_ONFAULT) == 0, __ATOMIC_RELAXED);
    engine_count(&engine_stats(&runtime_engine)->mlockall_calls);
    runtime_live_record_start_once();
    if (__atomic_exchange_n(&mlockall_logged, 1, __ATOMIC_RELAXED) == 0)
        log_info("mlockall is passed through and counted; its pages are not registered");
}

static void fill_report(struct stats_report *report)
{
    memset(report, 0, sizeof(*report));
    report->pid = (long)getpid();
    if (gethostname(report->host, sizeof(report->host) - 1) != 0)
        strcpy(report->host, "unknown");
    ssize_t n = readlink("/proc/self/exe", report->exe, sizeof(report->exe) - 1);
    report->exe[n > 0 ? n : 0] = '\0';
    report->config = &runtime_config;
    report->cudart_loaded = cuda.loaded;
    report->cudart_usable = cuda.usable && cuda_state == CUDA_READY;
    report->cudart_shared = cuda.shared_with_program;
    report->cudart_path = cuda.loaded ? cuda.path : NULL;
    if (cuda.error[0] != '\0')
        report->cudart_error = cuda.error;
    else if (cuda_disabled_reason != NULL)
        report->cudart_error = cuda_disabled_reason;
    else if (!runtime_config.register_enabled)
        report->cudart_error = "PINSHIM_REGISTER is off";
    report->cudart_try_count = cuda.try_count < STATS_MAX_TRIES ? cuda.try_count : STATS_MAX_TRIES;
    for (size_t i = 0; i < report->cudart_try_count; i++) {
        report->cudart_tries[i].name = cuda.tries[i].name;
        report->cudart_tries[i].result = cuda.tries[i].result;
    }
    if (runtime_config.context_mode == CONTEXT_PROGRAM && cuda_used_here && driver.found)
        report->driver_path = driver.path;
    report->contexts_created = __atomic_load_n(&contexts_created, __ATOMIC_RELAXED);
    struct engine *engine = &runtime_engine;
    engine_get_counters(engine, &report->counters);
    pthread_mutex_lock(&engine->mutex);
    report->skipped_disabled = engine_stats(engine)->skipped_disabled;
    report->skipped_cuda_library = engine_stats(engine)->skipped_cuda_library;
    report->registered_by_pieces = engine_stats(engine)->registered_by_pieces;
    report->read_only_registrations = engine_stats(engine)->read_only_registrations;
    report->skipped_read_only_unsupported = engine_stats(engine)->skipped_read_only_unsupported;
    report->skipped_io = engine_stats(engine)->skipped_pieces[ENGINE_MAPPING_IO];
    report->skipped_no_access = engine_stats(engine)->skipped_pieces[ENGINE_MAPPING_NO_ACCESS];
    report->skipped_shared_file = engine_stats(engine)->skipped_pieces[ENGINE_MAPPING_SHARED_FILE];
    report->skipped_unmapped = engine_stats(engine)->skipped_pieces[ENGINE_MAPPING_UNMAPPED];
    report->skipped_address = engine_stats(engine)->skipped_address;
    report->skipped_onfault_pages = engine_stats(engine)->skipped_onfault_pages;
    report->exit_unloading = engine_stats(engine)->exit_unloading;
    report->live_ranges_at_exit = engine->live_ranges_at_exit;
    report->live_bytes_at_exit = engine->live_bytes_at_exit;
    report->deferred_total = engine_stats(engine)->deferred_total;
    report->deferred_registered = engine_stats(engine)->deferred_registered;
    report->deferred_dropped = engine_stats(engine)->dropped_pending;
    report->pending_ranges_at_exit = engine->pending_ranges_at_exit;
    report->pending_bytes_at_exit = engine->pending_bytes_at_exit;
    report->queued_ranges_at_exit = engine->queued_ranges_at_exit;
    report->cancelled_queued = engine_stats(engine)->cancelled_queued;
    report->wait_nanoseconds = engine_stats(engine)->wait_nanoseconds;
    report->background_nanoseconds = engine_stats(engine)->background_nanoseconds;
    report->program_unregistrations = engine_stats(engine)->program_unregistrations;
    report->program_took_back = engine_stats(engine)->program_took_back;
    report->program_handed_over = engine_stats(engine)->program_handed_over;
    report->program_kept = engine_stats(engine)->program_kept;
    report->gone_with_context = engine_stats(engine)->gone_with_context;
    pthread_mutex_unlock(&engine->mutex);
    struct engine_device_counts devices[STATS_MAX_DEVICES];
    report->device_count = engine_get_devices(engine, devices, STATS_MAX_DEVICES);
    for (size_t i = 0; i < report->device_count; i++) {
        report->devices[i].registrations = devices[i].registrations;
        report->devices[i].bytes = devices[i].bytes;
    }
    report->fork_child = is_fork_child;
    report->ended_by = ended_by_immediate_exit ? "_exit" : "exit";
    report->block_size_source = block_extent_source_name(
        (enum block_extent_source)__atomic_load_n(&runtime_block_extent_source, __ATOMIC_RELAXED));
    struct engine_error_count errors[STATS_MAX_ERRORS];
    size_t count = engine_get_errors(&runtime_engine, errors, STATS_MAX_ERRORS);
    for (size_t i = 0; i < count; i++) {
        report->errors[i].code = errors[i].code;
        report->errors[i].count = errors[i].count;
        report->errors[i].name = backend_error_name(NULL, errors[i].code);
    }
    report->error_count = count;
}

/* Writes the text summary on stderr, or on the copy taken at start when the
 * program has closed stderr by now. */
static void write_summary(const struct stats_report *report)
{
    if (!stats_write_text(STDERR_FILENO, report) && stderr_copy_intact())
        stats_write_text(stderr_copy, report);
}

/* True when the JSON statistics file was written. */
static bool write_stats(void)
{
    if (runtime_config.stats_mode == STATS_NONE)
        return false;
    struct stats_report report;
    fill_report(&report);
    report.warnings = log_warning_count();
    if (!stats_worth_writing(&report, &runtime_config))
        return false;
    if (runtime_config.stats_mode == STATS_TEXT) {
        write_summary(&report);
        return false;
    }
    char path[CONFIG_PATH_MAX];
    char why[256];
    if (!stats_expand_path(runtime_config.stats_path, report.pid, report.host, path,
                           sizeof(path))) {
        log_warn("PINSHIM_STATS=\"%.200s\" expands to a path that is too long; writing the summary "
                 "to stderr instead",
                 runtime_config.stats_path);
        write_summary(&report);
        return false;
    }
    if (!stats_write_file(path, &report, why, sizeof(why))) {
        log_warn("cannot write stats to %.300s (%s); writing the summary to stderr instead", path,
                 why);
        write_summary(&report);
        return false;
    }
    return true;
}

void runtime_before_immediate_exit(void)
{
    bool live = __atomic_load_n(&runtime_live_state, __ATOMIC_ACQUIRE) != 0;
    if (!runtime_is_initialized() || (runtime_config.stats_mode == STATS_NONE && !live) ||
        runtime_guarded() || getpid() != process_id)
        return;
    int saved_errno = errno;
    runtime_guard_enter();
    bool kept = false;
    if (engine_note_immediate_exit(&runtime_engine)) {
        ended_by_immediate_exit = true;
        kept = write_stats();
    }
    runtime_live_record_finish("_exit", kept);
    runtime_guard_leave();
    errno = saved_errno;
}

__attribute__((constructor)) static void runtime_constructor(void)
{
    runtime_ensure_initialized();
}

__attribute__((destructor)) static void runtime_destructor(void)
{
    if (!runtime_is_initialized())
        return;
    int saved_errno = errno;
    /* The kernel drops every pin at exit; unregistering first keeps the
     * runtime's view clean when it is still alive, and is counted when it is not. */
    runtime_live_record_exiting();
    engine_shutdown(&runtime_engine);
    bool kept = write_stats();
    runtime_live_record_finish("exit", kept);
    errno = saved_errno;
}

/* ---- public API (pinshim.h) ---- */

PINSHIM_EXPORT const char *pinshim_version(void)
{
    return PINSHIM_VERSION_STRING;
}

PINSHIM_EXPORT int pinshim_is_registered(const void *ptr)
{
    if (!runtime_is_initialized())
        return 0;
    return engine_is_registered(&runtime_engine, (uintptr_t)ptr) ? 1 : 0;
}

PINSHIM_EXPORT size_t pinshim_drain(void)
{
    if (!runtime_is_initialized() || runtime_guarded())
        return 0;
    bool look = engine_has_pending(&runtime_engine) &&
                runtime_config.context_mode == CONTEXT_PROGRAM && driver_loaded();
    return engine_drain(&runtime_engine, look);
}

PINSHIM_EXPORT size_t pinshim_get_counters(struct pinshim_counters *out, size_t size)
{
    if (out == NULL)
        return 0;
    struct pinshim_counters current;
    memset(&current, 0, sizeof(current));
    if (runtime_is_initialized())
        engine_get_counters(&runtime_engine, &current);
    size_t copy = size < sizeof(current) ? size : sizeof(current);
    memcpy(out, &current, copy);
    return copy;
}
