/* overhead: what the shim costs on the CPU, measured in one run as ratios of
 * the same work with and without LD_PRELOAD=libpinshim.so.
 *
 *   (a) an allocation-heavy workload (mixed malloc/free/realloc/posix_memalign,
 *       1 and 2 threads) with no lock, and with 10,000 live registered ranges;
 *   (b) the shim's own bookkeeping per mlock+munlock pair of a registered range
 *       as the number of live ranges grows from 1 to 1,000,000;
 *   (c) whole programs: python3 running an allocation-heavy script, and sort;
 *   (p) the workload of (a) with and without the shim inside one process, in
 *       short paired blocks, for a precision that separate processes lack.
 *
 * The program re-executes itself (hidden --child modes) for every arm, so the
 * "with" arm runs under the shim and the "without" arm does not; the runs of
 * the two arms alternate so slow drifts of a shared machine hit both alike.
 * (p) runs under the shim and calls either the shim's functions or libc's own.
 * Registrations go to the fake CUDA runtime (PINSHIM_CUDART=libfake_cudart.so,
 * FAKE_CUDART_CHECK=0), so the figures are the shim's price, not CUDA's. */
#include "bench_util.h"

#include "pinshim.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef BENCH_SHIM_PATH
#define BENCH_SHIM_PATH ""
#endif
#ifndef BENCH_FAKE_CUDART_PATH
#define BENCH_FAKE_CUDART_PATH ""
#endif

#define LIVE_BUFFER_BYTES (64u * 1024u) /* one pinned staging buffer of the (a) arm */
#define MAX_ROUNDS 64
#define MAX_SIZES 16
#define BLOCK_PAIRS 50         /* pairs per interleaved block in (b) */
#define MAX_PAIRED_BLOCKS 1000 /* ABBA pairs per thread count in (p) */

/* The process's page (sysconf, set first in main): the (b) arm locks one page at a time. */
static size_t page_bytes;

static const size_t default_live_sizes[] = {1, 10, 100, 1000, 10000, 100000, 1000000};

struct options {
    bool quick;
    const char *json_path;
    const char *shim;
    const char *fake;
    const char *python;
    const char *parts;    /* which of a, b, c, i, p to run */
    int rounds;           /* alternating with/without runs of (a) and (c) */
    size_t alloc_ops;     /* per thread and repetition in (a) */
    int alloc_reps;       /* repetitions inside one process; the fastest counts */
    size_t paired_ops;    /* per thread and block in (p) */
    size_t paired_blocks; /* with/without pairs per thread count in (p) */
    size_t live_ranges_a;
    size_t pairs; /* mlock/munlock pairs per round in (b) */
    int pair_rounds;
    size_t live_sizes[MAX_SIZES];
    size_t live_size_count;
    size_t sort_megabytes;
    int program_rounds;
};

/* ------------------------------------------------------------------------ */
/* Child (a): the allocation-heavy workload.                                */

#define WORKLOAD_SLOTS 4096

/* The allocator the workload calls. The process-level arms use the global
 * symbols (under LD_PRELOAD, the shim's free, realloc and posix_memalign, and
 * libc's malloc in both arms); the paired part (p) switches between the shim's
 * functions and libc's own ones inside one process. */
struct alloc_api {
    void *(*malloc)(size_t);
    void (*free)(void *);
    void *(*realloc)(void *, size_t);
    int (*posix_memalign)(void **, size_t, size_t);
};

static const struct alloc_api global_api = {
    .malloc = &malloc, .free = &free, .realloc = &realloc, .posix_memalign = &posix_memalign};

struct worker {
    const struct alloc_api *api;
    uint64_t seed;
    size_t ops;
    double cpu_seconds;
    uint64_t checksum;
    pthread_barrier_t *start;
};

static inline uint64_t next_random(uint64_t *state)
{
    /* xorshift64*: cheap and the same sequence in both arms */
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* A mix in the spirit of a data-loading program: mostly small objects, some
 * medium ones, aligned blocks, and a few large page-aligned buffers (the ones
 * the shim rounds to whole pages). */
static void *allocate_one(const struct alloc_api *api, uint64_t r, size_t *size_out)
{
    unsigned kind = (unsigned)((r >> 32) % 1000);
    size_t spread = (size_t)(r >> 44);
    void *memory = NULL;
    size_t size;
    if (kind < 700) {
        size = 16 + spread % 240;
        memory = api->malloc(size);
    } else if (kind < 900) {
        size = 256 + spread % 3840;
        memory = api->malloc(size);
    } else if (kind < 970) {
        size = 4096 + spread % 61440;
        memory = api->malloc(size);
    } else if (kind < 990) {
        size = 64 + spread % 4032;
        if (api->posix_memalign(&memory, 64, size) != 0)
            memory = NULL;
    } else {
        size = 65536 + spread % 196608;
        if (api->posix_memalign(&memory, page_bytes, size) != 0)
            memory = NULL;
    }
    *size_out = size;
    return memory;
}

static void *workload_thread(void *argument)
{
    struct worker *worker = argument;
    const struct alloc_api *api = worker->api;
    void **slots = calloc(WORKLOAD_SLOTS, sizeof(*slots));
    size_t *sizes = calloc(WORKLOAD_SLOTS, sizeof(*sizes));
    uint64_t state = worker->seed, checksum = 0;
    pthread_barrier_wait(worker->start);
    double cpu_began = bench_thread_cpu_seconds();
    for (size_t op = 0; op < worker->ops; op++) {
        uint64_t r = next_random(&state);
        size_t slot = (size_t)(r & (WORKLOAD_SLOTS - 1));
        unsigned char *memory = slots[slot];
        if (memory != NULL) {
            checksum += memory[0] + memory[sizes[slot] - 1];
            if (((r >> 16) & 15) == 0) {
                /* realloc to another size keeps the block alive */
                size_t size = 16 + (size_t)(r >> 40) % 8192;
                unsigned char *moved = api->realloc(memory, size);
                if (moved != NULL) {
                    moved[0] = (unsigned char)op;
                    moved[size - 1] = (unsigned char)op;
                    slots[slot] = moved;
                    sizes[slot] = size;
                }
            } else {
                api->free(memory);
                slots[slot] = NULL;
            }
        } else {
            size_t size;
            memory = allocate_one(api, r, &size);
            if (memory != NULL) {
                memory[0] = (unsigned char)op;
                memory[size - 1] = (unsigned char)op;
                slots[slot] = memory;
                sizes[slot] = size;
            }
        }
    }
    for (size_t slot = 0; slot < WORKLOAD_SLOTS; slot++)
        api->free(slots[slot]);
    worker->cpu_seconds = bench_thread_cpu_seconds() - cpu_began;
    worker->checksum = checksum;
    free(slots);
    free(sizes);
    return NULL;
}

/* Runs the workload on threads threads through api; returns wall seconds, *cpu
 * the sum of the threads' CPU seconds. All it allocates is freed (through api)
 * before it returns. */
static double run_workload(const struct alloc_api *api, int threads, size_t ops, uint64_t seed,
                           double *cpu)
{
    pthread_t ids[2];
    struct worker workers[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        workers[i] = (struct worker){.api = api,
                                     .seed = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1),
                                     .ops = ops,
                                     .start = &start};
        pthread_create(&ids[i], NULL, workload_thread, &workers[i]);
    }
    pthread_barrier_wait(&start);
    double began = bench_now_seconds();
    uint64_t checksum = 0;
    *cpu = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], NULL);
        *cpu += workers[i].cpu_seconds;
        checksum += workers[i].checksum;
    }
    double wall = bench_now_seconds() - began;
    pthread_barrier_destroy(&start);
    if (checksum == 42) /* keeps the reads of the blocks alive */
        fputc(' ', stderr);
    return wall;
}

static size_t (*shim_counters_function(void))(struct pinshim_counters *, size_t)
{
    return (size_t(*)(struct pinshim_counters *, size_t))dlsym(RTLD_DEFAULT,
                                                               "pinshim_get_counters");
}

/* Leaves without the shim's exit-time unregistration of what is still live: it
 * is no part of any figure here, and it takes time quadratic in the number of
 * live ranges in pinshim 0.1.0 (minutes at 100k). The kernel drops the pins. */
static _Noreturn void exit_skipping_unregistration(int status)
{
    fflush(NULL);
    _exit(status);
}

/* The live ranges of (a) and (p): pinned 64 KiB staging buffers, locked before
 * timing, and left live until the process exits. False (with an ERROR line)
 * when one cannot be made. */
#define LIVE_GAP_BYTES (16u * 1024u) /* the hole after each live buffer, when interleaved */

/* The live ranges: pinned 64 KiB staging buffers, locked before timing. With
 * interleave, a 16 KiB block after each is freed once all are locked, so the
 * workload's blocks land in holes between registered buffers (the registry's
 * lookups cannot be skipped) instead of far from all of them; see
 * lock_live_buffers_in_workload_arena for why the arena matters. */
static bool lock_live_buffers(size_t live, bool interleave)
{
    if (live == 0)
        return true;
    void **buffers = calloc(live, sizeof(*buffers));
    void **gaps = calloc(live, sizeof(*gaps));
    if (buffers == NULL || gaps == NULL) {
        printf("ERROR no memory for %zu live buffers\n", live);
        return false;
    }
    for (size_t i = 0; i < live; i++) {
        if (posix_memalign(&buffers[i], page_bytes, LIVE_BUFFER_BYTES) != 0) {
            printf("ERROR posix_memalign of live buffer %zu failed\n", i);
            return false;
        }
        if (interleave && (gaps[i] = malloc(LIVE_GAP_BYTES)) == NULL) {
            printf("ERROR malloc of gap %zu failed\n", i);
            return false;
        }
        memset(buffers[i], 1, LIVE_BUFFER_BYTES);
        if (mlock(buffers[i], LIVE_BUFFER_BYTES) != 0) {
            printf("ERROR mlock of live buffer %zu failed: %s\n", i, strerror(errno));
            return false;
        }
    }
    for (size_t i = 0; i < live; i++)
        free(gaps[i]);
    free(gaps);
    return true;
}

struct live_setup {
    size_t live;
    bool ok;
};

static void *lock_live_buffers_thread(void *argument)
{
    struct live_setup *setup = argument;
    setup->ok = lock_live_buffers(setup->live, true);
    return NULL;
}

/* glibc gives each new thread an arena of its own, and a thread that ends
 * hands its arena to the next new thread: locking the buffers from a thread
 * that ends before the workload's threads start puts them in the arena the
 * (first) workload thread allocates from. From the main thread they would sit
 * in the main arena, where no workload block ever lands. */
static bool lock_live_buffers_in_workload_arena(size_t live)
{
    struct live_setup setup = {live, false};
    pthread_t thread;
    if (pthread_create(&thread, NULL, lock_live_buffers_thread, &setup) != 0)
        return false;
    pthread_join(thread, NULL);
    return setup.ok;
}

/* Prints the INFO line: whether the shim is loaded and how many ranges it holds. */
static void print_shim_info(void)
{
    size_t (*counters)(struct pinshim_counters *, size_t) = shim_counters_function();
    long long registered = -1;
    if (counters != NULL) {
        struct pinshim_counters now;
        memset(&now, 0, sizeof(now));
        counters(&now, sizeof(now));
        registered = (long long)now.live_ranges;
    }
    printf("INFO shim=%d live_ranges=%lld\n", counters != NULL, registered);
}

static int child_alloc(size_t live, size_t ops, int reps, int max_threads)
{
    if (!lock_live_buffers(live, false))
        return 1;
    print_shim_info();
    for (int threads = 1; threads <= max_threads; threads++) {
        double best_wall = 0, best_cpu = 0;
        for (int rep = 0; rep < reps; rep++) {
            double cpu;
            double wall =
                run_workload(&global_api, threads, ops, 0x1234567ull + (uint64_t)rep, &cpu);
            if (rep == 0 || wall < best_wall)
                best_wall = wall;
            if (rep == 0 || cpu < best_cpu)
                best_cpu = cpu;
        }
        printf("RESULT threads=%d wall=%.9f cpu=%.9f\n", threads, best_wall, best_cpu);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Child (p): the workload of (a), with and without the shim in one process. */

/* libc's own malloc, free, realloc and posix_memalign, which the shim does not
 * see. False (with an ERROR line) when libc cannot be found. */
static bool libc_api(struct alloc_api *api)
{
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    if (libc == NULL) {
        printf("ERROR dlopen(libc.so.6, RTLD_NOLOAD): %s\n", dlerror());
        return false;
    }
    *(void **)&api->malloc = dlsym(libc, "malloc");
    *(void **)&api->free = dlsym(libc, "free");
    *(void **)&api->realloc = dlsym(libc, "realloc");
    *(void **)&api->posix_memalign = dlsym(libc, "posix_memalign");
    if (api->malloc == NULL || api->free == NULL || api->realloc == NULL ||
        api->posix_memalign == NULL) {
        printf("ERROR libc.so.6 lacks malloc, free, realloc or posix_memalign\n");
        return false;
    }
    return true;
}

/* The file name of the object that holds function (for the INFO line). */
static const char *object_of(void (*function)(void *))
{
    Dl_info info;
    void *address;
    memcpy(&address, &function, sizeof(address));
    return dladdr(address, &info) != 0 && info.dli_fname != NULL ? info.dli_fname : "?";
}

/* One block of (p): a whole run_workload through one arm, and its BLOCK line. */
static void run_block(const struct alloc_api *api, const char *arm, int threads, size_t pair,
                      size_t ops, uint64_t seed)
{
    double cpu;
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    double wall = run_workload(api, threads, ops, seed, &cpu);
    getrusage(RUSAGE_SELF, &after);
    printf("BLOCK threads=%d pair=%zu arm=%s cpu=%.9f wall=%.9f faults=%ld\n", threads, pair, arm,
           cpu, wall, after.ru_minflt - before.ru_minflt);
}

/* pairs pairs of blocks in the order ABBA ABBA ... (A: with the shim, B:
 * without), so that both arms sit at the same average time; the two blocks of
 * a pair do the same work (one seed), each pair other work. One untimed block
 * per arm first warms the heap and the caches. */
static void run_paired_blocks(const struct alloc_api *with, const struct alloc_api *without,
                              int threads, size_t ops, size_t pairs)
{
    double cpu;
    run_workload(with, threads, ops, 0xABBAull, &cpu);
    run_workload(without, threads, ops, 0xABBAull, &cpu);
    for (size_t pair = 0; pair < pairs; pair++) {
        uint64_t seed = 0x5EED0000ull + 0x10001ull * (uint64_t)pair + (uint64_t)threads;
        bool with_first = pair % 2 == 0;
        run_block(with_first ? with : without, with_first ? "with" : "without", threads, pair, ops,
                  seed);
        run_block(with_first ? without : with, with_first ? "without" : "with", threads, pair, ops,
                  seed);
    }
}

static int child_alloc_interleaved(size_t live, size_t ops, size_t pairs, bool interleave)
{
    if (!(interleave ? lock_live_buffers_in_workload_arena(live) : lock_live_buffers(live, false)))
        return 1;
    if (shim_counters_function() == NULL) {
        printf("ERROR not running under the shim (pinshim_get_counters not found)\n");
        return 1;
    }
    print_shim_info();
    struct alloc_api without;
    if (!libc_api(&without))
        return 1;
    const struct alloc_api *with = &global_api;
    if (with->free == without.free) {
        printf("ERROR free is libc's: the shim does not interpose it\n");
        return 1;
    }
    printf("INFO with_free=%s without_free=%s\n", object_of(with->free), object_of(without.free));
    for (int threads = 1; threads <= 2; threads++)
        run_paired_blocks(with, &without, threads, ops, pairs);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Child (b): bookkeeping per mlock/munlock pair against live ranges.        */

static int raw_mlock(void *address, size_t length)
{
    return (int)syscall(SYS_mlock, address, length);
}

static int raw_munlock(void *address, size_t length)
{
    return (int)syscall(SYS_munlock, address, length);
}

struct pair_context {
    char *region;
    size_t live;
    size_t pairs;
    size_t (*counters)(struct pinshim_counters *, size_t);
    int (*fake_register)(void *, size_t, unsigned);
    int (*fake_unregister)(void *);
};

/* cudaHostRegisterPortable | cudaHostRegisterMapped: what the shim asks for
 * by default (cudaHostRegisterDefault's meaning on 64-bit systems). */
#define SHIM_DEFAULT_REGISTER_FLAGS 3u

/* The pair the shim makes, made without it: the fake's unregister, the
 * system calls, the fake's register, on the same page in the same order.
 * The shim does not see any of it and its view stays right (the page ends
 * registered and locked, as it began). */
static void bare_pair(const struct pair_context *ctx, char *page)
{
    ctx->fake_unregister(page);
    raw_munlock(page, page_bytes);
    raw_mlock(page, page_bytes);
    ctx->fake_register(page, page_bytes, SHIM_DEFAULT_REGISTER_FLAGS);
}

/* The pages each arm of (b) works on, as indexes into the region. */
enum { ARM_SHIM, ARM_RAW, ARM_BARE, ARMS };

/* One round of (b) at ctx->live ranges, in interleaved blocks: munlock+mlock
 * pairs through the shim, the same pairs as raw syscalls, and bare pairs
 * (the runtime's calls and the syscalls without the shim), each arm on pages
 * of its own (order[arm]: in the random pattern no arm finds what another
 * has just brought into cache, the kernel's page tables or the runtime's
 * tree). Prints a ROUND line of per-pair medians over the blocks; false on a
 * count that does not add up. */
static bool measure_round(const struct pair_context *ctx, const char *pattern, int round,
                          size_t *const order[ARMS])
{
    size_t blocks = (ctx->pairs + BLOCK_PAIRS - 1) / BLOCK_PAIRS;
    enum { SHIM, RAW, BARE, RUNTIME, BOOK, BOOK_COUNTERS, SERIES };
    double *ns[SERIES];
    for (int k = 0; k < SERIES; k++)
        ns[k] = calloc(blocks, sizeof(double));
    bool ok = true;
    for (size_t block = 0; block < blocks && ok; block++) {
        size_t first = block * BLOCK_PAIRS;
        size_t last = first + BLOCK_PAIRS < ctx->pairs ? first + BLOCK_PAIRS : ctx->pairs;
        double count = (double)(last - first);
        /* Short interleaved blocks, rotating which goes first, so that
         * interference from other processes hits the three loops alike. */
        for (int turn = 0; turn < ARMS; turn++) {
            int arm = (int)((block + (size_t)round + (size_t)turn) % ARMS);
            const size_t *pages = order[arm];
            if (arm == ARM_SHIM) {
                struct pinshim_counters before, after;
                ctx->counters(&before, sizeof(before));
                double began = bench_now_seconds();
                for (size_t i = first; i < last; i++) {
                    char *page = ctx->region + pages[i] * page_bytes;
                    munlock(page, page_bytes);
                    mlock(page, page_bytes);
                }
                ns[SHIM][block] = (bench_now_seconds() - began) * 1e9 / count;
                ctx->counters(&after, sizeof(after));
                uint64_t registered = after.register_ok - before.register_ok;
                uint64_t unregistered = after.unregister_ok - before.unregister_ok;
                if (registered != last - first || unregistered != last - first ||
                    after.live_ranges != ctx->live) {
                    printf("ERROR live=%zu: %" PRIu64 " registrations and %" PRIu64
                           " unregistrations for %zu pairs, %" PRIu64 " live\n",
                           ctx->live, registered, unregistered, last - first, after.live_ranges);
                    ok = false;
                }
                ns[RUNTIME][block] =
                    (double)(after.register_nanoseconds - before.register_nanoseconds +
                             after.unregister_nanoseconds - before.unregister_nanoseconds) /
                    count;
            } else if (arm == ARM_RAW) {
                double began = bench_now_seconds();
                for (size_t i = first; i < last; i++) {
                    char *page = ctx->region + pages[i] * page_bytes;
                    raw_munlock(page, page_bytes);
                    raw_mlock(page, page_bytes);
                }
                ns[RAW][block] = (bench_now_seconds() - began) * 1e9 / count;
            } else {
                double began = bench_now_seconds();
                for (size_t i = first; i < last; i++)
                    bare_pair(ctx, ctx->region + pages[i] * page_bytes);
                ns[BARE][block] = (bench_now_seconds() - began) * 1e9 / count;
            }
        }
        ns[BOOK][block] = ns[SHIM][block] - ns[BARE][block];
        ns[BOOK_COUNTERS][block] = ns[SHIM][block] - ns[RAW][block] - ns[RUNTIME][block];
    }
    if (ok)
        printf("ROUND live=%zu pattern=%s round=%d pairs=%zu shim=%.3f raw=%.3f bare=%.3f "
               "runtime=%.3f book=%.3f bookcounters=%.3f\n",
               ctx->live, pattern, round, ctx->pairs, bench_median(ns[SHIM], blocks),
               bench_median(ns[RAW], blocks), bench_median(ns[BARE], blocks),
               bench_median(ns[RUNTIME], blocks), bench_median(ns[BOOK], blocks),
               bench_median(ns[BOOK_COUNTERS], blocks));
    for (int k = 0; k < SERIES; k++)
        free(ns[k]);
    return ok;
}

static int child_bookkeeping(const size_t *sizes, size_t size_count, size_t pairs, int rounds)
{
    size_t (*counters)(struct pinshim_counters *, size_t) = shim_counters_function();
    if (counters == NULL) {
        printf("ERROR not running under the shim (pinshim_get_counters not found)\n");
        return 1;
    }
    size_t max_live = 0;
    for (size_t i = 0; i < size_count; i++)
        if (sizes[i] > max_live)
            max_live = sizes[i];
    /* One mapping holds every range. Locking it once with the raw syscall
     * populates it; the shim then sees one mlock per page, which registers
     * that page alone. */
    size_t pages = max_live;
    char *region = mmap(NULL, pages * page_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) {
        printf("ERROR mmap of %zu pages failed: %s\n", pages, strerror(errno));
        return 1;
    }
    double setup_began = bench_now_seconds();
    if (raw_mlock(region, pages * page_bytes) != 0) {
        printf("ERROR mlock of %zu pages failed: %s\n", pages, strerror(errno));
        return 1;
    }
    printf("INFO populated %zu pages in %.3f s\n", pages, bench_now_seconds() - setup_began);

    /* The fake runtime the shim loaded, for the bare pairs. */
    int (*fake_register)(void *, size_t, unsigned) = NULL;
    int (*fake_unregister)(void *) = NULL;

    size_t *order[ARMS];
    for (int arm = 0; arm < ARMS; arm++)
        order[arm] = malloc(pairs * sizeof(*order[arm]));
    size_t live = 0;
    uint64_t state = 0xC0FFEEull;
    for (size_t s = 0; s < size_count; s++) {
        size_t target = sizes[s];
        double grow_began = bench_now_seconds();
        while (live < target) {
            if (mlock(region + live * page_bytes, page_bytes) != 0) {
                printf("SKIP live=%zu reason=mlock of page %zu failed: %s\n", target, live,
                       strerror(errno));
                return 0;
            }
            live++;
        }
        struct pinshim_counters before;
        counters(&before, sizeof(before));
        if (before.live_ranges != live) {
            printf("ERROR live=%zu but the shim holds %" PRIu64 " registrations\n", live,
                   before.live_ranges);
            return 1;
        }
        printf("INFO live=%zu reached in %.3f s\n", live, bench_now_seconds() - grow_began);
        if (fake_register == NULL) {
            const char *fake_path = getenv("PINSHIM_CUDART");
            void *fake = fake_path ? dlopen(fake_path, RTLD_NOW | RTLD_NOLOAD) : NULL;
            if (fake != NULL) {
                fake_register = (int (*)(void *, size_t, unsigned))dlsym(fake, "cudaHostRegister");
                fake_unregister = (int (*)(void *))dlsym(fake, "cudaHostUnregister");
            }
            if (fake_register == NULL || fake_unregister == NULL) {
                printf("ERROR the fake runtime the shim registers with (PINSHIM_CUDART=%s) is "
                       "not loaded\n",
                       fake_path ? fake_path : "");
                return 1;
            }
        }
        struct pair_context context = {
            .region = region,
            .live = live,
            .pairs = pairs,
            .counters = counters,
            .fake_register = fake_register,
            .fake_unregister = fake_unregister,
        };
        /* random: pages picked at random among the live ones, for each arm
         * its own (the shim's, the fake's and the kernel's tables are out of
         * cache at large counts). */
        for (int arm = 0; arm < ARMS; arm++)
            for (size_t i = 0; i < pairs; i++)
                order[arm][i] = (size_t)(next_random(&state) % live);
        for (int round = 0; round < rounds; round++)
            if (!measure_round(&context, "random", round, order))
                return 1;
        /* sequential: the live pages in address order (each pair's
         * neighbours were the last ones touched: issue 22), each arm from
         * its own place among them. */
        for (int arm = 0; arm < ARMS; arm++)
            for (size_t i = 0; i < pairs; i++)
                order[arm][i] = (i + (size_t)arm * (live / ARMS)) % live;
        for (int round = 0; round < rounds; round++)
            if (!measure_round(&context, "sequential", round, order))
                return 1;
        /* hot: one page over and over, the same for every arm (what the code
         * costs with its data in cache). */
        for (int arm = 0; arm < ARMS; arm++)
            for (size_t i = 0; i < pairs; i++)
                order[arm][i] = live / 2;
        for (int round = 0; round < rounds; round++)
            if (!measure_round(&context, "hot", round, order))
                return 1;
        fflush(stdout);
    }
    for (int arm = 0; arm < ARMS; arm++)
        free(order[arm]);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Parent.                                                                  */

struct arm_samples {
    double wall[MAX_ROUNDS];
    double cpu[MAX_ROUNDS];
    int count;
};

struct alloc_result {
    const char *condition;
    size_t live;
    int threads;
    struct arm_samples with, without;
    long long verified_live; /* what the shim reported holding, -1 if unknown */
    bool ok;
};

/* (p): per condition and thread count, the paired blocks of one child. */
struct paired_result {
    const char *condition;
    size_t live;
    int threads;
    size_t pairs;                                              /* complete with/without pairs */
    double *with_cpu, *without_cpu, *with_wall, *without_wall; /* per pair, seconds */
    double *with_faults, *without_faults; /* per pair, the process's minor page faults */
    long long verified_live;              /* what the shim reported holding, -1 if unknown */
    bool ok;
    char error[200];
};

struct bookkeeping_result {
    size_t live;
    const char *pattern; /* "random", "sequential" or "hot" */
    bool skipped;
    char reason[200];
    int rounds;
    /* Per round, per pair, in ns: medians over the round's interleaved blocks. */
    double shim[MAX_ROUNDS], raw[MAX_ROUNDS], bare[MAX_ROUNDS], runtime[MAX_ROUNDS];
    double book[MAX_ROUNDS], book_counters[MAX_ROUNDS];
    size_t pairs;
};

struct program_result {
    const char *name;
    char command[512];
    struct arm_samples with, without;
    bool ok;
    char error[200];
};

static struct options options;
static const char *shim_path;
static const char *fake_path;

static double ratio(double with, double without)
{
    return without > 0 ? with / without : 0.0;
}

static double percent(double value_ratio)
{
    return (value_ratio - 1.0) * 100.0;
}

static void arm_add(struct arm_samples *arm, double wall, double cpu)
{
    if (arm->count < MAX_ROUNDS) {
        arm->wall[arm->count] = wall;
        arm->cpu[arm->count] = cpu;
        arm->count++;
    }
}

static void shim_environment(struct bench_env *env)
{
    bench_env_set(env, "LD_PRELOAD", shim_path);
    /* The children never use CUDA themselves: in the default program mode
     * the shim would wait for them to and register nothing, so the costs
     * measured here are those of create mode, which registers at once. */
    bench_env_set(env, "PINSHIM_CONTEXT", "create");
    if (fake_path != NULL) {
        bench_env_set(env, "PINSHIM_CUDART", fake_path);
        bench_env_set(env, "FAKE_CUDART_CHECK", "0");
    }
}

static const char *find_line(const char *text, const char *prefix)
{
    size_t length = strlen(prefix);
    for (const char *line = text; line != NULL && *line != '\0';) {
        if (strncmp(line, prefix, length) == 0)
            return line;
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return NULL;
}

static bool field_number(const char *line, const char *key, double *out)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), " %s=", key);
    const char *end_of_line = strchr(line, '\n');
    const char *field = strstr(line, pattern);
    if (field == NULL || (end_of_line != NULL && field > end_of_line))
        return false;
    *out = strtod(field + strlen(pattern), NULL);
    return true;
}

static void run_alloc_part(struct alloc_result *results, size_t *result_count)
{
    static const struct {
        const char *name;
        bool live;
    } conditions[] = {{"no locks", false}, {"10k live ranges", true}};
    *result_count = 0;
    for (size_t c = 0; c < 2; c++) {
        size_t live = conditions[c].live ? options.live_ranges_a : 0;
        for (int threads = 1; threads <= 2; threads++) {
            struct alloc_result *result = &results[*result_count + (size_t)threads - 1];
            memset(result, 0, sizeof(*result));
            result->condition = conditions[c].name;
            result->live = live;
            result->threads = threads;
            result->verified_live = -1;
            result->ok = true;
        }
        char live_text[32], ops_text[32], reps_text[16];
        snprintf(live_text, sizeof(live_text), "%zu", live);
        snprintf(ops_text, sizeof(ops_text), "%zu", options.alloc_ops);
        snprintf(reps_text, sizeof(reps_text), "%d", options.alloc_reps);
        char *argv[] = {
            (char *)bench_self_path(), "--child-alloc", live_text, ops_text, reps_text, NULL};
        fprintf(stderr, "overhead (a) %s:", conditions[c].name);
        for (int round = 0; round < options.rounds; round++) {
            for (int half = 0; half < 2; half++) {
                bool with_shim = (half == 0) == (round % 2 == 0);
                struct bench_env env;
                bench_env_from_current(&env);
                if (with_shim)
                    shim_environment(&env);
                struct bench_run run;
                bool started = bench_run_process(argv, &env, true, false, &run);
                bench_env_free(&env);
                const char *info = started && run.output ? find_line(run.output, "INFO") : NULL;
                for (int threads = 1; threads <= 2; threads++) {
                    struct alloc_result *result = &results[*result_count + (size_t)threads - 1];
                    char prefix[32];
                    snprintf(prefix, sizeof(prefix), "RESULT threads=%d", threads);
                    const char *line =
                        started && run.exit_code == 0 ? find_line(run.output, prefix) : NULL;
                    double wall, cpu, registered;
                    if (line == NULL || !field_number(line, "wall", &wall) ||
                        !field_number(line, "cpu", &cpu)) {
                        result->ok = false;
                        continue;
                    }
                    arm_add(with_shim ? &result->with : &result->without, wall, cpu);
                    if (with_shim && info != NULL && field_number(info, "live_ranges", &registered))
                        result->verified_live = (long long)registered;
                }
                if (!started || run.exit_code != 0)
                    fprintf(stderr, " [child failed: exit %d: %s]", run.exit_code,
                            run.output ? run.output : "");
                bench_run_free(&run);
            }
            fprintf(stderr, " %d", round + 1);
        }
        fprintf(stderr, "\n");
        *result_count += 2;
    }
}

/* ---- (p): the paired in-process measurement ---- */

/* Median, confidence interval and sum ratio of one series of pairs, in percent. */
struct paired_stats {
    double median, low, high, sum; /* low/high: NAN when too few pairs */
};

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The largest k >= 1 with P(X <= k-1) <= 0.025 for X ~ binomial(n, 1/2), or 0
 * when there is none (n < 6). The k-th and (n+1-k)-th smallest of n values then
 * bound their median with at least 95% confidence, whatever their distribution. */
static size_t median_interval_rank(size_t n)
{
    if (n == 0 || n > 1000) /* C(n, i) overflows a double past about 1020 */
        return 0;
    double total = 0, term = 1; /* term: C(n, i) */
    double *cumulative = malloc((n + 1) * sizeof(*cumulative));
    if (cumulative == NULL)
        return 0;
    for (size_t i = 0; i <= n; i++) {
        total += term;
        cumulative[i] = total;
        term = term * (double)(n - i) / (double)(i + 1);
    }
    size_t k = 0;
    while (k + 1 <= n && cumulative[k] / total <= 0.025)
        k++;
    free(cumulative);
    return k;
}

static struct paired_stats paired_statistics(const double *with, const double *without,
                                             size_t pairs)
{
    struct paired_stats stats = {0, NAN, NAN, 0};
    if (pairs == 0)
        return stats;
    double *ratios = malloc(pairs * sizeof(*ratios));
    double with_sum = 0, without_sum = 0;
    for (size_t i = 0; i < pairs; i++) {
        ratios[i] = percent(ratio(with[i], without[i]));
        with_sum += with[i];
        without_sum += without[i];
    }
    qsort(ratios, pairs, sizeof(*ratios), compare_doubles);
    stats.median = bench_median(ratios, pairs);
    stats.sum = percent(ratio(with_sum, without_sum));
    size_t k = median_interval_rank(pairs);
    if (k > 0) {
        stats.low = ratios[k - 1];
        stats.high = ratios[pairs - k];
    }
    free(ratios);
    return stats;
}

static double sum_of(const double *values, size_t count)
{
    double sum = 0;
    for (size_t i = 0; i < count; i++)
        sum += values[i];
    return sum;
}

static void paired_result_init(struct paired_result *result, const char *condition, size_t live,
                               int threads, size_t max_pairs)
{
    memset(result, 0, sizeof(*result));
    result->condition = condition;
    result->live = live;
    result->threads = threads;
    result->verified_live = -1;
    result->with_cpu = calloc(max_pairs, sizeof(double));
    result->without_cpu = calloc(max_pairs, sizeof(double));
    result->with_wall = calloc(max_pairs, sizeof(double));
    result->without_wall = calloc(max_pairs, sizeof(double));
    result->with_faults = calloc(max_pairs, sizeof(double));
    result->without_faults = calloc(max_pairs, sizeof(double));
}

/* Files the BLOCK lines of threads into result; a pair counts once both of its
 * blocks are there. */
static void parse_blocks(const char *output, int threads, size_t max_pairs,
                         struct paired_result *result)
{
    char *seen = calloc(max_pairs, 1); /* bit 0: with, bit 1: without */
    for (const char *line = find_line(output, "BLOCK "); line != NULL;
         line = strchr(line, '\n') ? find_line(strchr(line, '\n') + 1, "BLOCK ") : NULL) {
        int line_threads;
        size_t pair;
        char arm[8];
        double cpu, wall, faults = 0;
        if (sscanf(line, "BLOCK threads=%d pair=%zu arm=%7s cpu=%lf wall=%lf faults=%lf",
                   &line_threads, &pair, arm, &cpu, &wall, &faults) < 5 ||
            line_threads != threads || pair >= max_pairs)
            continue;
        bool with = strcmp(arm, "with") == 0;
        (with ? result->with_cpu : result->without_cpu)[pair] = cpu;
        (with ? result->with_wall : result->without_wall)[pair] = wall;
        (with ? result->with_faults : result->without_faults)[pair] = faults;
        seen[pair] |= with ? 1 : 2;
    }
    /* Complete pairs only, in order. */
    for (size_t pair = 0; pair < max_pairs; pair++) {
        if (seen[pair] != 3)
            continue;
        size_t to = result->pairs++;
        result->with_cpu[to] = result->with_cpu[pair];
        result->without_cpu[to] = result->without_cpu[pair];
        result->with_wall[to] = result->with_wall[pair];
        result->without_wall[to] = result->without_wall[pair];
        result->with_faults[to] = result->with_faults[pair];
        result->without_faults[to] = result->without_faults[pair];
    }
    free(seen);
}

/* The first ERROR line of output, or the exit status, as result's error. */
static void paired_failure(struct paired_result *result, const struct bench_run *run, bool started)
{
    const char *error = started && run->output ? find_line(run->output, "ERROR") : NULL;
    if (error != NULL) {
        const char *end = strchr(error, '\n');
        int length = end ? (int)(end - error) : (int)strlen(error);
        snprintf(result->error, sizeof(result->error), "%.*s", length, error);
    } else {
        snprintf(result->error, sizeof(result->error), "child exited with %d", run->exit_code);
    }
}

static void run_paired_part(struct paired_result *results, size_t *result_count)
{
    /* The third condition splits the no-lock price: PINSHIM_MIN_BYTES=1M lifts
     * the shim's page rounding of posix_memalign above the workload's largest
     * request (256 KiB), leaving only the interposed calls themselves. */
    /* The fourth puts the workload's blocks between the registered buffers
     * (see lock_live_buffers), where free must look each block up. */
    static const struct {
        const char *name;
        bool live;
        const char *setting;
        bool interleave;
    } conditions[] = {{"no locks", false, NULL, false},
                      {"10k live ranges", true, NULL, false},
                      {"no locks, no page rounding", false, "1M", false},
                      {"10k live ranges, interleaved", true, NULL, true}};
    *result_count = 0;
    size_t pairs = options.paired_blocks;
    for (size_t c = 0; c < sizeof(conditions) / sizeof(conditions[0]); c++) {
        size_t live = conditions[c].live ? options.live_ranges_a : 0;
        char live_text[32], ops_text[32], blocks_text[32];
        snprintf(live_text, sizeof(live_text), "%zu", live);
        snprintf(ops_text, sizeof(ops_text), "%zu", options.paired_ops);
        snprintf(blocks_text, sizeof(blocks_text), "%zu", pairs);
        char *argv[] = {(char *)bench_self_path(),
                        "--child-alloc-interleaved",
                        live_text,
                        ops_text,
                        blocks_text,
                        conditions[c].interleave ? "interleaved" : NULL,
                        NULL};
        struct bench_env env;
        bench_env_from_current(&env);
        shim_environment(&env);
        if (conditions[c].setting != NULL)
            bench_env_set(&env, "PINSHIM_MIN_BYTES", conditions[c].setting);
        fprintf(stderr, "overhead (p) %s: %zu ABBA pairs per thread count ...\n",
                conditions[c].name, pairs);
        struct bench_run run;
        bool started = bench_run_process(argv, &env, true, false, &run);
        bench_env_free(&env);
        bool exited_ok = started && run.exit_code == 0 && run.output != NULL;
        const char *info = exited_ok ? find_line(run.output, "INFO shim=") : NULL;
        double registered;
        for (int threads = 1; threads <= 2; threads++) {
            struct paired_result *result = &results[(*result_count)++];
            paired_result_init(result, conditions[c].name, live, threads, pairs);
            if (exited_ok)
                parse_blocks(run.output, threads, pairs, result);
            if (info != NULL && field_number(info, "live_ranges", &registered))
                result->verified_live = (long long)registered;
            result->ok = exited_ok && result->pairs > 0;
            if (!result->ok)
                paired_failure(result, &run, started);
        }
        if (!exited_ok)
            fprintf(stderr, "overhead (p): child exited with %d:\n%s\n", run.exit_code,
                    run.output ? run.output : "");
        bench_run_free(&run);
    }
}

/* (a) in instructions: the workload (1 thread) under callgrind, counting only
 * inside workload_thread, with and without the shim. Deterministic where the
 * timings of a shared machine are not. */
struct instruction_result {
    const char *condition;
    size_t live;
    double with, without; /* instructions; 0 when the run failed */
};

static double callgrind_count(size_t live, size_t ops, bool with_shim)
{
    char out_path[] = "/tmp/pinshim-overhead-callgrind-XXXXXX";
    int fd = mkstemp(out_path);
    if (fd < 0)
        return 0;
    close(fd);
    char out_option[PATH_MAX + 32], live_text[32], ops_text[32];
    snprintf(out_option, sizeof(out_option), "--callgrind-out-file=%s", out_path);
    snprintf(live_text, sizeof(live_text), "%zu", live);
    snprintf(ops_text, sizeof(ops_text), "%zu", ops);
    char *argv[] = {"valgrind",
                    "--tool=callgrind",
                    "--toggle-collect=workload_thread",
                    out_option,
                    "-q",
                    (char *)bench_self_path(),
                    "--child-alloc",
                    live_text,
                    ops_text,
                    "1",
                    "1",
                    NULL};
    struct bench_env env;
    bench_env_from_current(&env);
    if (with_shim)
        shim_environment(&env);
    struct bench_run run;
    bool started = bench_run_process(argv, &env, false, true, &run);
    bench_env_free(&env);
    double total = 0;
    char *text = started && run.exit_code == 0 ? bench_read_file(out_path) : NULL;
    const char *line = text ? strstr(text, "\ntotals: ") : NULL;
    if (line != NULL)
        total = strtod(line + 9, NULL);
    free(text);
    unlink(out_path);
    return total;
}

static struct instruction_result instructions[2];
static size_t instruction_count;
static size_t instruction_ops;

static void run_instructions_part(struct instruction_result *results, size_t *result_count)
{
    *result_count = 0;
    struct bench_env probe;
    bench_env_from_current(&probe);
    char *version[] = {"valgrind", "--version", NULL};
    struct bench_run run;
    bool have_valgrind =
        bench_run_process(version, &probe, false, true, &run) && run.exit_code == 0;
    bench_env_free(&probe);
    if (!have_valgrind) {
        fprintf(stderr, "overhead (a, instructions): valgrind not found; skipped\n");
        return;
    }
    size_t ops = options.quick ? 50000 : 200000;
    instruction_ops = ops;
    for (int c = 0; c < 2; c++) {
        struct instruction_result *result = &results[(*result_count)++];
        result->condition = c == 0 ? "no locks" : "10k live ranges";
        result->live = c == 0 ? 0 : options.live_ranges_a;
        fprintf(stderr, "overhead (a, instructions) %s under callgrind ...\n", result->condition);
        result->without = callgrind_count(result->live, ops, false);
        result->with = callgrind_count(result->live, ops, true);
    }
}

static bool memlock_allows(size_t bytes, char *why, size_t why_size)
{
    /* CAP_IPC_LOCK (bit 14) lifts RLIMIT_MEMLOCK; root has it. */
    bool capable = false;
    FILE *status = fopen("/proc/self/status", "r");
    if (status != NULL) {
        char line[256];
        while (fgets(line, sizeof(line), status) != NULL) {
            unsigned long long caps;
            if (sscanf(line, "CapEff: %llx", &caps) == 1)
                capable = (caps >> 14) & 1;
        }
        fclose(status);
    }
    struct rlimit limit;
    if (!capable && getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        (unsigned long long)limit.rlim_cur < bytes) {
        snprintf(why, why_size,
                 "needs %zu MiB locked; RLIMIT_MEMLOCK is %llu KiB and CAP_IPC_LOCK is absent",
                 bytes >> 20, (unsigned long long)limit.rlim_cur >> 10);
        return false;
    }
    long available_pages = sysconf(_SC_AVPHYS_PAGES);
    long page_size = sysconf(_SC_PAGESIZE);
    double available = (double)available_pages * (double)page_size;
    if (available_pages > 0 && (double)bytes > 0.75 * available) {
        snprintf(why, why_size, "needs %zu MiB locked; only %.0f MiB of memory is free",
                 bytes >> 20, available / 1048576.0);
        return false;
    }
    return true;
}

static void run_bookkeeping_part(struct bookkeeping_result *results, size_t *result_count)
{
    /* Results: every size with the random pattern, then every size in
     * sequence, then every size hot. */
    static const char *const patterns[] = {"random", "sequential", "hot"};
    size_t sizes = options.live_size_count;
    *result_count = 3 * sizes;
    char size_list[256] = "";
    for (size_t i = 0; i < *result_count; i++) {
        struct bookkeeping_result *result = &results[i];
        memset(result, 0, sizeof(*result));
        result->live = options.live_sizes[i % sizes];
        result->pattern = patterns[i / sizes];
        result->pairs = options.pairs;
        /* The pages; the registry and the fake's tree add a few MiB unlocked. */
        size_t bytes = result->live * page_bytes;
        if (!memlock_allows(bytes, result->reason, sizeof(result->reason))) {
            result->skipped = true;
            continue;
        }
        if (i >= sizes)
            continue;
        size_t used = strlen(size_list);
        snprintf(size_list + used, sizeof(size_list) - used, "%s%zu", used ? "," : "",
                 result->live);
    }
    if (size_list[0] == '\0')
        return;
    char pairs_text[32], rounds_text[16];
    snprintf(pairs_text, sizeof(pairs_text), "%zu", options.pairs);
    snprintf(rounds_text, sizeof(rounds_text), "%d", options.pair_rounds);
    char *argv[] = {
        (char *)bench_self_path(), "--child-bookkeeping", size_list, pairs_text, rounds_text, NULL};
    struct bench_env env;
    bench_env_from_current(&env);
    shim_environment(&env);
    bench_env_set(&env, "PINSHIM_MIN_BYTES", "4K");
    /* The bookkeeping alone: locating the pages on NUMA nodes, a system call
     * per registration, is measured by numa_cost. */
    bench_env_set(&env, "PINSHIM_NUMA", "0");
    fprintf(stderr, "overhead (b) live ranges %s ...\n", size_list);
    struct bench_run run;
    bool started = bench_run_process(argv, &env, true, false, &run);
    bench_env_free(&env);
    for (size_t i = 0; i < *result_count; i++) {
        struct bookkeeping_result *result = &results[i];
        if (result->skipped)
            continue;
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "ROUND live=%zu pattern=%s ", result->live,
                 result->pattern);
        for (const char *line = started ? find_line(run.output, prefix) : NULL; line != NULL;
             line = find_line(strchr(line, '\n') ? strchr(line, '\n') + 1 : "", prefix)) {
            int r = result->rounds;
            if (r >= MAX_ROUNDS)
                break;
            if (field_number(line, "shim", &result->shim[r]) &&
                field_number(line, "raw", &result->raw[r]) &&
                field_number(line, "bare", &result->bare[r]) &&
                field_number(line, "runtime", &result->runtime[r]) &&
                field_number(line, "book", &result->book[r]) &&
                field_number(line, "bookcounters", &result->book_counters[r]))
                result->rounds++;
        }
        if (result->rounds == 0) {
            result->skipped = true;
            snprintf(prefix, sizeof(prefix), "SKIP live=%zu ", result->live);
            const char *skip = started ? find_line(run.output, prefix) : NULL;
            const char *error = started ? find_line(run.output, "ERROR") : NULL;
            const char *line = skip ? skip : error;
            if (line != NULL) {
                const char *end = strchr(line, '\n');
                int length = end ? (int)(end - line) : (int)strlen(line);
                snprintf(result->reason, sizeof(result->reason), "%.*s", length, line);
            } else {
                snprintf(result->reason, sizeof(result->reason), "child exited with %d",
                         run.exit_code);
            }
        }
    }
    if (!started || run.exit_code != 0)
        fprintf(stderr, "overhead (b): child exited with %d:\n%s\n", run.exit_code,
                run.output ? run.output : "");
    bench_run_free(&run);
}

/* The python workload: objects, strings, JSON round trip, big byte buffers. */
static const char python_script[] =
    "import json, random\n"
    "rng = random.Random(7)\n"
    "records = [{'id': i, 'name': 'item%d' % i, 'tags': [rng.random() for _ in range(6)],\n"
    "            'blob': 'x' * rng.randrange(1, 3000)} for i in range(SCALE)]\n"
    "text = json.dumps(records)\n"
    "back = json.loads(text)\n"
    "back.sort(key=lambda r: r['tags'][0])\n"
    "blocks = [bytearray(rng.randrange(1, 400000)) for _ in range(SCALE // 40)]\n"
    "total = sum(len(b) for b in blocks) + len(text)\n"
    "del blocks, back, records\n"
    "assert total > 0\n";

static bool write_inputs(const char *directory, size_t scale, char *script_path, size_t script_size,
                         char *sort_path, size_t sort_size)
{
    snprintf(script_path, script_size, "%s/workload.py", directory);
    FILE *script = fopen(script_path, "w");
    if (script == NULL)
        return false;
    fprintf(script, "SCALE = %zu\n%s", scale, python_script);
    fclose(script);

    snprintf(sort_path, sort_size, "%s/lines.txt", directory);
    FILE *lines = fopen(sort_path, "w");
    if (lines == NULL)
        return false;
    static const char words[] = "abcdefghijklmnopqrstuvwxyz";
    uint64_t state = 0xBADC0DEull;
    size_t written = 0, target = options.sort_megabytes * 1000000;
    while (written < target) {
        uint64_t r = next_random(&state);
        int n = fprintf(lines, "%016" PRIx64 " %08u %.*s\n", r, (unsigned)(r % 100000000),
                        (int)((r >> 20) % 27), words);
        if (n <= 0)
            break;
        written += (size_t)n;
    }
    fclose(lines);
    return written >= target;
}

static void run_programs_part(struct program_result *results, size_t *result_count)
{
    *result_count = 0;
    char directory[] = "/tmp/pinshim-overhead-XXXXXX";
    if (mkdtemp(directory) == NULL) {
        perror("overhead (c): mkdtemp");
        return;
    }
    char script[PATH_MAX], lines[PATH_MAX];
    size_t scale = options.quick ? 20000 : 60000;
    fprintf(stderr, "overhead (c): writing a %zu MB input for sort ...\n", options.sort_megabytes);
    bool inputs_ok = write_inputs(directory, scale, script, sizeof(script), lines, sizeof(lines));

    struct {
        const char *name;
        char *argv[8];
    } programs[] = {
        {"python3", {(char *)options.python, script, NULL}},
        {"sort", {"sort", "-S", "1G", "-o", "/dev/null", lines, NULL}},
    };
    for (size_t p = 0; p < 2; p++) {
        struct program_result *result = &results[(*result_count)++];
        memset(result, 0, sizeof(*result));
        result->name = programs[p].name;
        result->ok = inputs_ok;
        if (!inputs_ok)
            snprintf(result->error, sizeof(result->error), "could not write the inputs");
        size_t used = 0;
        for (char **word = programs[p].argv; *word != NULL; word++)
            used += (size_t)snprintf(result->command + used, sizeof(result->command) - used, "%s%s",
                                     used ? " " : "", *word);
        fprintf(stderr, "overhead (c) %s:", result->name);
        for (int round = 0; round < options.program_rounds && result->ok; round++) {
            for (int half = 0; half < 2; half++) {
                bool with_shim = (half == 0) == (round % 2 == 0);
                struct bench_env env;
                bench_env_from_current(&env);
                bench_env_set(&env, "LC_ALL", "C");
                if (with_shim)
                    bench_env_set(&env, "LD_PRELOAD", shim_path);
                struct bench_run run;
                bool started = bench_run_process(programs[p].argv, &env, false, true, &run);
                bench_env_free(&env);
                if (!started || run.exit_code != 0) {
                    result->ok = false;
                    snprintf(result->error, sizeof(result->error), "%.150s exited with %d",
                             result->command, run.exit_code);
                    break;
                }
                arm_add(with_shim ? &result->with : &result->without, run.wall, run.cpu);
            }
            fprintf(stderr, " %d", round + 1);
        }
        fprintf(stderr, "\n");
    }
    unlink(script);
    unlink(lines);
    rmdir(directory);
}

/* ---- output ---- */

/* How (b) is measured, for the table and the JSON. */
static const char bookkeeping_method[] =
    "  method: one process under the shim holds N one-page registrations (fake runtime,\n"
    "  FAKE_CUDART_CHECK=0, PINSHIM_MIN_BYTES=4K). In blocks of 50, three loops take turns:\n"
    "  munlock+mlock pairs through the shim (one unregister + one register each); bare pairs,\n"
    "  the same work without the shim (the fake's cudaHostUnregister, the munlock and mlock\n"
    "  system calls, the fake's cudaHostRegister, which the shim does not see); and raw pairs\n"
    "  (the system calls alone). Each loop has pages of its own. Per block: bookkeeping =\n"
    "  shim pair - bare pair, the shim's own work with the runtime's and the kernel's left\n"
    "  out at the same cache state; 'counters' is the earlier estimate, shim pair - raw pair -\n"
    "  the runtime time the shim's counters measured. random: pages drawn at random among the\n"
    "  N (tables out of cache at large N); sequential: the N in address order; hot: one page\n"
    "  over and over (data in cache). Per pair: median over a round's blocks; median, min\n"
    "  over rounds";

/* How (p) is measured, for the table and the JSON. */
static const char paired_method[] =
    "  method: one process under the shim runs the workload of (a) in blocks, each a whole\n"
    "  run (allocates, works, frees all it allocated), calling either the shim's free, realloc\n"
    "  and posix_memalign (with) or libc's own, from dlopen(libc.so.6) (without); malloc is\n"
    "  libc's in both. Blocks go in pairs ABBA ABBA ... (A with, B without), so both arms sit at\n"
    "  the same average time; the two blocks of a pair do the same work (one seed), after one\n"
    "  untimed block of each arm. Per pair: with / without - 1 of the threads' CPU time. cpu med:\n"
    "  median over the pairs; 95% CI: the k-th and (n+1-k)-th smallest of the n pair ratios,\n"
    "  k the largest with P(Binomial(n, 1/2) <= k-1) <= 0.025 (distribution-free); cpu sum:\n"
    "  summed with / summed without - 1; wall med: median of the pairs' wall-time ratios";

/* "[low, high]" of a confidence interval in percent, or "n/a" when undefined. */
static const char *interval_text(const struct paired_stats *stats, char *buffer, size_t size)
{
    if (isnan(stats->low) || isnan(stats->high))
        snprintf(buffer, size, "n/a");
    else
        snprintf(buffer, size, "[%+.2f%%, %+.2f%%]", stats->low, stats->high);
    return buffer;
}

static void print_paired_table(const struct paired_result *paired, size_t paired_count)
{
    printf("\n(p) allocation-heavy workload, paired in one process: %zu ops per thread and "
           "block, %zu ABBA pairs\n",
           options.paired_ops, options.paired_blocks);
    printf("%-30s %7s %5s %10s %10s %9s %-20s %9s %9s %8s %s\n", "condition", "threads", "pairs",
           "without s", "with s", "cpu med", "95% CI of cpu med", "cpu sum", "wall med", "faults",
           "shim holds");
    for (size_t i = 0; i < paired_count; i++) {
        const struct paired_result *r = &paired[i];
        if (!r->ok) {
            printf("%-30s %7d  failed: %s\n", r->condition, r->threads, r->error);
            continue;
        }
        struct paired_stats cpu = paired_statistics(r->with_cpu, r->without_cpu, r->pairs);
        struct paired_stats wall = paired_statistics(r->with_wall, r->without_wall, r->pairs);
        char interval[64];
        double faults_without = sum_of(r->without_faults, r->pairs);
        printf("%-30s %7d %5zu %10.4f %10.4f %+8.2f%% %-20s %+8.2f%% %+8.2f%% %+7.2f%% %lld\n",
               r->condition, r->threads, r->pairs, sum_of(r->without_cpu, r->pairs),
               sum_of(r->with_cpu, r->pairs), cpu.median,
               interval_text(&cpu, interval, sizeof(interval)), cpu.sum, wall.median,
               faults_without > 0 ? (sum_of(r->with_faults, r->pairs) / faults_without - 1) * 100
                                  : 0.0,
               r->verified_live);
    }
    printf("  (without s, with s: CPU seconds summed over the pairs; faults: the process's minor "
           "page faults\n  during the with blocks against the without blocks)\n%s\n",
           paired_method);
}

static void print_tables(const struct alloc_result *alloc, size_t alloc_count,
                         const struct paired_result *paired, size_t paired_count,
                         const struct bookkeeping_result *book, size_t book_count,
                         const struct program_result *programs, size_t program_count)
{
    if (alloc_count > 0) {
        printf("\n(a) allocation-heavy workload: %zu ops per thread, fastest of %d in each "
               "process, %d alternating rounds\n",
               options.alloc_ops, options.alloc_reps, options.rounds);
        printf("%-16s %7s %12s %12s %9s %9s %9s %9s %s\n", "condition", "threads", "without s",
               "with s", "wall med", "wall min", "cpu med", "cpu min", "shim holds");
        for (size_t i = 0; i < alloc_count; i++) {
            const struct alloc_result *r = &alloc[i];
            if (!r->ok || r->with.count == 0 || r->without.count == 0) {
                printf("%-16s %7d  failed\n", r->condition, r->threads);
                continue;
            }
            double without = bench_median(r->without.wall, (size_t)r->without.count);
            double with = bench_median(r->with.wall, (size_t)r->with.count);
            printf("%-16s %7d %12.4f %12.4f %+8.2f%% %+8.2f%% %+8.2f%% %+8.2f%% %lld\n",
                   r->condition, r->threads, without, with, percent(ratio(with, without)),
                   percent(ratio(bench_minimum(r->with.wall, (size_t)r->with.count),
                                 bench_minimum(r->without.wall, (size_t)r->without.count))),
                   percent(ratio(bench_median(r->with.cpu, (size_t)r->with.count),
                                 bench_median(r->without.cpu, (size_t)r->without.count))),
                   percent(ratio(bench_minimum(r->with.cpu, (size_t)r->with.count),
                                 bench_minimum(r->without.cpu, (size_t)r->without.count))),
                   r->verified_live);
        }
        printf("  (wall/cpu med: median with / median without - 1; min: fastest with / fastest "
               "without - 1)\n");
    }
    if (instruction_count > 0) {
        printf("\n(a) in instructions: callgrind, 1 thread, %zu ops, counted inside the "
               "workload only\n",
               instruction_ops);
        printf("%-16s %14s %14s %9s %12s\n", "condition", "without", "with", "ratio", "extra/op");
        for (size_t i = 0; i < instruction_count; i++) {
            const struct instruction_result *r = &instructions[i];
            if (r->with <= 0 || r->without <= 0) {
                printf("%-16s  failed\n", r->condition);
                continue;
            }
            printf("%-16s %14.0f %14.0f %+8.2f%% %12.1f\n", r->condition, r->without, r->with,
                   percent(ratio(r->with, r->without)),
                   (r->with - r->without) / (double)instruction_ops);
        }
    }
    if (paired_count > 0)
        print_paired_table(paired, paired_count);
    if (book_count > 0) {
        double worst_per_operation = 0;
        printf("\n(b) bookkeeping per mlock+munlock pair of a registered page: %zu pairs in "
               "blocks of %d, %d rounds\n",
               options.pairs, BLOCK_PAIRS, options.pair_rounds);
        printf("%-10s %9s %9s %9s %9s %9s %10s %10s %10s %8s\n", "pages", "live", "pair", "pair",
               "syscalls", "runtime", "bookkeep", "bookkeep", "bookkeep", "per op");
        printf("%-10s %9s %9s %9s %9s %9s %10s %10s %10s %8s\n", "", "ranges", "shim ns", "bare ns",
               "ns", "ns", "median ns", "min ns", "counters", "ns");
        for (size_t i = 0; i < book_count; i++) {
            const struct bookkeeping_result *r = &book[i];
            if (r->skipped) {
                printf("%-10s %9zu  skipped: %s\n", r->pattern, r->live, r->reason);
                continue;
            }
            size_t n = (size_t)r->rounds;
            double per_operation = bench_median(r->book, n) / 2;
            printf("%-10s %9zu %9.0f %9.0f %9.0f %9.0f %10.0f %10.0f %10.0f %8.0f\n", r->pattern,
                   r->live, bench_median(r->shim, n), bench_median(r->bare, n),
                   bench_median(r->raw, n), bench_median(r->runtime, n), bench_median(r->book, n),
                   bench_minimum(r->book, n), bench_median(r->book_counters, n), per_operation);
            if (per_operation > worst_per_operation)
                worst_per_operation = per_operation;
        }
        printf("%s\n", bookkeeping_method);
        printf("  per op: the median bookkeeping of a pair halved (a pair is one unregister and\n"
               "  one register). Largest: %.0f ns, against the goal of 1000 ns.\n",
               worst_per_operation);
    }
    if (program_count > 0) {
        printf("\n(c) whole programs, %d alternating rounds\n", options.program_rounds);
        printf("%-8s %12s %12s %9s %9s %9s  %s\n", "program", "without s", "with s", "wall med",
               "wall min", "cpu med", "command");
        for (size_t i = 0; i < program_count; i++) {
            const struct program_result *r = &programs[i];
            if (!r->ok || r->with.count == 0) {
                printf("%-8s  failed: %s\n", r->name, r->error);
                continue;
            }
            size_t nw = (size_t)r->with.count, no = (size_t)r->without.count;
            double without = bench_median(r->without.wall, no);
            double with = bench_median(r->with.wall, nw);
            printf(
                "%-8s %12.3f %12.3f %+8.2f%% %+8.2f%% %+8.2f%%  %s\n", r->name, without, with,
                percent(ratio(with, without)),
                percent(ratio(bench_minimum(r->with.wall, nw), bench_minimum(r->without.wall, no))),
                percent(ratio(bench_median(r->with.cpu, nw), bench_median(r->without.cpu, no))),
                r->command);
        }
    }
}

static void json_array(FILE *out, const double *values, int count, double scale)
{
    fputc('[', out);
    for (int i = 0; i < count; i++)
        fprintf(out, "%s%.9g", i ? ", " : "", values[i] * scale);
    fputc(']', out);
}

static void json_arm(FILE *out, const struct arm_samples *arm)
{
    fprintf(out, "{\"wall_s\": ");
    json_array(out, arm->wall, arm->count, 1.0);
    fprintf(out, ", \"cpu_s\": ");
    json_array(out, arm->cpu, arm->count, 1.0);
    fprintf(
        out,
        ", \"wall_median_s\": %.9g, \"wall_min_s\": %.9g, \"cpu_median_s\": %.9g, "
        "\"cpu_min_s\": %.9g}",
        bench_median(arm->wall, (size_t)arm->count), bench_minimum(arm->wall, (size_t)arm->count),
        bench_median(arm->cpu, (size_t)arm->count), bench_minimum(arm->cpu, (size_t)arm->count));
}

static void json_ratios(FILE *out, const struct arm_samples *with,
                        const struct arm_samples *without)
{
    size_t nw = (size_t)with->count, no = (size_t)without->count;
    fprintf(out,
            "\"wall_ratio_median\": %.6f, \"wall_ratio_min\": %.6f, \"cpu_ratio_median\": %.6f, "
            "\"cpu_ratio_min\": %.6f",
            ratio(bench_median(with->wall, nw), bench_median(without->wall, no)),
            ratio(bench_minimum(with->wall, nw), bench_minimum(without->wall, no)),
            ratio(bench_median(with->cpu, nw), bench_median(without->cpu, no)),
            ratio(bench_minimum(with->cpu, nw), bench_minimum(without->cpu, no)));
}

/* The value of "without" (the caller wrote the key), then "with" and the ratios. */
static void json_arms(FILE *out, const struct arm_samples *with, const struct arm_samples *without)
{
    json_arm(out, without);
    fprintf(out, ",\n   \"with\": ");
    json_arm(out, with);
    fprintf(out, ",\n   ");
    json_ratios(out, with, without);
}

static void json_optional(FILE *out, double value)
{
    if (isnan(value))
        fprintf(out, "null");
    else
        fprintf(out, "%.4f", value);
}

static void json_paired_result(FILE *out, const struct paired_result *r)
{
    fprintf(out, "{\"condition\": ");
    bench_json_string(out, r->condition);
    fprintf(out, ", \"live\": %zu, \"threads\": %d, \"ok\": %s, \"error\": ", r->live, r->threads,
            r->ok ? "true" : "false");
    bench_json_string(out, r->ok ? NULL : r->error);
    fprintf(out, ", \"shim_reported_live_ranges\": %lld, \"pairs\": %zu", r->verified_live,
            r->pairs);
    if (r->ok) {
        struct paired_stats cpu = paired_statistics(r->with_cpu, r->without_cpu, r->pairs);
        struct paired_stats wall = paired_statistics(r->with_wall, r->without_wall, r->pairs);
        fprintf(out, ",\n   \"cpu_median_pct\": %.4f, \"cpu_ci_low_pct\": ", cpu.median);
        json_optional(out, cpu.low);
        fprintf(out, ", \"cpu_ci_high_pct\": ");
        json_optional(out, cpu.high);
        fprintf(out, ", \"cpu_sum_pct\": %.4f, \"wall_median_pct\": %.4f, \"wall_sum_pct\": %.4f",
                cpu.sum, wall.median, wall.sum);
        fprintf(out, ", \"page_faults_with\": %.0f, \"page_faults_without\": %.0f",
                sum_of(r->with_faults, r->pairs), sum_of(r->without_faults, r->pairs));
        const double *series[] = {r->with_cpu, r->without_cpu, r->with_wall, r->without_wall};
        static const char *const names[] = {"with_cpu_s", "without_cpu_s", "with_wall_s",
                                            "without_wall_s"};
        for (size_t k = 0; k < 4; k++) {
            fprintf(out, ",\n   \"%s\": ", names[k]);
            json_array(out, series[k], (int)r->pairs, 1.0);
        }
    }
    fprintf(out, "}");
}

static void json_paired(FILE *out, const struct paired_result *paired, size_t paired_count)
{
    fprintf(out,
            ",\n \"alloc_paired\": {\"ops_per_thread_per_block\": %zu, \"pairs\": %zu, "
            "\"order\": \"ABBA\", \"method\": ",
            options.paired_ops, options.paired_blocks);
    bench_json_string(out, paired_method);
    fprintf(out, ", \"results\": [");
    for (size_t i = 0; i < paired_count; i++) {
        fprintf(out, "%s\n  ", i ? "," : "");
        json_paired_result(out, &paired[i]);
    }
    fprintf(out, "]}");
}

static bool write_json(const char *path, const struct alloc_result *alloc, size_t alloc_count,
                       const struct paired_result *paired, size_t paired_count,
                       const struct bookkeeping_result *book, size_t book_count,
                       const struct program_result *programs, size_t program_count)
{
    FILE *out = bench_json_open(path, "overhead");
    if (out == NULL)
        return false;
    fprintf(out, ", \"cpus\": %ld, \"quick\": %s, \"shim\": ", sysconf(_SC_NPROCESSORS_ONLN),
            options.quick ? "true" : "false");
    bench_json_string(out, shim_path);
    fprintf(out, ", \"fake_cudart\": ");
    bench_json_string(out, fake_path);

    fprintf(out,
            ",\n \"alloc\": {\"ops_per_thread\": %zu, \"reps_per_process\": %d, "
            "\"rounds\": %d, \"live_buffer_bytes\": %u,",
            options.alloc_ops, options.alloc_reps, options.rounds, LIVE_BUFFER_BYTES);
    fprintf(out,
            "\n  \"instructions\": {\"tool\": \"callgrind\", \"threads\": 1, \"ops\": %zu, "
            "\"results\": [",
            instruction_ops);
    for (size_t i = 0; i < instruction_count; i++) {
        const struct instruction_result *r = &instructions[i];
        fprintf(out, "%s{\"condition\": ", i ? ", " : "");
        bench_json_string(out, r->condition);
        fprintf(out, ", \"live_ranges\": %zu, \"without\": %.0f, \"with\": %.0f, \"ratio\": %.6f}",
                r->live, r->without, r->with, ratio(r->with, r->without));
    }
    fprintf(out, "]},\n  \"results\": [");
    for (size_t i = 0; i < alloc_count; i++) {
        const struct alloc_result *r = &alloc[i];
        fprintf(out, "%s\n  {\"condition\": ", i ? "," : "");
        bench_json_string(out, r->condition);
        fprintf(out,
                ", \"live_ranges\": %zu, \"threads\": %d, \"ok\": %s, "
                "\"shim_reported_live_ranges\": %lld,\n   \"without\": ",
                r->live, r->threads, r->ok ? "true" : "false", r->verified_live);
        json_arms(out, &r->with, &r->without);
        fprintf(out, "}");
    }
    fprintf(out, "]}");
    json_paired(out, paired, paired_count);
    fprintf(out,
            ",\n \"bookkeeping\": {\"pairs\": %zu, \"rounds\": %d, \"min_bytes\": "
            "\"4K\", \"method\": ",
            options.pairs, options.pair_rounds);
    bench_json_string(out, bookkeeping_method);
    fprintf(out, ", \"block_pairs\": %d, \"results\": [", BLOCK_PAIRS);
    for (size_t i = 0; i < book_count; i++) {
        const struct bookkeeping_result *r = &book[i];
        fprintf(out,
                "%s\n  {\"live_ranges\": %zu, \"pattern\": \"%s\", \"skipped\": %s, \"reason\": ",
                i ? "," : "", r->live, r->pattern, r->skipped ? "true" : "false");
        bench_json_string(out, r->skipped ? r->reason : NULL);
        if (!r->skipped) {
            size_t n = (size_t)r->rounds;
            static const char *const names[] = {"pair_shim_ns",         "pair_bare_ns",
                                                "pair_raw_syscalls_ns", "pair_runtime_ns",
                                                "bookkeeping_ns",       "bookkeeping_counters_ns"};
            const double *series[] = {r->shim,    r->bare, r->raw,
                                      r->runtime, r->book, r->book_counters};
            for (size_t k = 0; k < 6; k++) {
                fprintf(out, ",\n   \"%s\": ", names[k]);
                json_array(out, series[k], r->rounds, 1.0);
                fprintf(out, ", \"%s_median\": %.3f, \"%s_min\": %.3f", names[k],
                        bench_median(series[k], n), names[k], bench_minimum(series[k], n));
            }
            fprintf(out, ",\n   \"bookkeeping_per_operation_ns_median\": %.3f",
                    bench_median(r->book, n) / 2);
        }
        fprintf(out, "}");
    }
    fprintf(out, "]},\n \"programs\": {\"rounds\": %d, \"sort_megabytes\": %zu, \"results\": [",
            options.program_rounds, options.sort_megabytes);
    for (size_t i = 0; i < program_count; i++) {
        const struct program_result *r = &programs[i];
        fprintf(out, "%s\n  {\"name\": ", i ? "," : "");
        bench_json_string(out, r->name);
        fprintf(out, ", \"command\": ");
        bench_json_string(out, r->command);
        fprintf(out, ", \"ok\": %s, \"error\": ", r->ok ? "true" : "false");
        bench_json_string(out, r->ok ? NULL : r->error);
        fprintf(out, ",\n   \"without\": ");
        json_arms(out, &r->with, &r->without);
        fprintf(out, "}");
    }
    fprintf(out, "]}}\n");
    return fclose(out) == 0;
}

/* ---- command line ---- */

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: overhead [--quick] [--json FILE] [--only PARTS] [--shim LIB] [--fake LIB]\n"
        "                [--rounds N] [--ops N] [--pairs N] [--max-live N] [--sort-mb N]\n"
        "                [--python PATH] [--blocks N]\n"
        "The CPU price of libpinshim.so: (a) allocation-heavy workload, (b) bookkeeping per\n"
        "mlock/munlock pair against live ranges, (c) whole programs (python3, sort).\n"
        "  --only PARTS   any of a, b, c, i, p (default abcip; i: (a) counted in instructions\n"
        "                 with valgrind's callgrind; p: (a) with and without the shim in one\n"
        "                 process, in paired blocks, with a confidence interval)\n"
        "  --blocks N     ABBA pairs of blocks per thread count in p (default 30, at most 1000)\n"
        "  --shim LIB     libpinshim.so (default: the one of this build)\n"
        "  --fake LIB     libfake_cudart.so for (a), (b) and (p) (default: this build's)\n"
        "  --max-live N   largest live-range count of (b) (default 1000000)\n");
}

static bool parse_size(const char *text, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        return false;
    *out = (size_t)value;
    return true;
}

static int parse_sizes(const char *list, size_t *sizes, size_t max)
{
    size_t count = 0;
    const char *cursor = list;
    while (*cursor != '\0' && count < max) {
        char *end;
        sizes[count++] = (size_t)strtoull(cursor, &end, 10);
        if (*end != ',' && *end != '\0')
            return -1;
        cursor = *end == ',' ? end + 1 : end;
    }
    return (int)count;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    if (argc >= 2 && strcmp(argv[1], "--child-alloc") == 0) {
        size_t live, ops, reps, max_threads = 2;
        if ((argc != 5 && argc != 6) || !parse_size(argv[2], &live) || !parse_size(argv[3], &ops) ||
            !parse_size(argv[4], &reps) || (argc == 6 && !parse_size(argv[5], &max_threads)) ||
            max_threads < 1 || max_threads > 2)
            return 64;
        exit_skipping_unregistration(child_alloc(live, ops, (int)reps, (int)max_threads));
    }
    if (argc >= 2 && strcmp(argv[1], "--child-alloc-interleaved") == 0) {
        size_t live, ops, blocks;
        bool interleave = argc == 6 && strcmp(argv[5], "interleaved") == 0;
        if ((argc != 5 && !interleave) || !parse_size(argv[2], &live) ||
            !parse_size(argv[3], &ops) || !parse_size(argv[4], &blocks) || ops == 0 || blocks == 0)
            return 64;
        exit_skipping_unregistration(child_alloc_interleaved(live, ops, blocks, interleave));
    }
    if (argc >= 2 && strcmp(argv[1], "--child-bookkeeping") == 0) {
        size_t sizes[MAX_SIZES], pairs, rounds;
        int count = argc == 5 ? parse_sizes(argv[2], sizes, MAX_SIZES) : -1;
        if (count <= 0 || !parse_size(argv[3], &pairs) || !parse_size(argv[4], &rounds) ||
            rounds == 0 || pairs == 0)
            return 64;
        exit_skipping_unregistration(child_bookkeeping(sizes, (size_t)count, pairs, (int)rounds));
    }

    options = (struct options){
        .parts = "abcip",
        .python = "python3",
        .rounds = 7,
        .alloc_ops = 2000000,
        .alloc_reps = 3,
        .paired_ops = 2000000,
        .paired_blocks = 30,
        .live_ranges_a = 10000,
        .pairs = 20000,
        .pair_rounds = 7,
        .sort_megabytes = 100,
        .program_rounds = 5,
    };
    size_t max_live = 1000000;
    bool rounds_given = false, ops_given = false, pairs_given = false, sort_given = false,
         blocks_given = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        size_t number = 0;
        if (strcmp(arg, "--quick") == 0) {
            options.quick = true;
        } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (value == NULL) {
            fprintf(stderr, "overhead: unknown option or missing value: %s\n", arg);
            usage(stderr);
            return 64;
        } else if (strcmp(arg, "--json") == 0) {
            options.json_path = value, i++;
        } else if (strcmp(arg, "--only") == 0) {
            options.parts = value, i++;
        } else if (strcmp(arg, "--shim") == 0) {
            options.shim = value, i++;
        } else if (strcmp(arg, "--fake") == 0) {
            options.fake = value, i++;
        } else if (strcmp(arg, "--python") == 0) {
            options.python = value, i++;
        } else if (parse_size(value, &number) && number > 0) {
            i++;
            if (strcmp(arg, "--rounds") == 0) {
                options.rounds = options.program_rounds = options.pair_rounds =
                    (int)(number < MAX_ROUNDS / 2 ? number : MAX_ROUNDS / 2);
                rounds_given = true;
            } else if (strcmp(arg, "--ops") == 0) {
                options.alloc_ops = number, ops_given = true;
            } else if (strcmp(arg, "--pairs") == 0) {
                options.pairs = number, pairs_given = true;
            } else if (strcmp(arg, "--blocks") == 0) {
                options.paired_blocks = number < MAX_PAIRED_BLOCKS ? number : MAX_PAIRED_BLOCKS;
                blocks_given = true;
            } else if (strcmp(arg, "--max-live") == 0) {
                max_live = number;
            } else if (strcmp(arg, "--sort-mb") == 0) {
                options.sort_megabytes = number, sort_given = true;
            } else {
                fprintf(stderr, "overhead: unknown option %s\n", arg);
                return 64;
            }
        } else {
            fprintf(stderr, "overhead: bad value for %s: %s\n", arg, value);
            return 64;
        }
    }
    if (options.quick) {
        if (!rounds_given)
            options.rounds = options.pair_rounds = options.program_rounds = 3;
        if (!ops_given)
            options.alloc_ops = 500000;
        if (!pairs_given)
            options.pairs = 5000;
        if (!sort_given)
            options.sort_megabytes = 20;
        options.alloc_reps = 2;
        if (!blocks_given)
            options.paired_blocks = 20;
        options.paired_ops = 100000;
    }
    for (size_t i = 0; i < sizeof(default_live_sizes) / sizeof(*default_live_sizes); i++)
        if (default_live_sizes[i] <= max_live)
            options.live_sizes[options.live_size_count++] = default_live_sizes[i];

    static char shim_buffer[PATH_MAX], fake_buffer[PATH_MAX];
    const char *found = bench_find_library(options.shim, BENCH_SHIM_PATH, "../src/libpinshim.so");
    if (found == NULL) {
        fprintf(stderr, "overhead: libpinshim.so not found%s%s; pass --shim PATH\n",
                options.shim ? " at " : "", options.shim ? options.shim : "");
        return 1;
    }
    shim_path = strcpy(shim_buffer, found);
    found = bench_find_library(options.fake, BENCH_FAKE_CUDART_PATH,
                               "../tests/fake_cudart/libfake_cudart.so");
    fake_path = found ? strcpy(fake_buffer, found) : NULL;
    bool want_a = strchr(options.parts, 'a') != NULL, want_b = strchr(options.parts, 'b') != NULL,
         want_c = strchr(options.parts, 'c') != NULL, want_i = strchr(options.parts, 'i') != NULL,
         want_p = strchr(options.parts, 'p') != NULL;
    if ((want_a || want_b || want_i || want_p) && fake_path == NULL) {
        fprintf(stderr, "overhead: libfake_cudart.so not found; pass --fake PATH (parts a, b and "
                        "p register through it)\n");
        return 1;
    }
    fprintf(stderr, "overhead: shim %s, fake runtime %s\n", shim_path,
            fake_path ? fake_path : "(none)");

    static struct alloc_result alloc[4];
    static struct paired_result paired[8];
    static struct bookkeeping_result book[3 * MAX_SIZES];
    static struct program_result programs[2];
    size_t alloc_count = 0, paired_count = 0, book_count = 0, program_count = 0;
    double began = bench_now_seconds();
    if (want_a)
        run_alloc_part(alloc, &alloc_count);
    if (want_p)
        run_paired_part(paired, &paired_count);
    if (want_i)
        run_instructions_part(instructions, &instruction_count);
    if (want_b)
        run_bookkeeping_part(book, &book_count);
    if (want_c)
        run_programs_part(programs, &program_count);
    print_tables(alloc, alloc_count, paired, paired_count, book, book_count, programs,
                 program_count);
    printf("\ntotal time %.1f s\n", bench_now_seconds() - began);
    if (options.json_path != NULL &&
        !write_json(options.json_path, alloc, alloc_count, paired, paired_count, book, book_count,
                    programs, program_count)) {
        fprintf(stderr, "overhead: cannot write %s: %s\n", options.json_path, strerror(errno));
        return 1;
    }
    return 0;
}
