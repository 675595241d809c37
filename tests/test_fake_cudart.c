/* Tests of the fake CUDA driver and runtime themselves: if the double is
 * wrong, every shim test built on it proves nothing. Criterion runs each test
 * in its own process, so tests may change the environment and the double's
 * state. This program links both the runtime and the driver (libcuda.so.1). */
#include "fake_cuda.h"
#include "fake_cudart.h"

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const config_variables[] = {
    "FAKE_CUDART_NO_DRIVER",
    "FAKE_CUDART_DEVICES",
    "FAKE_CUDART_FAIL_REGISTER_EVERY",
    "FAKE_CUDART_FAIL_UNREGISTER_EVERY",
    "FAKE_CUDART_FAIL_ERROR",
    "FAKE_CUDART_UNLOAD_AT_EXIT",
    "FAKE_CUDART_CHECK",
    "FAKE_CUDART_LOG",
    "FAKE_CUDA_DEVICES",
    "FAKE_CUDA_MAX_REGISTER_BYTES",
    "FAKE_CUDA_REGISTER_SECONDS_PER_GIB",
    "FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB",
    "FAKE_CUDA_UNLOAD_AT_EXIT",
    "FAKE_CUDA_DRIVER_VERSION",
    "FAKE_CUDA_LOG",
    "FAKE_CUDA_DRIVER",
};

/* Starts from a known configuration; checks off unless a test turns them on,
 * so rule tests can use addresses that are not mapped at all. */
static void fresh_state(const char *extra_name, const char *extra_value)
{
    for (size_t i = 0; i < sizeof config_variables / sizeof config_variables[0]; i++)
        unsetenv(config_variables[i]);
    setenv("FAKE_CUDART_CHECK", "0", 1);
    if (extra_name)
        setenv(extra_name, extra_value, 1);
    fake_cudart_reset();
    fake_cuda_reset(); /* linked here: loaded even before the runtime loads it */
}

static void *fake_address(uintptr_t offset)
{
    return (void *)(uintptr_t)(0x10000000u + offset);
}

static char *map_pages(size_t pages)
{
    void *memory = mmap(NULL, pages * (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(memory != MAP_FAILED, "mmap: %s", strerror(errno));
    return memory;
}

/* Raw system calls: sanitizer runtimes replace mlock/munlock with no-ops. */
static int lock_pages(void *memory, size_t bytes)
{
    return (int)syscall(SYS_mlock, memory, bytes);
}

static int unlock_pages(void *memory, size_t bytes)
{
    return (int)syscall(SYS_munlock, memory, bytes);
}

static void lock_or_skip(void *memory, size_t bytes)
{
    if (lock_pages(memory, bytes) != 0) {
        if (errno == EPERM || errno == ENOMEM)
            cr_skip_test("mlock not permitted here (%s)", strerror(errno));
        cr_assert_fail("mlock: %s", strerror(errno));
    }
}

Test(fake_cudart, register_and_unregister)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(fake_cudart_live_count(), 1);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 0);
    cr_assert_eq(fake_cudart_live_count(), 0);
    cr_assert_eq(fake_cudart_call_count(FAKE_CALL_REGISTER), 1);
    cr_assert_eq(fake_cudart_call_count(FAKE_CALL_UNREGISTER), 1);
    cr_assert_eq(cudaGetLastError(), 0);
}

/* The example from NVIDIA's documentation of cudaErrorHostMemoryAlreadyRegistered. */
Test(fake_cudart, overlapping_register_is_712)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 160, 0), 0);
    cr_assert_eq(cudaHostRegister(fake_address(80), 160, 0), 712);
    cr_assert_eq(cudaHostRegister(fake_address(0), 16, 0), 712);
    cr_assert_eq(cudaHostRegister(fake_address(0) - 16, 17, 0), 712, "ends inside");
    cr_assert_eq(cudaHostRegister(fake_address(0) - 16, 1000, 0), 712, "covers it");
    cr_assert_eq(fake_cudart_live_count(), 1);
    /* Touching ranges do not overlap. */
    cr_assert_eq(cudaHostRegister(fake_address(160), 80, 0), 0);
    cr_assert_eq(cudaHostRegister(fake_address(0) - 16, 16, 0), 0);
    cr_assert_eq(fake_cudart_live_count(), 3);
    cr_assert_eq(cudaGetLastError(), 712);
}

Test(fake_cudart, invalid_register_arguments)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(NULL, 4096, 0), 1);
    cr_assert_eq(cudaHostRegister(fake_address(0), 0, 0), 1);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0x10), 1);
    cr_assert_eq(cudaHostRegister(fake_address(0), SIZE_MAX, 0), 1, "wraps around");
    cr_assert_eq(fake_cudart_live_count(), 0);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0x0F), 0);
    struct fake_cudart_range range;
    cr_assert_eq(fake_cudart_snapshot(&range, 1), 1);
    cr_assert_eq(range.flags, 0x0Fu);
}

Test(fake_cudart, unregister_interior_is_1_and_unknown_is_713)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(cudaHostUnregister(fake_address(8)), 1);
    cr_assert_eq(cudaHostUnregister(fake_address(4095)), 1);
    cr_assert_eq(cudaHostUnregister(fake_address(4096)), 713);
    cr_assert_eq(cudaHostUnregister(fake_address(0) - 1), 713);
    cr_assert_eq(cudaHostUnregister(NULL), 713);
    cr_assert_eq(fake_cudart_live_count(), 1);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 0);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 713, "twice");
}

Test(fake_cudart, last_error_kept_until_read)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 713);
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 0, "success does not clear");
    cr_assert_eq(cudaPeekAtLastError(), 713);
    cr_assert_eq(cudaPeekAtLastError(), 713, "peek does not clear");
    cr_assert_eq(cudaGetLastError(), 713);
    cr_assert_eq(cudaGetLastError(), 0, "read clears");
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 712);
    cr_assert_eq(cudaHostRegister(NULL, 64, 0), 1);
    cr_assert_eq(cudaGetLastError(), 1, "the latest failure wins");
}

static void *fail_in_thread(void *unused)
{
    (void)unused;
    int seen_before = cudaPeekAtLastError();
    int failed = cudaHostUnregister(fake_address(1 << 20));
    int seen_after = cudaGetLastError();
    return (void *)(intptr_t)(seen_before == 0 && failed == 713 && seen_after == 713);
}

Test(fake_cudart, last_error_is_per_thread)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(NULL, 1, 0), 1);
    pthread_t thread;
    void *thread_ok;
    cr_assert_eq(pthread_create(&thread, NULL, fail_in_thread, NULL), 0);
    cr_assert_eq(pthread_join(thread, &thread_ok), 0);
    cr_assert(thread_ok, "the other thread saw a clean error, then its own");
    cr_assert_eq(cudaGetLastError(), 1, "not overwritten by the other thread");
}

Test(fake_cudart, fail_every_n_from_environment)
{
    fresh_state("FAKE_CUDART_FAIL_REGISTER_EVERY", "3");
    setenv("FAKE_CUDART_FAIL_UNREGISTER_EVERY", "2", 1);
    setenv("FAKE_CUDART_FAIL_ERROR", "801", 1);
    fake_cudart_reset();
    int expected[] = {0, 0, 801, 0, 0, 801};
    for (int call = 0; call < 6; call++)
        cr_assert_eq(cudaHostRegister(fake_address((uintptr_t)call * 4096), 4096, 0),
                     expected[call], "register call %d", call + 1);
    cr_assert_eq(fake_cudart_live_count(), 4, "injected failures change nothing");
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 0);
    cr_assert_eq(cudaHostUnregister(fake_address(4096)), 801);
    cr_assert_eq(fake_cudart_live_count(), 3);
    cr_assert_eq(cudaGetLastError(), 801);
}

Test(fake_cudart, fail_every_n_from_api)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 0);
    fake_cudart_set_fail_every(2, 1, 0);
    cr_assert_eq(cudaHostRegister(fake_address(4096), 64, 0), 0);
    cr_assert_eq(cudaHostRegister(fake_address(8192), 64, 0), 2, "default error");
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 2);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 2);
    fake_cudart_set_fail_every(0, 0, 0);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 0);
    cr_assert_eq(fake_cudart_live_count(), 1);
}

Test(fake_cudart, no_driver)
{
    fresh_state("FAKE_CUDART_NO_DRIVER", "1");
    int count = -7, attribute = -7;
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 35);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 35);
    cr_assert_eq(cudaGetDeviceCount(&count), 35);
    cr_assert_eq(count, -7, "count left unwritten");
    cr_assert_eq(cudaPointerGetAttributes(&attribute, fake_address(0)), 35);
    cr_assert_eq(cudaPeekAtLastError(), 35);
    cr_assert_eq(cudaGetLastError(), 35);
    cr_assert_str_eq(cudaGetErrorName(35), "cudaErrorInsufficientDriver");
    cr_assert_eq(fake_cudart_live_count(), 0);
}

Test(fake_cudart, device_count)
{
    int count = -1;
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaGetDeviceCount(&count), 0);
    cr_assert_eq(count, 1, "one device by default");
    cr_assert_eq(cudaGetDeviceCount(NULL), 1);

    fresh_state("FAKE_CUDART_DEVICES", "4");
    cr_assert_eq(cudaGetDeviceCount(&count), 0);
    cr_assert_eq(count, 4);

    fresh_state("FAKE_CUDART_DEVICES", "0");
    cr_assert_eq(cudaGetDeviceCount(&count), 100);
    cr_assert_eq(count, 0);
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 100);
    cr_assert_eq(cudaGetLastError(), 100);
}

Test(fake_cudart, unloading_after_destructor)
{
    fresh_state(NULL, NULL);
    fake_cudart_simulate_exit();
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 0, "not configured: no effect");

    fresh_state("FAKE_CUDART_UNLOAD_AT_EXIT", "1");
    cr_assert_eq(cudaHostRegister(fake_address(0), 64, 0), 0);
    fake_cudart_simulate_exit();
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 4);
    cr_assert_eq(cudaHostRegister(fake_address(4096), 64, 0), 4);
    cr_assert_eq(cudaGetLastError(), 4);
    cr_assert_eq(fake_cudart_live_count(), 1);
}

Test(fake_cudart, pointer_attributes)
{
    fresh_state(NULL, NULL);
    int attributes[8];
    memset(attributes, 0x55, sizeof attributes);
    cr_assert_eq(cudaHostRegister(fake_address(0), 100, 0), 0);
    cr_assert_eq(cudaPointerGetAttributes(attributes, fake_address(99)), 0);
    cr_assert_eq(attributes[0], 1);
    cr_assert_eq(attributes[1], 0x55555555, "only the type is written");
    cr_assert_eq(cudaPointerGetAttributes(attributes, fake_address(100)), 0);
    cr_assert_eq(attributes[0], 0);
    cr_assert_eq(cudaPointerGetAttributes(NULL, fake_address(0)), 1);
}

Test(fake_cudart, error_names_and_strings)
{
    static const struct {
        int code;
        const char *name;
    } names[] = {
        {0, "cudaSuccess"},
        {1, "cudaErrorInvalidValue"},
        {2, "cudaErrorMemoryAllocation"},
        {3, "cudaErrorInitializationError"},
        {4, "cudaErrorCudartUnloading"},
        {34, "cudaErrorStubLibrary"},
        {35, "cudaErrorInsufficientDriver"},
        {100, "cudaErrorNoDevice"},
        {712, "cudaErrorHostMemoryAlreadyRegistered"},
        {713, "cudaErrorHostMemoryNotRegistered"},
        {800, "cudaErrorNotPermitted"},
        {801, "cudaErrorNotSupported"},
        {999, "cudaErrorUnknown"},
        {-1, "cudaErrorUnknown"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cr_assert_str_eq(cudaGetErrorName(names[i].code), names[i].name);
        cr_assert_not_null(cudaGetErrorString(names[i].code));
    }
    cr_assert_str_eq(cudaGetErrorString(0), "no error");
}

Test(fake_cudart, unlocked_register_is_a_violation)
{
    fresh_state("FAKE_CUDART_CHECK", "1");
    char *memory = map_pages(2);
    cr_assert_eq(cudaHostRegister(memory, 100, 0), 0, "violations do not change results");
    cr_assert_eq(fake_cudart_violation_count_of(FAKE_VIOLATION_REGISTER_NOT_LOCKED), 1);
    cr_assert_eq(fake_cudart_violation_count(), 1);

    long page = sysconf(_SC_PAGESIZE);
    munmap(memory + page, (size_t)page);
    cr_assert_eq(cudaHostRegister(memory + page, 100, 0), 0);
    cr_assert_eq(fake_cudart_violation_count_of(FAKE_VIOLATION_REGISTER_UNMAPPED), 1);
}

Test(fake_cudart, locked_register_and_unregister_are_clean)
{
    fresh_state("FAKE_CUDART_CHECK", "1");
    long page = sysconf(_SC_PAGESIZE);
    char *memory = map_pages(3);
    lock_or_skip(memory, 3 * (size_t)page);
    cr_assert_eq(cudaHostRegister(memory + 10, 2 * (size_t)page, 0), 0, "spans three pages");
    cr_assert_eq(cudaHostUnregister(memory + 10), 0);
    cr_assert_eq(fake_cudart_violation_count(), 0);
}

Test(fake_cudart, unregister_after_munlock_or_munmap_is_a_violation)
{
    fresh_state("FAKE_CUDART_CHECK", "1");
    long page = sysconf(_SC_PAGESIZE);
    char *memory = map_pages(2);
    lock_or_skip(memory, 2 * (size_t)page);
    cr_assert_eq(cudaHostRegister(memory, (size_t)page, 0), 0);
    cr_assert_eq(cudaHostRegister(memory + page, (size_t)page, 0), 0);
    cr_assert_eq(fake_cudart_violation_count(), 0);

    cr_assert_eq(unlock_pages(memory, (size_t)page), 0);
    cr_assert_eq(cudaHostUnregister(memory), 0);
    cr_assert_eq(fake_cudart_violation_count_of(FAKE_VIOLATION_UNREGISTER_NOT_LOCKED), 1);

    munmap(memory + page, (size_t)page);
    cr_assert_eq(cudaHostUnregister(memory + page), 0);
    cr_assert_eq(fake_cudart_violation_count_of(FAKE_VIOLATION_UNREGISTER_UNMAPPED), 1);
    cr_assert_eq(fake_cudart_violation_count(), 2);
}

Test(fake_cudart, two_registrations_on_one_page_is_a_violation)
{
    fresh_state("FAKE_CUDART_CHECK", "1");
    long page = sysconf(_SC_PAGESIZE);
    char *memory = map_pages(3);
    lock_or_skip(memory, 3 * (size_t)page);
    cr_assert_eq(cudaHostRegister(memory + page, 100, 0), 0);
    cr_assert_eq(cudaHostRegister(memory + 2 * page + 200, 100, 0), 0, "next page: fine");
    cr_assert_eq(fake_cudart_violation_count(), 0);
    cr_assert_eq(cudaHostRegister(memory + page + 200, 100, 0), 0, "starts in a used page");
    cr_assert_eq(cudaHostRegister(memory + 2 * page, 100, 0), 0, "ends in a used page");
    cr_assert_eq(fake_cudart_violation_count_of(FAKE_VIOLATION_PAGE_SHARED), 2);
}

Test(fake_cudart, checks_can_be_turned_off)
{
    fresh_state("FAKE_CUDART_CHECK", "1");
    fake_cudart_set_check(0);
    char *memory = map_pages(1);
    cr_assert_eq(cudaHostRegister(memory, 100, 0), 0);
    cr_assert_eq(cudaHostRegister(memory + 200, 100, 0), 0);
    cr_assert_eq(fake_cudart_violation_count(), 0);
}

static char *read_whole_file(const char *path)
{
    FILE *file = fopen(path, "r");
    cr_assert_not_null(file, "open %s", path);
    static char text[8192];
    size_t length = fread(text, 1, sizeof text - 1, file);
    text[length] = '\0';
    fclose(file);
    return text;
}

Test(fake_cudart, log_lines)
{
    char path[] = "/tmp/fake_cudart_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    fresh_state("FAKE_CUDART_LOG", path);
    setenv("FAKE_CUDART_CHECK", "1", 1);
    fake_cudart_reset();

    char *memory = map_pages(1);
    cr_assert_eq(cudaHostRegister(memory, 4096, 2), 0);
    cr_assert_eq(cudaHostRegister(memory, 4096, 0), 712);
    cr_assert_eq(cudaHostUnregister(memory + 1), 1);
    cr_assert_eq(cudaGetLastError(), 1);
    fake_cudart_set_check(0);
    cr_assert_eq(cudaHostUnregister(memory), 0);

    /* A violation is found before the registration is recorded, so its line
     * comes first. The driver writes register/unregister lines with the flags
     * it got: cudaHostRegisterDefault (0) became PORTABLE|DEVICEMAP (3). */
    char expected[1024];
    int pid = (int)getpid();
    uintmax_t base = (uintptr_t)memory;
    snprintf(expected, sizeof expected,
             "violation %d register_not_locked 0x%jx 4096\n"
             "register %d 0x%jx 4096 2 0\n"
             "register %d 0x%jx 4096 3 712\n"
             "unregister %d 0x%jx 1\n"
             "getlasterror %d 1\n"
             "unregister %d 0x%jx 0\n",
             pid, base, pid, base, pid, base, pid, base + 1, pid, pid, base);
    cr_assert_str_eq(read_whole_file(path), expected);
    unlink(path);
}

Test(fake_cudart, log_is_append_only)
{
    char path[] = "/tmp/fake_cudart_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "earlier\n", 8), 8);
    close(fd);
    fresh_state("FAKE_CUDART_LOG", path);
    cr_assert_eq(cudaHostRegister(NULL, 1, 0), 1);
    char expected[128];
    snprintf(expected, sizeof expected, "earlier\nregister %d 0x0 1 3 1\n", (int)getpid());
    cr_assert_str_eq(read_whole_file(path), expected);
    unlink(path);
}

/* Descending bases are what mmap hands out; a million of them must be quick.
 * Loops assert once at the end: Criterion reports every assertion it makes. */
Test(fake_cudart, a_million_registrations, .timeout = 30)
{
    fresh_state(NULL, NULL);
    const size_t count = 1000000;
    size_t failures = 0;
    for (size_t i = count; i-- > 0;)
        failures += cudaHostRegister(fake_address(i * 64), 32, 0) != 0;
    cr_assert_eq(failures, 0);
    cr_assert_eq(fake_cudart_live_count(), count);
    cr_assert_eq(cudaHostRegister(fake_address(500000 * 64 + 16), 32, 0), 712);
    cr_assert_eq(cudaHostRegister(fake_address(500000 * 64 + 32), 32, 0), 0, "a gap");
    cr_assert_eq(cudaHostUnregister(fake_address(500000 * 64 + 32)), 0);

    struct fake_cudart_range *ranges = calloc(count, sizeof *ranges);
    cr_assert_not_null(ranges);
    cr_assert_eq(fake_cudart_snapshot(ranges, count), count);
    for (size_t i = 0; i < count; i++)
        failures += ranges[i].base != (uintptr_t)fake_address(i * 64);
    cr_assert_eq(failures, 0, "sorted by base");
    free(ranges);

    /* Remove about half in a scattered order, then all. */
    for (size_t i = 0; i < count; i += 2)
        failures += cudaHostUnregister(fake_address(((i * 7919) % count) * 64)) != 0;
    cr_assert_eq(failures, 0);
    for (size_t i = 0; i < count; i++) {
        int error = cudaHostUnregister(fake_address(i * 64));
        failures += error != 0 && error != 713;
    }
    cr_assert_eq(failures, 0);
    cr_assert_eq(fake_cudart_live_count(), 0);
}

Test(fake_cudart, snapshot_respects_max)
{
    fresh_state(NULL, NULL);
    for (uintptr_t i = 0; i < 10; i++)
        cr_assert_eq(cudaHostRegister(fake_address((9 - i) * 100), 10, 0), 0);
    struct fake_cudart_range ranges[4];
    cr_assert_eq(fake_cudart_snapshot(ranges, 4), 4);
    cr_assert_eq(ranges[0].base, (uintptr_t)fake_address(0));
    cr_assert_eq(ranges[3].base, (uintptr_t)fake_address(300));
    cr_assert_eq(ranges[3].size, 10);
    cr_assert_eq(fake_cudart_snapshot(NULL, 0), 0);
}

enum { THREADS = 8, PER_THREAD = 20000 };

static void *register_many(void *arg)
{
    uintptr_t first = (uintptr_t)arg * PER_THREAD;
    for (uintptr_t i = 0; i < PER_THREAD; i++) {
        if (cudaHostRegister(fake_address((first + i) * 16), 16, 0) != 0)
            return (void *)0;
    }
    for (uintptr_t i = 0; i < PER_THREAD; i += 2) {
        if (cudaHostUnregister(fake_address((first + i) * 16)) != 0)
            return (void *)0;
    }
    return (void *)1;
}

Test(fake_cudart, concurrent_callers)
{
    fresh_state(NULL, NULL);
    pthread_t threads[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++)
        cr_assert_eq(pthread_create(&threads[t], NULL, register_many, (void *)t), 0);
    for (int t = 0; t < THREADS; t++) {
        void *ok;
        pthread_join(threads[t], &ok);
        cr_assert(ok, "thread %d", t);
    }
    cr_assert_eq(fake_cudart_live_count(), THREADS * PER_THREAD / 2);
    cr_assert_eq(fake_cudart_call_count(FAKE_CALL_REGISTER), THREADS * PER_THREAD);
}

typedef int (*host_register_fn)(void *, size_t, unsigned);
typedef int (*host_unregister_fn)(void *);

/* The minimal variant is what the shim sees with a stripped-down runtime. Its
 * runtime state is its own; the driver (and so the registrations) is shared,
 * as two runtimes in one process share libcuda. */
Test(fake_cudart, minimal_variant_exports_two_functions)
{
    const char *path = getenv("FAKE_CUDART_MINIMAL_PATH");
    if (!path)
        cr_skip_test("FAKE_CUDART_MINIMAL_PATH not set (run through meson test)");
    fresh_state(NULL, NULL); /* the copy we load reads FAKE_CUDART_CHECK=0 too */
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(library, "dlopen: %s", dlerror());
    host_register_fn host_register;
    host_unregister_fn host_unregister;
    *(void **)&host_register = dlsym(library, "cudaHostRegister");
    *(void **)&host_unregister = dlsym(library, "cudaHostUnregister");
    cr_assert_not_null(host_register);
    cr_assert_not_null(host_unregister);
    cr_assert_neq((void *)host_register, (void *)cudaHostRegister, "a separate copy");
    static const char *const hidden[] = {
        "cudaGetLastError",       "cudaPeekAtLastError", "cudaGetErrorName",
        "cudaGetErrorString",     "cudaGetDeviceCount",  "cudaPointerGetAttributes",
        "fake_cudart_live_count", "fake_cudart_reset",   "fake_cudart_snapshot",
    };
    for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
        cr_assert_null(dlsym(library, hidden[i]), "%s is exported", hidden[i]);

    cr_assert_eq(host_register(fake_address(0), 160, 0), 0);
    cr_assert_eq(host_register(fake_address(80), 160, 0), 712);
    cr_assert_eq(fake_cuda_live_count(), 1, "in the one driver");
    cr_assert_eq(cudaHostRegister(fake_address(0), 160, 0), 712, "seen by the full runtime");
    cr_assert_eq(host_unregister(fake_address(0)), 0);
    cr_assert_eq(fake_cudart_live_count(), 0);
    cr_assert_eq(fake_cudart_call_count(FAKE_CALL_REGISTER), 1, "runtime counters are per copy");
    dlclose(library);
}
