/* Scenarios run under LD_PRELOAD=libpinshim.so with the fake CUDA runtime.
 * After each step the program compares what the fake runtime holds with what
 * the shim should have registered, page for page, and prints PASS or a FAIL
 * line. Usage: scenarios NAME. With EXPECT_REGISTRATION=0 (no driver, no
 * device, PINSHIM_REGISTER=0) it expects nothing registered at any point. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdbool.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAKE_CUDART_NO_CUDA_PROTOTYPES
#include "emulation.h"
#include "fake_cudart.h"
#include "pinshim.h"

#define KIB ((size_t)1024)
#define MIB (KIB * KIB)

static size_t page;
static bool expect_registration = true;
static bool check_state = true; /* EXPECT_REGISTRATION=skip: faults make the state unknowable */
static int failures;

struct fake_api {
    size_t (*snapshot)(struct fake_cudart_range *, size_t);
    size_t (*violations)(void);
    uint64_t (*calls)(int);
    int (*host_register)(void *, size_t, unsigned);
    int (*host_unregister)(void *);
    int (*peek_last_error)(void);
    size_t (*live_count)(void);
    void (*set_check)(int);
};
static struct fake_api fake;
static int (*shim_is_registered)(const void *);
static size_t (*shim_counters)(struct pinshim_counters *, size_t);

/* The shim loads the runtime lazily; find the same copy once it is there. */
static bool load_fake(void)
{
    if (fake.snapshot != NULL)
        return true;
    const char *path = getenv("PINSHIM_CUDART");
    void *handle = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (handle == NULL)
        return false;
    fake.snapshot =
        (size_t(*)(struct fake_cudart_range *, size_t))dlsym(handle, "fake_cudart_snapshot");
    fake.violations = (size_t(*)(void))dlsym(handle, "fake_cudart_violation_count");
    fake.calls = (uint64_t(*)(int))dlsym(handle, "fake_cudart_call_count");
    fake.host_register = (int (*)(void *, size_t, unsigned))dlsym(handle, "cudaHostRegister");
    fake.host_unregister = (int (*)(void *))dlsym(handle, "cudaHostUnregister");
    fake.peek_last_error = (int (*)(void))dlsym(handle, "cudaPeekAtLastError");
    fake.live_count = (size_t(*)(void))dlsym(handle, "fake_cudart_live_count");
    fake.set_check = (void (*)(int))dlsym(handle, "fake_cudart_set_check");
    return fake.snapshot != NULL;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL %s:%d: ", __func__, __LINE__);                                                \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        failures++;                                                                                \
    } while (0)

/* expected: pairs of (start, end) byte addresses, page aligned, sorted. */
static void expect_state(const char *step, const uintptr_t *expected, size_t pairs)
{
    if (!check_state)
        return;
    if (!expect_registration)
        pairs = 0;
    struct fake_cudart_range ranges[256];
    size_t count = load_fake() ? fake.snapshot(ranges, 256) : 0;
    bool same = count == pairs;
    for (size_t i = 0; same && i < pairs; i++)
        same = ranges[i].base == expected[2 * i] &&
               ranges[i].base + ranges[i].size == expected[2 * i + 1];
    if (!same) {
        FAIL("%s: runtime holds %zu ranges, expected %zu", step, count, pairs);
        for (size_t i = 0; i < count; i++)
            printf("  have %#lx-%#lx\n", (unsigned long)ranges[i].base,
                   (unsigned long)(ranges[i].base + ranges[i].size));
        for (size_t i = 0; i < pairs; i++)
            printf("  want %#lx-%#lx\n", (unsigned long)expected[2 * i],
                   (unsigned long)expected[2 * i + 1]);
    }
    if (fake.violations && fake.violations() != 0)
        FAIL("%s: the fake runtime recorded %zu violations", step, fake.violations());
    if (expect_registration && fake.peek_last_error && fake.peek_last_error() != 0)
        FAIL("%s: the shim left CUDA error %d for the program", step, fake.peek_last_error());
}

#define EXPECT(step, ...)                                                                          \
    do {                                                                                           \
        uintptr_t expected_[] = {0, __VA_ARGS__};                                                  \
        expect_state(step, expected_ + 1, (sizeof(expected_) / sizeof(*expected_) - 1) / 2);       \
    } while (0)
#define EXPECT_NONE(step) expect_state(step, NULL, 0)

#define U(p) ((uintptr_t)(p))

static void *aligned_buffer(size_t size)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0) {
        FAIL("posix_memalign(%zu) failed", size);
        exit(1);
    }
    return p;
}

static void check_zero(int result, const char *what)
{
    if (result != 0)
        FAIL("%s returned %d, errno %d", what, result, errno);
}

static void scenario_basic(void)
{
    size_t size = MIB + 100;
    char *p = aligned_buffer(size);
    if (U(p) % page != 0)
        FAIL("posix_memalign of %zu bytes is not page aligned: %p", size, (void *)p);
    check_zero(mlock(p, size), "mlock");
    size_t rounded = (size + page - 1) / page * page;
    EXPECT("after mlock", U(p), U(p) + rounded);
    if (shim_is_registered && expect_registration &&
        (!shim_is_registered(p) || !shim_is_registered(p + size - 1) || shim_is_registered(p - 1)))
        FAIL("pinshim_is_registered disagrees");
    memset(p, 0xab, size);
    check_zero(munlock(p, size), "munlock");
    EXPECT_NONE("after munlock");
    free(p);
    EXPECT_NONE("after free");
    if (shim_counters && expect_registration) {
        struct pinshim_counters c;
        shim_counters(&c, sizeof(c));
        if (c.register_ok != 1 || c.unregister_ok != 1 || c.unregister_munlock != 1 ||
            c.live_ranges != 0)
            FAIL("counters: register_ok %lu unregister_ok %lu munlock %lu live %lu",
                 (unsigned long)c.register_ok, (unsigned long)c.unregister_ok,
                 (unsigned long)c.unregister_munlock, (unsigned long)c.live_ranges);
    }
}

static void scenario_small(void)
{
    char *p = aligned_buffer(4 * KIB);
    check_zero(mlock(p, 4 * KIB), "mlock");
    EXPECT_NONE("small lock");
    check_zero(munlock(p, 4 * KIB), "munlock");
    free(p);
    char *q = aligned_buffer(32 * KIB);
    if (U(q) % 64 != 0)
        FAIL("alignment lost");
    free(q);
}

static void scenario_free_locked(void)
{
    char *p = aligned_buffer(2 * MIB);
    check_zero(mlock(p, 2 * MIB), "mlock");
    EXPECT("locked", U(p), U(p) + 2 * MIB);
    free(p); /* never unlocked */
    EXPECT_NONE("after free");
}

static void scenario_exit_live(void)
{
    char *a = aligned_buffer(MIB), *b = aligned_buffer(3 * MIB);
    check_zero(mlock(a, MIB), "mlock a");
    check_zero(mlock(b, 3 * MIB), "mlock b");
    /* Exit with both registered: the stats must say so. */
}

/* memtester: malloc, lock a page-aligned part inside, free the original pointer. */
static void scenario_memtester(void)
{
    size_t size = 8 * MIB + 123;
    char *p = malloc(size);
    uintptr_t aligned = (U(p) + page - 1) & ~(page - 1);
    size_t length = (size - (aligned - U(p))) & ~(page - 1);
    check_zero(mlock((void *)aligned, length), "mlock inside");
    EXPECT("locked inside", aligned, aligned + length);
    free(p);
    EXPECT_NONE("after free of the original pointer");
}

static void scenario_partial_munlock(void)
{
    size_t size = 64 * page;
    char *p = aligned_buffer(size);
    check_zero(mlock(p, size), "mlock");
    check_zero(munlock(p + 16 * page + 5, 16 * page - 10), "munlock middle");
    EXPECT("middle unlocked", U(p), U(p) + 16 * page, U(p) + 32 * page, U(p) + size);
    check_zero(munlock(p, size), "munlock all");
    EXPECT_NONE("all unlocked");
    free(p);
}

static void scenario_overlapping_locks(void)
{
    size_t size = 64 * page;
    char *p = aligned_buffer(size);
    check_zero(mlock(p, 32 * page), "mlock first half");
    check_zero(mlock(p + 16 * page, 48 * page), "mlock overlapping");
    check_zero(mlock(p + 8 * page, 16 * page), "mlock inside (already locked)");
    /* One run of locked pages: one registration (a copy across two fails). */
    EXPECT("one registration", U(p), U(p) + size);
    check_zero(munlock(p + 16 * page, 24 * page), "munlock across both");
    EXPECT("ends stay", U(p), U(p) + 16 * page, U(p) + 40 * page, U(p) + size);
    free(p);
    EXPECT_NONE("after free");
}

static void scenario_mmap_locked(void)
{
    size_t size = 4 * MIB;
    char *p =
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (p == MAP_FAILED) {
        FAIL("mmap MAP_LOCKED: %s", strerror(errno));
        return;
    }
    EXPECT("mapped locked", U(p), U(p) + size);
    check_zero(munmap(p, size / 2), "munmap first half");
    EXPECT("second half", U(p) + size / 2, U(p) + size);
    check_zero(munmap(p + size / 2, size / 2), "munmap rest");
    EXPECT_NONE("unmapped");
}

static void scenario_mmap_fixed(void)
{
    size_t size = MIB;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check_zero(mlock(p, size), "mlock");
    char *q = mmap(p + 384 * KIB, 256 * KIB, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (q != p + 384 * KIB)
        FAIL("mmap MAP_FIXED moved");
    EXPECT("hole punched", U(p), U(p) + 384 * KIB, U(p) + 640 * KIB, U(p) + size);
    check_zero(munmap(p, size), "munmap");
    EXPECT_NONE("unmapped");
}

static void scenario_mremap(void)
{
    size_t size = MIB;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check_zero(mlock(p, size), "mlock");
    char *q = mremap(p, size, 4 * size, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) {
        FAIL("mremap grow: %s", strerror(errno));
        return;
    }
    EXPECT("grown, still locked", U(q), U(q) + 4 * size);
    char *r = mremap(q, 4 * size, size / 2, 0);
    if (r != q)
        FAIL("mremap shrink moved");
    EXPECT("shrunk", U(q), U(q) + size / 2);
    check_zero(munmap(q, size / 2), "munmap");
    EXPECT_NONE("unmapped");
}

/* A failed reallocarray leaves the block valid; GCC's use-after-free warning
 * cannot know that it failed. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* MREMAP_DONTUNMAP of part of a locked mapping: Linux clears the lock of the
 * whole old mapping, so only the moved pages stay registered (found by the
 * model-based test). */
static void scenario_mremap_dontunmap(void)
{
    size_t size = 145 * page, moved = 33 * page;
    char *p =
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (p == MAP_FAILED) {
        FAIL("mmap: %s", strerror(errno));
        return;
    }
    EXPECT("locked mapping", U(p), U(p) + size);
    char *q = mremap(p, moved, moved, MREMAP_MAYMOVE | MREMAP_DONTUNMAP);
    if (q == MAP_FAILED) {
        printf("SKIP mremap(MREMAP_DONTUNMAP): %s\n", strerror(errno));
        munmap(p, size);
        return;
    }
    EXPECT("only the moved pages", U(q), U(q) + moved);
    check_zero(munmap(q, moved), "munmap moved");
    check_zero(munmap(p, size), "munmap old");
    EXPECT_NONE("unmapped");
}

static void scenario_realloc(void)
{
    char *p = aligned_buffer(MIB);
    check_zero(mlock(p, MIB), "mlock");
    char *q = realloc(p, 8 * MIB);
    if (q == NULL)
        FAIL("realloc failed");
    EXPECT_NONE("after realloc");
    int *array = reallocarray(NULL, 1 << 20, sizeof(int));
    check_zero(mlock(array, (1 << 20) * sizeof(int)), "mlock array");
    errno = 0;
    volatile size_t huge = SIZE_MAX / 2; /* hidden from the compiler's size check */
    int *same = reallocarray(array, huge, 4);
    if (same != NULL || errno != ENOMEM)
        FAIL("reallocarray overflow: errno %d", errno);
    if (expect_registration && fake.live_count && fake.live_count() != 1)
        FAIL("a failed reallocarray dropped the registration");
    int *grown = reallocarray(array, 1 << 21, sizeof(int));
    if (grown == NULL)
        FAIL("reallocarray grow failed");
    array = grown;
    EXPECT_NONE("after reallocarray");
    free(array);
    free(q);
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

static void scenario_munlockall(void)
{
    char *a = aligned_buffer(MIB), *b = aligned_buffer(MIB);
    check_zero(mlock(a, MIB), "mlock a");
    check_zero(mlock(b, MIB), "mlock b");
    check_zero(munlockall(), "munlockall");
    EXPECT_NONE("after munlockall");
    free(a);
    free(b);
}

static void scenario_mlock2_and_mlockall(void)
{
    char *p = aligned_buffer(MIB);
    if (test_kernel_has_mlock2()) {
        check_zero(mlock2(p, MIB, MLOCK_ONFAULT), "mlock2");
        EXPECT("mlock2", U(p), U(p) + MIB);
        check_zero(munlock(p, MIB), "munlock");
    } else {
        /* The call fails under the shim as without it, registering nothing;
         * mlock stands in for the rest. */
        printf("NOTE the kernel has no mlock2 system call (ENOSYS): MLOCK_ONFAULT not tested\n");
        errno = 0;
        if (mlock2(p, MIB, MLOCK_ONFAULT) != -1 || errno != EINVAL)
            FAIL("mlock2 without the system call: errno %d, expected EINVAL", errno);
        EXPECT_NONE("mlock2 that failed");
        check_zero(mlock(p, MIB), "mlock");
        EXPECT("mlock", U(p), U(p) + MIB);
        check_zero(munlock(p, MIB), "munlock");
    }
    check_zero(mlockall(MCL_CURRENT), "mlockall");
    EXPECT_NONE("mlockall registers nothing");
    check_zero(munlockall(), "munlockall");
    free(p);
    if (shim_counters) {
        struct pinshim_counters c;
        shim_counters(&c, sizeof(c));
        if (c.mlockall_calls != 1)
            FAIL("mlockall_calls %lu", (unsigned long)c.mlockall_calls);
    }
}

/* mlockall(MCL_CURRENT | MCL_FUTURE) first: the kernel locks every later
 * mapping at once; an explicit mlock still registers, and free releases. */
static void scenario_future_locked(void)
{
    if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
        printf("NOTE mlockall failed: %s\n", strerror(errno));
        return;
    }
    char *p = aligned_buffer(MIB);
    check_zero(mlock(p, MIB), "mlock");
    EXPECT("mlock under MCL_FUTURE", U(p), U(p) + MIB);
    free(p);
    EXPECT_NONE("after free");
    check_zero(munlockall(), "munlockall");
}

static void scenario_errno(void)
{
    errno = 0;
    if (mlock((void *)page, page) == 0 || errno != ENOMEM)
        FAIL("mlock of unmapped memory: errno %d, expected ENOMEM", errno);
    char *p = aligned_buffer(MIB);
    check_zero(mlock(p, MIB), "mlock");
    errno = 1234;
    check_zero(munlock(p, MIB), "munlock");
    if (errno != 1234)
        FAIL("a successful munlock changed errno to %d", errno);
    errno = 4321;
    free(p);
    if (errno != 4321)
        FAIL("free changed errno to %d", errno);
    void *q = (void *)1;
    if (posix_memalign(&q, 3, MIB) != EINVAL || q != (void *)1)
        FAIL("posix_memalign with a bad alignment");
    if (munmap((char *)aligned_buffer(MIB) + 1, page) == 0 || errno != EINVAL)
        FAIL("munmap unaligned: errno %d", errno);
    errno = 0;
    if (munlock((void *)page, 64 * page) == 0 || errno != ENOMEM)
        FAIL("munlock of unmapped memory: errno %d", errno);
}

/* munlock over a hole: Linux unlocks up to the hole and fails with ENOMEM; what
 * stays locked must stay registered. */
static void scenario_munlock_hole(void)
{
    size_t size = 64 * page;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check_zero(mlock(p, 16 * page), "mlock head");
    check_zero(mlock(p + 32 * page, 32 * page), "mlock tail");
    check_zero(munmap(p + 20 * page, 4 * page), "punch a hole");
    EXPECT("two locks", U(p), U(p) + 16 * page, U(p) + 32 * page, U(p) + size);
    errno = 0;
    if (munlock(p, size) == 0 || errno != ENOMEM)
        FAIL("munlock over a hole: errno %d", errno);
    EXPECT("tail stays", U(p) + 32 * page, U(p) + size);
    munmap(p, size);
    EXPECT_NONE("unmapped");
}

static void scenario_already_registered(void)
{
    char *p = aligned_buffer(MIB);
    char *q = aligned_buffer(MIB);
    check_zero(mlock(q, MIB), "mlock other"); /* loads the runtime */
    if (!load_fake()) {
        if (expect_registration)
            FAIL("fake runtime not loaded");
        return;
    }
    /* The double checks that registered memory is locked; the program's own
     * registration of unlocked memory is legal CUDA, so that check is off for it. */
    fake.set_check(0);
    check_zero(fake.host_register(p, MIB, 0), "program's own cudaHostRegister");
    fake.set_check(1);
    check_zero(mlock(p, MIB), "mlock");
    EXPECT("both", U(p) < U(q) ? U(p) : U(q), (U(p) < U(q) ? U(p) : U(q)) + MIB,
           U(p) < U(q) ? U(q) : U(p), (U(p) < U(q) ? U(q) : U(p)) + MIB);
    check_zero(munlock(p, MIB), "munlock");
    /* The program's registration is not the shim's to drop. */
    struct fake_cudart_range ranges[4];
    size_t count = fake.snapshot(ranges, 4);
    bool kept = false;
    for (size_t i = 0; i < count; i++)
        kept |= ranges[i].base == U(p);
    if (!kept)
        FAIL("the shim unregistered the program's own registration");
    fake.set_check(0);
    check_zero(fake.host_unregister(p), "program's own cudaHostUnregister");
    fake.set_check(1);
    free(p);
    munlock(q, MIB);
    free(q);
    EXPECT_NONE("end");
}

static void scenario_fork(void)
{
    char *p = aligned_buffer(MIB);
    check_zero(mlock(p, MIB), "mlock in parent");
    EXPECT("parent locked", U(p), U(p) + MIB);
    uint64_t unregisters = load_fake() ? fake.calls(FAKE_CALL_UNREGISTER) : 0;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        if (shim_is_registered && shim_is_registered(p))
            FAIL("the child inherited the parent's registry");
        char *c = aligned_buffer(MIB);
        check_zero(mlock(c, MIB), "mlock in child");
        munlock(c, MIB);
        free(c);
        munlock(p, MIB);
        free(p);
        if (fake.calls && fake.calls(FAKE_CALL_UNREGISTER) != unregisters)
            FAIL("the child unregistered memory");
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("child failed with status %d", status);
    EXPECT("parent unchanged", U(p), U(p) + MIB);
    check_zero(munlock(p, MIB), "munlock in parent");
    free(p);
    EXPECT_NONE("end");
}

static void *thread_cycles(void *argument)
{
    unsigned seed = (unsigned)(uintptr_t)argument;
    for (int i = 0; i < 200; i++) {
        size_t size = (64 + (size_t)(rand_r(&seed) % 1024)) * KIB;
        char *p = aligned_buffer(size);
        if (mlock(p, size) != 0)
            FAIL("mlock in thread");
        p[0] = 1;
        if (rand_r(&seed) % 2)
            munlock(p, size);
        free(p);
        void *small = malloc((size_t)(rand_r(&seed) % 4096) + 1);
        free(small);
    }
    return NULL;
}

static void scenario_threads(void)
{
    pthread_t threads[8];
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&threads[i], NULL, thread_cycles, (void *)(i + 1));
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    EXPECT_NONE("after threads");
}

/* The process's threads now (Threads: in /proc/self/status), or -1. */
static int thread_count(void)
{
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    int threads = -1;
    while (status != NULL && fgets(line, sizeof(line), status) != NULL)
        if (sscanf(line, "Threads: %d", &threads) == 1)
            break;
    if (status != NULL)
        fclose(status);
    return threads;
}

/* Issue 37: a single-threaded program stays single-threaded for glibc
 * through its first registering lock (the shim's checks of glibc's chunk
 * headers run there; a thread of theirs would switch malloc and free to
 * their locking paths for good), and no thread is left behind. */
static void scenario_single_threaded(void)
{
    const volatile char *flag = dlsym(RTLD_DEFAULT, "__libc_single_threaded");
    if (flag == NULL)
        printf("NOTE glibc before 2.32 has no __libc_single_threaded: the thread count alone\n");
    if (flag != NULL && *flag == 0)
        FAIL("glibc counts the process as threaded before anything was locked");
    /* Counted, not taken as one: qemu-user runs a thread of its own. */
    int threads_before = thread_count();
    size_t size = 64 * KIB;
    char *p = aligned_buffer(size);
    check_zero(mlock(p, size), "mlock");
    EXPECT("after mlock", U(p), U(p) + size);
    if (flag != NULL && *flag == 0)
        FAIL("the first lock made glibc count the process as threaded");
    if (thread_count() != threads_before)
        FAIL("%d threads after the first lock, %d before", thread_count(), threads_before);
    void *small = malloc(100);
    free(small);
    check_zero(munlock(p, size), "munlock");
    free(p);
    EXPECT_NONE("after free");
    if (flag != NULL && *flag == 0)
        FAIL("glibc counts the process as threaded after the unlock");
}

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"basic", scenario_basic},
    {"small", scenario_small},
    {"free_locked", scenario_free_locked},
    {"exit_live", scenario_exit_live},
    {"memtester", scenario_memtester},
    {"partial_munlock", scenario_partial_munlock},
    {"overlapping_locks", scenario_overlapping_locks},
    {"mmap_locked", scenario_mmap_locked},
    {"mmap_fixed", scenario_mmap_fixed},
    {"mremap", scenario_mremap},
    {"mremap_dontunmap", scenario_mremap_dontunmap},
    {"realloc", scenario_realloc},
    {"munlockall", scenario_munlockall},
    {"mlock2_and_mlockall", scenario_mlock2_and_mlockall},
    {"future_locked", scenario_future_locked},
    {"errno", scenario_errno},
    {"munlock_hole", scenario_munlock_hole},
    {"already_registered", scenario_already_registered},
    {"fork", scenario_fork},
    {"threads", scenario_threads},
    {"single_threaded", scenario_single_threaded},
};

/* SCENARIOS_USE_CUDA=1: the program is a GPU program, as the shim's default
 * (PINSHIM_CONTEXT=program) expects: it loads the runtime (PINSHIM_CUDART)
 * and initialises CUDA before it locks anything, so that the shim registers
 * into the context it made. A failure (no driver, no device) is the
 * program's own business: it goes on without CUDA. */
static void use_cuda_first(void)
{
    void *runtime = dlopen(getenv("PINSHIM_CUDART"), RTLD_NOW | RTLD_GLOBAL);
    int (*cuda_free)(void *) = runtime ? (int (*)(void *))dlsym(runtime, "cudaFree") : NULL;
    int error = cuda_free != NULL ? cuda_free(NULL) : -1;
    printf("NOTE the program's CUDA initialisation returned %d\n", error);
}

int main(int argc, char **argv)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    const char *expect = getenv("EXPECT_REGISTRATION");
    expect_registration = expect == NULL || strcmp(expect, "1") == 0;
    check_state = expect == NULL || strcmp(expect, "skip") != 0;
    shim_is_registered = (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    shim_counters =
        (size_t(*)(struct pinshim_counters *, size_t))dlsym(RTLD_DEFAULT, "pinshim_get_counters");
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++)
            printf("%s\n", scenarios[i].name);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: scenarios NAME | --list\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++) {
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            if (shim_is_registered == NULL && getenv("REQUIRE_SHIM") != NULL) {
                printf("FAIL libpinshim.so is not preloaded\n");
                return 1;
            }
            if (getenv("SCENARIOS_USE_CUDA") != NULL && getenv("SCENARIOS_USE_CUDA")[0] == '1')
                use_cuda_first();
            scenarios[i].run();
            printf("%s %s\n", failures ? "FAIL" : "PASS", argv[1]);
            return failures ? 1 : 0;
        }
    }
    fprintf(stderr, "unknown scenario %s\n", argv[1]);
    return 2;
}
