/* run_joins: what joining locked runs costs. The shim keeps ONE registration
 * per run of contiguous locked pages; no driver grows a registration in
 * place, so a lock that touches or overlaps a registered run unregisters the
 * run and registers the union. A buffer locked in k adjacent pieces, in
 * order, is then registered k times, growing: (k+1)/2 times its size in all,
 * quadratic in k (UCX PR #11803 says the same of its registration cache).
 * With PINSHIM_ASYNC=on the registration thread registers queued runs, and
 * pieces still queued coalesce without a call.
 *
 * One buffer of S bytes (one private anonymous mmap, every page written
 * before the first lock: resident memory, as a framework locks it) is locked
 * in k adjacent pieces of S/k bytes, in order, reversed or in a random order
 * (a Fisher-Yates shuffle driven by splitmix64 started at seed + k: sync and
 * async lock the same sequence), under the shim in create mode
 * (PINSHIM_CONTEXT=create, PINSHIM_CUDART=the fake runtime) on the fake driver
 * with FAKE_CUDA_REGISTER_SECONDS_PER_GIB=0.1 (about an H200 system's, vLLM
 * #51081) and FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB a tenth of that, with
 * registration synchronous (PINSHIM_ASYNC=off) or asynchronous (on: the last
 * lock is followed by pinshim_drain(), and the time until it returns counts).
 *
 * Every (k, order, mode) runs in a process of its own (this program
 * re-executed under LD_PRELOAD=libpinshim.so), which warms the shim up on a
 * 1 MiB mapping of its own first (context, thread, runtime loaded), then maps
 * and touches the buffer, reads the shim's counters (pinshim_get_counters)
 * and the fake driver's (found with dlopen("libcuda.so.1", RTLD_NOLOAD)),
 * locks the pieces, drains, and reads them again: registrations and bytes
 * registered, unregistrations (those made to join), the time inside the lock
 * calls, the whole sequence's wall time, and the registrations left. Exactly
 * one must be left, covering the buffer (the shim's live_ranges and the
 * driver's live registrations): any other count makes the run fail.
 *
 * --check: fails (exit 1) when an asynchronous in-order burst registered more
 * than 3 x S in bytes (the goal: at most about twice the final run's
 * registration). Timings are reported, never judged. */
#include "bench_util.h"

#include "pinshim.h"
/* The fake driver's query API: enum fake_cu_call and struct fake_cuda_range
 * (its functions are looked up with dlsym, never linked). */
#include "../tests/fake_cudart/fake_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_SHIM_PATH
#define BENCH_SHIM_PATH ""
#endif
#ifndef BENCH_FAKE_CUDART_PATH
#define BENCH_FAKE_CUDART_PATH ""
#endif

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define MAX_PIECE_COUNTS 16
#define WARMUP_BYTES MIB
#define CHECK_LIMIT 3.0 /* --check: bytes registered / S, async in order */

enum order { ORDER_IN, ORDER_REVERSED, ORDER_RANDOM, ORDER_COUNT };
static const char *const order_names[] = {"in", "reversed", "random"};
static const char *const order_titles[] = {"in order", "reversed", "random"};

enum mode { MODE_SYNC, MODE_ASYNC, MODE_COUNT };
static const char *const mode_names[] = {"sync", "async"};

static double seconds_since(double began)
{
    return bench_now_seconds() - began;
}

/* ------------------------------------------------------------------------ */
/* The order of the pieces.                                                  */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Piece indices in locking order: 0..k-1, k-1..0, or a shuffle seeded by
 * seed + k. */
static void piece_order(size_t *order, size_t k, enum order which, uint64_t seed)
{
    for (size_t i = 0; i < k; i++)
        order[i] = which == ORDER_REVERSED ? k - 1 - i : i;
    if (which != ORDER_RANDOM)
        return;
    uint64_t state = seed + (uint64_t)k;
    for (size_t i = k - 1; i > 0; i--) {
        size_t j = (size_t)(splitmix64(&state) % (uint64_t)(i + 1));
        size_t swap = order[i];
        order[i] = order[j];
        order[j] = swap;
    }
}

/* ------------------------------------------------------------------------ */
/* Child: one (k, order, mode).                                              */

struct driver_api {
    uint64_t (*registrations_completed)(void);
    uint64_t (*call_count)(int);
    size_t (*live_count)(void);
    size_t (*snapshot_live)(struct fake_cuda_range *, size_t);
};

static bool find_driver(struct driver_api *api)
{
    memset(api, 0, sizeof(*api));
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == NULL)
        return false;
    *(void **)&api->registrations_completed = dlsym(driver, "fake_cuda_registrations_completed");
    *(void **)&api->call_count = dlsym(driver, "fake_cuda_call_count");
    *(void **)&api->live_count = dlsym(driver, "fake_cuda_live_count");
    *(void **)&api->snapshot_live = dlsym(driver, "fake_cuda_snapshot_live");
    return api->registrations_completed != NULL && api->call_count != NULL &&
           api->live_count != NULL && api->snapshot_live != NULL;
}

static unsigned char *map_touched(size_t bytes)
{
    unsigned char *buffer =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED)
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    for (size_t offset = 0; offset < bytes; offset += (size_t)page)
        buffer[offset] = 1;
    return buffer;
}

static int child_main(size_t bytes, size_t k, enum order which, enum mode mode, uint64_t seed,
                      long gap_us)
{
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    if (setrlimit(RLIMIT_MEMLOCK, &unlimited) != 0)
        printf("INFO cannot raise RLIMIT_MEMLOCK: %s\n", strerror(errno));

    size_t (*get_counters)(struct pinshim_counters *, size_t) =
        (size_t(*)(struct pinshim_counters *, size_t))dlsym(RTLD_DEFAULT, "pinshim_get_counters");
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    if (get_counters == NULL || drain == NULL) {
        printf("ERROR not under the shim: no pinshim_get_counters / pinshim_drain\n");
        return 1;
    }

    /* The first lock of the process loads the shim's CUDA side, makes its
     * context and starts its thread: done on a mapping of its own, undone
     * before the buffer is mapped. */
    unsigned char *warm = map_touched(WARMUP_BYTES);
    if (warm == NULL || mlock(warm, WARMUP_BYTES) != 0) {
        printf("ERROR warm-up lock failed: %s\n", strerror(errno));
        return 1;
    }
    drain();
    munlock(warm, WARMUP_BYTES);
    munmap(warm, WARMUP_BYTES);

    struct driver_api driver;
    bool have_driver = find_driver(&driver);
    if (!have_driver)
        printf("INFO no fake driver query API (libcuda.so.1 with fake_cuda_*): shim counters "
               "only\n");

    size_t piece = bytes / k;
    size_t *order = malloc(k * sizeof(*order));
    unsigned char *buffer = map_touched(bytes);
    if (order == NULL || buffer == NULL) {
        printf("ERROR cannot map %zu bytes: %s\n", bytes, strerror(errno));
        return 1;
    }
    piece_order(order, k, which, seed);

    struct pinshim_counters before, after;
    memset(&before, 0, sizeof(before));
    memset(&after, 0, sizeof(after));
    get_counters(&before, sizeof(before));
    uint64_t driver_registered = 0, driver_unregistered = 0;
    if (have_driver) {
        driver_registered = driver.registrations_completed();
        driver_unregistered = driver.call_count(FAKE_CU_CALL_MEM_HOST_UNREGISTER);
    }

    double lock_sum = 0, lock_max = 0;
    double began = bench_now_seconds();
    for (size_t i = 0; i < k; i++) {
        if (gap_us > 0 && i > 0) {
            struct timespec gap = {gap_us / 1000000, gap_us % 1000000 * 1000};
            while (nanosleep(&gap, &gap) != 0 && errno == EINTR)
                ;
        }
        double call = bench_now_seconds();
        int locked = mlock(buffer + order[i] * piece, piece);
        double spent = seconds_since(call);
        if (locked != 0) {
            printf("ERROR lock of piece %zu (%zu of %zu) failed: %s\n", order[i], i + 1, k,
                   strerror(errno));
            return 1;
        }
        lock_sum += spent;
        if (spent > lock_max)
            lock_max = spent;
    }
    double locks_wall = seconds_since(began);
    double drained = 0;
    size_t waiting = 0;
    if (mode == MODE_ASYNC) {
        double call = bench_now_seconds();
        waiting = drain();
        drained = seconds_since(call);
    }
    double wall = seconds_since(began);

    get_counters(&after, sizeof(after));
    size_t driver_live = 0, covering = 0;
    if (have_driver) {
        driver_registered = driver.registrations_completed() - driver_registered;
        driver_unregistered =
            driver.call_count(FAKE_CU_CALL_MEM_HOST_UNREGISTER) - driver_unregistered;
        driver_live = driver.live_count();
        struct fake_cuda_range live[4];
        size_t listed = driver.snapshot_live(live, 4);
        for (size_t i = 0; i < listed && i < 4; i++)
            covering += live[i].base == (uintptr_t)buffer && live[i].size == bytes;
    }
    int registered = 0;
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    if (is_registered != NULL)
        registered = is_registered(buffer) && is_registered(buffer + bytes - 1);

    printf("RESULT lock_calls=%zu lock_sum=%.9f lock_max=%.9f locks_wall=%.9f drain=%.9f "
           "wall=%.9f waiting=%zu "
           "register_ok=%" PRIu64 " register_failed=%" PRIu64 " register_bytes=%" PRIu64
           " register_ns=%" PRIu64 " unregister_ok=%" PRIu64 " unregister_failed=%" PRIu64
           " unregister_join=%" PRIu64 " unregister_ns=%" PRIu64 " live_ranges=%" PRIu64
           " live_bytes=%" PRIu64 " held_ranges=%" PRIu64 " queued_ranges=%" PRIu64
           " pending_ranges=%" PRIu64 " driver=%d driver_registered=%" PRIu64
           " driver_unregistered=%" PRIu64 " driver_live=%zu driver_covering=%zu "
           "is_registered=%d\n",
           k, lock_sum, lock_max, locks_wall, drained, wall, waiting,
           after.register_ok - before.register_ok, after.register_failed - before.register_failed,
           after.register_bytes - before.register_bytes,
           after.register_nanoseconds - before.register_nanoseconds,
           after.unregister_ok - before.unregister_ok,
           after.unregister_failed - before.unregister_failed,
           after.unregister_join - before.unregister_join,
           after.unregister_nanoseconds - before.unregister_nanoseconds, after.live_ranges,
           after.live_bytes, after.held_ranges, after.queued_ranges, after.pending_ranges,
           have_driver, driver_registered, driver_unregistered, driver_live, covering, registered);

    munlock(buffer, bytes);
    munmap(buffer, bytes);
    free(order);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Parent.                                                                   */

struct row {
    size_t k;
    enum order order;
    enum mode mode;
    bool ran;       /* a RESULT line came back */
    int exit_code;  /* the child's */
    bool final_ok;  /* one registration left, covering the buffer */
    double seconds; /* the child process, start to end */
    char message[256];
    /* From the RESULT line. */
    double lock_sum, lock_max, locks_wall, drain, wall;
    uint64_t lock_calls, waiting;
    uint64_t register_ok, register_failed, register_bytes, register_ns;
    uint64_t unregister_ok, unregister_failed, unregister_join, unregister_ns;
    uint64_t live_ranges, live_bytes, held_ranges, queued_ranges, pending_ranges;
    uint64_t driver, driver_registered, driver_unregistered, driver_live, driver_covering;
    uint64_t is_registered;
};

static struct {
    size_t bytes;
    size_t pieces[MAX_PIECE_COUNTS];
    size_t piece_count;
    bool orders[ORDER_COUNT];
    bool modes[MODE_COUNT];
    uint64_t seed;
    const char *seconds_per_gib;
    char unregister_seconds_per_gib[64];
    long gap_us;
    bool check;
    const char *json_path;
} options;

static struct row *rows;
static size_t row_count;

/* The value after " key=" in line. */
static bool field(const char *line, const char *key, double *out)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), " %s=", key);
    const char *at = strstr(line, pattern);
    if (at == NULL)
        return false;
    char *end;
    *out = strtod(at + strlen(pattern), &end);
    return end != at + strlen(pattern);
}

static bool field_u64(const char *line, const char *key, uint64_t *out)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), " %s=", key);
    const char *at = strstr(line, pattern);
    if (at == NULL)
        return false;
    char *end;
    *out = strtoull(at + strlen(pattern), &end, 10);
    return end != at + strlen(pattern);
}

static void parse_result(const char *output, struct row *row)
{
    for (const char *line = output; line != NULL && *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        char text[1024];
        if (length >= sizeof(text))
            length = sizeof(text) - 1;
        memcpy(text, line, length);
        text[length] = '\0';
        if (strncmp(text, "RESULT ", 7) == 0) {
            bool ok = field_u64(text, "lock_calls", &row->lock_calls) &&
                      field(text, "lock_sum", &row->lock_sum) &&
                      field(text, "lock_max", &row->lock_max) &&
                      field(text, "locks_wall", &row->locks_wall) &&
                      field(text, "drain", &row->drain) && field(text, "wall", &row->wall) &&
                      field_u64(text, "waiting", &row->waiting) &&
                      field_u64(text, "register_ok", &row->register_ok) &&
                      field_u64(text, "register_failed", &row->register_failed) &&
                      field_u64(text, "register_bytes", &row->register_bytes) &&
                      field_u64(text, "register_ns", &row->register_ns) &&
                      field_u64(text, "unregister_ok", &row->unregister_ok) &&
                      field_u64(text, "unregister_failed", &row->unregister_failed) &&
                      field_u64(text, "unregister_join", &row->unregister_join) &&
                      field_u64(text, "unregister_ns", &row->unregister_ns) &&
                      field_u64(text, "live_ranges", &row->live_ranges) &&
                      field_u64(text, "live_bytes", &row->live_bytes) &&
                      field_u64(text, "held_ranges", &row->held_ranges) &&
                      field_u64(text, "queued_ranges", &row->queued_ranges) &&
                      field_u64(text, "pending_ranges", &row->pending_ranges) &&
                      field_u64(text, "driver", &row->driver) &&
                      field_u64(text, "driver_registered", &row->driver_registered) &&
                      field_u64(text, "driver_unregistered", &row->driver_unregistered) &&
                      field_u64(text, "driver_live", &row->driver_live) &&
                      field_u64(text, "driver_covering", &row->driver_covering) &&
                      field_u64(text, "is_registered", &row->is_registered);
            row->ran = ok;
            if (!ok)
                snprintf(row->message, sizeof(row->message), "unreadable RESULT line");
        } else if (strncmp(text, "ERROR ", 6) == 0 && row->message[0] == '\0') {
            size_t kept =
                strlen(text) < sizeof(row->message) ? strlen(text) : sizeof(row->message) - 1;
            memcpy(row->message, text, kept);
            row->message[kept] = '\0';
        }
        line = end ? end + 1 : NULL;
    }
}

/* One registration left, covering the buffer, by the shim's count and (when
 * its query API is there) the driver's. */
static bool final_registration_ok(const struct row *row)
{
    bool shim = row->live_ranges == 1 && row->live_bytes == options.bytes &&
                row->held_ranges == 0 && row->queued_ranges == 0 && row->pending_ranges == 0 &&
                row->is_registered == 1;
    bool driver = row->driver == 0 || (row->driver_live == 1 && row->driver_covering == 1);
    return row->ran && shim && driver;
}

static void run_row(struct row *row, const char *shim, const char *runtime)
{
    struct bench_env env;
    bench_env_from_current(&env);
    bench_env_set(&env, "LD_PRELOAD", shim);
    bench_env_set(&env, "PINSHIM_CONTEXT", "create");
    bench_env_set(&env, "PINSHIM_CUDART", runtime);
    bench_env_set(&env, "PINSHIM_ASYNC", row->mode == MODE_ASYNC ? "on" : "off");
    bench_env_set(&env, "FAKE_CUDA_REGISTER_SECONDS_PER_GIB", options.seconds_per_gib);
    bench_env_set(&env, "FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB", options.unregister_seconds_per_gib);
    /* The double's /proc/self/smaps checks are test machinery, not CUDA's cost. */
    bench_env_set(&env, "FAKE_CUDART_CHECK", "0");

    char bytes[32], k[32], seed[32], gap[32];
    snprintf(bytes, sizeof(bytes), "%zu", options.bytes);
    snprintf(k, sizeof(k), "%zu", row->k);
    snprintf(seed, sizeof(seed), "%" PRIu64, options.seed);
    snprintf(gap, sizeof(gap), "%ld", options.gap_us);
    char *argv[] = {
        (char *)bench_self_path(),     "--child", bytes, k,   (char *)order_names[row->order],
        (char *)mode_names[row->mode], seed,      gap,   NULL};
    fprintf(stderr, "run_joins: k=%zu order=%s mode=%s\n", row->k, order_names[row->order],
            mode_names[row->mode]);
    struct bench_run run;
    bool started = bench_run_process(argv, &env, true, false, &run);
    row->exit_code = started ? run.exit_code : -1;
    row->seconds = run.wall;
    if (run.output != NULL)
        parse_result(run.output, row);
    if (row->exit_code != 0 && row->message[0] == '\0')
        snprintf(row->message, sizeof(row->message), "child exit %d", row->exit_code);
    row->final_ok = row->exit_code == 0 && final_registration_ok(row);
    bench_run_free(&run);
    bench_env_free(&env);
}

static void format_seconds(char *out, size_t size, double seconds)
{
    if (seconds >= 1)
        snprintf(out, size, "%.3f s", seconds);
    else if (seconds >= 1e-3)
        snprintf(out, size, "%.2f ms", seconds * 1e3);
    else
        snprintf(out, size, "%.1f us", seconds * 1e6);
}

static void format_bytes(char *out, size_t size, double bytes)
{
    if (bytes >= (double)GIB)
        snprintf(out, size, "%.2f GiB", bytes / (double)GIB);
    else if (bytes >= (double)MIB)
        snprintf(out, size, "%.1f MiB", bytes / (double)MIB);
    else
        snprintf(out, size, "%.0f KiB", bytes / 1024.0);
}

static double ratio_of(const struct row *row)
{
    return (double)row->register_bytes / (double)options.bytes;
}

static bool row_checked(const struct row *row)
{
    return row->mode == MODE_ASYNC && row->order == ORDER_IN;
}

static bool row_check_fails(const struct row *row)
{
    return !row->ran || ratio_of(row) > CHECK_LIMIT;
}

static void print_table(void)
{
    printf("\n| k | piece | order | mode | registrations | bytes registered | registered / S | "
           "unregistrations (to join) | in lock calls (sum) | longest lock | drain | wall | "
           "cudaHostRegister time | final registrations |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < row_count; i++) {
        const struct row *row = &rows[i];
        char piece[32];
        format_bytes(piece, sizeof(piece), (double)(options.bytes / row->k));
        if (!row->ran) {
            printf("| %zu | %s | %s | %s | failed: %s |||||||||\n", row->k, piece,
                   order_titles[row->order], mode_names[row->mode], row->message);
            continue;
        }
        char registered[32], in_locks[32], longest[32], drain[32], wall[32], registering[32];
        format_bytes(registered, sizeof(registered), (double)row->register_bytes);
        format_seconds(in_locks, sizeof(in_locks), row->lock_sum);
        format_seconds(longest, sizeof(longest), row->lock_max);
        format_seconds(wall, sizeof(wall), row->wall);
        format_seconds(registering, sizeof(registering), (double)row->register_ns / 1e9);
        if (row->mode == MODE_ASYNC)
            format_seconds(drain, sizeof(drain), row->drain);
        else
            snprintf(drain, sizeof(drain), "-");
        char final[64];
        if (row->final_ok)
            snprintf(final, sizeof(final), "1");
        else
            snprintf(final, sizeof(final), "**%" PRIu64 " (driver %" PRIu64 ")**", row->live_ranges,
                     row->driver_live);
        printf("| %zu | %s | %s | %s | %" PRIu64 " | %s | %.2f | %" PRIu64 " (%" PRIu64
               ") | %s | %s | %s | %s | %s | %s |\n",
               row->k, piece, order_titles[row->order], mode_names[row->mode], row->register_ok,
               registered, ratio_of(row), row->unregister_ok, row->unregister_join, in_locks,
               longest, drain, wall, registering, final);
    }
}

static bool driver_agrees(const struct row *row)
{
    return row->driver == 0 ||
           (row->driver_registered == row->register_ok &&
            row->driver_unregistered == row->unregister_ok + row->unregister_failed);
}

static void json_row(FILE *out, const struct row *row)
{
    fprintf(out,
            "{\"k\": %zu, \"piece_bytes\": %zu, \"order\": \"%s\", \"mode\": \"%s\", "
            "\"exit_code\": %d, \"ran\": %s, \"message\": ",
            row->k, options.bytes / row->k, order_names[row->order], mode_names[row->mode],
            row->exit_code, row->ran ? "true" : "false");
    bench_json_string(out, row->message[0] ? row->message : NULL);
    fprintf(out,
            ", \"lock_calls\": %" PRIu64 ", \"lock_sum_s\": %.9f, \"lock_max_s\": %.9f, "
            "\"locks_wall_s\": %.9f, \"drain_s\": %.9f, \"wall_s\": %.9f, \"waiting_after_drain\": "
            "%" PRIu64 ", \"register_ok\": %" PRIu64 ", \"register_failed\": %" PRIu64
            ", \"register_bytes\": %" PRIu64 ", \"registered_over_size\": %.4f, \"register_s\": "
            "%.9f, \"unregister_ok\": %" PRIu64 ", \"unregister_failed\": %" PRIu64
            ", \"unregister_join\": %" PRIu64 ", \"unregister_s\": %.9f, \"final_live_ranges\": "
            "%" PRIu64 ", \"final_live_bytes\": %" PRIu64 ", \"final_held_ranges\": %" PRIu64
            ", \"final_queued_ranges\": %" PRIu64 ", \"final_ok\": %s, \"driver\": ",
            row->lock_calls, row->lock_sum, row->lock_max, row->locks_wall, row->drain, row->wall,
            row->waiting, row->register_ok, row->register_failed, row->register_bytes,
            ratio_of(row), (double)row->register_ns / 1e9, row->unregister_ok,
            row->unregister_failed, row->unregister_join, (double)row->unregister_ns / 1e9,
            row->live_ranges, row->live_bytes, row->held_ranges, row->queued_ranges,
            row->final_ok ? "true" : "false");
    if (row->driver)
        fprintf(out,
                "{\"registrations\": %" PRIu64 ", \"unregister_calls\": %" PRIu64
                ", \"live\": %" PRIu64 ", \"live_covering_buffer\": %" PRIu64 "}",
                row->driver_registered, row->driver_unregistered, row->driver_live,
                row->driver_covering);
    else
        fprintf(out, "null");
    fprintf(out, ", \"process_s\": %.6f}", row->seconds);
}

static bool write_json(const char *path, const char *command, const char *shim, const char *runtime,
                       bool check_passed)
{
    FILE *out = bench_json_open(path, "run_joins");
    if (out == NULL)
        return false;
    fprintf(out, ", \"command\": ");
    bench_json_string(out, command);
    fprintf(out, ", \"shim\": ");
    bench_json_string(out, shim);
    fprintf(out, ", \"runtime\": ");
    bench_json_string(out, runtime);
    fprintf(out,
            ", \"size_bytes\": %zu, \"register_seconds_per_gib\": %s, "
            "\"unregister_seconds_per_gib\": %s, \"seed\": %" PRIu64 ", \"gap_us\": %ld, "
            "\"memory\": ",
            options.bytes, options.seconds_per_gib, options.unregister_seconds_per_gib,
            options.seed, options.gap_us);
    bench_json_string(out, "one private anonymous mmap of size_bytes, every page written before "
                           "the first lock");
    fprintf(out, ", \"environment\": ");
    bench_json_string(out, "LD_PRELOAD=shim PINSHIM_CONTEXT=create PINSHIM_CUDART=runtime "
                           "PINSHIM_ASYNC=off|on FAKE_CUDART_CHECK=0");
    fprintf(out, ", \"random_order\": ");
    bench_json_string(out, "Fisher-Yates shuffle driven by splitmix64 started at seed + k");
    if (options.check)
        fprintf(out, ", \"check\": {\"limit_registered_over_size\": %.1f, \"passed\": %s}",
                CHECK_LIMIT, check_passed ? "true" : "false");
    else
        fprintf(out, ", \"check\": null");
    fprintf(out, ",\n \"rows\": [");
    for (size_t i = 0; i < row_count; i++) {
        fprintf(out, "%s\n  ", i ? "," : "");
        json_row(out, &rows[i]);
    }
    fprintf(out, "]}\n");
    return fclose(out) == 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: run_joins [--size-mib N] [--pieces K,...] [--orders in,reversed,random]\n"
            "                 [--modes sync,async] [--seed N] [--gap-us N] [--seconds-per-gib S]\n"
            "                 [--check]\n"
            "                 [--cudart LIB] [--shim LIB] [--json FILE]\n"
            "Locks one buffer in k adjacent pieces under the shim (create mode, the fake\n"
            "runtime and driver) and reports what joining the pieces into one registration\n"
            "costs: registrations, bytes registered, unregistrations, time in the locks.\n"
            "  --size-mib         the buffer, S (default 64); S / k must be whole pages\n"
            "  --pieces           the piece counts k (default 2,4,16,64,256,1024)\n"
            "  --orders           in, reversed, random (default all three)\n"
            "  --modes            sync (PINSHIM_ASYNC=off), async (on; pinshim_drain() after\n"
            "                     the last lock, counted) (default both)\n"
            "  --seed             the random order's seed (default 20261206)\n"
            "  --gap-us           a pause between one lock and the next (default 0: a burst);\n"
            "                     in the wall time, not in the lock calls'\n"
            "  --seconds-per-gib  the fake driver's registration latency (default 0.1, about an\n"
            "                     H200 system's); unregistration a tenth of it\n"
            "  --check            exit 1 when an async in-order burst registered more than\n"
            "                     3 x S in bytes\n"
            "  --cudart LIB       the runtime the shim loads (default: PINSHIM_CUDART, else the\n"
            "                     test suite's fake runtime)\n"
            "Exit status: 0; 1 when a run failed, left other than one registration over the\n"
            "buffer, or (--check) registered too much; 64 on bad options.\n");
}

static bool parse_pieces(const char *text)
{
    options.piece_count = 0;
    const char *cursor = text;
    while (*cursor != '\0') {
        char *end;
        unsigned long long k = strtoull(cursor, &end, 10);
        if (end == cursor || k < 1 || options.piece_count == MAX_PIECE_COUNTS ||
            (*end != ',' && *end != '\0'))
            return false;
        options.pieces[options.piece_count++] = (size_t)k;
        cursor = *end == ',' ? end + 1 : end;
    }
    return options.piece_count > 0;
}

/* A comma-separated subset of names into chosen[]. */
static bool parse_names(const char *text, const char *const *names, size_t count, bool *chosen)
{
    memset(chosen, 0, count * sizeof(*chosen));
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", text);
    bool any = false;
    char *saved;
    for (char *item = strtok_r(copy, ",", &saved); item != NULL;
         item = strtok_r(NULL, ",", &saved)) {
        size_t i = 0;
        while (i < count && strcmp(item, names[i]) != 0)
            i++;
        if (i == count)
            return false;
        chosen[i] = any = true;
    }
    return any;
}

static int index_of(const char *name, const char *const *names, int count)
{
    for (int i = 0; i < count; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 8 && strcmp(argv[1], "--child") == 0) {
        size_t bytes = (size_t)strtoull(argv[2], NULL, 10);
        size_t k = (size_t)strtoull(argv[3], NULL, 10);
        int which = index_of(argv[4], order_names, ORDER_COUNT);
        int mode = index_of(argv[5], mode_names, MODE_COUNT);
        if (bytes == 0 || k == 0 || which < 0 || mode < 0)
            return 64;
        int status = child_main(bytes, k, (enum order)which, (enum mode)mode,
                                (uint64_t)strtoull(argv[6], NULL, 10), atol(argv[7]));
        fflush(NULL);
        return status;
    }

    options.bytes = 64 * MIB;
    options.seed = 20261206;
    options.seconds_per_gib = "0.1";
    parse_pieces("2,4,16,64,256,1024");
    for (int i = 0; i < ORDER_COUNT; i++)
        options.orders[i] = true;
    for (int i = 0; i < MODE_COUNT; i++)
        options.modes[i] = true;
    const char *shim_option = NULL, *cudart_option = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--check") == 0) {
            options.check = true;
        } else if (value == NULL) {
            fprintf(stderr, "run_joins: unknown option or missing value: %s\n", arg);
            usage(stderr);
            return 64;
        } else if (strcmp(arg, "--size-mib") == 0 && strtoull(value, NULL, 10) >= 1) {
            options.bytes = (size_t)strtoull(value, NULL, 10) * MIB, i++;
        } else if (strcmp(arg, "--pieces") == 0 && parse_pieces(value)) {
            i++;
        } else if (strcmp(arg, "--orders") == 0 &&
                   parse_names(value, order_names, ORDER_COUNT, options.orders)) {
            i++;
        } else if (strcmp(arg, "--modes") == 0 &&
                   parse_names(value, mode_names, MODE_COUNT, options.modes)) {
            i++;
        } else if (strcmp(arg, "--seed") == 0) {
            options.seed = (uint64_t)strtoull(value, NULL, 10), i++;
        } else if (strcmp(arg, "--gap-us") == 0 && atol(value) >= 0) {
            options.gap_us = atol(value), i++;
        } else if (strcmp(arg, "--seconds-per-gib") == 0 && strtod(value, NULL) >= 0) {
            options.seconds_per_gib = value, i++;
        } else if (strcmp(arg, "--cudart") == 0) {
            cudart_option = value, i++;
        } else if (strcmp(arg, "--shim") == 0) {
            shim_option = value, i++;
        } else if (strcmp(arg, "--json") == 0) {
            options.json_path = value, i++;
        } else {
            fprintf(stderr, "run_joins: bad option or value: %s %s\n", arg, value);
            usage(stderr);
            return 64;
        }
    }
    snprintf(options.unregister_seconds_per_gib, sizeof(options.unregister_seconds_per_gib), "%g",
             strtod(options.seconds_per_gib, NULL) / 10);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < options.piece_count; i++)
        if (options.bytes % (options.pieces[i] * page) != 0) {
            fprintf(stderr, "run_joins: %zu bytes do not split into %zu pieces of whole pages\n",
                    options.bytes, options.pieces[i]);
            return 64;
        }
    if (options.check && !options.modes[MODE_ASYNC]) {
        fprintf(stderr, "run_joins: --check judges the async mode, which --modes leaves out\n");
        return 64;
    }
    if (options.check && !options.orders[ORDER_IN]) {
        fprintf(stderr, "run_joins: --check judges the in-order runs, which --orders leaves "
                        "out\n");
        return 64;
    }

    static char shim[PATH_MAX], runtime[PATH_MAX];
    const char *found = bench_find_library(shim_option, BENCH_SHIM_PATH, "../src/libpinshim.so");
    if (found == NULL) {
        fprintf(stderr, "run_joins: libpinshim.so not found; pass --shim PATH\n");
        return 1;
    }
    snprintf(shim, sizeof(shim), "%s", found);
    if (cudart_option == NULL)
        cudart_option = getenv("PINSHIM_CUDART");
    found = bench_find_library(cudart_option, BENCH_FAKE_CUDART_PATH,
                               "../tests/fake_cudart/libfake_cudart.so");
    if (found == NULL) {
        fprintf(stderr, "run_joins: no CUDA runtime (the fake one of the test suite is built "
                        "with -Dtests=true); pass --cudart LIB\n");
        return 1;
    }
    snprintf(runtime, sizeof(runtime), "%s", found);

    char command[2048] = "";
    for (int i = 0; i < argc; i++)
        snprintf(command + strlen(command), sizeof(command) - strlen(command), "%s%s", i ? " " : "",
                 argv[i]);
    char size[32];
    format_bytes(size, sizeof(size), (double)options.bytes);
    printf("run_joins: shim %s\n", shim);
    printf("runtime: %s on the fake driver, FAKE_CUDA_REGISTER_SECONDS_PER_GIB=%s, "
           "FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB=%s, FAKE_CUDART_CHECK=0; PINSHIM_CONTEXT=create\n",
           runtime, options.seconds_per_gib, options.unregister_seconds_per_gib);
    printf("buffer: S = %s, one private anonymous mmap, every page written before the first "
           "lock; random order: seed %" PRIu64 " (splitmix64 from seed + k, Fisher-Yates)\n",
           size, options.seed);
    if (options.gap_us > 0)
        printf("a pause of %ld us between one lock and the next (in the wall time, not in the "
               "lock calls')\n",
               options.gap_us);

    rows = calloc(options.piece_count * ORDER_COUNT * MODE_COUNT, sizeof(*rows));
    if (rows == NULL)
        return 1;
    double began = bench_now_seconds();
    for (size_t p = 0; p < options.piece_count; p++)
        for (int o = 0; o < ORDER_COUNT; o++)
            for (int m = 0; m < MODE_COUNT; m++) {
                if (!options.orders[o] || !options.modes[m])
                    continue;
                struct row *row = &rows[row_count++];
                row->k = options.pieces[p];
                row->order = (enum order)o;
                row->mode = (enum mode)m;
                run_row(row, shim, runtime);
            }
    print_table();

    bool all_ok = true, disagreements = false;
    for (size_t i = 0; i < row_count; i++) {
        const struct row *row = &rows[i];
        if (!row->final_ok) {
            all_ok = false;
            printf("\nFAIL k=%zu %s %s: %s; shim: live_ranges %" PRIu64 " (%" PRIu64
                   " bytes), held %" PRIu64 ", queued %" PRIu64 ", pending %" PRIu64
                   ", is_registered %" PRIu64 "; driver: live %" PRIu64 ", covering %" PRIu64,
                   row->k, order_names[row->order], mode_names[row->mode],
                   row->message[0] ? row->message : "not one registration over the buffer",
                   row->live_ranges, row->live_bytes, row->held_ranges, row->queued_ranges,
                   row->pending_ranges, row->is_registered, row->driver_live, row->driver_covering);
        }
        if (row->ran && !driver_agrees(row)) {
            disagreements = true;
            printf("\nNOTE k=%zu %s %s: the driver counted %" PRIu64 " registrations and %" PRIu64
                   " unregister calls, the shim %" PRIu64 " and %" PRIu64,
                   row->k, order_names[row->order], mode_names[row->mode], row->driver_registered,
                   row->driver_unregistered, row->register_ok,
                   row->unregister_ok + row->unregister_failed);
        }
    }
    printf("\n%sfinal registrations: %s\n", all_ok ? "" : "\n",
           all_ok ? "one over the whole buffer in every run (shim and driver)"
                  : "NOT one in every run");
    if (!disagreements)
        printf("the fake driver counted the same registrations and unregister calls as the "
               "shim in every run\n");

    bool check_passed = true;
    if (options.check) {
        printf("\ncheck: async, in order, bytes registered at most %.1f x S:\n", CHECK_LIMIT);
        for (size_t i = 0; i < row_count; i++) {
            const struct row *row = &rows[i];
            if (!row_checked(row))
                continue;
            bool fails = row_check_fails(row);
            check_passed = check_passed && !fails;
            if (row->ran)
                printf("  k=%-5zu %.2f x S %s\n", row->k, ratio_of(row), fails ? "OVER" : "ok");
            else
                printf("  k=%-5zu did not run: %s\n", row->k, row->message);
        }
        printf("check %s\n", check_passed ? "passed" : "FAILED");
    }
    printf("\ntotal time %.1f s\n", bench_now_seconds() - began);

    if (options.json_path != NULL &&
        !write_json(options.json_path, command, shim, runtime, check_passed)) {
        fprintf(stderr, "run_joins: cannot write %s: %s\n", options.json_path, strerror(errno));
        return 1;
    }
    return all_ok && check_passed ? 0 : 1;
}
