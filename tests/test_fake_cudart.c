/* Tests of the fake CUDA driver and runtime themselves: if the double is
 * wrong, every shim test built on it proves nothing. Criterion runs each test
 * in its own process, so tests may change the environment and the double's
 * state. This program links both the runtime and the driver (libcuda.so.1);
 * what needs a process that links the runtime only runs fake_cudart_probe. */
#include "emulation.h"
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
#include <sys/uio.h>
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
    "FAKE_CUDA_READ_ONLY_REGISTER",
    "FAKE_CUDA_HOST_PAGE_TABLES",
    "FAKE_CUDA_LONGTERM_PINS",
    "FAKE_CUDA_PIN_RULES",
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

/* Bytes of fake_address's reservation: 8 TiB natively; 8 GiB under an
 * emulator (qemu-user 7.2 keeps about 6 MiB of its own memory per GiB a
 * program reserves: 8 TiB took the machine's memory, 64 GiB took 0.4 s in
 * every test process). */
static size_t reservation_bytes(void)
{
    return test_emulator() ? (size_t)8 << 30 : (size_t)8 << 40;
}

static char *reservation;
static int reservation_error;

static void reserve(void)
{
    void *memory = mmap(NULL, reservation_bytes(), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    reservation_error = memory == MAP_FAILED ? errno : 0;
    reservation = memory == MAP_FAILED ? NULL : memory;
}

/* Addresses for the bookkeeping tests, inside one readable and writable
 * reservation that is never touched (MAP_NORESERVE): the driver double
 * refuses to register memory the real driver could not pin (unmapped,
 * PROT_NONE), so even tests that only count need mapped pages. Made once
 * (concurrent_callers' threads ask at the same time: two reservations there
 * had a thread register in one and unregister in the other). */
static void *fake_address(uintptr_t offset)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, reserve);
    const size_t size = reservation_bytes();
    cr_assert_not_null(reservation, "a reservation of %zu bytes: %s", size,
                       strerror(reservation_error));
    /* 1 MiB before offset 0 is mapped too: some tests go below it. */
    cr_assert_lt(offset, size - (1 << 20));
    return reservation + (1 << 20) + offset;
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

    /* Unmapped: recorded as the shim's violation, and refused, as the real
     * driver cannot pin a hole (NV_ERR_INVALID_ADDRESS: invalid value). */
    long page = sysconf(_SC_PAGESIZE);
    munmap(memory + page, (size_t)page);
    cr_assert_eq(cudaHostRegister(memory + page, 100, 0), 1);
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
 * Loops assert once at the end: Criterion reports every assertion it makes.
 * The timeout only catches a table gone quadratic (hours at this count): the
 * run took about 5 s natively and 18 to 29 s under qemu-user here, and went
 * past the old 30 s limit there beside another test (CI's aarch64 step). */
Test(fake_cudart, a_million_registrations, .timeout = 180)
{
    /* The table at scale; the pin rules have their own tests, and where the
     * kernel lacks PROCMAP_QUERY (before 6.11, qemu-user) they read smaps. */
    fresh_state("FAKE_CUDA_PIN_RULES", "0");
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
    fresh_state("FAKE_CUDA_PIN_RULES", "0"); /* the table under threads, as above */
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

/* ======================================================================== */
/* The fake driver and the runtime on top of it.                            */

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

/* The main program, as the driver names it in creator attribution (its
 * /proc/self/exe path: Criterion's workers run with argv[0] boxfort-worker). */
#define SELF "test_fake_cudart"
#define RUNTIME "libfake_cudart"

static const uintptr_t GiB = (uintptr_t)1 << 30;

/* cuInit(0), then the primary context of device retained and made current. */
static CUcontext init_and_make_current(int device)
{
    cr_assert_eq(cuInit(0), 0);
    CUcontext context = NULL;
    cr_assert_eq(cuDevicePrimaryCtxRetain(&context, device), 0);
    cr_assert_not_null(context);
    cr_assert_eq(cuCtxSetCurrent(context), 0);
    return context;
}

static struct fake_cuda_primary_state primary_state(int device)
{
    struct fake_cuda_primary_state state;
    memset(&state, 0x55, sizeof state);
    cr_assert_eq(fake_cuda_primary_state(device, &state), 0, "device %d", device);
    return state;
}

/* Waits (without asserting anything about time) until condition(cookie) holds
 * or 60 s have passed; returns whether it holds. */
static bool wait_until(bool (*condition)(void), const char *what)
{
    for (int i = 0; i < 60000; i++) {
        if (condition())
            return true;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    fprintf(stderr, "gave up waiting for %s\n", what);
    return condition();
}

Test(fake_cuda, nothing_before_cuinit)
{
    fresh_state(NULL, NULL);
    int count = -1, version = -1;
    CUcontext context = NULL;
    CUdevice device = -1;
    cr_assert_eq(fake_cuda_initialized(), 0);
    cr_assert_eq(cuDeviceGetCount(&count), 3);
    cr_assert_eq(cuDeviceGet(&device, 0), 3);
    cr_assert_eq(cuCtxGetCurrent(&context), 3);
    cr_assert_eq(cuCtxSetCurrent(NULL), 3);
    cr_assert_eq(cuCtxPopCurrent_v2(&context), 3);
    cr_assert_eq(cuCtxGetDevice(&device), 3);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&context, 0), 3);
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(0), 3);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 3);
    cr_assert_eq(cuMemHostUnregister(fake_address(0)), 3);
    cr_assert_eq(count, -1, "nothing written");
    /* These work without cuInit. */
    cr_assert_eq(cuDriverGetVersion(&version), 0);
    cr_assert_eq(version, 13000);
    const char *name = NULL;
    cr_assert_eq(cuGetErrorName(3, &name), 0);
    cr_assert_str_eq(name, "CUDA_ERROR_NOT_INITIALIZED");
    cr_assert_eq(cuInit(1), 1, "flags must be 0");
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(fake_cuda_initialized(), 1);
    cr_assert_eq(cuDeviceGetCount(&count), 0);
    cr_assert_eq(count, 1, "one device by default");
    cr_assert_eq(fake_cuda_contexts_created(), 0, "cuInit creates no context");
}

Test(fake_cuda, no_device)
{
    fresh_state("FAKE_CUDA_DEVICES", "0");
    int count = -1;
    cr_assert_eq(cuInit(0), 100);
    cr_assert_eq(cuDeviceGetCount(&count), 3, "still not initialised");
    cr_assert_eq(fake_cuda_initialized(), 0);
}

Test(fake_cuda, devices_and_ordinals)
{
    fresh_state("FAKE_CUDA_DEVICES", "4");
    int count = -1;
    CUdevice device = -1;
    CUcontext context = NULL;
    unsigned flags = 99;
    int active = 99;
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(cuDeviceGetCount(&count), 0);
    cr_assert_eq(count, 4);
    cr_assert_eq(cuDeviceGet(&device, 3), 0);
    cr_assert_eq(device, 3);
    cr_assert_eq(cuDeviceGet(&device, 4), 101);
    cr_assert_eq(cuDeviceGet(&device, -1), 101);
    cr_assert_eq(cuDeviceGet(NULL, 0), 1);
    cr_assert_eq(cuDevicePrimaryCtxGetState(4, &flags, &active), 101);
    cr_assert_eq(cuDevicePrimaryCtxGetState(3, &flags, &active), 0);
    cr_assert_eq(active, 0);
    cr_assert_eq(flags, 0u);
    cr_assert_eq(cuDevicePrimaryCtxGetState(3, NULL, &active), 1);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&context, 4), 101);
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(-1), 101);
    cr_assert_eq(cuDevicePrimaryCtxReset_v2(4), 101);
    cr_assert_eq(cuCtxCreate_v2(&context, 0, 4), 101);
    cr_assert_eq(fake_cuda_primary_state(4, &(struct fake_cuda_primary_state){0}), -1);

    fresh_state("FAKE_CUDA_DEVICES", "99");
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(cuDeviceGetCount(&count), 0);
    cr_assert_eq(count, 16, "at most 16");

    fresh_state("FAKE_CUDART_DEVICES", "3");
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(cuDeviceGetCount(&count), 0);
    cr_assert_eq(count, 3, "the runtime double's older variable");
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    fake_cuda_reload_config();
    cr_assert_eq(cuDeviceGetCount(&count), 0);
    cr_assert_eq(count, 2, "FAKE_CUDA_DEVICES wins");
}

Test(fake_cuda, error_names_and_strings)
{
    static const struct {
        int code;
        const char *name;
    } names[] = {
        {0, "CUDA_SUCCESS"},
        {1, "CUDA_ERROR_INVALID_VALUE"},
        {2, "CUDA_ERROR_OUT_OF_MEMORY"},
        {3, "CUDA_ERROR_NOT_INITIALIZED"},
        {4, "CUDA_ERROR_DEINITIALIZED"},
        {100, "CUDA_ERROR_NO_DEVICE"},
        {101, "CUDA_ERROR_INVALID_DEVICE"},
        {201, "CUDA_ERROR_INVALID_CONTEXT"},
        {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
        {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
        {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *name = NULL, *text = NULL;
        cr_assert_eq(cuGetErrorName(names[i].code, &name), 0);
        cr_assert_str_eq(name, names[i].name);
        cr_assert_eq(cuGetErrorString(names[i].code, &text), 0);
        cr_assert_not_null(text);
    }
    const char *name = "untouched";
    cr_assert_eq(cuGetErrorName(12345, &name), 1, "unknown code");
    cr_assert_null(name);
    cr_assert_eq(cuGetErrorName(0, NULL), 1);
    /* The runtime's names for the numbers the driver adds. */
    cr_assert_str_eq(cudaGetErrorName(101), "cudaErrorInvalidDevice");
    cr_assert_str_eq(cudaGetErrorName(201), "cudaErrorDeviceUninitialized");
    cr_assert_str_eq(cudaGetErrorName(709), "cudaErrorContextIsDestroyed");
}

Test(fake_cuda, primary_context_retain_release_reset)
{
    fresh_state(NULL, NULL);
    CUcontext first = NULL, again = NULL, second = NULL, third = NULL;
    cr_assert_eq(cuInit(0), 0);
    struct fake_cuda_primary_state state = primary_state(0);
    cr_assert_eq(state.active, 0);
    cr_assert_eq(state.refcount, 0);
    cr_assert_null(state.context);
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(0), 201, "nothing retained");

    cr_assert_eq(cuDevicePrimaryCtxRetain(&first, 0), 0);
    state = primary_state(0);
    cr_assert_eq(state.active, 1);
    cr_assert_eq(state.refcount, 1);
    cr_assert_eq(state.context, (void *)first);
    cr_assert_eq(fake_cuda_contexts_created(), 1, "activation is a creation");
    cr_assert_eq(fake_cuda_contexts_created_on(0), 1);
    cr_assert_eq(fake_cuda_contexts_created_by(SELF), 1, "attributed to this program");
    cr_assert_eq(fake_cuda_contexts_created_by(RUNTIME), 0);
    cr_assert_eq(fake_cuda_context_stack_depth(), 0, "retain does not push");

    cr_assert_eq(cuDevicePrimaryCtxRetain(&again, 0), 0);
    cr_assert_eq(again, first);
    cr_assert_eq(primary_state(0).refcount, 2);
    cr_assert_eq(fake_cuda_contexts_created(), 1, "an active one is not created again");

    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(0), 0);
    cr_assert_eq(primary_state(0).active, 1);
    cr_assert_eq(cuDevicePrimaryCtxRelease(0), 0, "the unversioned alias");
    state = primary_state(0);
    cr_assert_eq(state.active, 0, "destroyed at zero");
    cr_assert_eq(state.refcount, 0);
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(0), 201);

    cr_assert_eq(cuDevicePrimaryCtxRetain(&second, 0), 0);
    cr_assert_neq(second, first, "a new context, a new handle");
    cr_assert_eq(fake_cuda_contexts_created(), 2);

    /* Reset destroys it whatever its count, and keeps the count. */
    cr_assert_eq(cuDevicePrimaryCtxReset_v2(0), 0);
    state = primary_state(0);
    cr_assert_eq(state.active, 0);
    cr_assert_eq(state.refcount, 1);
    cr_assert_eq(cuDevicePrimaryCtxReset(0), 0, "resetting an inactive one is fine");
    cr_assert_eq(cuDevicePrimaryCtxRetain(&third, 0), 0);
    cr_assert_eq(primary_state(0).refcount, 2);
    cr_assert_eq(primary_state(0).active, 1);
    cr_assert_eq(fake_cuda_contexts_created(), 3);
    cr_assert_eq(cuDevicePrimaryCtxRetain(NULL, 0), 1);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_PRIMARY_CTX_RETAIN), 5);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_PRIMARY_CTX_RELEASE), 1);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_PRIMARY_CTX_RELEASE_V2), 3);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_PRIMARY_CTX_RESET), 1);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_PRIMARY_CTX_RESET_V2), 1);
    cr_assert_eq(fake_cuda_call_count_by(FAKE_CU_CALL_PRIMARY_CTX_RETAIN, SELF), 5);
    cr_assert_eq(fake_cuda_call_count_by(FAKE_CU_CALL_PRIMARY_CTX_RETAIN, RUNTIME), 0);
}

Test(fake_cuda, context_stack)
{
    fresh_state("FAKE_CUDA_DEVICES", "2");
    CUcontext current = (CUcontext)1, popped = NULL, zero = NULL, one = NULL;
    CUdevice device = -1;
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(cuCtxGetCurrent(&current), 0);
    cr_assert_null(current);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), 201, "empty stack");
    cr_assert_eq(cuCtxGetDevice(&device), 201, "no current context");
    cr_assert_eq(cuDevicePrimaryCtxRetain(&zero, 0), 0);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&one, 1), 0);

    cr_assert_eq(cuCtxPushCurrent_v2(zero), 0);
    cr_assert_eq(cuCtxPushCurrent(one), 0, "the unversioned alias");
    cr_assert_eq(fake_cuda_context_stack_depth(), 2);
    cr_assert_eq(cuCtxGetCurrent(&current), 0);
    cr_assert_eq(current, one);
    cr_assert_eq(cuCtxGetDevice(&device), 0);
    cr_assert_eq(device, 1);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), 0);
    cr_assert_eq(popped, one);
    cr_assert_eq(cuCtxGetDevice(&device), 0);
    cr_assert_eq(device, 0, "the previous context is current again");
    cr_assert_eq(cuCtxPopCurrent(NULL), 0, "the unversioned alias, result not wanted");
    cr_assert_eq(fake_cuda_context_stack_depth(), 0);

    /* SetCurrent replaces the top; on an empty stack it pushes; NULL pops. */
    cr_assert_eq(cuCtxSetCurrent(one), 0);
    cr_assert_eq(fake_cuda_context_stack_depth(), 1);
    cr_assert_eq(cuCtxPushCurrent_v2(one), 0);
    cr_assert_eq(cuCtxSetCurrent(zero), 0);
    cr_assert_eq(fake_cuda_context_stack_depth(), 2);
    cr_assert_eq(fake_cuda_context_stack_top(), (void *)zero);
    cr_assert_eq(cuCtxSetCurrent(NULL), 0);
    cr_assert_eq(fake_cuda_context_stack_top(), (void *)one);
    cr_assert_eq(cuCtxSetCurrent(NULL), 0);
    cr_assert_eq(cuCtxSetCurrent(NULL), 0, "a no-op on an empty stack");
    cr_assert_eq(fake_cuda_context_stack_depth(), 0);

    /* Bad handles. */
    cr_assert_eq(cuCtxPushCurrent_v2(NULL), 1);
    cr_assert_eq(cuCtxPushCurrent_v2((CUcontext)fake_address(0)), 201);
    cr_assert_eq(cuCtxSetCurrent((CUcontext)fake_address(0)), 201);

    /* The stack holds 32. */
    for (int i = 0; i < FAKE_CUDA_STACK_DEPTH; i++)
        cr_assert_eq(cuCtxPushCurrent_v2(zero), 0);
    cr_assert_eq(cuCtxPushCurrent_v2(zero), 2, "full");
    cr_assert_eq(fake_cuda_context_stack_depth(), FAKE_CUDA_STACK_DEPTH);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_CTX_PUSH_CURRENT), 1);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_CTX_PUSH_CURRENT_V2), 37);
}

/* What the shim must do on a thread that has the program's context current:
 * push its own choice, register, pop; the thread's stack is as before. */
Test(fake_cuda, push_register_pop_leaves_the_stack_as_before)
{
    fresh_state("FAKE_CUDA_DEVICES", "2");
    CUcontext program = init_and_make_current(1);
    CUcontext other = NULL, popped = NULL;
    cr_assert_eq(cuDevicePrimaryCtxRetain(&other, 0), 0);
    cr_assert_eq(cuCtxPushCurrent_v2(other), 0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 0);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), 0);
    cr_assert_eq(popped, other);
    cr_assert_eq(fake_cuda_context_stack_depth(), 1);
    cr_assert_eq(fake_cuda_context_stack_top(), (void *)program);
    struct fake_cuda_registration registration;
    cr_assert_eq(fake_cuda_lookup(fake_address(10), &registration), 1);
    cr_assert_eq(registration.device, 0, "registered where the pushed context was");
    cr_assert_eq(registration.context, (void *)other);
}

static CUcontext shared_context;
static int other_thread_results[8];

static void *other_thread_stack(void *unused)
{
    (void)unused;
    CUcontext current = (CUcontext)1;
    other_thread_results[0] = cuCtxGetCurrent(&current);
    other_thread_results[1] = current == NULL;
    other_thread_results[2] = cuCtxPushCurrent_v2(shared_context);
    other_thread_results[3] = (int)fake_cuda_context_stack_depth();
    return NULL;
}

Test(fake_cuda, stacks_are_per_thread)
{
    fresh_state(NULL, NULL);
    shared_context = init_and_make_current(0);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, other_thread_stack, NULL), 0);
    cr_assert_eq(pthread_join(thread, NULL), 0);
    cr_assert_eq(other_thread_results[0], 0);
    cr_assert(other_thread_results[1], "a new thread has no current context");
    cr_assert_eq(other_thread_results[2], 0);
    cr_assert_eq(other_thread_results[3], 1);
    cr_assert_eq(fake_cuda_context_stack_depth(), 1, "ours is untouched");
}

Test(fake_cuda, created_contexts)
{
    fresh_state("FAKE_CUDA_DEVICES", "3");
    CUcontext primary = init_and_make_current(0);
    CUcontext created = NULL;
    CUdevice device = -1;
    cr_assert_eq(fake_cuda_contexts_created(), 1);
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 2), 0);
    cr_assert_neq(created, primary);
    cr_assert_eq(fake_cuda_contexts_created(), 2);
    cr_assert_eq(fake_cuda_contexts_created_on(2), 1);
    cr_assert_eq(fake_cuda_contexts_created_by(SELF), 2);
    cr_assert_eq(fake_cuda_context_stack_depth(), 2, "created contexts are pushed");
    cr_assert_eq(cuCtxGetDevice(&device), 0);
    cr_assert_eq(device, 2);
    cr_assert_eq(cuCtxDestroy_v2(primary), 201, "a primary context is not destroyed so");
    cr_assert_eq(cuCtxDestroy_v2(NULL), 1);
    cr_assert_eq(cuCtxDestroy_v2(created), 0);
    cr_assert_eq(fake_cuda_context_stack_top(), (void *)primary, "popped from our stack");
    cr_assert_eq(cuCtxDestroy_v2(created), 201, "twice");
    cr_assert_eq(cuCtxCreate_v2(NULL, 0, 0), 1);
    /* At most 64 live at once. */
    CUcontext many[FAKE_CUDA_MAX_CREATED_CONTEXTS];
    CUcontext popped;
    for (int i = 0; i < FAKE_CUDA_MAX_CREATED_CONTEXTS; i++) {
        cr_assert_eq(cuCtxCreate_v2(&many[i], 0, 1), 0);
        cr_assert_eq(cuCtxPopCurrent_v2(&popped), 0);
    }
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 1), 2);
    cr_assert_eq(cuCtxDestroy_v2(many[7]), 0);
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 1), 0, "a slot came free");
    cr_assert_eq(fake_cuda_contexts_created_on(1), FAKE_CUDA_MAX_CREATED_CONTEXTS + 1);
}

Test(fake_cuda, register_rules)
{
    fresh_state("FAKE_CUDA_DEVICES", "2");
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 201, "no current context");
    cr_assert_eq(cuMemHostUnregister(fake_address(0)), 201);
    CUcontext zero = init_and_make_current(0);
    CUcontext one = NULL, popped;
    cr_assert_eq(cuDevicePrimaryCtxRetain(&one, 1), 0);

    cr_assert_eq(cuMemHostRegister_v2(NULL, 4096, 0), 1);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 0, 0), 1);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0x10), 1);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), SIZE_MAX, 0), 1, "wraps around");
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 8192, 0x0F), 0);
    cr_assert_eq(cuMemHostRegister(fake_address(8192), 4096, 1), 0, "the unversioned alias");

    /* Overlap with a registration of another context is still overlap. */
    cr_assert_eq(cuCtxPushCurrent_v2(one), 0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(4096), 8192, 0), 712);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(16384), 4096, 2), 0);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), 0);

    struct fake_cuda_registration all[4];
    cr_assert_eq(fake_cuda_snapshot(all, 4), 3);
    cr_assert_eq(all[0].base, (uintptr_t)fake_address(0));
    cr_assert_eq(all[0].flags, 0x0Fu);
    cr_assert_eq(all[0].device, 0);
    cr_assert_eq(all[0].context, (void *)zero);
    cr_assert_eq(all[0].state, FAKE_CUDA_REGISTRATION_LIVE);
    cr_assert_eq(all[1].flags, 1u);
    cr_assert_eq(all[2].device, 1);
    cr_assert_eq(all[2].context, (void *)one);
    cr_assert_eq(fake_cuda_registrations_on_device(0), 2);
    cr_assert_eq(fake_cuda_registrations_on_device(1), 1);
    cr_assert_eq(fake_cuda_registrations_in_context(one), 1);
    cr_assert_eq(fake_cuda_snapshot_from((uintptr_t)fake_address(1), all, 4), 2);

    /* Unregistration: from any live context (portable memory). */
    cr_assert_eq(cuMemHostUnregister(fake_address(4096)), 1, "interior");
    cr_assert_eq(cuMemHostUnregister(fake_address(1 << 20)), 713, "unknown");
    cr_assert_eq(cuMemHostUnregister(fake_address(16384)), 0, "made in device 1's context");
    cr_assert_eq(cuMemHostUnregister(fake_address(16384)), 713, "twice");
    cr_assert_eq(fake_cuda_live_count(), 2);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_MEM_HOST_REGISTER_V2), 8);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_MEM_HOST_REGISTER), 1);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_MEM_HOST_UNREGISTER), 5);
}

Test(fake_cuda, max_register_bytes)
{
    fresh_state("FAKE_CUDA_MAX_REGISTER_BYTES", "1G");
    init_and_make_current(0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), GiB + 1, 0), 2);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), GiB, 0), 0);
    cr_assert_eq(cudaHostRegister(fake_address(2 * GiB), GiB + 4096, 0), 2, "through the runtime");
    cr_assert_eq(cudaGetLastError(), 2);
}

/* Real R580+ drivers refuse 512 GiB and more. */
Test(fake_cuda, max_register_bytes_at_512_gib_and_unlimited)
{
    if (reservation_bytes() < (size_t)5120 << 30)
        cr_skip_test("under %s: the test needs a 5 TiB reservation, which the emulator cannot "
                     "afford (see reservation_bytes)",
                     test_emulator());
    fresh_state("FAKE_CUDA_MAX_REGISTER_BYTES", "549755813887");
    init_and_make_current(0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(4 * GiB), 512 * GiB, 0), 2);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(4 * GiB), 512 * GiB - 1, 0), 0);

    setenv("FAKE_CUDA_MAX_REGISTER_BYTES", "lots", 1);
    fake_cuda_reload_config();
    cr_assert_eq(cuMemHostRegister_v2(fake_address(1024 * GiB), 4096 * GiB, 0), 0,
                 "a bad value means unlimited");
}

/* The fault injection lives in the driver: the runtime path and the direct
 * driver path count together. */
Test(fake_cuda, injected_failures_on_both_paths)
{
    fresh_state("FAKE_CUDART_FAIL_REGISTER_EVERY", "2");
    setenv("FAKE_CUDART_FAIL_ERROR", "999", 1);
    setenv("FAKE_CUDART_FAIL_UNREGISTER_EVERY", "2", 1);
    fake_cuda_reset();
    init_and_make_current(0);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(4096), 4096, 0), 999);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(4096), 4096, 0), 0);
    cr_assert_eq(cudaHostRegister(fake_address(8192), 4096, 0), 999);
    cr_assert_eq(cudaGetLastError(), 999);
    cr_assert_eq(fake_cuda_live_count(), 2);
    cr_assert_eq(cuMemHostUnregister(fake_address(0)), 0);
    cr_assert_eq(cudaHostUnregister(fake_address(4096)), 999);
    cr_assert_eq(fake_cuda_live_count(), 1);
    fake_cudart_set_fail_every(0, 1, 801);
    cr_assert_eq(cuMemHostUnregister(fake_address(4096)), 801, "set through the runtime");
    fake_cuda_set_fail_every(0, 0, 0);
    cr_assert_eq(cuMemHostUnregister(fake_address(4096)), 0);
}

/* Destroying a context (any of three ways) drops the registrations made in
 * it, and leaves it destroyed (709) where it is still current. */
Test(fake_cuda, destroying_a_context_drops_its_registrations)
{
    fresh_state(NULL, NULL);
    CUcontext primary = init_and_make_current(0);
    CUcontext created = NULL, current = NULL;
    CUdevice device;
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 0);
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 0), 0);
    for (uintptr_t i = 1; i <= 300; i++)
        cr_assert_eq(cuMemHostRegister_v2(fake_address(i * 4096), 4096, 0), 0);
    cr_assert_eq(fake_cuda_registrations_in_context(created), 300);
    cr_assert_eq(cuCtxDestroy_v2(created), 0);
    cr_assert_eq(fake_cuda_live_count(), 1, "the created context's 300 went with it");
    cr_assert_eq(fake_cuda_registrations_in_context(primary), 1);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(4096), 4096, 0), 0, "that memory is free");

    /* Release to zero: the primary context's go too; it stays current here. */
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(0), 0);
    cr_assert_eq(fake_cuda_live_count(), 0);
    cr_assert_eq(cuCtxGetCurrent(&current), 0);
    cr_assert_eq(current, primary, "Release never pops");
    cr_assert_eq(cuCtxGetDevice(&device), 709);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 709);
    cr_assert_eq(cuMemHostUnregister(fake_address(0)), 709);
    cr_assert_eq(cuCtxPushCurrent_v2(primary), 201, "a destroyed context cannot be pushed");

    /* Reset: the same, whatever the count. */
    CUcontext again = NULL;
    cr_assert_eq(cuDevicePrimaryCtxRetain(&again, 0), 0);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&again, 0), 0);
    cr_assert_eq(cuCtxSetCurrent(again), 0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 0);
    cr_assert_eq(cuDevicePrimaryCtxReset_v2(0), 0);
    cr_assert_eq(fake_cuda_live_count(), 0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 709);
}

/* Set once the thread's cuCtxSetCurrent has returned (its call count goes up
 * as the call starts, before the context is looked up). */
static int context_set;

static void *register_in_destroyed_context(void *context)
{
    intptr_t results = 0;
    CUdevice device;
    results |= (intptr_t)(cuCtxSetCurrent(context) == 0) << 0;
    __atomic_store_n(&context_set, 1, __ATOMIC_RELEASE);
    /* ... main destroys the context, then creates another ... */
    while (fake_cuda_contexts_created() < 2) {
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    results |= (intptr_t)(cuCtxGetDevice(&device) == 709) << 1;
    results |= (intptr_t)(cuMemHostRegister_v2(fake_address(1 << 20), 4096, 0) == 709) << 2;
    return (void *)results;
}

/* A context destroyed by another thread stays current here, destroyed. */
Test(fake_cuda, destroyed_elsewhere_is_709_here)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cuInit(0), 0);
    CUcontext created = NULL, popped;
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 0), 0);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), 0);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, register_in_destroyed_context, created), 0);
    while (!__atomic_load_n(&context_set, __ATOMIC_ACQUIRE)) {
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    cr_assert_eq(cuCtxDestroy_v2(created), 0);
    CUcontext other = NULL;
    cr_assert_eq(cuDevicePrimaryCtxRetain(&other, 0), 0, "a second creation lets it go on");
    void *results;
    cr_assert_eq(pthread_join(thread, &results), 0);
    cr_assert_eq((intptr_t)results, 7, "set current, then 709 twice (bits: %ld)",
                 (long)(intptr_t)results);
}

/* ---- The runtime on the driver. ---- */

Test(fake_cuda, runtime_creates_device_0_context_for_a_thread_without_one)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1);
    cr_assert_eq(fake_cuda_contexts_created_on(0), 1);
    cr_assert_eq(fake_cuda_contexts_created_by(SELF), 1, "attributed to the runtime's caller");
    cr_assert_eq(fake_cuda_contexts_created_by(RUNTIME), 0);
    struct fake_cuda_primary_state state = primary_state(0);
    cr_assert_eq(state.active, 1);
    cr_assert_eq(state.refcount, 1, "the runtime holds one reference");
    cr_assert_eq(fake_cuda_context_stack_top(), state.context, "and made it current here");
    cr_assert_eq(fake_cuda_registrations_on_device(0), 1);
    struct fake_cuda_registration registration;
    cr_assert_eq(fake_cuda_lookup(fake_address(0), &registration), 1);
    cr_assert_eq(registration.flags, 3u, "cudaHostRegisterDefault is PORTABLE|DEVICEMAP");
    cr_assert_eq(registration.context, state.context);
    /* The runtime's calls into the driver are its own. */
    cr_assert_eq(fake_cuda_call_count_by(FAKE_CU_CALL_MEM_HOST_REGISTER_V2, RUNTIME), 1);
    cr_assert_eq(fake_cuda_call_count_by(FAKE_CU_CALL_MEM_HOST_REGISTER_V2, SELF), 0);
    cr_assert_eq(fake_cuda_call_count_by(FAKE_CU_CALL_INTERNAL_PRIMARY_CTX_RETAIN, RUNTIME), 1);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_PRIMARY_CTX_RETAIN), 0);

    /* Later calls reuse it. */
    cr_assert_eq(cudaHostRegister(fake_address(4096), 4096, 0), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1);
    struct fake_cuda_caller callers[8];
    size_t count = fake_cuda_callers(callers, 8);
    bool saw_self = false, saw_runtime = false;
    for (size_t i = 0; i < count; i++) {
        saw_self |= strstr(callers[i].object, SELF) && callers[i].contexts_created == 1;
        saw_runtime |= strstr(callers[i].object, RUNTIME) && callers[i].calls > 0 &&
                       callers[i].contexts_created == 0;
    }
    cr_assert(saw_self && saw_runtime, "callers: %zu", count);
}

static int other_thread_device = -1;

static void *register_without_choosing_a_device(void *unused)
{
    (void)unused;
    int error = cudaHostRegister(fake_address(1 << 20), 4096, 0);
    cudaGetDevice(&other_thread_device);
    return (void *)(intptr_t)error;
}

Test(fake_cuda, set_device_3_then_another_thread_creates_a_context_on_device_0)
{
    fresh_state("FAKE_CUDA_DEVICES", "4");
    cr_assert_eq(cudaSetDevice(3), 0);
    cr_assert_eq(fake_cuda_contexts_created_on(3), 1, "CUDA 12+: set device initialises");
    cr_assert_eq(fake_cuda_contexts_created_on(0), 0);
    pthread_t thread;
    void *error;
    cr_assert_eq(pthread_create(&thread, NULL, register_without_choosing_a_device, NULL), 0);
    cr_assert_eq(pthread_join(thread, &error), 0);
    cr_assert_eq((intptr_t)error, 0);
    cr_assert_eq(fake_cuda_contexts_created_on(0), 1, "the other thread made device 0's");
    cr_assert_eq(fake_cuda_contexts_created_by(SELF), 2);
    cr_assert_eq(fake_cuda_registrations_on_device(0), 1);
    cr_assert_eq(fake_cuda_registrations_on_device(3), 0);
    cr_assert_eq(other_thread_device, 0);
    int device = -1;
    cr_assert_eq(cudaGetDevice(&device), 0);
    cr_assert_eq(device, 3);
    cr_assert_eq(cudaSetDevice(4), 101);
    cr_assert_eq(cudaGetLastError(), 101);
    cr_assert_eq(cudaSetDevice(-1), 101);
}

Test(fake_cuda, runtime_uses_the_context_current_in_the_driver)
{
    fresh_state("FAKE_CUDA_DEVICES", "3");
    cr_assert_eq(cuInit(0), 0);
    CUcontext created = NULL;
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 2), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1, "no primary context made");
    cr_assert_eq(fake_cuda_registrations_in_context(created), 1);
    int device = -1;
    cr_assert_eq(cudaGetDevice(&device), 0);
    cr_assert_eq(device, 2, "the current context's device");
    cr_assert_eq(cudaFree(NULL), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1);

    /* A destroyed context current here, and not a primary context the
     * runtime holds, is the caller's problem: 709. */
    CUcontext mine = NULL;
    cr_assert_eq(cuDevicePrimaryCtxRetain(&mine, 1), 0);
    cr_assert_eq(cuCtxPushCurrent_v2(mine), 0);
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(1), 0); /* destroyed, never popped */
    cr_assert_eq(cudaHostRegister(fake_address(8192), 4096, 0), 709);
    cr_assert_eq(cudaGetLastError(), 709);
    cr_assert_eq(cudaGetDevice(&device), 0, "reports the thread's device");
    cr_assert_eq(device, 0);
}

Test(fake_cuda, runtime_and_driver_share_registrations)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(cuMemHostUnregister(fake_address(0)), 0, "the runtime's context is current");
    cr_assert_eq(cuMemHostRegister_v2(fake_address(8192), 4096, 0), 0);
    int attributes[4] = {0};
    cr_assert_eq(cudaPointerGetAttributes(attributes, fake_address(8192 + 5)), 0);
    cr_assert_eq(attributes[0], 1, "the runtime sees the driver's registration");
    cr_assert_eq(cudaHostRegister(fake_address(8192), 16, 0), 712);
    cr_assert_eq(cudaHostUnregister(fake_address(8192)), 0);
    cr_assert_eq(fake_cudart_live_count(), 0);
    cr_assert_eq(fake_cuda_live_count(), 0);
}

static void *register_once(void *base)
{
    return (void *)(intptr_t)cudaHostRegister(base, 4096, 0);
}

Test(fake_cuda, runtime_keeps_one_reference_per_device)
{
    fresh_state(NULL, NULL);
    pthread_t threads[4];
    for (uintptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, register_once, fake_address(i * 4096)), 0);
    for (int i = 0; i < 4; i++) {
        void *error;
        cr_assert_eq(pthread_join(threads[i], &error), 0);
        cr_assert_eq((intptr_t)error, 0);
    }
    cr_assert_eq(fake_cuda_contexts_created(), 1);
    cr_assert_eq(primary_state(0).refcount, 1);
    cr_assert_eq(fake_cuda_live_count(), 4);
}

Test(fake_cuda, device_reset_drops_registrations_and_the_runtime_recovers)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    void *before = primary_state(0).context;
    cr_assert_eq(cudaDeviceReset(), 0);
    cr_assert_eq(fake_cuda_live_count(), 0);
    cr_assert_eq(primary_state(0).active, 0);
    cr_assert_eq(primary_state(0).refcount, 1, "the runtime keeps its reference");
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0, "brought back");
    cr_assert_eq(fake_cuda_contexts_created(), 2);
    cr_assert_neq(primary_state(0).context, before);
    cr_assert_eq(fake_cuda_context_stack_top(), primary_state(0).context);
    cr_assert_eq(primary_state(0).refcount, 1);
}

Test(fake_cuda, runtime_calls_that_create_and_those_that_do_not)
{
    fresh_state(NULL, NULL);
    int count = -1, device = -1;
    cr_assert_eq(cudaGetDeviceCount(&count), 0);
    cr_assert_eq(count, 1);
    cr_assert_eq(fake_cuda_initialized(), 1, "cudaGetDeviceCount initialises");
    cr_assert_eq(cudaGetDevice(&device), 0);
    cr_assert_eq(device, 0);
    cr_assert_eq(cudaGetLastError(), 0);
    cr_assert_eq(cudaPeekAtLastError(), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 0, "none of those creates a context");
    cr_assert_eq(cudaDeviceSynchronize(), 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1);

    fresh_state(NULL, NULL);
    cr_assert_eq(cudaFree(NULL), 0, "the usual way to initialise");
    cr_assert_eq(fake_cuda_contexts_created(), 1);
    cr_assert_eq(cudaFree(fake_address(0)), 1, "device memory is not modelled");

    fresh_state(NULL, NULL);
    int attributes[2];
    cr_assert_eq(cudaPointerGetAttributes(attributes, fake_address(0)), 0);
    cr_assert_eq(attributes[0], 0);
    cr_assert_eq(fake_cuda_contexts_created(), 1);
}

/* Runs child_body in a fork child and returns its exit status (0: passed). */
static int in_fork_child(int (*child_body)(void))
{
    fflush(NULL);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0)
        _exit(child_body());
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status), "child status %d", status);
    return WEXITSTATUS(status);
}

/* Each failed check gives its own exit status. */
static int child_of_initialised_parent(void)
{
    CUcontext context = NULL;
    int count = -1;
    if (cuInit(0) != 3)
        return 10;
    if (cuDeviceGetCount(&count) != 3)
        return 11;
    if (cuDevicePrimaryCtxRetain(&context, 0) != 3)
        return 12;
    if (cuCtxGetCurrent(&context) != 3)
        return 13;
    if (cuMemHostRegister_v2(fake_address(1 << 20), 4096, 0) != 3)
        return 14;
    if (cuMemHostUnregister(fake_address(0)) != 3)
        return 15;
    if (fake_cuda_live_count() != 0 || fake_cuda_contexts_created() != 0)
        return 16;
    if (fake_cuda_primary_state(0, &(struct fake_cuda_primary_state){0}) != 0)
        return 17;
    if (cudaHostRegister(fake_address(1 << 20), 4096, 0) != 3)
        return 18;
    if (cudaFree(NULL) != 3 || cudaGetDeviceCount(&count) != 3)
        return 19;
    if (cudaGetLastError() != 3)
        return 20;
    return 0;
}

Test(fake_cuda, fork_child_of_an_initialised_parent_gets_3_everywhere)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    cr_assert_eq(in_fork_child(child_of_initialised_parent), 0);
    cr_assert_eq(fake_cuda_live_count(), 1, "the parent's state is its own");
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 0);
}

/* A parent that used only the driver: the child's runtime gets 3 too. */
static int child_runtime_of_driver_parent(void)
{
    if (cudaHostRegister(fake_address(1 << 20), 4096, 0) != 3)
        return 10;
    if (cudaGetLastError() != 3)
        return 11;
    return 0;
}

Test(fake_cuda, fork_child_of_a_driver_only_parent)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    cr_assert_eq(in_fork_child(child_runtime_of_driver_parent), 0);
}

static int child_of_uninitialised_parent(void)
{
    if (cudaHostRegister(fake_address(1 << 20), 4096, 0) != 0)
        return 10;
    if (fake_cuda_contexts_created() != 1 || fake_cuda_live_count() != 1)
        return 11;
    return 0;
}

Test(fake_cuda, fork_child_of_an_uninitialised_parent_can_initialise)
{
    fresh_state(NULL, NULL);
    cr_assert_eq(fake_cuda_initialized(), 0);
    cr_assert_eq(in_fork_child(child_of_uninitialised_parent), 0);
    cr_assert_eq(fake_cuda_initialized(), 0);
}

Test(fake_cuda, deinitialized_after_the_exit_handler)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    fake_cuda_simulate_exit();
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 0, "not configured: no effect");

    fresh_state("FAKE_CUDA_UNLOAD_AT_EXIT", "1");
    init_and_make_current(0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), 4096, 0), 0);
    fake_cuda_simulate_exit();
    CUcontext context;
    int version = 0;
    cr_assert_eq(cuInit(0), 4);
    cr_assert_eq(cuCtxGetCurrent(&context), 4);
    cr_assert_eq(cuMemHostUnregister(fake_address(0)), 4);
    cr_assert_eq(cuDevicePrimaryCtxRelease_v2(0), 4);
    cr_assert_eq(cuDriverGetVersion(&version), 0, "pure calls still answer");
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 4, "the runtime maps it to CudartUnloading");
    cr_assert_eq(cudaGetLastError(), 4);
    cr_assert_eq(fake_cuda_live_count(), 1, "kept for queries");
}

/* ---- Latency, slept without the double's lock. ---- */

static bool one_registration_in_flight(void)
{
    return fake_cuda_registrations_in_flight() == 1;
}

static bool one_unregistration_in_flight(void)
{
    return fake_cuda_unregistrations_in_flight() == 1;
}

static void *register_one_gib(void *unused)
{
    (void)unused;
    return (void *)(intptr_t)cudaHostRegister(fake_address(0), GiB, 0);
}

/* The first thread sleeps (1000 s per GiB) until woken; a second one
 * registers, and completes, meanwhile. Were the lock held across the sleep,
 * the second registration would wait for the first, which only ends when we
 * wake it after the second returns: the test would hang until meson's
 * timeout fails it. (No Criterion .timeout on these: two tests with one,
 * running at once, make Criterion's runner leak 48 bytes that
 * scripts/sanitize's LeakSanitizer reports.) */
Test(fake_cuda, latency_is_slept_without_the_lock)
{
    fresh_state("FAKE_CUDA_REGISTER_SECONDS_PER_GIB", "1000");
    setenv("FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB", "0", 1);
    fake_cuda_reset();
    cr_assert_eq(cudaFree(NULL), 0);
    pthread_t first;
    cr_assert_eq(pthread_create(&first, NULL, register_one_gib, NULL), 0);
    cr_assert(wait_until(one_registration_in_flight, "the first registration's sleep"));

    struct fake_cuda_registration reserved;
    cr_assert_eq(fake_cuda_snapshot(&reserved, 1), 1);
    cr_assert_eq(reserved.state, FAKE_CUDA_REGISTRATION_REGISTERING);
    cr_assert_eq(fake_cuda_live_count(), 0, "not live while registering");
    cr_assert_eq(cudaHostRegister(fake_address(4096), 4096, 0), 712, "but reserved");
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 713, "not registered yet");

    /* 4 KiB at 1000 s/GiB: about 4 ms, slept while the first still sleeps. */
    cr_assert_eq(cudaHostRegister(fake_address(2 * GiB), 4096, 0), 0);
    cr_assert_eq(fake_cuda_registrations_completed(), 1, "the second completed");
    cr_assert_eq(fake_cuda_registrations_in_flight(), 1, "while the first still sleeps");
    cr_assert_eq(fake_cuda_live_count(), 1);

    fake_cuda_wake_sleepers();
    void *error;
    cr_assert_eq(pthread_join(first, &error), 0);
    cr_assert_eq((intptr_t)error, 0);
    cr_assert_eq(fake_cuda_registrations_completed(), 2);
    cr_assert_eq(fake_cuda_live_count(), 2);
}

static void *unregister_one_gib(void *unused)
{
    (void)unused;
    return (void *)(intptr_t)cudaHostUnregister(fake_address(0));
}

/* Unregistration sleeps a tenth of the register rate unless told otherwise;
 * meanwhile the range is neither live nor free. */
Test(fake_cuda, unregistration_latency)
{
    fresh_state("FAKE_CUDA_REGISTER_SECONDS_PER_GIB", "0");
    setenv("FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB", "1000", 1);
    fake_cuda_reset();
    cr_assert_eq(cudaHostRegister(fake_address(0), GiB, 0), 0, "no register latency");
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, unregister_one_gib, NULL), 0);
    cr_assert(wait_until(one_unregistration_in_flight, "the unregistration's sleep"));
    cr_assert_eq(fake_cuda_live_count(), 0);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 712, "still reserved");
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 713, "already going");
    int attributes[1];
    cr_assert_eq(cudaPointerGetAttributes(attributes, fake_address(0)), 0);
    cr_assert_eq(attributes[0], 0);
    fake_cuda_wake_sleepers();
    void *error;
    cr_assert_eq(pthread_join(thread, &error), 0);
    cr_assert_eq((intptr_t)error, 0);
    cr_assert_eq(fake_cuda_snapshot(NULL, 0), 0);
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0, "free again");

    /* Unset, the unregister rate follows the register rate (a tenth of it). */
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    cr_assert_eq(cuMemHostRegister_v2(fake_address(0), GiB, 0), 0, "no latency by default");
    setenv("FAKE_CUDA_REGISTER_SECONDS_PER_GIB", "10000", 1);
    fake_cuda_reload_config();
    cr_assert_eq(pthread_create(&thread, NULL, unregister_one_gib, NULL), 0);
    cr_assert(wait_until(one_unregistration_in_flight, "the default-rate unregistration"));
    fake_cuda_wake_sleepers();
    cr_assert_eq(pthread_join(thread, &error), 0);
    cr_assert_eq((intptr_t)error, 0);
    cr_assert_eq(fake_cuda_live_count(), 0);
}

static void *register_one_gib_in_created_context(void *context)
{
    if (cuCtxSetCurrent(context) != 0)
        return (void *)(intptr_t)-1;
    return (void *)(intptr_t)cuMemHostRegister_v2(fake_address(0), GiB, 0);
}

Test(fake_cuda, context_destroyed_while_a_registration_sleeps)
{
    fresh_state("FAKE_CUDA_REGISTER_SECONDS_PER_GIB", "1000");
    cr_assert_eq(cuInit(0), 0);
    CUcontext created = NULL, popped;
    cr_assert_eq(cuCtxCreate_v2(&created, 0, 0), 0);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), 0);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, register_one_gib_in_created_context, created), 0);
    cr_assert(wait_until(one_registration_in_flight, "the registration's sleep"));
    cr_assert_eq(cuCtxDestroy_v2(created), 0);
    fake_cuda_wake_sleepers();
    void *error;
    cr_assert_eq(pthread_join(thread, &error), 0);
    cr_assert_eq((intptr_t)error, 709);
    cr_assert_eq(fake_cuda_snapshot(NULL, 0), 0);
    struct fake_cuda_registration any;
    cr_assert_eq(fake_cuda_snapshot(&any, 1), 0, "nothing left");
}

/* ---- Big registrations: bookkeeping never touches the memory. ---- */

/* 200 GiB locked without a page of memory: PROT_NONE, locked with
 * mlock2(MLOCK_ONFAULT) (VmFlags "lo lf"). A plain mlock would try to fault
 * every page in, which Linux refuses for PROT_NONE with ENOMEM. */
Test(fake_cuda, a_200_gib_locked_reservation_registers)
{
    if (test_emulator())
        cr_skip_test("under %s: a 200 GiB reservation costs the emulator about 1.2 GiB of its "
                     "own memory (see reservation_bytes)",
                     test_emulator());
    fresh_state("FAKE_CUDART_CHECK", "1");
    const size_t bytes = 200 * (size_t)GiB;
    /* Readable and writable, as pinnable memory is; never touched. */
    void *memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED)
        cr_skip_test("cannot reserve 200 GiB of address space: %s", strerror(errno));
    if (syscall(SYS_mlock2, memory, bytes, MLOCK_ONFAULT) != 0) {
        int error = errno;
        munmap(memory, bytes);
        cr_skip_test("mlock2(MLOCK_ONFAULT) of a 200 GiB reservation failed (%s): "
                     "needs root or CAP_IPC_LOCK, or RLIMIT_MEMLOCK above 200 GiB",
                     strerror(error));
    }
    init_and_make_current(0);
    cr_assert_eq(cuMemHostRegister_v2(memory, bytes, 0), 0);
    cr_assert_eq(fake_cuda_violation_count(), 0, "mapped and locked");
    cr_assert_eq(fake_cuda_live_count(), 1);
    struct fake_cuda_registration registration;
    cr_assert_eq(fake_cuda_lookup((char *)memory + bytes - 1, &registration), 1);
    cr_assert_eq(registration.size, bytes);
    cr_assert_eq(cuMemHostRegister_v2((char *)memory + 100 * GiB, 4096, 0), 712);
    cr_assert_eq(cuMemHostUnregister(memory), 0);
    cr_assert_eq(fake_cuda_violation_count(), 0);
    /* The checks do look: unlocked, the same range is a violation. */
    cr_assert_eq(unlock_pages(memory, bytes), 0);
    cr_assert_eq(cuMemHostRegister_v2(memory, bytes, 0), 0);
    cr_assert_eq(fake_cuda_violation_count_of(FAKE_CU_VIOLATION_REGISTER_NOT_LOCKED), 1);
    cr_assert_eq(munmap(memory, bytes), 0);
}

/* ---- Logs. ---- */

Test(fake_cuda, driver_log_lines)
{
    char cuda_path[] = "/tmp/fake_cuda_log_XXXXXX";
    char cudart_path[] = "/tmp/fake_cudart_log_XXXXXX";
    int fd = mkstemp(cuda_path);
    cr_assert_geq(fd, 0);
    close(fd);
    fd = mkstemp(cudart_path);
    cr_assert_geq(fd, 0);
    close(fd);
    fresh_state("FAKE_CUDA_LOG", cuda_path);
    setenv("FAKE_CUDART_LOG", cudart_path, 1);
    fake_cudart_reset();
    fake_cuda_reset();

    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 0);
    void *primary = primary_state(0).context;
    cr_assert_eq(cuMemHostUnregister(fake_address(8)), 1);
    cr_assert_eq(cuDevicePrimaryCtxReset_v2(0), 0);

    char expected[2048];
    int pid = (int)getpid();
    uintmax_t base = (uintptr_t)fake_address(0);
    uintmax_t handle = (uintptr_t)primary;
    /* The creator is this program, by its /proc/self/exe path. */
    char *text = read_whole_file(cuda_path);
    char creator[1024];
    cr_assert_eq(sscanf(text, "ctx_create %*d 0x%*x 0 primary %1023s", creator), 1, "%s", text);
    cr_assert(strstr(creator, SELF), "creator %s", creator);
    snprintf(expected, sizeof expected,
             "ctx_create %d 0x%jx 0 primary %s\n"
             "cu_register %d 0x%jx 4096 3 0 0 0x%jx\n"
             "cu_unregister %d 0x%jx 1 0 0x%jx\n"
             "ctx_destroy %d 0x%jx 0 reset 1\n",
             pid, handle, creator, pid, base, handle, pid, base + 8, handle, pid, handle);
    cr_assert_str_eq(text, expected);

    /* The runtime double's log has the same calls in its own format, parsed
     * by tests/support/fake_log.c: no driver-only lines. */
    snprintf(expected, sizeof expected,
             "register %d 0x%jx 4096 3 0\n"
             "unregister %d 0x%jx 1\n",
             pid, base, pid, base + 8);
    cr_assert_str_eq(read_whole_file(cudart_path), expected);
    unlink(cuda_path);
    unlink(cudart_path);
}

/* A call that fails before it reaches the driver is logged by the runtime. */
Test(fake_cuda, runtime_logs_what_never_reaches_the_driver)
{
    char path[] = "/tmp/fake_cudart_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    fresh_state("FAKE_CUDART_LOG", path);
    setenv("FAKE_CUDA_DEVICES", "0", 1);
    fake_cudart_reset();
    fake_cuda_reset();
    cr_assert_eq(cudaHostRegister(fake_address(0), 4096, 0), 100);
    cr_assert_eq(cudaHostUnregister(fake_address(0)), 100);
    char expected[256];
    int pid = (int)getpid();
    uintmax_t base = (uintptr_t)fake_address(0);
    snprintf(expected, sizeof expected,
             "register %d 0x%jx 4096 0 100\n"
             "unregister %d 0x%jx 100\n",
             pid, base, pid, base);
    cr_assert_str_eq(read_whole_file(path), expected);
    unlink(path);
}

/* ---- Processes that link the runtime only (fake_cudart_probe). ---- */

/* Runs the probe with extra environment settings; returns its stdout. */
static const char *run_probe(const char *scenario, const char *setting)
{
    const char *probe = getenv("FAKE_CUDART_PROBE");
    if (!probe)
        cr_skip_test("FAKE_CUDART_PROBE not set (run through meson test)");
    char output_path[] = "/tmp/fake_cudart_probe_XXXXXX";
    int fd = mkstemp(output_path);
    cr_assert_geq(fd, 0);
    if (setting)
        putenv((char *)setting);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd, 1);
    char *argv[] = {(char *)probe, (char *)scenario, NULL};
    pid_t child;
    cr_assert_eq(posix_spawn(&child, probe, &actions, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(fd);
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "probe %s: status %d", scenario,
              status);
    const char *text = read_whole_file(output_path);
    unlink(output_path);
    return text;
}

Test(fake_cuda, runtime_loads_the_driver_lazily_and_glibc_finds_it_by_soname)
{
    fresh_state(NULL, NULL);
    const char *text = run_probe("lazy", NULL);
    cr_assert_str_eq(text, "loaded_at_start=0\n"
                           "get_last_error=0\n"
                           "loaded_after_get_last_error=0\n"
                           "get_device_count=0 count=1\n"
                           "loaded_after_get_device_count=1\n"
                           "soname_is_fake=1\n"
                           "soname_is_path=1\n");
}

Test(fake_cuda, missing_driver_is_35_and_never_loaded)
{
    fresh_state(NULL, NULL);
    const char *text = run_probe("no_driver", "FAKE_CUDART_NO_DRIVER=1");
    cr_assert_str_eq(text, "register=35\n"
                           "unregister=35\n"
                           "get_device_count=35 count=-7\n"
                           "set_device=35\n"
                           "free=35\n"
                           "get_last_error=35\n"
                           "loaded=0\n");
    text = run_probe("no_driver", "FAKE_CUDA_DRIVER=/nonexistent/libcuda.so.1");
    cr_assert(strstr(text, "register=35\n") && strstr(text, "loaded=0\n"), "%s", text);
}

/* An exit handler registered before the driver was loaded runs after the
 * driver's own: with FAKE_CUDA_UNLOAD_AT_EXIT=1 the driver answers 4, and the
 * runtime (whose own handler has not run yet) passes the 4 on. */
Test(fake_cuda, driver_teardown_at_exit)
{
    fresh_state("FAKE_CUDART_CHECK", "0");
    setenv("FAKE_CUDA_UNLOAD_AT_EXIT", "1", 1);
    const char *text = run_probe("exit", NULL);
    cr_assert_str_eq(text, "register=0\n"
                           "loaded=1\n"
                           "exit_driver=4\n"
                           "exit_runtime=4\n");
    unsetenv("FAKE_CUDA_UNLOAD_AT_EXIT");
    text = run_probe("exit", NULL);
    cr_assert_str_eq(text, "register=0\n"
                           "loaded=1\n"
                           "exit_driver=0\n"
                           "exit_runtime=713\n");
}

/* ---- What the real driver refuses to pin (fake_cuda.h). ---- */

static void *map_file(const char *directory, int prot, int flags, size_t bytes, int *fd_out)
{
    char path[256];
    snprintf(path, sizeof path, "%s/pinshim-fake-XXXXXX", directory);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp in %s: %s", directory, strerror(errno));
    unlink(path);
    cr_assert_eq(ftruncate(fd, (off_t)bytes), 0);
    void *memory = mmap(NULL, bytes, prot, flags, fd, 0);
    cr_assert(memory != MAP_FAILED, "mmap: %s", strerror(errno));
    *fd_out = fd;
    return memory;
}

Test(fake_cuda, read_only_memory_needs_the_read_only_flag)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *memory = map_pages(4);
    cr_assert_eq(mprotect(memory, 2 * page, PROT_READ), 0);
    /* Pinned for write: refused (vllm-omni #6240: invalid argument). */
    cr_assert_eq(cuMemHostRegister_v2(memory, 2 * page, 0), 1);
    cr_assert_eq(cuMemHostRegister_v2(memory, 4 * page, 0), 1, "one read-only page is enough");
    cr_assert_eq(cuMemHostRegister_v2(memory, 2 * page, FAKE_CU_MEMHOSTREGISTER_READ_ONLY), 0);
    cr_assert_eq(cuMemHostRegister_v2(memory + 2 * page, 2 * page, 3), 0, "the writable rest");
    cr_assert_eq(fake_cuda_live_count(), 2);
    /* No read access at all: never. */
    cr_assert_eq(mprotect(memory + 3 * page, page, PROT_NONE), 0);
    char *other = map_pages(1);
    cr_assert_eq(mprotect(other, page, PROT_NONE), 0);
    cr_assert_eq(cuMemHostRegister_v2(other, page, FAKE_CU_MEMHOSTREGISTER_READ_ONLY), 1);
    /* A hole. */
    char *holed = map_pages(3);
    cr_assert_eq(munmap(holed + page, page), 0);
    cr_assert_eq(cuMemHostRegister_v2(holed, 3 * page, 0), 1);
}

/* FAKE_CUDA_PIN_RULES=0, for tests of other things: no look at the mapping. */
Test(fake_cuda, pin_rules_off_pins_what_the_rules_refuse)
{
    fresh_state("FAKE_CUDA_PIN_RULES", "0");
    init_and_make_current(0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *memory = map_pages(2);
    cr_assert_eq(mprotect(memory, page, PROT_READ), 0);
    cr_assert_eq(mprotect(memory + page, page, PROT_NONE), 0);
    cr_assert_eq(cuMemHostRegister_v2(memory, 2 * page, 0), 0);
    cr_assert_eq(cuMemHostUnregister(memory), 0);
    setenv("FAKE_CUDA_PIN_RULES", "1", 1);
    fake_cuda_reload_config();
    cr_assert_eq(cuMemHostRegister_v2(memory, 2 * page, 0), 1, "the rules again");
}

Test(fake_cuda, read_only_flag_on_a_device_without_support_is_801)
{
    fresh_state("FAKE_CUDA_READ_ONLY_REGISTER", "1,0");
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    fake_cuda_reload_config();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *memory = map_pages(2);
    cr_assert_eq(mprotect(memory, 2 * page, PROT_READ), 0);
    init_and_make_current(1);
    int supported = -1;
    cr_assert_eq(cuDeviceGetAttribute(&supported, 113, 1), 0);
    cr_assert_eq(supported, 0);
    cr_assert_eq(cuMemHostRegister_v2(memory, page, FAKE_CU_MEMHOSTREGISTER_READ_ONLY), 801);
    cr_assert_eq(cuDeviceGetAttribute(&supported, 113, 0), 0);
    cr_assert_eq(supported, 1);
    init_and_make_current(0);
    cr_assert_eq(cuMemHostRegister_v2(memory, page, FAKE_CU_MEMHOSTREGISTER_READ_ONLY), 0);
    /* The runtime asks the same. */
    cr_assert_eq(cudaDeviceGetAttribute(&supported, 113, 1), 0);
    cr_assert_eq(supported, 0);
    cr_assert_eq(cudaDeviceGetAttribute(&supported, 99, 0), 0);
    cr_assert_eq(supported, 1);
    cr_assert_eq(cudaDeviceGetAttribute(&supported, 113, 7), 101, "no device 7");
    unsetenv("FAKE_CUDA_DEVICES");
}

Test(fake_cuda, writable_shared_file_mappings_are_not_long_term_pinnable)
{
    const char *build = test_writeback_directory();
    if (build == NULL)
        cr_skip_test("no writable directory on a disk file system (., /var/tmp, /tmp)");
    fresh_state("FAKE_CUDA_LONGTERM_PINS", "1");
    init_and_make_current(0);
    size_t bytes = 4 * (size_t)sysconf(_SC_PAGESIZE);
    int fd;
    /* A file of a file system that writes back: refused for write... */
    char *shared = map_file(build, PROT_READ | PROT_WRITE, MAP_SHARED, bytes, &fd);
    cr_assert_eq(cuMemHostRegister_v2(shared, bytes, 0), 1);
    /* ...fine read-only, and private (copy-on-write) or without long-term pins. */
    cr_assert_eq(cuMemHostRegister_v2(shared, bytes, FAKE_CU_MEMHOSTREGISTER_READ_ONLY), 0);
    close(fd);
    char *private_map = map_file(build, PROT_READ | PROT_WRITE, MAP_PRIVATE, bytes, &fd);
    cr_assert_eq(cuMemHostRegister_v2(private_map, bytes, 0), 0);
    close(fd);
    /* shmem: memfd, shared anonymous memory, /dev/shm. */
    int memfd = (int)syscall(SYS_memfd_create, "fake", 0);
    cr_assert_geq(memfd, 0);
    cr_assert_eq(ftruncate(memfd, (off_t)bytes), 0);
    void *memfd_map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    cr_assert(memfd_map != MAP_FAILED);
    cr_assert_eq(cuMemHostRegister_v2(memfd_map, bytes, 0), 0);
    void *anonymous = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_eq(cuMemHostRegister_v2(anonymous, bytes, 0), 0);
    char *tmpfs = map_file("/dev/shm", PROT_READ | PROT_WRITE, MAP_SHARED, bytes, &fd);
    cr_assert_eq(cuMemHostRegister_v2(tmpfs, bytes, 0), 0);
    close(fd);

    fresh_state("FAKE_CUDA_LONGTERM_PINS", "0");
    init_and_make_current(0);
    shared = map_file(build, PROT_READ | PROT_WRITE, MAP_SHARED, bytes, &fd);
    cr_assert_eq(cuMemHostRegister_v2(shared, bytes, 0), 0, "a short-term pin is allowed");
    close(fd);
}

Test(fake_cuda, with_host_page_tables_registration_only_populates)
{
    fresh_state("FAKE_CUDA_HOST_PAGE_TABLES", "1");
    setenv("FAKE_CUDA_LONGTERM_PINS", "1", 1);
    fake_cuda_reload_config();
    init_and_make_current(0);
    int uses = -1;
    cr_assert_eq(cuDeviceGetAttribute(&uses, 100, 0), 0);
    cr_assert_eq(uses, 1);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *memory = map_pages(2);
    cr_assert_eq(mprotect(memory, 2 * page, PROT_READ), 0);
    cr_assert_eq(cuMemHostRegister_v2(memory, 2 * page, 0), 0, "read-only needs no flag");
    int fd;
    const char *directory = test_writeback_directory();
    if (directory != NULL) {
        char *shared = map_file(directory, PROT_READ | PROT_WRITE, MAP_SHARED, 2 * page, &fd);
        cr_assert_eq(cuMemHostRegister_v2(shared, 2 * page, 0), 0, "no long-term pin");
        close(fd);
    }
    char *holed = map_pages(3);
    cr_assert_eq(munmap(holed + page, page), 0);
    cr_assert_eq(cuMemHostRegister_v2(holed, 3 * page, 0), 1, "a hole all the same");
}

Test(fake_cuda, host_alloc_locks_its_memory_itself_and_maps_it)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    void *memory = NULL;
    cr_assert_eq(cuMemHostAlloc(&memory, 100000, 0), 0);
    cr_assert_not_null(memory);
    struct fake_cuda_registration registration;
    cr_assert_eq(fake_cuda_lookup(memory, &registration), 1);
    cr_assert_eq(registration.size % (size_t)sysconf(_SC_PAGESIZE), 0);
    cr_assert_eq(cuMemHostRegister_v2(memory, 4096, 0), 712);
    cr_assert_eq(cuMemHostUnregister(memory), 1, "not a registration");
    unsigned long long device_pointer = 0;
    cr_assert_eq(cuMemHostGetDevicePointer_v2(&device_pointer, (char *)memory + 8, 0), 0);
    cr_assert_eq(device_pointer, (unsigned long long)(uintptr_t)memory + 8);
    cr_assert_eq(cuMemHostGetDevicePointer_v2(&device_pointer, memory, 1), 1, "flags");
    cr_assert_eq(cuMemFreeHost((char *)memory + 8), 1);
    cr_assert_eq(cuMemFreeHost(memory), 0);
    cr_assert_eq(fake_cuda_live_count(), 0);
    /* The runtime's: cudaHostAlloc, cudaHostGetDevicePointer, cudaFreeHost. */
    void *pinned = NULL, *device = NULL;
    cr_assert_eq(cudaMallocHost(&pinned, 4096), 0);
    cr_assert_eq(cudaHostGetDevicePointer(&device, pinned, 0), 0);
    cr_assert_eq(device, pinned);
    cr_assert_eq(cudaFreeHost(pinned), 0);
    char *plain = map_pages(1);
    cr_assert_eq(cudaHostGetDevicePointer(&device, plain, 0), 1, "not registered");
    cr_assert_eq(cudaGetLastError(), 1);
    cr_assert_eq(cudaHostRegister(plain, 4096, FAKE_CU_MEMHOSTREGISTER_PORTABLE), 0);
    cr_assert_eq(cudaHostGetDevicePointer(&device, plain, 0), 1, "registered without DEVICEMAP");
    cr_assert_eq(cudaHostUnregister(plain), 0);
    cr_assert_eq(cudaHostRegister(plain, 4096, 0), 0);
    cr_assert_eq(cudaHostGetDevicePointer(&device, plain, 0), 0, "the default maps it");
}

/* ---- Device memory and copies: the memcpy rule. ---- */

/* What the driver counted, by enum fake_cuda_copy_kind. */
struct copy_tally {
    uint64_t pinned, pageable, refused, device, host, invalid;
};

static struct copy_tally copy_tally(void)
{
    return (struct copy_tally){
        .pinned = fake_cuda_copy_count(FAKE_CUDA_COPY_PINNED),
        .pageable = fake_cuda_copy_count(FAKE_CUDA_COPY_PAGEABLE),
        .refused = fake_cuda_copy_count(FAKE_CUDA_COPY_REFUSED),
        .device = fake_cuda_copy_count(FAKE_CUDA_COPY_DEVICE),
        .host = fake_cuda_copy_count(FAKE_CUDA_COPY_HOST),
        .invalid = fake_cuda_copy_count(FAKE_CUDA_COPY_INVALID),
    };
}

static void assert_tally(struct copy_tally expected)
{
    struct copy_tally seen = copy_tally();
    cr_assert(memcmp(&seen, &expected, sizeof seen) == 0,
              "copies pinned %ju pageable %ju refused %ju device %ju host %ju invalid %ju, "
              "expected %ju %ju %ju %ju %ju %ju",
              (uintmax_t)seen.pinned, (uintmax_t)seen.pageable, (uintmax_t)seen.refused,
              (uintmax_t)seen.device, (uintmax_t)seen.host, (uintmax_t)seen.invalid,
              (uintmax_t)expected.pinned, (uintmax_t)expected.pageable, (uintmax_t)expected.refused,
              (uintmax_t)expected.device, (uintmax_t)expected.host, (uintmax_t)expected.invalid);
}

static size_t page_bytes(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* A pattern that differs between seeds and along the buffer. */
static void fill(char *memory, size_t bytes, unsigned seed)
{
    for (size_t i = 0; i < bytes; i++)
        memory[i] = (char)(seed * 31 + i * 7 + i / 251);
}

static bool holds(const char *memory, size_t bytes, unsigned seed)
{
    for (size_t i = 0; i < bytes; i++) {
        if (memory[i] != (char)(seed * 31 + i * 7 + i / 251))
            return false;
    }
    return true;
}

static CUdeviceptr device_buffer(size_t bytes)
{
    CUdeviceptr buffer = 0;
    cr_assert_eq(cuMemAlloc_v2(&buffer, bytes), 0);
    cr_assert(fake_cuda_is_device_pointer(buffer), "0x%llx", buffer);
    return buffer;
}

/* Device contents, read through a scratch mapping that is registered nowhere
 * (a pageable copy: counted as one). */
static bool device_holds(CUdeviceptr buffer, size_t bytes, unsigned seed)
{
    size_t pages = (bytes + page_bytes() - 1) / page_bytes();
    char *scratch = map_pages(pages);
    cr_assert_eq(cuMemcpyDtoH_v2(scratch, buffer, bytes), 0);
    bool same = holds(scratch, bytes, seed);
    cr_assert_eq(munmap(scratch, pages * page_bytes()), 0);
    return same;
}

Test(fake_cuda, copies_inside_one_registration_are_pinned_and_move_the_data)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *host = map_pages(4);
    cr_assert_eq(cuMemHostRegister_v2(host, 4 * page, 0), 0);
    CUdeviceptr device = device_buffer(4 * page);

    fill(host, 2 * page, 1);
    fill(host + 2 * page, 2 * page, 2);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 2 * page), 0);
    cr_assert_eq(cuMemcpyDtoH_v2(host + 2 * page, device, 2 * page), 0);
    cr_assert(holds(host + 2 * page, 2 * page, 1), "the bytes went there and back");

    /* Async, on the NULL stream and on CU_STREAM_LEGACY, at interior device
     * addresses and odd host offsets. */
    fill(host + 5, page, 3);
    cr_assert_eq(cuMemcpyHtoDAsync_v2(device + 1000, host + 5, page, NULL), 0);
    cr_assert_eq(
        cuMemcpyDtoHAsync_v2(host + 2 * page + 7, device + 1000, page, (CUstream)(uintptr_t)1), 0);
    cr_assert_eq(cuStreamSynchronize(NULL), 0);
    cr_assert(holds(host + 2 * page + 7, page, 3));

    assert_tally((struct copy_tally){.pinned = 4});
    cr_assert_eq(fake_cuda_copy_bytes(FAKE_CUDA_COPY_PINNED), 6 * page);
    cr_assert_eq(fake_cuda_copy_bytes(FAKE_CUDA_COPY_PAGEABLE), 0);
    cr_assert_eq(fake_cuda_call_count(FAKE_CU_CALL_MEMCPY_HTOD_ASYNC_V2), 1);
    cr_assert_eq(cuMemFree_v2(device), 0);
    cr_assert_eq(fake_cuda_device_allocations(), 0);
}

Test(fake_cuda, runtime_copies_inside_one_registration)
{
    fresh_state(NULL, NULL);
    size_t page = page_bytes();
    void *device = NULL;
    cr_assert_eq(cudaMalloc(&device, 2 * page), 0, "the first call: it creates the context");
    cr_assert_eq(fake_cuda_contexts_created_by(SELF), 1, "attributed to the runtime's caller");
    cr_assert_eq(fake_cuda_contexts_created_by(RUNTIME), 0);
    cr_assert(fake_cuda_is_device_pointer((uintptr_t)device));
    char *host = map_pages(2);
    cr_assert_eq(cudaHostRegister(host, 2 * page, 0), 0);

    fill(host, page, 4);
    cr_assert_eq(cudaMemcpy(device, host, page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 0);
    cr_assert_eq(cudaMemcpy(host + page, device, page, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST), 0);
    cr_assert(holds(host + page, page, 4));

    fill(host, page, 5);
    cr_assert_eq(cudaMemcpyAsync(device, host, page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE, NULL), 0);
    cr_assert_eq(cudaMemcpyAsync(host + page, device, page, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST, NULL),
                 0);
    cr_assert_eq(cudaStreamSynchronize(NULL), 0);
    cr_assert(holds(host + page, page, 5));

    fill(host, page, 6);
    cr_assert_eq(cudaMemcpy(device, host, page, FAKE_CUDA_MEMCPY_DEFAULT), 0);
    cr_assert_eq(cudaMemcpy(host + page, device, page, FAKE_CUDA_MEMCPY_DEFAULT), 0);
    cr_assert(holds(host + page, page, 6));
    assert_tally((struct copy_tally){.pinned = 6});
    cr_assert_eq(fake_cudart_copy_count(FAKE_CUDA_COPY_PINNED), 6);

    /* Device to device, and the runtime's own host to host. */
    void *other = NULL;
    cr_assert_eq(cudaMalloc(&other, page), 0);
    cr_assert_eq(cudaMemcpy(other, device, page, FAKE_CUDA_MEMCPY_DEVICE_TO_DEVICE), 0);
    fill(host + page, page, 0);
    cr_assert_eq(cudaMemcpyAsync(host + page, other, page, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST, NULL),
                 0);
    cr_assert(holds(host + page, page, 6));
    fill(host, page, 7);
    cr_assert_eq(cudaMemcpy(host + page, host, page, FAKE_CUDA_MEMCPY_HOST_TO_HOST), 0);
    cr_assert(holds(host + page, page, 7));
    assert_tally((struct copy_tally){.pinned = 7, .device = 1});
    cr_assert_eq(fake_cudart_call_count(FAKE_CALL_MEMCPY), 6);
    cr_assert_eq(fake_cudart_call_count(FAKE_CALL_MEMCPY_ASYNC), 3);
    cr_assert_eq(cudaGetLastError(), 0);

    cr_assert_eq(cudaFree(device), 0);
    cr_assert_eq(cudaFree(other), 0);
    cr_assert_eq(fake_cuda_device_allocations(), 0);
    cr_assert_eq(cudaFree(device), 1, "twice");
    cr_assert_eq(cudaGetLastError(), 1);
}

Test(fake_cuda, copies_from_unregistered_memory_are_pageable)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *host = map_pages(4);
    CUdeviceptr device = device_buffer(2 * page);
    /* A registration right after the range: touching is not overlapping. */
    cr_assert_eq(cuMemHostRegister_v2(host + 2 * page, 2 * page, 0), 0);

    fill(host, 2 * page, 8);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 2 * page), 0);
    fill(host, 2 * page, 0);
    cr_assert_eq(cuMemcpyDtoHAsync_v2(host, device, 2 * page, NULL), 0);
    cr_assert(holds(host, 2 * page, 8));
    fill(host, page, 9);
    cr_assert_eq(cudaMemcpy((void *)(uintptr_t)device, host, page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE),
                 0);
    cr_assert_eq(cudaMemcpyAsync(host + page, (void *)(uintptr_t)device, page,
                                 FAKE_CUDA_MEMCPY_DEVICE_TO_HOST, NULL),
                 0);
    cr_assert(holds(host + page, page, 9));
    assert_tally((struct copy_tally){.pageable = 4});
    cr_assert_eq(fake_cuda_copy_bytes(FAKE_CUDA_COPY_PAGEABLE), 6 * page);
    cr_assert_eq(cudaGetLastError(), 0);
}

/* Measured on an H200 (driver 580): two registrations of neighbouring pages,
 * and a copy across the joint, is cudaErrorInvalidValue in both directions,
 * with cudaMemcpy and cudaMemcpyAsync. */
Test(fake_cuda, a_copy_across_two_adjacent_registrations_is_refused)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *host = map_pages(4);
    cr_assert_eq(cuMemHostRegister_v2(host, 2 * page, 0), 0);
    cr_assert_eq(cuMemHostRegister_v2(host + 2 * page, 2 * page, 0), 0);
    CUdeviceptr device = device_buffer(2 * page);
    void *device_address = (void *)(uintptr_t)device;

    fill(host, 2 * page, 10);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 2 * page), 0, "inside the first one");
    fill(host, 4 * page, 11);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + page, 2 * page), 1);
    cr_assert_eq(cuMemcpyHtoDAsync_v2(device, host + page, 2 * page, NULL), 1);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + 2 * page - 1, 2), 1, "two bytes across the joint");
    cr_assert_eq(cudaMemcpy(device_address, host + page, 2 * page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE),
                 1);
    cr_assert_eq(cudaMemcpyAsync(device_address, host + page, 2 * page,
                                 FAKE_CUDA_MEMCPY_HOST_TO_DEVICE, NULL),
                 1);
    cr_assert_eq(cudaMemcpy(device_address, host + page, 2 * page, FAKE_CUDA_MEMCPY_DEFAULT), 1);
    cr_assert_eq(cudaGetLastError(), 1);
    assert_tally((struct copy_tally){.pinned = 1, .refused = 6});
    cr_assert(device_holds(device, 2 * page, 10), "nothing copied to the device");

    cr_assert_eq(cuMemcpyDtoH_v2(host + page, device, 2 * page), 1);
    cr_assert_eq(cuMemcpyDtoHAsync_v2(host + page, device, 2 * page, NULL), 1);
    cr_assert_eq(cudaMemcpy(host + page, device_address, 2 * page, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST),
                 1);
    cr_assert_eq(cudaMemcpyAsync(host + page, device_address, 2 * page,
                                 FAKE_CUDA_MEMCPY_DEVICE_TO_HOST, NULL),
                 1);
    cr_assert_eq(cudaGetLastError(), 1);
    cr_assert(holds(host, 4 * page, 11), "nothing copied to the host");
    assert_tally((struct copy_tally){.pinned = 1, .pageable = 1, .refused = 10});

    /* Each half on its own is pinned. */
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + page, page), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(device + page, host + 2 * page, page), 0);
    cr_assert_eq(cuMemcpyDtoH_v2(host + 2 * page, device, page), 0);
    assert_tally((struct copy_tally){.pinned = 4, .pageable = 1, .refused = 10});
    cr_assert_eq(fake_cuda_copy_bytes(FAKE_CUDA_COPY_REFUSED), 18 * page + 2);

    /* One of them gone: the range mixes registered and unregistered bytes. */
    cr_assert_eq(cuMemHostUnregister(host + 2 * page), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + page, 2 * page), 1);
    /* Both gone: pageable. */
    cr_assert_eq(cuMemHostUnregister(host), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + page, 2 * page), 0);
    assert_tally((struct copy_tally){.pinned = 4, .pageable = 2, .refused = 11});
}

Test(fake_cuda, a_copy_mixing_registered_and_unregistered_bytes_is_refused)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *host = map_pages(4);
    cr_assert_eq(cuMemHostRegister_v2(host + page, 2 * page, 0), 0);
    CUdeviceptr device = device_buffer(4 * page);
    void *device_address = (void *)(uintptr_t)device;
    fill(host, 4 * page, 12);

    /* Starts inside the registration and runs out of it. */
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + 2 * page, 2 * page), 1);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + page, 2 * page + 1), 1, "one byte out");
    cr_assert_eq(cuMemcpyDtoH_v2(host + 2 * page, device, 2 * page), 1);
    cr_assert_eq(
        cudaMemcpy(host + 2 * page, device_address, 2 * page, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST), 1);
    /* Starts outside and runs into it. */
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 2 * page), 1);
    cr_assert_eq(cuMemcpyHtoDAsync_v2(device, host + page - 1, 2, NULL), 1, "one byte in");
    cr_assert_eq(cuMemcpyDtoHAsync_v2(host, device, 2 * page, NULL), 1);
    cr_assert_eq(cudaMemcpy(device_address, host, 2 * page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 1);
    /* Covers it. */
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 4 * page), 1);
    assert_tally((struct copy_tally){.refused = 9});
    cr_assert(holds(host, 4 * page, 12), "nothing copied to the host");
    /* The device memory is as cuMemAlloc_v2 left it: zeroed. */
    char *zero = map_pages(4);
    memset(zero, 0, 4 * page);
    char *scratch = map_pages(4);
    cr_assert_eq(cuMemcpyDtoH_v2(scratch, device, 4 * page), 0);
    cr_assert(memcmp(scratch, zero, 4 * page) == 0, "nothing copied to the device");

    /* Exactly the registration, or exactly outside it. */
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + page, 2 * page), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, page), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + 3 * page, page), 0);
    assert_tally((struct copy_tally){.pinned = 1, .pageable = 3, .refused = 9});
}

Test(fake_cuda, copies_from_host_alloc_memory_are_pinned)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *memory = NULL;
    cr_assert_eq(cuMemHostAlloc((void **)&memory, 3 * page, 0), 0);
    CUdeviceptr device = device_buffer(page);
    fill(memory, page, 13);
    cr_assert_eq(cuMemcpyHtoD_v2(device, memory, page), 0);
    cr_assert_eq(cuMemcpyDtoH_v2(memory + 2 * page, device, page), 0);
    cr_assert(holds(memory + 2 * page, page, 13));
    /* Running off its end mixes it with whatever follows. */
    cr_assert_eq(cuMemcpyHtoD_v2(device, memory + 3 * page - 10, 20), 1);
    assert_tally((struct copy_tally){.pinned = 2, .refused = 1});

    /* The runtime's cudaMallocHost, with the kind inferred. */
    char *pinned = NULL;
    void *device_address = NULL;
    cr_assert_eq(cudaMallocHost((void **)&pinned, 2 * page), 0);
    cr_assert_eq(cudaMalloc(&device_address, page), 0);
    fill(pinned, page, 14);
    cr_assert_eq(cudaMemcpy(device_address, pinned, page, FAKE_CUDA_MEMCPY_DEFAULT), 0);
    cr_assert_eq(
        cudaMemcpyAsync(pinned + page, device_address, page, FAKE_CUDA_MEMCPY_DEFAULT, NULL), 0);
    cr_assert(holds(pinned + page, page, 14));
    assert_tally((struct copy_tally){.pinned = 4, .refused = 1});
    cr_assert_eq(cudaFreeHost(pinned), 0);
    cr_assert_eq(cuMemFreeHost(memory), 0);
}

Test(fake_cuda, copies_need_a_valid_device_range)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    char *host = map_pages(1);
    CUdeviceptr device = device_buffer(1000);
    cr_assert_eq(cuMemcpyHtoD_v2(0, host, 10), 1, "NULL");
    cr_assert_eq(cuMemcpyHtoD_v2(device + 1000, host, 1), 1, "just past the end");
    cr_assert_eq(cuMemcpyHtoD_v2(device + 990, host, 11), 1, "runs past the end");
    cr_assert_eq(cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)host, host, 10), 1, "a host address");
    cr_assert_eq(cuMemcpyHtoD_v2(device - 1, host, 10), 1, "before it");
    cr_assert_eq(cuMemcpyDtoH_v2(host, device + 1000, 1), 1);
    cr_assert_eq(cuMemcpyDtoHAsync_v2(host, device + 999, 2, NULL), 1);
    cr_assert_eq(cuMemcpyDtoD_v2(device, device + 500, 501), 1);
    cr_assert_eq(cuMemcpyHtoD_v2(device, NULL, 10), 1, "NULL host");
    cr_assert_eq(cuMemcpyDtoH_v2((void *)(uintptr_t)device, device, 10), 1, "device as host");
    assert_tally((struct copy_tally){.invalid = 10});
    cr_assert_eq(cuMemcpyHtoD_v2(device + 990, host, 10), 0, "the last bytes");
    cr_assert_eq(cuMemcpyHtoD_v2(0, NULL, 0), 0, "0 bytes: nothing looked at");
    assert_tally((struct copy_tally){.pageable = 1, .invalid = 10});

    /* Allocation and freeing. */
    CUdeviceptr other = 0;
    cr_assert_eq(cuMemAlloc_v2(&other, 0), 1, "cuda.h: 0 bytes");
    cr_assert_eq(cuMemAlloc_v2(NULL, 8), 1);
    cr_assert_eq(cuMemFree_v2(device + 8), 1, "interior");
    cr_assert_eq(cuMemFree_v2(0), 1);
    cr_assert_eq(cuMemFree_v2(device), 0);
    cr_assert_eq(cuMemFree_v2(device), 1, "twice");
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 10), 1, "freed");
    cr_assert_eq(fake_cuda_device_allocations(), 0);
    other = device_buffer(1000);
    cr_assert_neq(other, device, "addresses are not reused");

    /* The runtime. */
    void *none = host;
    cr_assert_eq(cudaMalloc(&none, 0), 0);
    cr_assert_null(none, "size 0: NULL");
    cr_assert_eq(cudaMalloc(NULL, 8), 1);
    cr_assert_eq(cudaMemcpy(host, host, 10, 5), 21);
    cr_assert_eq(cudaMemcpyAsync(host, host, 10, -1, NULL), 21);
    cr_assert_str_eq(cudaGetErrorName(21), "cudaErrorInvalidMemcpyDirection");
    cr_assert_eq(cudaMemcpy(host, host, 10, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 1, "not device");
    cr_assert_eq(cudaMemcpy((void *)(uintptr_t)(device), host, 10, FAKE_CUDA_MEMCPY_DEFAULT), 1,
                 "freed");
    cr_assert_eq(cudaMemcpy(NULL, host, 10, FAKE_CUDA_MEMCPY_HOST_TO_HOST), 1);
    cr_assert_eq(cudaGetLastError(), 1);
    cr_assert_eq(cudaFree(host), 1, "not device memory");
    assert_tally((struct copy_tally){.pageable = 1, .invalid = 13});
}

Test(fake_cuda, copies_need_the_state_and_a_context)
{
    fresh_state(NULL, NULL);
    char *host = map_pages(1);
    CUdeviceptr device = 0;
    cr_assert_eq(cuMemcpyHtoD_v2(1, host, 10), 3);
    cr_assert_eq(cuMemAlloc_v2(&device, 10), 3);
    cr_assert_eq(cuStreamSynchronize(NULL), 3);
    cr_assert_eq(cuInit(0), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(1, host, 10), 201, "no context");
    cr_assert_eq(cuMemcpy(1, (CUdeviceptr)(uintptr_t)host, 10), 201);
    cr_assert_eq(cuMemAlloc_v2(&device, 10), 201);
    cr_assert_eq(cuMemFree_v2(1), 201);
    cr_assert_eq(cuStreamSynchronize(NULL), 201);
    assert_tally((struct copy_tally){0});

    /* Allocations go with their context. */
    init_and_make_current(0);
    device = device_buffer(4096);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 10), 0);
    cr_assert_eq(cuDevicePrimaryCtxReset_v2(0), 0);
    cr_assert_eq(fake_cuda_device_allocations(), 0);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 10), 709, "the current context is destroyed");
    init_and_make_current(0);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 10), 1, "the allocation went with it");
    assert_tally((struct copy_tally){.pageable = 1, .invalid = 1});

    /* And with a reset of the double. */
    device = device_buffer(4096);
    fake_cuda_reset();
    cr_assert_eq(fake_cuda_device_allocations(), 0);
    assert_tally((struct copy_tally){0});
}

Test(fake_cuda, unified_copies_infer_each_side)
{
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *host = map_pages(4);
    CUdeviceptr device = device_buffer(page), other = device_buffer(page);
    CUdeviceptr host_address = (CUdeviceptr)(uintptr_t)host;
    fill(host, page, 15);
    cr_assert_eq(cuMemcpy(device, host_address, page), 0);
    cr_assert_eq(cuMemcpyAsync(other, device, page, NULL), 0);
    cr_assert_eq(cuMemcpyDtoD_v2(device, other, page), 0);
    cr_assert_eq(cuMemcpyDtoDAsync_v2(other, device, page, NULL), 0);
    cr_assert_eq(cuMemcpy(host_address + page, other, page), 0);
    cr_assert(holds(host + page, page, 15));
    fill(host, page, 16);
    cr_assert_eq(cuMemcpyAsync(host_address + 2 * page, host_address, page, NULL), 0);
    cr_assert(holds(host + 2 * page, page, 16));
    cr_assert_eq(cudaMemcpy(host + 3 * page, host, page, FAKE_CUDA_MEMCPY_DEFAULT), 0);
    cr_assert(holds(host + 3 * page, page, 16));
    assert_tally((struct copy_tally){.pageable = 2, .device = 3, .host = 2});

    /* The rule applies to the host side however the kind was found. */
    cr_assert_eq(cuMemHostRegister_v2(host, page, 0), 0);
    cr_assert_eq(cuMemHostRegister_v2(host + page, page, 0), 0);
    cr_assert_eq(cuMemcpy(device, host_address + 100, page), 1);
    cr_assert_eq(cuMemcpyAsync(host_address + 100, device, page, NULL), 1);
    cr_assert_eq(cuMemcpy(device, host_address + 100, page - 100), 0);
    /* Host to host has no rule. */
    cr_assert_eq(cuMemcpy(host_address + 2 * page, host_address + 100, page), 0);
    assert_tally(
        (struct copy_tally){.pinned = 1, .pageable = 2, .refused = 2, .device = 3, .host = 3});
}

/* A registration still sleeping in simulated latency counts as registered:
 * a copy inside it is pinned, one running out of it refused. */
Test(fake_cuda, a_registration_in_flight_counts_as_registered)
{
    fresh_state("FAKE_CUDA_REGISTER_SECONDS_PER_GIB", "1000");
    void *device = NULL;
    cr_assert_eq(cudaMalloc(&device, 4096), 0);
    pthread_t registering;
    cr_assert_eq(pthread_create(&registering, NULL, register_one_gib, NULL), 0);
    cr_assert(wait_until(one_registration_in_flight, "the registration's sleep"));
    cr_assert_eq(fake_cuda_live_count(), 0);
    cr_assert_eq(cudaMemcpy(device, fake_address(4096), 100, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 0);
    cr_assert_eq(cudaMemcpy(device, fake_address(0) - 50, 100, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 1);
    cr_assert_eq(cudaMemcpy(fake_address(GiB - 50), device, 100, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST),
                 1);
    assert_tally((struct copy_tally){.pinned = 1, .refused = 2});
    fake_cuda_wake_sleepers();
    void *error;
    cr_assert_eq(pthread_join(registering, &error), 0);
    cr_assert_eq((intptr_t)error, 0);
}

Test(fake_cuda, a_refused_copy_is_logged_to_the_driver_log_only)
{
    char cuda_path[] = "/tmp/fake_cuda_log_XXXXXX";
    char cudart_path[] = "/tmp/fake_cudart_log_XXXXXX";
    int fd = mkstemp(cuda_path);
    cr_assert_geq(fd, 0);
    close(fd);
    fd = mkstemp(cudart_path);
    cr_assert_geq(fd, 0);
    close(fd);
    fresh_state("FAKE_CUDA_LOG", cuda_path);
    setenv("FAKE_CUDART_LOG", cudart_path, 1);
    fake_cudart_reset();
    fake_cuda_reset();

    size_t page = page_bytes();
    char *host = map_pages(2);
    cr_assert_eq(cudaHostRegister(host, page, 0), 0);
    cr_assert_eq(cudaHostRegister(host + page, page, 0), 0);
    void *device = NULL;
    cr_assert_eq(cudaMalloc(&device, 2 * page), 0);
    cr_assert_eq(cudaMemcpy(device, host, page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 0);
    cr_assert_eq(cudaMemcpy(device, host + 8, page, FAKE_CUDA_MEMCPY_HOST_TO_DEVICE), 1);
    cr_assert_eq(cudaMemcpyAsync(host + 16, device, page, FAKE_CUDA_MEMCPY_DEVICE_TO_HOST, NULL),
                 1);

    char expected[512];
    int pid = (int)getpid();
    uintmax_t base = (uintptr_t)host;
    uintmax_t handle = (uintptr_t)primary_state(0).context;
    snprintf(expected, sizeof expected,
             "copy_refused %d 0x%jx %zu htod 0 0x%jx\n"
             "copy_refused %d 0x%jx %zu dtoh 0 0x%jx\n",
             pid, base + 8, page, handle, pid, base + 16, page, handle);
    char *text = read_whole_file(cuda_path);
    char *first = strstr(text, "copy_refused");
    cr_assert_not_null(first, "%s", text);
    cr_assert_str_eq(first, expected);

    snprintf(expected, sizeof expected,
             "register %d 0x%jx %zu 3 0\n"
             "register %d 0x%jx %zu 3 0\n",
             pid, base, page, pid, base + page, page);
    cr_assert_str_eq(read_whole_file(cudart_path), expected, "nothing about copies");
    unlink(cuda_path);
    unlink(cudart_path);
}

/* process_vm_readv on the process itself, as the driver double copies. */
static bool self_copy_works(void)
{
    char from[8] = "copy me", to[8] = {0};
    struct iovec local = {to, sizeof to}, remote = {from, sizeof from};
    return syscall(SYS_process_vm_readv, (pid_t)getpid(), &local, 1UL, &remote, 1UL, 0UL) ==
               (long)sizeof to &&
           memcmp(from, to, sizeof to) == 0;
}

Test(fake_cuda, a_host_range_that_faults_is_invalid_not_a_crash)
{
    if (!self_copy_works())
        cr_skip_test("process_vm_readv refused here: the double copies with memcpy");
    fresh_state(NULL, NULL);
    init_and_make_current(0);
    size_t page = page_bytes();
    char *host = map_pages(3);
    cr_assert_eq(munmap(host + page, page), 0);
    cr_assert_eq(mprotect(host + 2 * page, page, PROT_READ), 0);
    CUdeviceptr device = device_buffer(2 * page);
    cr_assert_eq(cuMemcpyHtoD_v2(device, host, 2 * page), 1, "runs into a hole");
    cr_assert_eq(cuMemcpyDtoH_v2(host + 2 * page, device, 10), 1, "read-only");
    cr_assert_eq(cuMemcpyHtoD_v2(device, host + 2 * page, 10), 0, "reading it is fine");
    assert_tally((struct copy_tally){.pageable = 1, .invalid = 2});
}
