#include "runtime.h"

#include "block_extent.h"
#include "cuda_loader.h"
#include "log.h"
#include "memory_map.h"
#include "stats.h"

#include "pinshim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PINSHIM_EXPORT __attribute__((visibility("default")))

__thread int runtime_guard_depth __attribute__((tls_model("initial-exec")));

struct engine runtime_engine;
struct pinshim_config runtime_config;
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
static int cuda_state;
static struct cuda_runtime cuda;
static pthread_mutex_t cuda_load_mutex = PTHREAD_MUTEX_INITIALIZER;
static const char *cuda_disabled_reason; /* for the stats when nothing was loaded */
static bool is_fork_child;
static bool parent_used_cuda;
static int mlockall_logged;
/* A copy of stderr taken at start: programs such as coreutils close fd 2 in
 * their exit handlers, which run before the shim's destructor. */
static int stderr_copy = -1;

/* ---- CUDA backend for the engine ---- */

static bool backend_ready(void *context)
{
    (void)context;
    int state = __atomic_load_n(&cuda_state, __ATOMIC_ACQUIRE);
    if (state != CUDA_NOT_TRIED)
        return state == CUDA_READY;
    pthread_mutex_lock(&cuda_load_mutex);
    state = __atomic_load_n(&cuda_state, __ATOMIC_ACQUIRE);
    if (state == CUDA_NOT_TRIED) {
        if (!runtime_config.register_enabled) {
            state = CUDA_DISABLED;
            cuda_disabled_reason = "PINSHIM_REGISTER is off";
        } else if (is_fork_child && parent_used_cuda) {
            /* CUDA cannot be used in a child of a process that initialised it. */
            state = CUDA_DISABLED;
            cuda_disabled_reason = "forked from a process that had initialised CUDA";
            log_info("%s: locks in this child stay mlocked only", cuda_disabled_reason);
        } else {
            runtime_guard_enter();
            bool ok = cuda_runtime_load(&cuda, runtime_config.cudart);
            runtime_guard_leave();
            if (ok) {
                state = CUDA_READY;
                log_info("using CUDA runtime %s%s", cuda.path,
                         cuda.shared_with_program ? " (already loaded by the program)" : "");
            } else {
                state = CUDA_DISABLED;
                log_warn("%s; continuing with mlock only", cuda.error);
            }
        }
        __atomic_store_n(&cuda_state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cuda_load_mutex);
    return state == CUDA_READY;
}

static int backend_register(void *context, void *base, size_t length)
{
    (void)context;
    runtime_guard_enter();
    int error = cuda.host_register(base, length, runtime_config.register_flags);
    if (error != 0)
        cuda_runtime_clear_last_error(&cuda);
    runtime_guard_leave();
    return error;
}

static int backend_unregister(void *context, void *base)
{
    (void)context;
    runtime_guard_enter();
    int error = cuda.host_unregister(base);
    if (error != 0)
        cuda_runtime_clear_last_error(&cuda);
    runtime_guard_leave();
    return error;
}

static const char *backend_error_name(void *context, int error)
{
    (void)context;
    return cuda_error_name(cuda.loaded ? &cuda : NULL, error);
}

static bool backend_locked_parts(void *context, uintptr_t start, uintptr_t end,
                                 void (*found)(void *found_context, uintptr_t part_start,
                                               uintptr_t part_end),
                                 void *found_context)
{
    (void)context;
    return memory_map_locked_parts(start, end, found, found_context);
}

static const struct engine_backend cuda_backend = {
    .context = NULL,
    .ready = backend_ready,
    .register_range = backend_register,
    .unregister_range = backend_unregister,
    .error_name = backend_error_name,
    .locked_parts = backend_locked_parts,
};

/* ---- lifecycle ---- */

static const char *lookup_environment(const char *name, void *context)
{
    (void)context;
    return getenv(name);
}

static void before_fork(void)
{
    if (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) == INIT_DONE)
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
    is_fork_child = true;
    if (cuda_state == CUDA_READY || cuda.loaded)
        parent_used_cuda = true;
    if (cuda_state == CUDA_READY)
        cuda_state = CUDA_NOT_TRIED;
    pthread_mutex_init(&cuda_load_mutex, NULL);
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

static void initialize(void)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0)
        runtime_page_size = (uintptr_t)page;
    config_load(&runtime_config, lookup_environment, NULL, config_secure_execution());
    log_set_level(runtime_config.log_level);
    if (!engine_init(&runtime_engine, &cuda_backend, runtime_config.min_bytes, runtime_page_size))
        log_warn("cannot map memory for the range registry; registration is off");
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    warn_if_allocator_precedes_shim();
    if (runtime_config.stats_mode != STATS_NONE)
        stderr_copy = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
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
    engine_count(&runtime_engine.mlockall_calls);
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
    else if (cuda_state == CUDA_DISABLED)
        report->cudart_error = cuda_disabled_reason;
    engine_get_counters(&runtime_engine, &report->counters);
    report->skipped_disabled = __atomic_load_n(&runtime_engine.skipped_disabled, __ATOMIC_RELAXED);
    report->skipped_address = __atomic_load_n(&runtime_engine.skipped_address, __ATOMIC_RELAXED);
    report->exit_unloading = runtime_engine.exit_unloading;
    report->skipped_race_pages = runtime_engine.skipped_race;
    report->live_ranges_at_exit = runtime_engine.live_ranges_at_exit;
    report->live_bytes_at_exit = runtime_engine.live_bytes_at_exit;
    report->fork_child = is_fork_child;
    report->block_size_source = block_extent_source_name(
        (enum block_extent_source)__atomic_load_n(&runtime_block_extent_source, __ATOMIC_RELAXED));
    struct engine_error_count errors[STATS_MAX_ERRORS];
    size_t count = engine_get_errors(&runtime_engine, errors, STATS_MAX_ERRORS);
    for (size_t i = 0; i < count; i++) {
        report->errors[i].code = errors[i].code;
        report->errors[i].count = errors[i].count;
        report->errors[i].name = cuda_error_name(cuda.loaded ? &cuda : NULL, errors[i].code);
    }
    report->error_count = count;
}

/* Writes the text summary on stderr, or on the copy taken at start when the
 * program has closed stderr by now. */
static void write_summary(const struct stats_report *report)
{
    if (!stats_write_text(STDERR_FILENO, report) && stderr_copy >= 0)
        stats_write_text(stderr_copy, report);
}

static void write_stats(void)
{
    if (runtime_config.stats_mode == STATS_NONE)
        return;
    struct stats_report report;
    fill_report(&report);
    report.warnings = log_warning_count();
    if (!stats_worth_writing(&report, &runtime_config))
        return;
    if (runtime_config.stats_mode == STATS_TEXT) {
        write_summary(&report);
        return;
    }
    char path[CONFIG_PATH_MAX];
    char why[256];
    if (!stats_expand_path(runtime_config.stats_path, report.pid, report.host, path,
                           sizeof(path))) {
        log_warn("PINSHIM_STATS=\"%.200s\" expands to a path that is too long; writing the summary "
                 "to stderr instead",
                 runtime_config.stats_path);
        write_summary(&report);
        return;
    }
    if (!stats_write_file(path, &report, why, sizeof(why))) {
        log_warn("cannot write stats to %.300s (%s); writing the summary to stderr instead", path,
                 why);
        write_summary(&report);
    }
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
    engine_shutdown(&runtime_engine);
    write_stats();
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
