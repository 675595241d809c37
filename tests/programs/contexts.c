/* Issue 11: which CUDA context the shim registers into, and when. A program
 * that reaches CUDA the way real ones do: it links neither the runtime nor
 * the driver; it dlopens the runtime (PINSHIM_CUDART, the fake one) when a
 * scenario "uses CUDA", and the runtime loads the fake driver
 * (libcuda.so.1) at its first call, as libcudart loads libcuda. Each
 * scenario prints "key=value" lines that test_contexts checks, and exits 0
 * unless the harness itself failed (exit 2).
 *
 *   contexts <scenario> [munlock|free]
 *
 * scenarios:
 *   worker-after-set-device  main chose device 3 (of FAKE_CUDA_DEVICES=4); a
 *                            worker thread with no context locks; a second
 *                            worker chose device 1 itself and locks; a third
 *                            made its own (non-primary) context and locks
 *   lock-then-init           locks before CUDA is initialised, then the
 *                            program initialises device 2; the second word
 *                            says how the shim gets to know: "drain"
 *                            (pinshim_drain) or "watch" (nothing: its
 *                            thread or its next call)
 *   never-init               locks and releases without CUDA; what is loaded
 *   fork-child-inits         the parent locks, a forked child uses CUDA
 *   release-pending          pending ranges unlocked, freed and unmapped
 *   release-queued-in-flight a queued range released while another is in
 *                            flight, then the in-flight one released
 *                            (second word: munlock or free)
 *   fork-with-pending        the parent locks without CUDA and forks; the
 *                            child initialises CUDA; then the parent does
 *   chunks                   a 200 GiB reservation locked on fault and
 *                            registered (PINSHIM_ONFAULT=all) in chunks
 *   capture-beside-lock      a thread captures a graph (global mode) while
 *                            main, then a thread with no context, lock
 *                            memory and main unlocks some; then the capture
 *                            ends
 *   fork-child-after-start   the parent starts CUDA and locks nothing; a
 *                            forked child locks; what the shim called there
 *   pinned-at-return         main chose device 2; what is registered, and
 *                            where, the moment mlock, mlock2 and
 *                            mmap(MAP_LOCKED) return, in main and in a worker
 *                            that never chose a device (no pinshim_drain)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emulation.h"
#include "fake_cuda.h"
#include "pinshim.h"

#define MIB (1024ul * 1024)
#define GIB (1024ul * MIB)
#define HARNESS_FAILED 2

static void die(const char *what)
{
    printf("harness: %s\n", what);
    fflush(stdout);
    _exit(HARNESS_FAILED);
}

/* ---- the shim, found as any program finds an optional library ---- */

static size_t shim_drain(void)
{
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    return drain != NULL ? drain() : 0;
}

static struct pinshim_counters shim_counters(void)
{
    struct pinshim_counters counters;
    memset(&counters, 0, sizeof counters);
    size_t (*get)(struct pinshim_counters *, size_t) =
        (size_t(*)(struct pinshim_counters *, size_t))dlsym(RTLD_DEFAULT, "pinshim_get_counters");
    if (get != NULL)
        get(&counters, sizeof counters);
    return counters;
}

/* ---- the runtime, loaded when the program uses CUDA ---- */

static void *runtime;

static void *runtime_symbol(const char *name)
{
    if (runtime == NULL) {
        const char *path = getenv("PINSHIM_CUDART");
        runtime = path != NULL ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (runtime == NULL)
            die("cannot load the runtime named by PINSHIM_CUDART");
    }
    void *symbol = dlsym(runtime, name);
    if (symbol == NULL)
        die(name);
    return symbol;
}

static int cuda_set_device(int device)
{
    return ((int (*)(int))runtime_symbol("cudaSetDevice"))(device);
}

static int cuda_free(void *pointer)
{
    return ((int (*)(void *))runtime_symbol("cudaFree"))(pointer);
}

static int cuda_host_register(void *pointer, size_t size)
{
    return ((int (*)(void *, size_t, unsigned))runtime_symbol("cudaHostRegister"))(pointer, size,
                                                                                   0);
}

static int cuda_host_unregister(void *pointer)
{
    return ((int (*)(void *))runtime_symbol("cudaHostUnregister"))(pointer);
}

/* ---- the driver double's query API, once the driver is loaded ---- */

static bool driver_loaded(void)
{
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle != NULL)
        dlclose(handle);
    return handle != NULL;
}

static void *driver_symbol(const char *name)
{
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        die("the driver is not loaded");
    void *symbol = dlsym(handle, name);
    dlclose(handle);
    if (symbol == NULL)
        die(name);
    return symbol;
}

#define DRIVER(name, type) ((type)driver_symbol(#name))

/* The device a live registration holds address on, -1 when none. */
static int registered_device(const void *address)
{
    struct fake_cuda_registration registration;
    if (!DRIVER(fake_cuda_lookup,
                int (*)(const void *, struct fake_cuda_registration *))(address, &registration))
        return -1;
    return registration.device;
}

static void *registered_context(const void *address)
{
    struct fake_cuda_registration registration;
    if (!DRIVER(fake_cuda_lookup,
                int (*)(const void *, struct fake_cuda_registration *))(address, &registration))
        return NULL;
    return registration.context;
}

static unsigned long long shim_contexts(void)
{
    return (unsigned long long)DRIVER(fake_cuda_contexts_created_by,
                                      uint64_t(*)(const char *))("libpinshim");
}

static unsigned long long shim_calls(int which)
{
    return (unsigned long long)DRIVER(fake_cuda_call_count_by,
                                      uint64_t(*)(int, const char *))(which, "libpinshim");
}

static unsigned long long violations(void)
{
    return (unsigned long long)DRIVER(fake_cuda_violation_count, size_t(*)(void))();
}

/* The shim's registrations in one range (every state), by the double. */
static size_t registrations_within(uintptr_t start, uintptr_t end, size_t *largest)
{
    struct fake_cuda_registration list[64];
    size_t count =
        DRIVER(fake_cuda_snapshot_from,
               size_t(*)(uintptr_t, struct fake_cuda_registration *, size_t))(start, list, 64);
    size_t within = 0;
    *largest = 0;
    for (size_t i = 0; i < count; i++) {
        if (list[i].base >= end)
            break;
        within++;
        if (list[i].size > *largest)
            *largest = list[i].size;
    }
    return within;
}

static void sleep_ms(long milliseconds)
{
    struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000L};
    nanosleep(&pause, NULL);
}

/* ---- what the process holds ---- */

/* The thread id of the shim's thread (named pinshim-reg), or 0. */
static pid_t registration_thread_id(void)
{
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL)
        die("cannot list /proc/self/task");
    pid_t found = 0;
    for (struct dirent *entry; found == 0 && (entry = readdir(tasks)) != NULL;) {
        if (entry->d_name[0] == '.')
            continue;
        char path[300], name[64] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", entry->d_name);
        FILE *comm = fopen(path, "r");
        if (comm != NULL) {
            if (fgets(name, sizeof name, comm) != NULL && strncmp(name, "pinshim-reg", 11) == 0)
                found = (pid_t)atoi(entry->d_name);
            fclose(comm);
        }
    }
    closedir(tasks);
    return found;
}

/* 1 when the shim's thread runs. */
static int registration_thread_runs(void)
{
    return registration_thread_id() != 0;
}

/* 1 once thread tid sleeps (state S in /proc: blocked, here in the shim's
 * wait for the registration in flight). */
static bool thread_sleeps(pid_t tid)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *stat = fopen(path, "r");
    if (stat == NULL)
        return false;
    bool sleeps = false;
    if (fgets(line, sizeof line, stat) != NULL) {
        const char *close = strrchr(line, ')');
        sleeps = close != NULL && close[1] == ' ' && close[2] == 'S';
    }
    fclose(stat);
    return sleeps;
}

/* Waits (up to 30 s) until the shim's thread sleeps: the watcher, waiting
 * on the shim's condition variable between its looks. A fork now has the
 * child inherit a condition variable with a waiter that does not exist
 * there (the child must not wait for it). */
static bool wait_watcher_sleeps(void)
{
    for (int i = 0; i < 3000; i++) {
        pid_t watcher = registration_thread_id();
        if (watcher != 0 && thread_sleeps(watcher))
            return true;
        sleep_ms(10);
    }
    return false;
}

/* 1 when a mapped file's path contains part. */
static int mapped(const char *part)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps == NULL)
        die("cannot read /proc/self/maps");
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, maps) != NULL)
        if (strstr(line, part) != NULL)
            found = 1;
    fclose(maps);
    return found;
}

static void *locked_block(size_t size)
{
    void *block = NULL;
    if (posix_memalign(&block, 4096, size) != 0)
        die("posix_memalign");
    memset(block, 1, size);
    if (mlock(block, size) != 0)
        die("mlock");
    return block;
}

/* Waits (polling, up to 30 s, so a broken shim fails rather than hangs) for
 * address to be registered. */
static bool wait_registered(const void *address)
{
    for (int i = 0; i < 3000; i++) {
        if (registered_device(address) >= 0)
            return true;
        sleep_ms(10);
    }
    return false;
}

/* ---- scenarios ---- */

struct worker {
    int set_device;   /* -1: leaves the thread without a device */
    bool own_context; /* cuCtxCreate_v2 on device 2 first */
    void *block;      /* what it locked */
    void *context;    /* its current context when it locked */
    unsigned depth_before, depth_after;
    void *top_before, *top_after;
};

static void *worker_main(void *argument)
{
    struct worker *worker = argument;
    if (worker->set_device >= 0 && cuda_set_device(worker->set_device) != 0)
        die("cudaSetDevice in the worker");
    if (worker->own_context) {
        CUcontext made = NULL;
        if (DRIVER(cuCtxCreate_v2, int (*)(CUcontext *, unsigned, CUdevice))(&made, 0, 2) != 0)
            die("cuCtxCreate_v2");
    }
    unsigned (*depth)(void) = DRIVER(fake_cuda_context_stack_depth, unsigned (*)(void));
    void *(*top)(void) = DRIVER(fake_cuda_context_stack_top, void *(*)(void));
    worker->depth_before = depth();
    worker->top_before = top();
    worker->context = worker->top_before;
    worker->block = locked_block(4 * MIB);
    worker->depth_after = depth();
    worker->top_after = top();
    return NULL;
}

static void run_worker(struct worker *worker)
{
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker_main, worker) != 0 || pthread_join(thread, NULL) != 0)
        die("pthread");
}

static int worker_after_set_device(void)
{
    if (cuda_set_device(3) != 0 || cuda_free(NULL) != 0)
        die("the program's CUDA initialisation on device 3");
    struct worker plain = {.set_device = -1}, chose = {.set_device = 1},
                  own = {.set_device = -1, .own_context = true};
    run_worker(&plain);
    run_worker(&chose);
    run_worker(&own);
    shim_drain();
    printf("plain_device=%d\n", registered_device(plain.block));
    printf("plain_stack_unchanged=%d\n",
           plain.depth_before == 0 && plain.depth_after == 0 && plain.top_after == NULL);
    printf("chose_device=%d\n", registered_device(chose.block));
    printf("chose_stack_unchanged=%d\n",
           chose.depth_after == chose.depth_before && chose.top_after == chose.top_before);
    printf("own_in_its_context=%d\n",
           own.context != NULL && registered_context(own.block) == own.context);
    printf("own_stack_unchanged=%d\n",
           own.depth_after == own.depth_before && own.top_after == own.top_before);
    printf("contexts_by_shim=%llu\n", shim_contexts());
    printf("contexts_on_device_0=%llu\n",
           (unsigned long long)DRIVER(fake_cuda_contexts_created_on, uint64_t(*)(int))(0));
    printf("violations=%llu\n", violations());
    munlock(plain.block, 4 * MIB);
    free(chose.block); /* released while locked: the shim unregisters first */
    munlock(own.block, 4 * MIB);
    printf("live_after_release=%zu\n", DRIVER(fake_cuda_live_count, size_t(*)(void))());
    printf("violations_after_release=%llu\n", violations());
    return 0;
}

static int lock_then_init(const char *how)
{
    char *block = locked_block(4 * MIB);
    printf("driver_loaded_before=%d\n", driver_loaded());
    printf("thread_before=%d\n", registration_thread_runs());
    printf("pending_before=%llu\n", (unsigned long long)shim_counters().pending_ranges);
    if (cuda_set_device(2) != 0 || cuda_free(NULL) != 0)
        die("the program's CUDA initialisation on device 2");
    if (strcmp(how, "drain") == 0)
        shim_drain();
    else if (!wait_registered(block))
        die("not registered within 30 s of the program's CUDA initialisation");
    printf("device=%d\n", registered_device(block));
    printf("contexts_by_shim=%llu\n", shim_contexts());
    printf("pending_after=%llu\n", (unsigned long long)shim_counters().pending_ranges);
    printf("violations=%llu\n", violations());
    munlock(block, 4 * MIB);
    free(block);
    printf("live_after_release=%zu\n", DRIVER(fake_cuda_live_count, size_t(*)(void))());
    return 0;
}

static int never_init(void)
{
    char *kept = locked_block(4 * MIB);
    char *released = locked_block(8 * MIB);
    munlock(released, 8 * MIB);
    free(released);
    shim_drain();
    printf("pending=%llu\n", (unsigned long long)shim_counters().pending_ranges);
    printf("driver_loaded=%d\n", driver_loaded());
    printf("runtime_mapped=%d\n", mapped("cudart"));
    printf("thread=%d\n", registration_thread_runs());
    (void)kept; /* still locked at exit: pending at exit in the stats */
    return 0;
}

static int fork_child_inits(void)
{
    char *block = locked_block(4 * MIB);
    if (registration_thread_runs())
        printf("watcher_sleeps_at_fork=%d\n", wait_watcher_sleeps());
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        int init = cuda_free(NULL);
        char *own = malloc(1 * MIB);
        int registered = own != NULL ? cuda_host_register(own, 1 * MIB) : -1;
        int unregistered = registered == 0 ? cuda_host_unregister(own) : -1;
        printf("child_init=%d\nchild_register=%d\nchild_unregister=%d\n", init, registered,
               unregistered);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the child did not end well");
    printf("parent_init=%d\n", cuda_free(NULL));
    shim_drain();
    printf("parent_device=%d\n", registered_device(block));
    printf("contexts_by_shim=%llu\n", shim_contexts());
    munlock(block, 4 * MIB);
    free(block);
    return 0;
}

static int release_pending(void)
{
    char *unlocked = locked_block(4 * MIB);
    munlock(unlocked, 4 * MIB);
    char *freed = locked_block(4 * MIB);
    free(freed);
    char *unmapped = mmap(NULL, 4 * MIB, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (unmapped == MAP_FAILED)
        die("mmap MAP_LOCKED");
    munmap(unmapped, 4 * MIB);
    printf("pending_after_releases=%llu\n", (unsigned long long)shim_counters().pending_ranges);
    /* The watcher ends with the last pending range (waits up to 30 s). */
    int watcher = 1;
    for (int i = 0; i < 3000 && (watcher = registration_thread_runs()) != 0; i++)
        sleep_ms(10);
    printf("watcher_after_releases=%d\n", watcher);
    if (cuda_free(NULL) != 0)
        die("the program's CUDA initialisation");
    shim_drain();
    printf("shim_register_calls=%llu\n", shim_calls(FAKE_CU_CALL_MEM_HOST_REGISTER_V2) +
                                             shim_calls(FAKE_CU_CALL_MEM_HOST_REGISTER));
    printf("live=%zu\n", DRIVER(fake_cuda_live_count, size_t(*)(void))());
    free(unlocked);
    return 0;
}

struct releaser {
    void *block;
    size_t size;
    bool use_free;
    pid_t tid;
    int done;
};

static void *releaser_main(void *argument)
{
    struct releaser *releaser = argument;
    __atomic_store_n(&releaser->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    if (releaser->use_free)
        free(releaser->block);
    else
        munlock(releaser->block, releaser->size);
    __atomic_store_n(&releaser->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int release_queued_in_flight(const char *how)
{
    /* FAKE_CUDA_REGISTER_SECONDS_PER_GIB is large: the first registration
     * sleeps until fake_cuda_wake_sleepers. */
    if (cuda_free(NULL) != 0)
        die("the program's CUDA initialisation");
    size_t (*in_flight)(void) = DRIVER(fake_cuda_registrations_in_flight, size_t(*)(void));
    const size_t size = 64 * MIB;
    char *first = locked_block(size);
    for (int i = 0; i < 3000 && in_flight() == 0; i++)
        sleep_ms(10);
    printf("first_in_flight=%zu\n", in_flight());
    char *queued = locked_block(size);
    struct pinshim_counters counters = shim_counters();
    printf("queued=%llu\n", (unsigned long long)counters.queued_ranges);
    /* Released while the thread is still inside the first registration:
     * cancelled, not waited for. */
    if (strcmp(how, "free") == 0)
        free(queued);
    else
        munlock(queued, size);
    printf("first_still_in_flight=%zu\n", in_flight());
    printf("queued_after=%llu\n", (unsigned long long)shim_counters().queued_ranges);

    struct releaser releaser = {first, size, strcmp(how, "free") == 0, 0, 0};
    pthread_t thread;
    if (pthread_create(&thread, NULL, releaser_main, &releaser) != 0)
        die("pthread_create");
    bool waited = false;
    for (int i = 0; i < 3000 && !waited; i++) {
        pid_t tid = __atomic_load_n(&releaser.tid, __ATOMIC_ACQUIRE);
        waited = tid != 0 && thread_sleeps(tid) && in_flight() == 1 &&
                 !__atomic_load_n(&releaser.done, __ATOMIC_ACQUIRE);
        if (!waited)
            sleep_ms(10);
    }
    printf("release_waited_for_the_registration=%d\n", waited);
    DRIVER(fake_cuda_wake_sleepers, void (*)(void))();
    pthread_join(thread, NULL);
    printf("registrations_completed=%llu\n",
           (unsigned long long)DRIVER(fake_cuda_registrations_completed, uint64_t(*)(void))());
    printf("shim_register_calls=%llu\n", shim_calls(FAKE_CU_CALL_MEM_HOST_REGISTER_V2) +
                                             shim_calls(FAKE_CU_CALL_MEM_HOST_REGISTER));
    printf("shim_unregister_calls=%llu\n", shim_calls(FAKE_CU_CALL_MEM_HOST_UNREGISTER));
    printf("live=%zu\n", DRIVER(fake_cuda_live_count, size_t(*)(void))());
    printf("violations=%llu\n", violations());
    if (!releaser.use_free)
        free(first);
    return 0;
}

static int fork_with_pending(void)
{
    char *block = locked_block(4 * MIB);
    if (registration_thread_runs())
        printf("watcher_sleeps_at_fork=%d\n", wait_watcher_sleeps());
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        /* Locks are not inherited: the parent's pending range is not the
         * child's to register. */
        printf("child_pending=%llu\n", (unsigned long long)shim_counters().pending_ranges);
        int init = cuda_free(NULL);
        char *own = locked_block(4 * MIB);
        shim_drain();
        printf("child_init=%d\n", init);
        printf("child_parent_block_device=%d\n", registered_device(block));
        printf("child_own_device=%d\n", registered_device(own));
        printf("child_contexts_by_shim=%llu\n", shim_contexts());
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the child did not end well");
    printf("parent_pending=%llu\n", (unsigned long long)shim_counters().pending_ranges);
    if (cuda_free(NULL) != 0)
        die("the parent's CUDA initialisation");
    shim_drain();
    printf("parent_device=%d\n", registered_device(block));
    munlock(block, 4 * MIB);
    free(block);
    return 0;
}

static int chunks(void)
{
    if (cuda_free(NULL) != 0)
        die("the program's CUDA initialisation");
    const size_t size = 200 * GIB;
    /* Readable and writable, as memory the driver can pin must be; never
     * touched, so nothing is allocated. */
    char *reservation = mmap(NULL, size, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reservation == MAP_FAILED)
        die("a 200 GiB reservation");
    /* MLOCK_ONFAULT: nothing is faulted in, so nothing is allocated. */
    if (mlock2(reservation, size, MLOCK_ONFAULT) != 0) {
        printf("skipped=mlock2 %s\n", strerror(errno));
        return 0;
    }
    shim_drain();
    size_t largest = 0;
    size_t count =
        registrations_within((uintptr_t)reservation, (uintptr_t)reservation + size, &largest);
    printf("registrations=%zu\n", count);
    printf("largest_gib=%zu\n", largest / GIB);
    printf("registered_end=%d\n", registered_device(reservation + size - 1) >= 0);
    printf("violations=%llu\n", violations());
    munmap(reservation, size);
    printf("live_after_unmap=%zu\n", DRIVER(fake_cuda_live_count, size_t(*)(void))());
    return 0;
}

struct at_return {
    int device;
};

static void *lock_and_look(void *argument)
{
    struct at_return *seen = argument;
    char *block = locked_block(1 * MIB);
    seen->device = registered_device(block) == registered_device(block + MIB - 1)
                       ? registered_device(block)
                       : -2;
    munlock(block, 1 * MIB);
    free(block);
    return NULL;
}

static int pinned_at_return(void)
{
    if (cuda_set_device(2) != 0 || cuda_free(NULL) != 0)
        die("the program's CUDA initialisation on device 2");
    struct at_return main_thread;
    lock_and_look(&main_thread);
    printf("mlock_device=%d\n", main_thread.device);
    char *onfault = NULL;
    if (posix_memalign((void **)&onfault, 4096, 1 * MIB) != 0)
        die("posix_memalign");
    memset(onfault, 1, 1 * MIB);
    if (mlock2(onfault, 1 * MIB, MLOCK_ONFAULT) == 0) {
        printf("mlock2_device=%d\n", registered_device(onfault + MIB - 1));
        munlock(onfault, 1 * MIB);
    } else if (errno == EINVAL && !test_kernel_has_mlock2()) {
        printf("mlock2_device=none\n"); /* the kernel lacks mlock2 (qemu-user) */
    } else {
        die("mlock2");
    }
    free(onfault);
    char *mapped_locked = mmap(NULL, 1 * MIB, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (mapped_locked == MAP_FAILED)
        die("mmap MAP_LOCKED");
    printf("map_locked_device=%d\n", registered_device(mapped_locked));
    munmap(mapped_locked, 1 * MIB);
    struct at_return worker;
    pthread_t thread;
    if (pthread_create(&thread, NULL, lock_and_look, &worker) != 0 ||
        pthread_join(thread, NULL) != 0)
        die("pthread");
    printf("worker_device=%d\n", worker.device);
    printf("violations=%llu\n", violations());
    printf("contexts_by_shim=%llu\n", shim_contexts());
    return 0;
}

/* ---- capture-beside-lock ---- */

static pthread_mutex_t capture_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t capture_cond = PTHREAD_COND_INITIALIZER;
static int capture_step;    /* 1: capturing; 2: the locks are done */
static char capture_stream; /* any non-NULL address is a stream to the double */

static void capture_step_to(int step)
{
    pthread_mutex_lock(&capture_mutex);
    capture_step = step;
    pthread_cond_broadcast(&capture_cond);
    pthread_mutex_unlock(&capture_mutex);
}

static void capture_wait_for(int step)
{
    pthread_mutex_lock(&capture_mutex);
    while (capture_step < step)
        pthread_cond_wait(&capture_cond, &capture_mutex);
    pthread_mutex_unlock(&capture_mutex);
}

static void *capturer_main(void *argument)
{
    int *ended = argument;
    if (cuda_set_device(0) != 0)
        die("cudaSetDevice in the capturer");
    int begun = ((int (*)(void *, int))runtime_symbol("cudaStreamBeginCapture"))(
        &capture_stream, FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL);
    printf("capture_begin=%d\n", begun);
    capture_step_to(1);
    capture_wait_for(2);
    void *graph = NULL;
    ended[0] =
        ((int (*)(void *, void **))runtime_symbol("cudaStreamEndCapture"))(&capture_stream, &graph);
    ended[1] = graph != NULL;
    return NULL;
}

static int capture_beside_lock(void)
{
    if (cuda_set_device(0) != 0 || cuda_free(NULL) != 0)
        die("CUDA");
    char *unlocked_during = locked_block(4 * MIB);
    shim_drain();
    int ended[2] = {-1, 0};
    pthread_t capturer;
    if (pthread_create(&capturer, NULL, capturer_main, ended) != 0)
        die("pthread_create");
    capture_wait_for(1);
    char *block = locked_block(8 * MIB);
    struct worker worker = {.set_device = -1};
    run_worker(&worker);
    printf("munlock=%d\n", munlock(unlocked_during, 4 * MIB));
    shim_drain();
    capture_step_to(2);
    if (pthread_join(capturer, NULL) != 0)
        die("pthread_join");
    printf("capture_end=%d\ngraph=%d\n", ended[0], ended[1]);
    printf("block_registered=%d\n", wait_registered(block));
    printf("worker_registered=%d\n", wait_registered(worker.block));
    printf("unlocked_registered=%d\n", registered_device(unlocked_during) >= 0);
    printf("refusals=%llu\n",
           (unsigned long long)DRIVER(fake_cuda_capture_refusals, uint64_t(*)(void))());
    munlock(block, 8 * MIB);
    free(block);
    free(unlocked_during);
    return 0;
}

/* ---- fork-child-after-start ---- */

static int fork_child_after_start(void)
{
    if (cuda_free(NULL) != 0)
        die("cudaFree");
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        /* The double counts afresh in a child (fake_cuda.h). */
        char *block = locked_block(4 * MIB);
        shim_drain();
        unsigned long long calls = 0;
        for (int which = 0; which < FAKE_CU_CALL_KIND_COUNT; which++)
            calls += shim_calls(which);
        printf("child_registered=%d\nchild_shim_calls=%llu\n", registered_device(block) >= 0,
               calls);
        printf("child_munlock=%d\n", munlock(block, 4 * MIB));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    printf("child_status=%d\n",
           waitpid(child, &status, 0) == child && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    char *block = locked_block(4 * MIB);
    printf("registered=%d\n", wait_registered(block));
    munlock(block, 4 * MIB);
    free(block);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *scenario = argc > 1 ? argv[1] : "";
    const char *how = argc > 2 ? argv[2] : "";
    if (strcmp(scenario, "worker-after-set-device") == 0)
        return worker_after_set_device();
    if (strcmp(scenario, "lock-then-init") == 0)
        return lock_then_init(how);
    if (strcmp(scenario, "never-init") == 0)
        return never_init();
    if (strcmp(scenario, "fork-child-inits") == 0)
        return fork_child_inits();
    if (strcmp(scenario, "release-pending") == 0)
        return release_pending();
    if (strcmp(scenario, "release-queued-in-flight") == 0)
        return release_queued_in_flight(how);
    if (strcmp(scenario, "fork-with-pending") == 0)
        return fork_with_pending();
    if (strcmp(scenario, "chunks") == 0)
        return chunks();
    if (strcmp(scenario, "pinned-at-return") == 0)
        return pinned_at_return();
    if (strcmp(scenario, "capture-beside-lock") == 0)
        return capture_beside_lock();
    if (strcmp(scenario, "fork-child-after-start") == 0)
        return fork_child_after_start();
    die("unknown scenario");
}
