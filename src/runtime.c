#include "runtime.h"

#include "accelerator.h"
#include "block_extent.h"
#include "loaded_objects.h"
#include "log.h"
#include "memory_map.h"
#include "stats.h"
#include "trace.h"
#include "numa_placement.h"

#include "pinshim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
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

struct engine runtime_engine;
uintptr_t runtime_free_gate;
struct mapping_bounds runtime_mapping_bounds;
struct pinshim_config runtime_config;
/* Until the set-up reads the kernel's (sysconf), the smallest page any Linux
 * host has: a check made with it errs towards "not page-aligned", which
 * passes the call through. */
uintptr_t runtime_page_size = 4096;
struct huge_pages runtime_huge_pages;
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

static int future_mappings_locked;

enum init_state { INIT_NONE = 0, INIT_RUNNING, INIT_DONE };
static int init_state;

static bool is_fork_child;
static pid_t process_id; /* this process's, set at start and in fork children */
static bool ended_by_immediate_exit;
static int mlockall_logged;
static int fork_warned;
static uint64_t last_notice_nanoseconds;
/* A copy of stderr taken at start, for the exit summary: programs such as
 * coreutils close fd 2 in their exit handlers, which run before the shim's
 * destructor. Kept at a high number, and written to only while it is still
 * the file it was (a program may close it and reuse the number). */
static int stderr_copy = -1;
static struct stat stderr_copy_identity;

/* ---- the engine's backend: GPU calls through the accelerator layer ---- */

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
    reentry_guard_enter();
    engine_worker_run(&runtime_engine, WORKER_POLL_MAX_NANOSECONDS, false);
    reentry_guard_leave();
    return NULL;
}

static void backend_wake_worker(void *context)
{
    (void)context;
    pthread_attr_t attributes;
    sigset_t all, previous;
    sigfillset(&all);
    pthread_t thread;
    reentry_guard_enter();
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
    reentry_guard_leave();
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

/* Writes the process's vendor and its call into the counters, once a
 * vendor is chosen, for the live record's readers (pinshim top). */
static int vendor_noted;

/* At exit, before the GPU runtimes end: the exit handlers run in the reverse
 * order of their registration, and libraries' destructors (the runtimes'
 * teardown among them) after every handler registered once the program was
 * running, so the shim's last unregistrations meet a runtime still whole.
 * Registered when a vendor is chosen, after the runtime has started (and
 * registered its own teardown). The destructor does the rest. */
static void unregister_before_runtimes_end(void)
{
    if (!runtime_is_initialized() || getpid() != process_id)
        return;
    int saved_errno = errno;
    live_process_exiting();
    engine_shutdown(&runtime_engine);
    errno = saved_errno;
}

static void note_vendor(void)
{
    const struct vendor *vendor = accelerator_vendor();
    if (vendor == NULL || __atomic_load_n(&vendor_noted, __ATOMIC_RELAXED) ||
        __atomic_exchange_n(&vendor_noted, 1, __ATOMIC_RELAXED))
        return;
    struct engine_statistics *statistics = engine_stats(&runtime_engine);
    snprintf(statistics->vendor, sizeof(statistics->vendor), "%s", vendor->name);
    snprintf(statistics->register_call, sizeof(statistics->register_call), "%s",
             vendor->call_name(false));
    static int exit_handler_registered;
    if (!__atomic_exchange_n(&exit_handler_registered, 1, __ATOMIC_RELAXED))
        atexit(unregister_before_runtimes_end);
}

/* The GPU calls are the accelerator layer's, made with the reentrancy guard
 * held: a runtime may allocate, map and lock memory. */
static enum engine_choice backend_choose_place(void *context, bool from_worker,
                                               const struct range_place *hint,
                                               struct range_place *place)
{
    reentry_guard_enter();
    enum engine_choice choice = accelerator_choose_place(context, from_worker, hint, place);
    reentry_guard_leave();
    note_vendor();
    return choice;
}

static struct engine_result backend_register(void *context, struct range_place *place, void *base,
                                             size_t length)
{
    reentry_guard_enter();
    struct engine_result result = accelerator_register(context, place, base, length);
    reentry_guard_leave();
    return result;
}

static struct engine_result backend_unregister(void *context, const struct range_place *place,
                                               void *base, size_t length)
{
    reentry_guard_enter();
    struct engine_result result = accelerator_unregister(context, place, base, length);
    reentry_guard_leave();
    return result;
}

static bool backend_thread_place(void *context, struct range_place *place)
{
    reentry_guard_enter();
    bool known = accelerator_thread_place(context, place);
    reentry_guard_leave();
    note_vendor();
    return known;
}

static bool backend_read_only_supported(void *context, const struct range_place *place)
{
    reentry_guard_enter();
    bool supported = accelerator_read_only_supported(context, place);
    reentry_guard_leave();
    return supported;
}

static bool backend_page_nodes(void *context, uintptr_t start, uintptr_t end,
                               struct numa_placement *out)
{
    (void)context;
    return numa_placement_locate(start, end, runtime_page_size, out);
}

static int backend_device_node(void *context, const struct range_place *place)
{
    reentry_guard_enter();
    int node = accelerator_device_node(context, place);
    reentry_guard_leave();
    return node;
}

static const struct engine_backend engine_backend_of_process = {
    .context = NULL,
    .choose_place = backend_choose_place,
    .register_range = backend_register,
    .unregister_range = backend_unregister,
    .thread_place = backend_thread_place,
    .error_name = accelerator_error_name,
    .call_name = accelerator_call_name,
    .locked_parts = backend_locked_parts,
    .resident_parts = backend_resident_parts,
    .is_mapped = backend_is_mapped,
    .mapping_kinds = backend_mapping_kinds,
    .read_only_supported = backend_read_only_supported,
    .mapping_bounds = backend_mapping_bounds,
    .wake_worker = backend_wake_worker,
    .registered = backend_registered,
    .page_nodes = backend_page_nodes,
    .device_node = backend_device_node,
};

/* Whether a GPU runtime is loaded in the process (the loader's list: nothing
 * is loaded to find out). */
static bool runtime_loaded(void)
{
    reentry_guard_enter();
    bool loaded = accelerator_runtime_loaded();
    reentry_guard_leave();
    return loaded;
}

void runtime_notice_gpu_slow(void)
{
    if (runtime_config.context_mode != CONTEXT_PROGRAM || reentry_guarded())
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
    if (runtime_loaded()) {
        reentry_guard_enter();
        engine_worker_poke(&runtime_engine);
        reentry_guard_leave();
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
    /* Never a call into a runtime here: its own fork handlers ran first and
     * may hold its locks. What the shim saw of it says enough. */
    accelerator_before_fork();
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
    live_process_after_fork_child();
    is_fork_child = true;
    process_id = getpid();
    accelerator_after_fork_child();
    vendor_noted = 0;
    loaded_objects_after_fork();
    fork_warned = 0;
    /* The thread that was choosing is gone: choose again at the next lock. */
    block_extent_after_fork_child();
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
        .numa = runtime_config.numa,
    };
    /* NVTX loads the library NVTX_INJECTION64_PATH names: never in a
     * setuid, setgid or capability-raising program. */
    trace_configure(runtime_config.nvtx && !config_secure_execution());
    accelerator_configure(&(struct accelerator_settings){
        .register_enabled = runtime_config.register_enabled,
        .create_mode = runtime_config.context_mode == CONTEXT_CREATE,
        .vendor = (enum accelerator_vendor_choice)runtime_config.vendor,
        .device = runtime_config.device,
        .library = runtime_config.cudart,
    });
    if (!engine_init(&runtime_engine, &engine_backend_of_process, &options))
        log_warn("cannot map memory for the range registry; registration is off");
    huge_pages_init(&runtime_huge_pages,
                    runtime_config.huge_pages == HUGE_PAGES_AUTO && runtime_config.register_enabled,
                    "/sys/kernel/mm/transparent_hugepage", "/proc/buddyinfo", NULL,
                    runtime_page_size);
    snprintf(engine_stats(&runtime_engine)->huge_pages_kernel,
             sizeof(engine_stats(&runtime_engine)->huge_pages_kernel), "%s",
             huge_pages_kernel_name(runtime_huge_pages.kernel));
    engine_set_mapping_bounds(&runtime_engine, &runtime_mapping_bounds);
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
        reentry_guard_enter();
        initialize();
        reentry_guard_leave();
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

void runtime_live_record_start(void)
{
    if (runtime_is_initialized())
        live_process_start(&runtime_config, &runtime_engine, is_fork_child);
}

bool runtime_is_initialized(void)
{
    return __atomic_load_n(&init_state, __ATOMIC_ACQUIRE) == INIT_DONE;
}

void runtime_huge_pages_before_lock(uintptr_t addr, size_t length, bool faults_in,
                                    struct huge_pages_lock *lock)
{
    huge_pages_before_lock(&runtime_huge_pages, addr, length, faults_in, lock);
}

void runtime_huge_pages_after_lock(const struct huge_pages_lock *lock, bool locked)
{
    struct huge_pages_outcome outcome;
    huge_pages_after_lock(&runtime_huge_pages, lock, locked, &outcome);
    struct engine_statistics *statistics = engine_stats(&runtime_engine);
    __atomic_add_fetch(&statistics->huge_bytes, outcome.huge_bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->small_bytes, outcome.small_bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->page_size_unknown_bytes, outcome.unknown_bytes,
                       __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->huge_made_bytes, lock->plan.made, __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->huge_had_pages_bytes, lock->plan.had_pages, __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->huge_no_block_bytes, lock->plan.no_block, __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->huge_refused_bytes, lock->plan.refused, __ATOMIC_RELAXED);
    __atomic_add_fetch(&statistics->huge_stopped_bytes, lock->plan.stopped, __ATOMIC_RELAXED);
    if (outcome.backed_off_now) {
        __atomic_store_n(&statistics->huge_backed_off, 1, __ATOMIC_RELAXED);
        int saved_errno = errno;
        log_info("huge pages: chunks were made huge at %.2f GiB/s, below 1 GiB/s (memory the "
                 "hypervisor had not backed yet, or compaction); the shim makes no more in "
                 "this process",
                 (double)lock->plan.slow_bytes_per_second / (double)(1u << 30));
        errno = saved_errno;
    }
}

size_t runtime_huge_pages_alignment(size_t alignment, size_t size)
{
    size_t aligned = huge_pages_allocation_alignment(&runtime_huge_pages, alignment, size);
    if (aligned != alignment)
        engine_count(&engine_stats(&runtime_engine)->huge_aligned_allocations);
    return aligned;
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
    struct accelerator_description accelerator;
    accelerator_describe(&accelerator);
    const struct vendor_description *described = &accelerator.vendor_description;
    if (accelerator.vendor != NULL) {
        report->vendor = accelerator.vendor->name;
        report->vendor_title = accelerator.vendor->title;
        report->register_call = accelerator.vendor->call_name(false);
        report->unregister_call = accelerator.vendor->call_name(true);
    }
    if (runtime_config.context_mode == CONTEXT_CREATE) {
        report->runtime_loaded = described->library != NULL;
        report->runtime_usable = accelerator.vendor != NULL;
        report->runtime_shared = described->shared_with_program;
        report->runtime_path = described->library;
        report->contexts_created = described->contexts_created;
        report->runtime_try_count = described->try_count;
        for (size_t i = 0; i < described->try_count && i < STATS_MAX_TRIES; i++) {
            report->runtime_tries[i].name = described->tries[i].name;
            report->runtime_tries[i].result = described->tries[i].result;
        }
        if (accelerator.vendor == NULL && accelerator.create_error[0] != '\0')
            snprintf(report->runtime_error_text, sizeof(report->runtime_error_text), "%s",
                     accelerator.create_error);
        else if (described->error != NULL)
            snprintf(report->runtime_error_text, sizeof(report->runtime_error_text), "%s",
                     described->error);
    } else {
        report->driver_path = described->library;
    }
    if (report->runtime_error_text[0] != '\0')
        report->runtime_error = report->runtime_error_text;
    else if (accelerator.disabled_reason != NULL)
        report->runtime_error = accelerator.disabled_reason;
    else if (!runtime_config.register_enabled)
        report->runtime_error = "PINSHIM_REGISTER is off";
    struct engine *engine = &runtime_engine;
    engine_get_counters(engine, &report->counters);
    pthread_mutex_lock(&engine->mutex);
    report->skipped_disabled = engine_stats(engine)->skipped_disabled;
    report->skipped_runtime_library = engine_stats(engine)->skipped_runtime_library;
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
    report->runs_joined = engine_stats(engine)->runs_joined;
    report->join_failed = engine_stats(engine)->join_failed;
    report->runs_chunked = engine_stats(engine)->runs_chunked;
    report->held_ranges_at_exit = engine_stats(engine)->held_ranges;
    report->held_bytes_at_exit = engine_stats(engine)->held_bytes;
    report->numa = engine->options.numa;
    for (size_t node = 0; node < NUMA_PLACEMENT_MAX_NODES; node++) {
        report->numa_nodes[node].bytes = engine_stats(engine)->numa_nodes[node].bytes;
        report->numa_nodes[node].local_bytes = engine_stats(engine)->numa_nodes[node].local_bytes;
    }
    report->numa_remote_bytes = engine_stats(engine)->numa_remote_bytes;
    report->numa_unknown_bytes = engine_stats(engine)->numa_unknown_bytes;
    for (size_t i = 0; i < STATS_MAX_DEVICES && i < ENGINE_MAX_DEVICES; i++)
        report->device_nodes[i] = engine_stats(engine)->device_nodes[i];
    report->huge_pages_option = runtime_config.huge_pages == HUGE_PAGES_AUTO ? "auto" : "off";
    report->huge_pages_kernel = huge_pages_kernel_name(runtime_huge_pages.kernel);
    report->huge_pmd_size = runtime_huge_pages.pmd_size;
    report->huge_bytes = engine_stats(engine)->huge_bytes;
    report->small_bytes = engine_stats(engine)->small_bytes;
    report->page_size_unknown_bytes = engine_stats(engine)->page_size_unknown_bytes;
    report->huge_made_bytes = engine_stats(engine)->huge_made_bytes;
    report->huge_had_pages_bytes = engine_stats(engine)->huge_had_pages_bytes;
    report->huge_no_block_bytes = engine_stats(engine)->huge_no_block_bytes;
    report->huge_refused_bytes = engine_stats(engine)->huge_refused_bytes;
    report->huge_stopped_bytes = engine_stats(engine)->huge_stopped_bytes;
    report->huge_aligned_allocations = engine_stats(engine)->huge_aligned_allocations;
    report->huge_backed_off = engine_stats(engine)->huge_backed_off != 0;
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
        (enum block_extent_source)__atomic_load_n(&block_extent_chosen_source, __ATOMIC_RELAXED));
    struct engine_error_count errors[STATS_MAX_ERRORS];
    size_t count = engine_get_errors(&runtime_engine, errors, STATS_MAX_ERRORS);
    for (size_t i = 0; i < count; i++) {
        report->errors[i].code = errors[i].code;
        report->errors[i].count = errors[i].count;
        report->errors[i].name = accelerator_error_name(NULL, errors[i].code);
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
    bool live = __atomic_load_n(&live_process_state, __ATOMIC_ACQUIRE) != 0;
    if (!runtime_is_initialized() || (runtime_config.stats_mode == STATS_NONE && !live) ||
        reentry_guarded() || getpid() != process_id)
        return;
    int saved_errno = errno;
    reentry_guard_enter();
    bool kept = false;
    if (engine_note_immediate_exit(&runtime_engine)) {
        ended_by_immediate_exit = true;
        kept = write_stats();
    }
    live_process_finish("_exit", kept, runtime_config.stats_mode == STATS_JSON);
    reentry_guard_leave();
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
    live_process_exiting();
    reentry_guard_enter();
    accelerator_process_exiting();
    reentry_guard_leave();
    engine_shutdown(&runtime_engine);
    bool kept = write_stats();
    live_process_finish("exit", kept, runtime_config.stats_mode == STATS_JSON);
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
    if (!runtime_is_initialized() || reentry_guarded())
        return 0;
    bool look = engine_has_pending(&runtime_engine) &&
                runtime_config.context_mode == CONTEXT_PROGRAM && runtime_loaded();
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
