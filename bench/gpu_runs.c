/* gpu_runs: issue 34's copies on a GPU. A program locks its buffers in pieces
 * and copies each buffer whole; run once without the shim and once under
 * LD_PRELOAD=libpinshim.so (bench/gpu-check.sh runs both), it shows whether
 * the shim changes what a copy returns. On an H200 a copy whose host range ran
 * from one registration into the next failed with cudaErrorInvalidValue
 * (results/2026-12-04-h200.md), so the shim keeps one registration per run of
 * contiguous locked pages of one object. The scenarios:
 *
 *   two-adjacent  16 MiB mmap'd once, locked in two 8 MiB mlock calls
 *   grown         8 MiB mmap'd, mlock of its first 2 MiB, then of all 8 MiB
 *   shared-page   two malloc'd heap buffers of about 100 KiB, the second on
 *                 the first one's last page (whether they share it is
 *                 printed), each locked
 *   half-locked   4 MiB mmap'd, only its first 2 MiB locked; copied whole,
 *                 then its locked half alone
 *
 * Each buffer is copied whole with cudaMemcpy H2D and D2H, and with
 * cudaMemcpyAsync + cudaStreamSynchronize H2D and D2H; the bytes are checked
 * through a pageable scratch buffer. One line per copy:
 *
 *   COPY scenario copy direction mode result=N name gbps=X type=T bytes=B
 *        expected=E verdict=ok|FAIL
 *
 * gbps is the median of --reps copies (wall clock around the call, and around
 * enqueue + synchronize for async), "-" when the copy failed; type is
 * cudaPointerGetAttributes' type of the buffer's first byte right before the
 * copy (0 unregistered, 1 host: pinned; -1 the call failed); bytes is intact,
 * WRONG, or "-" when the copy failed. Under the shim (found with
 * dlsym(RTLD_DEFAULT, "pinshim_is_registered")) a REGS line per scenario
 * gives pinshim_is_registered at each buffer's first and last byte and how
 * many registrations the shim made for it (its live_ranges counter, after
 * pinshim_drain).
 *
 * Expected, and judged: without the shim every copy succeeds with the bytes
 * intact and type 0 (pageable). Under the shim every copy of locked memory
 * succeeds, intact, type 1 (pinned), each scenario is one registration, and
 * half-locked's whole copy fails with cudaErrorInvalidValue (1): a copy that
 * spans registered and unregistered memory is a documented limit. A line that
 * differs says verdict=FAIL; the last line is PASS or FAIL with the count.
 *
 * The runtime is reached with dlopen/dlsym (the CUDA headers give the types
 * only), so a dry run can use the fake runtime and driver of
 * tests/fake_cudart: --cudart LIB. Exits 0 when every line is as expected, 1
 * when one is not, 2 when there is no usable GPU.
 *
 *   gpu_runs [--cudart LIB] [--reps N] */
#include "bench_util.h"

#include <pinshim.h>

#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define LARGEST (16 * MIB)
#define MAX_REPS 50

/* ---- the runtime, by dlsym ---- */

static struct {
    cudaError_t (*get_device_count)(int *);
    cudaError_t (*malloc_)(void **, size_t);
    cudaError_t (*free_)(void *);
    cudaError_t (*memcpy_)(void *, const void *, size_t, enum cudaMemcpyKind);
    cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
    cudaError_t (*stream_synchronize)(cudaStream_t);
    cudaError_t (*pointer_attributes)(struct cudaPointerAttributes *, const void *);
    const char *(*error_name)(cudaError_t);
    /* optional: without them, the default stream and no clearing */
    cudaError_t (*get_last_error)(void);
    cudaError_t (*stream_create)(cudaStream_t *, unsigned);
    cudaError_t (*stream_destroy)(cudaStream_t);
} rt;

/* The shim's calls, when it is loaded. */
static struct {
    int (*is_registered)(const void *);
    size_t (*drain)(void);
    size_t (*get_counters)(struct pinshim_counters *, size_t);
    const char *(*version)(void);
} shim;

#define BIND(table, library, field, name) (*(void **)&(table).field = dlsym(library, name))

static const char *error_name(cudaError_t error)
{
    const char *name = rt.error_name != NULL ? rt.error_name(error) : NULL;
    return name != NULL ? name : "cudaError?";
}

/* 0 when ready, 2 when there is no usable GPU (a SKIP line says why). */
static int setup_runtime(const char *path)
{
    void *runtime = bench_open_cudart(path);
    if (runtime == NULL) {
        printf("SKIP gpu_runs: no CUDA runtime (%s)\n", dlerror());
        return 2;
    }
    BIND(rt, runtime, get_device_count, "cudaGetDeviceCount");
    BIND(rt, runtime, malloc_, "cudaMalloc");
    BIND(rt, runtime, free_, "cudaFree");
    BIND(rt, runtime, memcpy_, "cudaMemcpy");
    BIND(rt, runtime, memcpy_async, "cudaMemcpyAsync");
    BIND(rt, runtime, stream_synchronize, "cudaStreamSynchronize");
    BIND(rt, runtime, pointer_attributes, "cudaPointerGetAttributes");
    BIND(rt, runtime, error_name, "cudaGetErrorName");
    BIND(rt, runtime, get_last_error, "cudaGetLastError");
    BIND(rt, runtime, stream_create, "cudaStreamCreateWithFlags");
    BIND(rt, runtime, stream_destroy, "cudaStreamDestroy");
    if (rt.get_device_count == NULL || rt.malloc_ == NULL || rt.free_ == NULL ||
        rt.memcpy_ == NULL || rt.memcpy_async == NULL || rt.stream_synchronize == NULL ||
        rt.pointer_attributes == NULL || rt.error_name == NULL) {
        printf("SKIP gpu_runs: the runtime lacks cudaMalloc, cudaMemcpy(Async), "
               "cudaStreamSynchronize, cudaPointerGetAttributes or cudaGetErrorName\n");
        return 2;
    }
    int devices = 0;
    cudaError_t error = rt.get_device_count(&devices);
    if (error != cudaSuccess || devices == 0) {
        printf("SKIP gpu_runs: no usable CUDA device (%d %s)\n", (int)error,
               error != cudaSuccess ? error_name(error) : "0 devices");
        return 2;
    }
    return 0;
}

static void clear_last_error(void)
{
    if (rt.get_last_error != NULL)
        rt.get_last_error();
}

static int pointer_type(const void *pointer)
{
    struct cudaPointerAttributes attributes;
    memset(&attributes, 0, sizeof(attributes));
    if (rt.pointer_attributes(&attributes, pointer) != cudaSuccess) {
        clear_last_error();
        return -1;
    }
    return (int)attributes.type;
}

/* ---- the copies ---- */

static void *device;
static cudaStream_t stream;              /* non-blocking when the runtime can make one, else 0 */
static unsigned char *pattern, *scratch; /* pageable, LARGEST each */
static int reps = 5;
static bool under_shim;
static int copies, copy_mismatches, mismatches, harness_failures; /* mismatches: the rest */

enum expect { EXPECT_SUCCESS, EXPECT_INVALID_VALUE };

static void fill_pattern(size_t length, unsigned seed)
{
    for (size_t i = 0; i < length; i++)
        pattern[i] = (unsigned char)((i >> 3) * 131 + (i & 7) * 17 + seed * 29 + 1);
}

/* One copy of [host, host + length) in one direction, mode: the first call's
 * result (or the first failure of the repetitions) and the median time. */
static cudaError_t timed_copies(unsigned char *host, size_t length, bool to_device, bool async,
                                double *seconds)
{
    double times[MAX_REPS];
    int done = 0;
    cudaError_t error = cudaSuccess;
    for (int rep = 0; rep < reps && error == cudaSuccess; rep++) {
        double began = bench_now_seconds();
        if (async) {
            error = to_device
                        ? rt.memcpy_async(device, host, length, cudaMemcpyHostToDevice, stream)
                        : rt.memcpy_async(host, device, length, cudaMemcpyDeviceToHost, stream);
            cudaError_t synchronised = rt.stream_synchronize(stream);
            if (error == cudaSuccess)
                error = synchronised;
        } else {
            error = to_device ? rt.memcpy_(device, host, length, cudaMemcpyHostToDevice)
                              : rt.memcpy_(host, device, length, cudaMemcpyDeviceToHost);
        }
        double took = bench_now_seconds() - began;
        if (error == cudaSuccess)
            times[done++] = took;
    }
    if (error != cudaSuccess)
        clear_last_error();
    *seconds = done > 0 ? bench_median(times, (size_t)done) : 0;
    return error;
}

/* Copies [host, host + length) whole, H2D and D2H, sync and async, checks the
 * bytes, prints a COPY line each and judges it against the expectation. */
static void copy_whole(const char *scenario, const char *name, unsigned char *host, size_t length,
                       enum expect expect)
{
    static unsigned seed;
    static const struct {
        bool to_device, async;
    } kinds[] = {{true, false}, {false, false}, {true, true}, {false, true}};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        bool to_device = kinds[k].to_device, async = kinds[k].async;
        fill_pattern(length, ++seed);
        const char *bytes = "-";
        cudaError_t error;
        double seconds = 0;
        int type;
        if (to_device) {
            memcpy(host, pattern, length);
            type = pointer_type(host);
            error = timed_copies(host, length, true, async, &seconds);
            if (error == cudaSuccess) {
                /* What arrived, read back through the pageable scratch. */
                memset(scratch, 0, length);
                cudaError_t back = rt.memcpy_(scratch, device, length, cudaMemcpyDeviceToHost);
                if (back != cudaSuccess) {
                    clear_last_error();
                    printf("harness: reading the device back: %d %s\n", (int)back,
                           error_name(back));
                    harness_failures++;
                    bytes = "unchecked";
                } else {
                    bytes = memcmp(scratch, pattern, length) == 0 ? "intact" : "WRONG";
                }
            }
        } else {
            /* The device holds the pattern, sent from the pageable scratch. */
            memcpy(scratch, pattern, length);
            cudaError_t sent = rt.memcpy_(device, scratch, length, cudaMemcpyHostToDevice);
            if (sent != cudaSuccess) {
                clear_last_error();
                printf("harness: filling the device: %d %s\n", (int)sent, error_name(sent));
                harness_failures++;
            }
            memset(host, 0, length);
            type = pointer_type(host);
            error = timed_copies(host, length, false, async, &seconds);
            if (error == cudaSuccess)
                bytes = memcmp(host, pattern, length) == 0 ? "intact" : "WRONG";
        }
        int want_type = under_shim ? 1 : 0;
        cudaError_t want_error =
            under_shim && expect == EXPECT_INVALID_VALUE ? cudaErrorInvalidValue : cudaSuccess;
        bool as_expected = error == want_error && type == want_type &&
                           (error != cudaSuccess || strcmp(bytes, "intact") == 0);
        char expected[64], gbps[32] = "-";
        snprintf(expected, sizeof(expected), "%s,type-%d",
                 want_error == cudaSuccess ? "success" : "cudaErrorInvalidValue", want_type);
        if (error == cudaSuccess && seconds > 0)
            snprintf(gbps, sizeof(gbps), "%.2f", (double)length / seconds / 1e9);
        printf("COPY %s %s %s %s result=%d %s gbps=%s type=%d bytes=%s expected=%s verdict=%s\n",
               scenario, name, to_device ? "H2D" : "D2H", async ? "async" : "sync", (int)error,
               error_name(error), gbps, type, bytes, expected, as_expected ? "ok" : "FAIL");
        copies++;
        copy_mismatches += !as_expected;
    }
}

/* ---- what the shim registered ---- */

/* The shim's registrations alive now, once its queue is empty (0 without it). */
static uint64_t live_registrations(void)
{
    if (shim.drain != NULL)
        shim.drain();
    struct pinshim_counters counters;
    memset(&counters, 0, sizeof(counters));
    if (shim.get_counters == NULL || shim.get_counters(&counters, sizeof(counters)) == 0)
        return 0;
    return counters.live_ranges;
}

/* After a scenario's locks: pinshim_is_registered at the buffers' first and
 * last bytes, and the registrations the shim made (its live registrations
 * now, less those before); judged when expected_registrations > 0. */
static void report_registrations(const char *scenario, const unsigned char *first_byte,
                                 const unsigned char *last_byte, int want_last,
                                 uint64_t live_before, int expected_registrations)
{
    if (!under_shim)
        return;
    uint64_t live = live_registrations();
    int first = shim.is_registered(first_byte), last = shim.is_registered(last_byte);
    long long made = (long long)live - (long long)live_before;
    bool as_expected = first == 1 && last == want_last &&
                       (expected_registrations <= 0 || made == expected_registrations);
    char expected[32] = "-";
    if (expected_registrations > 0)
        snprintf(expected, sizeof(expected), "%d", expected_registrations);
    printf("REGS %s first_byte=%d last_byte=%d (expected 1 %d) registrations=%lld (expected %s) "
           "verdict=%s\n",
           scenario, first, last, want_last, made, expected, as_expected ? "ok" : "FAIL");
    mismatches += !as_expected;
}

static bool lock(const char *scenario, const void *address, size_t length)
{
    if (mlock(address, length) == 0)
        return true;
    printf("FAIL %s: mlock of %zu bytes: %s (RLIMIT_MEMLOCK?)\n", scenario, length,
           strerror(errno));
    mismatches++;
    return false;
}

static unsigned char *map(size_t length)
{
    void *memory = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        printf("harness: mmap of %zu bytes: %s\n", length, strerror(errno));
        harness_failures++;
        return NULL;
    }
    memset(memory, 0x5a, length);
    return memory;
}

/* ---- the scenarios ---- */

static void two_adjacent(void)
{
    const char *name = "two-adjacent";
    unsigned char *buffer = map(16 * MIB);
    if (buffer == NULL)
        return;
    uint64_t before = live_registrations();
    printf("SCENARIO %s: 16 MiB mmap'd once, mlock of its first 8 MiB, then of its last 8 MiB\n",
           name);
    if (lock(name, buffer, 8 * MIB) && lock(name, buffer + 8 * MIB, 8 * MIB)) {
        report_registrations(name, buffer, buffer + 16 * MIB - 1, 1, before, 1);
        copy_whole(name, "whole-16MiB", buffer, 16 * MIB, EXPECT_SUCCESS);
    }
    munlock(buffer, 16 * MIB);
    munmap(buffer, 16 * MIB);
}

static void grown(void)
{
    const char *name = "grown";
    unsigned char *buffer = map(8 * MIB);
    if (buffer == NULL)
        return;
    uint64_t before = live_registrations();
    printf("SCENARIO %s: 8 MiB mmap'd, mlock of its first 2 MiB, then of all 8 MiB\n", name);
    if (lock(name, buffer, 2 * MIB) && lock(name, buffer, 8 * MIB)) {
        report_registrations(name, buffer, buffer + 8 * MIB - 1, 1, before, 1);
        copy_whole(name, "whole-8MiB", buffer, 8 * MIB, EXPECT_SUCCESS);
    }
    munlock(buffer, 8 * MIB);
    munmap(buffer, 8 * MIB);
}

static void shared_page(void)
{
    const char *name = "shared-page";
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* The second right after the first on the heap, on the first one's last
     * page (malloc, not page-rounded). */
    size_t first_length = 100 * KIB + 200, second_length = 100 * KIB;
    unsigned char *first = malloc(first_length), *second = malloc(second_length);
    if (first == NULL || second == NULL) {
        printf("harness: malloc\n");
        harness_failures++;
        free(first);
        free(second);
        return;
    }
    memset(first, 0x5a, first_length);
    memset(second, 0x5a, second_length);
    uintptr_t first_last_page = ((uintptr_t)first + first_length - 1) & ~(uintptr_t)(page - 1);
    bool share = ((uintptr_t)second & ~(uintptr_t)(page - 1)) == first_last_page;
    printf("SCENARIO %s: two malloc'd buffers of %zu and %zu bytes at %p and %p, each locked; "
           "they share a page: %s\n",
           name, first_length, second_length, (void *)first, (void *)second,
           share ? "yes" : "NO (the scenario does not test what it means to)");
    if (!share)
        printf("NOTE %s: the two buffers do not share a page here\n", name);
    uint64_t before = live_registrations();
    if (lock(name, first, first_length) && lock(name, second, second_length)) {
        const unsigned char *low = first < second ? first : second;
        const unsigned char *high =
            first < second ? second + second_length - 1 : first + first_length - 1;
        report_registrations(name, low, high, 1, before, share ? 1 : 0);
        copy_whole(name, "first-100KiB", first, first_length, EXPECT_SUCCESS);
        copy_whole(name, "second-100KiB", second, second_length, EXPECT_SUCCESS);
    }
    munlock(first, first_length);
    munlock(second, second_length);
    free(first);
    free(second);
}

static void half_locked(void)
{
    const char *name = "half-locked";
    unsigned char *buffer = map(4 * MIB);
    if (buffer == NULL)
        return;
    uint64_t before = live_registrations();
    printf("SCENARIO %s: 4 MiB mmap'd, only its first 2 MiB locked; copied whole (under the "
           "shim a copy that spans registered and unregistered memory fails: a limit), then "
           "its locked half\n",
           name);
    if (lock(name, buffer, 2 * MIB)) {
        report_registrations(name, buffer, buffer + 4 * MIB - 1, 0, before, 1);
        copy_whole(name, "whole-4MiB", buffer, 4 * MIB, EXPECT_INVALID_VALUE);
        copy_whole(name, "locked-half-2MiB", buffer, 2 * MIB, EXPECT_SUCCESS);
    }
    munlock(buffer, 2 * MIB);
    munmap(buffer, 4 * MIB);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cudart = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cudart") == 0 && i + 1 < argc) {
            cudart = argv[++i];
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > MAX_REPS) {
                fprintf(stderr, "gpu_runs: --reps takes 1 ... %d\n", MAX_REPS);
                return 64;
            }
        } else {
            fprintf(stderr, "usage: gpu_runs [--cudart LIB] [--reps N]\n");
            return 64;
        }
    }
    BIND(shim, RTLD_DEFAULT, is_registered, "pinshim_is_registered");
    BIND(shim, RTLD_DEFAULT, drain, "pinshim_drain");
    BIND(shim, RTLD_DEFAULT, get_counters, "pinshim_get_counters");
    BIND(shim, RTLD_DEFAULT, version, "pinshim_version");
    under_shim = shim.is_registered != NULL;
    printf("INFO gpu_runs %s (%s), cudart %s, %d copies per figure\n",
           under_shim ? "under the shim" : "without the shim",
           under_shim && shim.version != NULL ? shim.version() : "no pinshim_is_registered",
           cudart != NULL ? cudart : "searched", reps);
    int status = setup_runtime(cudart);
    if (status != 0)
        return status;
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);

    /* A GPU program: CUDA starts, and device memory is taken, before any lock. */
    cudaError_t error = rt.malloc_(&device, LARGEST);
    pattern = malloc(LARGEST);
    scratch = malloc(LARGEST);
    if (error != cudaSuccess || pattern == NULL || scratch == NULL) {
        printf("FAIL gpu_runs: cudaMalloc of %zu bytes: %d %s, or out of memory\n", LARGEST,
               (int)error, error_name(error));
        return 1;
    }
    bool own_stream =
        rt.stream_create != NULL && rt.stream_create(&stream, cudaStreamNonBlocking) == cudaSuccess;
    if (!own_stream) {
        clear_last_error();
        stream = 0;
    }
    printf("INFO async copies on %s\n",
           own_stream ? "a non-blocking stream" : "the default stream (no cudaStreamCreate)");

    two_adjacent();
    grown();
    shared_page();
    half_locked();

    if (own_stream && rt.stream_destroy != NULL)
        rt.stream_destroy(stream);
    rt.free_(device);
    free(pattern);
    free(scratch);
    bool passed = copy_mismatches == 0 && mismatches == 0 && harness_failures == 0;
    printf("%s gpu_runs %s: %d of %d copies as expected, %d other mismatch(es), %d harness "
           "failure(s)\n",
           passed ? "PASS" : "FAIL", under_shim ? "under the shim" : "without the shim",
           copies - copy_mismatches, copies, mismatches, harness_failures);
    return passed ? 0 : 1;
}
