/* free_instructions: what the shim adds to a free + malloc pair, in
 * instructions, counted by valgrind's callgrind (deterministic: the same
 * binary and input give the same count, so it can be checked in CI, where
 * timings cannot).
 *
 * The workload is issue 14's, as issue 22 measured it: a loop of free +
 * malloc pairs over a ring of 256 blocks of 16 B to 8 KiB, one in eight from
 * posix_memalign(64, ...), in each of 1 or 2 threads (each with a glibc
 * arena of its own). Conditions:
 *   none         no locks
 *   below        10,000 locked 64 KiB buffers at addresses below every block
 *                of the workload (mapped there; fewer when the room below is
 *                short, as under valgrind, where the heap starts at 64 MiB)
 *   above        the same, above every block of the workload
 *   interleaved  10,000 locked 64 KiB posix_memalign buffers allocated by
 *                the workload's threads from their own arenas, each followed
 *                by a 16 KiB block freed once all are locked: the workload's
 *                blocks land in the holes between registered buffers
 *   slack        10,000 locked 64 KiB posix_memalign(4096) buffers and
 *                nothing between them: the workload's blocks land in the
 *                alignment slack glibc leaves in front of each, in the
 *                granule before a registered buffer
 *   shared       10,000 locked malloc'd buffers of 64 KiB + 100 bytes (not
 *                page-aligned), each followed by a 16 KiB block freed once
 *                all are locked: the registrations' first and last pages are
 *                shared with the workload's blocks, which land next to the
 *                locked bytes, on registered pages
 * Each condition runs under callgrind with and without the shim (the fake
 * CUDA runtime registers), at two loop lengths; the difference cancels
 * set-up and exit, and the extra instructions per pair are
 * ((with_long - with_short) - (without_long - without_short)) / pairs.
 *
 * Issue 37's ring, one thread: 0, 100, 1,000 or 10,000 locked 64 KiB
 * posix_memalign(4096) buffers, then a ring of 256 slots where each step
 * frees a random slot and allocates 16 B to 8 KiB into it (one step in eight
 * with posix_memalign(64, n), or none: "malloc only"), writing its first
 * byte; 400,000 - 200,000 pairs. In two heaps:
 *   grown     the main heap grows in one piece, as the kernel's brk lets it:
 *             glibc.malloc.top_pad of 1 GiB in both arms, because valgrind
 *             caps the brk heap at 8 MiB and glibc then continues in separate
 *             mappings; with the pad the blocks land where they do natively
 *             (--ring-layout counts, natively, the frees inside the span of
 *             the locked buffers: most blocks are above it)
 *   capped    valgrind's own 8 MiB brk heap: from 1,000 buffers on every
 *             block lands in the alignment slack between locked buffers
 *             (the window path on every free)
 * Budgets: 4 with nothing locked, 10 in the grown heap (issue 37), 18 in the
 * capped one.
 *
 * Usage:
 *   free_instructions [--check] [--json FILE] [--only CONDITION]   runs every
 *       condition (or one: none ... shared, ring, ring-capped); with --check
 *       exits 1 when one exceeds its budget (8 with no locks, 20 with; the
 *       ring's above)
 *   free_instructions --timed [--rounds N]   the ring natively, without and
 *       with the shim alternating, and the median time ratio per count
 *   free_instructions --ring-layout          where the ring's frees land natively
 *   free_instructions --child CONDITION THREADS PAIRS   one run (under callgrind)
 *   free_instructions --ring LIVE MEMALIGN PAIRS        one ring run
 * Environment: PINSHIM_LIB, FAKE_CUDART (set by meson for the test). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RING 256
#define LIVE 10000
#define LIVE_BYTES (64u * 1024u)
#define GAP_BYTES (16u * 1024u)
#define SHORT_PAIRS 40000
#define LONG_PAIRS 80000
#define MAX_THREADS 2

struct worker {
    pthread_t thread;
    unsigned index;
    size_t pairs;
    uint64_t rng;
    void *ring[RING];
    uintptr_t low, high; /* the blocks' addresses seen */
};

static const char *condition;
static int thread_count;
static pthread_barrier_t ready, go;

static uint64_t next(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static void note(struct worker *worker, void *block)
{
    uintptr_t address = (uintptr_t)block;
    if (worker->low == 0 || address < worker->low)
        worker->low = address;
    if (address + 8192 > worker->high)
        worker->high = address + 8192;
}

/* A block of the workload: 16 B to 8 KiB, one in eight from
 * posix_memalign(64, ...), as PyTorch allocates CPU tensors. */
static void *workload_block(uint64_t *rng)
{
    uint64_t draw = next(rng);
    size_t size = 16 + draw % 8176;
    void *block = NULL;
    if ((draw >> 32) % 8 == 0)
        return posix_memalign(&block, 64, size) == 0 ? block : NULL;
    return malloc(size);
}

/* The loop callgrind counts (--toggle-collect=free_malloc_loop). */
__attribute__((noinline)) void free_malloc_loop(struct worker *worker)
{
    for (size_t i = 0; i < worker->pairs; i++) {
        size_t slot = next(&worker->rng) % RING;
        free(worker->ring[slot]);
        worker->ring[slot] = workload_block(&worker->rng);
    }
}

static unsigned interleaved_locked;

/* count locked buffers from the calling thread's arena: page-aligned ones
 * (aligned) of LIVE_BYTES, or malloc'd ones of LIVE_BYTES + 100; each
 * followed by a GAP_BYTES block freed once all are locked, unless gap is
 * false. */
static bool lock_in_arena(unsigned count, bool aligned, bool gap)
{
    void **gaps = calloc(count, sizeof(*gaps));
    void *buffer = NULL;
    if (gaps == NULL)
        return false;
    size_t size = aligned ? LIVE_BYTES : LIVE_BYTES + 100;
    for (unsigned i = 0; i < count; i++) {
        if ((aligned ? posix_memalign(&buffer, 4096, size) != 0
                     : (buffer = malloc(size)) == NULL) ||
            (gap && (gaps[i] = malloc(GAP_BYTES)) == NULL)) {
            fprintf(stderr, "free_instructions: allocation %u failed\n", i);
            return false;
        }
        if (mlock(buffer, size) != 0) {
            fprintf(stderr, "free_instructions: mlock: %s\n", strerror(errno));
            return false;
        }
    }
    for (unsigned i = 0; i < count; i++)
        free(gaps[i]);
    free(gaps);
    __atomic_fetch_add(&interleaved_locked, count, __ATOMIC_RELAXED);
    return true;
}

static void *worker_main(void *argument)
{
    struct worker *worker = argument;
    unsigned share = LIVE / (unsigned)thread_count + (worker->index < LIVE % thread_count);
    bool interleaved = strcmp(condition, "interleaved") == 0,
         slack = strcmp(condition, "slack") == 0, shared = strcmp(condition, "shared") == 0;
    if ((interleaved || slack || shared) && !lock_in_arena(share, !shared, !slack))
        exit(3);
    for (int i = 0; i < RING; i++) {
        worker->ring[i] = workload_block(&worker->rng);
        note(worker, worker->ring[i]);
    }
    /* Where the blocks go: a short run of the loop, addresses noted. */
    for (int i = 0; i < 4 * RING; i++) {
        size_t slot = next(&worker->rng) % RING;
        free(worker->ring[slot]);
        worker->ring[slot] = workload_block(&worker->rng);
        note(worker, worker->ring[slot]);
    }
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    free_malloc_loop(worker);
    return NULL;
}

/* The mapping (from /proc/self/maps) that holds address. */
static bool mapping_of(uintptr_t address, uintptr_t *start, uintptr_t *end)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    bool found = false;
    while (!found && maps != NULL && fgets(line, sizeof(line), maps) != NULL) {
        unsigned long low, high;
        if (sscanf(line, "%lx-%lx", &low, &high) == 2 && low <= address && address < high) {
            *start = low;
            *end = high;
            found = true;
        }
    }
    if (maps != NULL)
        fclose(maps);
    return found;
}

/* Buffers mapped one page apart: each its own registration. */
static size_t buffer_stride(void)
{
    return LIVE_BYTES + (size_t)sysconf(_SC_PAGESIZE);
}

/* count 64 KiB buffers mapped and locked at [base, ...), one page apart. */
static unsigned lock_mapped(uintptr_t base, unsigned count)
{
    size_t stride = buffer_stride();
    unsigned made = 0;
    for (; made < count; made++) {
        void *want = (void *)(base + made * stride);
        void *buffer = mmap(want, LIVE_BYTES, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (buffer != want) {
            if (buffer != MAP_FAILED)
                munmap(buffer, LIVE_BYTES);
            break;
        }
        if (mlock(buffer, LIVE_BYTES) != 0) {
            fprintf(stderr, "free_instructions: mlock: %s\n", strerror(errno));
            exit(3);
        }
    }
    return made;
}

/* Below or above every mapping that holds a block of the workload. */
static unsigned lock_far(struct worker *workers, bool below)
{
    uintptr_t low = UINTPTR_MAX, high = 0;
    for (int t = 0; t < thread_count; t++) {
        uintptr_t start, end;
        if (mapping_of(workers[t].low, &start, &end) && start < low)
            low = start;
        if (mapping_of(workers[t].high - 8192, &start, &end) && end > high)
            high = end;
    }
    size_t stride = buffer_stride(), size = (size_t)LIVE * stride;
    const uintptr_t gib = (uintptr_t)1 << 30;
    if (below) {
        /* As far below as 10,000 buffers need, else as many as fit above 16 MiB. */
        uintptr_t top = (low & ~(gib - 1)) > gib ? (low & ~(gib - 1)) - gib : low - (16 << 20);
        uintptr_t base = top > size + ((uintptr_t)16 << 20) ? top - size : (uintptr_t)16 << 20;
        unsigned room = (unsigned)((top - base) / stride);
        return lock_mapped(base, room < LIVE ? room : LIVE);
    }
    for (uintptr_t base = (high + gib) & ~(gib - 1); base < ((uintptr_t)1 << 47) - size;
         base += gib) {
        unsigned made = lock_mapped(base, LIVE);
        if (made == LIVE)
            return made;
        /* Something in the way: undo and go further up. */
        for (unsigned i = 0; i < made; i++)
            munmap((void *)(base + i * stride), LIVE_BYTES);
    }
    return 0;
}

static int child(const char *which, int threads, size_t pairs)
{
    /* The fake runtime loaded, and the driver it loads at its first call,
     * up front in both runs, from the main thread: loaded later by the shim
     * (at the first registration, from a workload thread) their own
     * allocations would change that thread's heap, and glibc's work on it,
     * between the runs with and without the shim (a program that uses CUDA
     * has its driver loaded long before). */
    void *runtime = getenv("FAKE_CUDART") != NULL ? dlopen(getenv("FAKE_CUDART"), RTLD_NOW) : NULL;
    if (runtime == NULL)
        fprintf(stderr, "free_instructions: cannot load %s\n", getenv("FAKE_CUDART"));
    int (*get_device_count)(int *) =
        runtime != NULL ? (int (*)(int *))dlsym(runtime, "cudaGetDeviceCount") : NULL;
    int devices = 0;
    if (get_device_count != NULL)
        get_device_count(&devices);
    condition = which;
    thread_count = threads;
    struct worker workers[MAX_THREADS];
    memset(workers, 0, sizeof(workers));
    pthread_barrier_init(&ready, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        workers[t].index = (unsigned)t;
        workers[t].pairs = pairs;
        workers[t].rng = 88172645463325252ull + (uint64_t)t * 7919;
        pthread_create(&workers[t].thread, NULL, worker_main, &workers[t]);
    }
    pthread_barrier_wait(&ready);
    unsigned locked = interleaved_locked;
    if (strcmp(which, "below") == 0 || strcmp(which, "above") == 0)
        locked = lock_far(workers, strcmp(which, "below") == 0);
    printf("locked %u\n", locked);
    fflush(stdout);
    pthread_barrier_wait(&go);
    for (int t = 0; t < threads; t++)
        pthread_join(workers[t].thread, NULL);
    return 0;
}

/* ---- issue 37's ring ---- */

#define RING_SHORT_PAIRS 200000
#define RING_LONG_PAIRS 400000
#define RING_TIMED_PAIRS 2000000
#define RING_TOP_PAD "glibc.malloc.top_pad=1073741824"

static const unsigned ring_lives[] = {0, 100, 1000, 10000};

struct ring {
    uint64_t rng;
    bool memalign;
    void *slots[RING];
    uintptr_t span_start, span_end; /* of the locked buffers */
    size_t in_span, above, below;   /* frees, counted by ring_loop_counting */
};

static void *ring_block(struct ring *ring)
{
    uint64_t draw = next(&ring->rng);
    size_t size = 16 + draw % 8176;
    void *block = NULL;
    if (ring->memalign && (draw >> 32) % 8 == 0) {
        if (posix_memalign(&block, 64, size) != 0)
            block = NULL;
    } else {
        block = malloc(size);
    }
    if (block != NULL)
        *(volatile char *)block = 1;
    return block;
}

/* The loop callgrind counts (--toggle-collect=ring_loop). */
__attribute__((noinline)) void ring_loop(struct ring *ring, size_t pairs)
{
    for (size_t i = 0; i < pairs; i++) {
        size_t slot = next(&ring->rng) % RING;
        free(ring->slots[slot]);
        ring->slots[slot] = ring_block(ring);
    }
}

/* The same loop, counting where each freed block lies. */
static void ring_loop_counting(struct ring *ring, size_t pairs)
{
    for (size_t i = 0; i < pairs; i++) {
        size_t slot = next(&ring->rng) % RING;
        uintptr_t address = (uintptr_t)ring->slots[slot];
        ring->in_span += address >= ring->span_start && address < ring->span_end;
        ring->above += address >= ring->span_end;
        ring->below += address < ring->span_start;
        free(ring->slots[slot]);
        ring->slots[slot] = ring_block(ring);
    }
}

/* One ring run: prints "locked N", then with mode "time" the loop's
 * nanoseconds, with "layout" where its frees landed. */
static int ring_child(unsigned live, bool memalign, size_t pairs, const char *mode)
{
    /* As child(): the runtime and its driver loaded up front in both runs. */
    void *runtime = getenv("FAKE_CUDART") != NULL ? dlopen(getenv("FAKE_CUDART"), RTLD_NOW) : NULL;
    int (*get_device_count)(int *) =
        runtime != NULL ? (int (*)(int *))dlsym(runtime, "cudaGetDeviceCount") : NULL;
    int devices = 0;
    if (get_device_count != NULL)
        get_device_count(&devices);
    static struct ring ring;
    ring.rng = 88172645463325252ull;
    ring.memalign = memalign;
    ring.span_start = UINTPTR_MAX;
    for (unsigned i = 0; i < live; i++) {
        void *buffer = NULL;
        if (posix_memalign(&buffer, 4096, LIVE_BYTES) != 0 || mlock(buffer, LIVE_BYTES) != 0) {
            fprintf(stderr, "free_instructions: buffer %u: %s\n", i, strerror(errno));
            return 3;
        }
        if ((uintptr_t)buffer < ring.span_start)
            ring.span_start = (uintptr_t)buffer;
        if ((uintptr_t)buffer + LIVE_BYTES > ring.span_end)
            ring.span_end = (uintptr_t)buffer + LIVE_BYTES;
    }
    for (int i = 0; i < RING; i++)
        ring.slots[i] = ring_block(&ring);
    printf("locked %u\n", live);
    if (mode != NULL && strcmp(mode, "layout") == 0) {
        ring_loop_counting(&ring, pairs);
        printf("in_span %zu above %zu below %zu\n", ring.in_span, ring.above, ring.below);
    } else if (mode != NULL && strcmp(mode, "time") == 0) {
        struct timespec begin, end;
        clock_gettime(CLOCK_MONOTONIC, &begin);
        ring_loop(&ring, pairs);
        clock_gettime(CLOCK_MONOTONIC, &end);
        printf("ns %lld\n", (long long)(end.tv_sec - begin.tv_sec) * 1000000000ll +
                                (end.tv_nsec - begin.tv_nsec));
    } else {
        ring_loop(&ring, pairs);
    }
    return 0;
}

/* ---- running the children ---- */

struct run {
    char *const *arguments; /* after the program's own path */
    const char *toggle;     /* the function callgrind counts; NULL: run natively */
    bool with_shim;
    const char *tunables; /* added to GLIBC_TUNABLES, or NULL */
};

/* Runs a child as run says, its stdout read into output; callgrind's total
 * inside run->toggle, or 0 natively; -1 when it failed. */
static double run_child(const struct run *run, char *output, size_t output_size)
{
    char out[] = "/tmp/pinshim-free-instructions-XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0)
        return -1;
    close(fd);
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_fds[1], STDOUT_FILENO);
        close(pipe_fds[0]);
        /* meson test sets it: glibc would fill every block, the 640 MiB of
         * buffers included, which under valgrind takes minutes and counts
         * the filling, not the shim. */
        unsetenv("MALLOC_PERTURB_");
        setenv("FAKE_CUDART_CHECK", "0", 1);
        if (run->tunables != NULL) {
            const char *old = getenv("GLIBC_TUNABLES");
            char tunables[512];
            snprintf(tunables, sizeof(tunables), "%s%s%s", old != NULL ? old : "",
                     old != NULL ? ":" : "", run->tunables);
            setenv("GLIBC_TUNABLES", tunables, 1);
        }
        if (run->with_shim) {
            setenv("LD_PRELOAD", getenv("PINSHIM_LIB"), 1);
            setenv("PINSHIM_CUDART", getenv("FAKE_CUDART"), 1);
            setenv("PINSHIM_CONTEXT", "create", 1);
            setenv("PINSHIM_ASYNC", "off", 1);
        }
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        char toggle_option[96], out_option[64];
        snprintf(toggle_option, sizeof(toggle_option), "--toggle-collect=%s",
                 run->toggle != NULL ? run->toggle : "");
        snprintf(out_option, sizeof(out_option), "--callgrind-out-file=%s", out);
        const char *argv[16];
        int argc = 0;
        if (run->toggle != NULL) {
            argv[argc++] = "valgrind";
            argv[argc++] = "--tool=callgrind";
            argv[argc++] = toggle_option;
            argv[argc++] = out_option;
            argv[argc++] = "-q";
        }
        argv[argc++] = self;
        for (int i = 0; run->arguments[i] != NULL && argc < 15; i++)
            argv[argc++] = run->arguments[i];
        argv[argc] = NULL;
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pipe_fds[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < output_size &&
           (got = read(pipe_fds[0], output + used, output_size - 1 - used)) > 0)
        used += (size_t)got;
    output[used] = '\0';
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    double total = run->toggle != NULL ? -1 : 0;
    FILE *profile = run->toggle != NULL ? fopen(out, "r") : NULL;
    char line[512];
    while (profile != NULL && fgets(line, sizeof(line), profile) != NULL)
        if (strncmp(line, "totals: ", 8) == 0)
            total = strtod(line + 8, NULL);
    if (profile != NULL)
        fclose(profile);
    unlink(out);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? total : -1;
}

/* Instructions inside free_malloc_loop (all threads), or -1. */
static double count(const char *which, int threads, size_t pairs, bool with_shim, unsigned *locked)
{
    char threads_text[16], pairs_text[32];
    snprintf(threads_text, sizeof(threads_text), "%d", threads);
    snprintf(pairs_text, sizeof(pairs_text), "%zu", pairs);
    char *arguments[] = {"--child", (char *)which, threads_text, pairs_text, NULL};
    struct run run = {arguments, "free_malloc_loop", with_shim, NULL};
    char output[256];
    double total = run_child(&run, output, sizeof(output));
    sscanf(output, "locked %u", locked);
    return total;
}

/* Instructions inside ring_loop, or -1 (grown: with the top pad). */
static double count_ring(unsigned live, bool memalign, size_t pairs, bool with_shim, bool grown)
{
    char live_text[16], pairs_text[32];
    snprintf(live_text, sizeof(live_text), "%u", live);
    snprintf(pairs_text, sizeof(pairs_text), "%zu", pairs);
    char *arguments[] = {"--ring", live_text, memalign ? "1" : "0", pairs_text, NULL};
    struct run run = {arguments, "ring_loop", with_shim, grown ? RING_TOP_PAD : NULL};
    char output[256];
    return run_child(&run, output, sizeof(output));
}

static FILE *json;
static bool json_first = true;

static void json_row(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void json_row(const char *format, ...)
{
    if (json == NULL)
        return;
    fprintf(json, "%s\n  ", json_first ? "" : ",");
    json_first = false;
    va_list arguments;
    va_start(arguments, format);
    vfprintf(json, format, arguments);
    va_end(arguments);
}

/* One condition's four callgrind totals (without the shim, short and long
 * loop, then with it), per pair: false when a run failed. */
struct per_pair {
    double without, with, extra;
};

static bool per_pair_of(double without_short, double without_long, double with_short,
                        double with_long, double pairs, struct per_pair *result)
{
    if (without_short < 0 || without_long < 0 || with_short < 0 || with_long < 0)
        return false;
    result->without = (without_long - without_short) / pairs;
    result->with = (with_long - with_short) / pairs;
    result->extra = result->with - result->without;
    return true;
}

/* The six layouts of issues 14 and 22, in one and two threads. */
static void run_layouts(const char *only, int *runs, int *over, int *failed)
{
    static const char *const conditions[] = {"none",        "below", "above",
                                             "interleaved", "slack", "shared"};
    bool any = false;
    for (size_t c = 0; c < sizeof(conditions) / sizeof(*conditions); c++)
        any |= only == NULL || strcmp(only, conditions[c]) == 0;
    if (!any)
        return;
    printf("extra instructions per free + malloc pair (callgrind, %d - %d pairs per thread)\n",
           LONG_PAIRS, SHORT_PAIRS);
    printf("%-12s %7s %8s %12s %12s %7s %7s\n", "condition", "threads", "locked", "without/pair",
           "with/pair", "extra", "budget");
    for (size_t c = 0; c < sizeof(conditions) / sizeof(*conditions); c++) {
        if (only != NULL && strcmp(only, conditions[c]) != 0)
            continue;
        for (int threads = 1; threads <= MAX_THREADS; threads++) {
            (*runs)++;
            unsigned locked = 0, ignored = 0;
            double without_short = count(conditions[c], threads, SHORT_PAIRS, false, &ignored);
            double without_long = count(conditions[c], threads, LONG_PAIRS, false, &ignored);
            double with_short = count(conditions[c], threads, SHORT_PAIRS, true, &locked);
            double with_long = count(conditions[c], threads, LONG_PAIRS, true, &ignored);
            double budget = c == 0 ? 8 : 20;
            struct per_pair pair;
            if (!per_pair_of(without_short, without_long, with_short, with_long,
                             (double)(LONG_PAIRS - SHORT_PAIRS) * threads, &pair)) {
                printf("%-12s %7d  run failed (valgrind missing, or the child failed)\n",
                       conditions[c], threads);
                (*failed)++;
                continue;
            }
            bool within = pair.extra <= budget;
            *over += !within;
            printf("%-12s %7d %8u %12.2f %12.2f %7.2f %7.0f%s\n", conditions[c], threads, locked,
                   pair.without, pair.with, pair.extra, budget, within ? "" : "  OVER");
            json_row("{\"condition\": \"%s\", \"threads\": %d, \"locked\": %u, "
                     "\"without\": %.3f, \"with\": %.3f, \"extra\": %.3f, \"budget\": %.0f}",
                     conditions[c], threads, locked, pair.without, pair.with, pair.extra, budget);
        }
    }
}

/* Issue 37's ring, in the grown heap (condition "ring") and valgrind's
 * capped one ("ring-capped"). */
static void run_ring(const char *only, int *runs, int *over, int *failed)
{
    for (int grown = 1; grown >= 0; grown--) {
        const char *name = grown ? "ring" : "ring-capped";
        if (only != NULL && strcmp(only, name) != 0)
            continue;
        printf("\nissue 37's ring, %s (callgrind, %d - %d pairs)\n",
               grown ? "the heap grown in one piece (glibc.malloc.top_pad=1 GiB), as natively"
                     : "valgrind's brk heap, capped at 8 MiB: blocks between locked buffers",
               RING_LONG_PAIRS, RING_SHORT_PAIRS);
        printf("%-12s %-15s %7s %12s %12s %7s %7s\n", "condition", "loop", "locked", "without/pair",
               "with/pair", "extra", "budget");
        for (int memalign = 1; memalign >= 0; memalign--)
            for (size_t l = 0; l < sizeof(ring_lives) / sizeof(*ring_lives); l++) {
                unsigned live = ring_lives[l];
                const char *loop = memalign ? "posix_memalign" : "malloc only";
                (*runs)++;
                double without_short = count_ring(live, memalign, RING_SHORT_PAIRS, false, grown);
                double without_long = count_ring(live, memalign, RING_LONG_PAIRS, false, grown);
                double with_short = count_ring(live, memalign, RING_SHORT_PAIRS, true, grown);
                double with_long = count_ring(live, memalign, RING_LONG_PAIRS, true, grown);
                struct per_pair pair;
                if (!per_pair_of(without_short, without_long, with_short, with_long,
                                 RING_LONG_PAIRS - RING_SHORT_PAIRS, &pair)) {
                    printf("%-12s %-15s %7u  run failed\n", name, loop, live);
                    (*failed)++;
                    continue;
                }
                double budget = live == 0 ? 4 : grown ? 10 : 18;
                bool within = pair.extra <= budget;
                *over += !within;
                printf("%-12s %-15s %7u %12.2f %12.2f %7.2f %7.0f%s\n", name, loop, live,
                       pair.without, pair.with, pair.extra, budget, within ? "" : "  OVER");
                json_row("{\"condition\": \"%s\", \"loop\": \"%s\", \"threads\": 1, "
                         "\"locked\": %u, \"without\": %.3f, \"with\": %.3f, \"extra\": %.3f, "
                         "\"budget\": %.0f}",
                         name, loop, live, pair.without, pair.with, pair.extra, budget);
            }
    }
}

/* Where the ring's frees land: natively without and with the shim, and
 * under valgrind (no tool) in the capped heap and the grown one. */
static int ring_layout(void)
{
    printf("frees of the ring (200,000 pairs, posix_memalign in the loop): inside the span of "
           "the locked buffers / above it / below it\n");
    printf("%7s  %-26s %9s %9s %9s\n", "locked", "run", "in span", "above", "below");
    for (size_t l = 1; l < sizeof(ring_lives) / sizeof(*ring_lives); l++) {
        char live_text[16];
        snprintf(live_text, sizeof(live_text), "%u", ring_lives[l]);
        char *arguments[] = {"--ring", live_text, "1", "200000", "layout", NULL};
        char *under_valgrind[] = {"--valgrind-none", live_text, "1", "200000", "layout", NULL};
        struct {
            const char *name;
            bool valgrind, shim;
            const char *tunables;
        } runs[] = {{"native", false, false, NULL},
                    {"native, the shim", false, true, NULL},
                    {"native, top_pad", false, false, RING_TOP_PAD},
                    {"valgrind, top_pad (grown)", true, false, RING_TOP_PAD},
                    {"valgrind (capped)", true, false, NULL}};
        for (size_t r = 0; r < sizeof(runs) / sizeof(*runs); r++) {
            /* valgrind's "none" tool runs the loop as it is, uncounted. */
            struct run run = {runs[r].valgrind ? under_valgrind : arguments, NULL, runs[r].shim,
                              runs[r].tunables};
            char output[256] = "";
            if (run_child(&run, output, sizeof(output)) < 0)
                output[0] = '\0';
            size_t in_span = 0, above = 0, below = 0;
            const char *counts = strstr(output, "in_span");
            if (counts == NULL ||
                sscanf(counts, "in_span %zu above %zu below %zu", &in_span, &above, &below) != 3) {
                printf("%7u  %-26s run failed\n", ring_lives[l], runs[r].name);
                continue;
            }
            printf("%7u  %-26s %9zu %9zu %9zu\n", ring_lives[l], runs[r].name, in_span, above,
                   below);
        }
    }
    return 0;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The ring natively, without and with the shim alternating, rounds times:
 * the median ratio of the loop's time. */
static int ring_timed(int rounds)
{
    printf("issue 37's ring natively, %d pairs a run, %d rounds alternating without and with "
           "the shim: median loop time ratio (with / without)\n",
           RING_TIMED_PAIRS, rounds);
    printf("%-15s %7s %14s %14s %8s\n", "loop", "locked", "without ns/pair", "with ns/pair",
           "ratio");
    for (int memalign = 1; memalign >= 0; memalign--)
        for (size_t l = 0; l < sizeof(ring_lives) / sizeof(*ring_lives); l++) {
            char live_text[16], pairs_text[32];
            snprintf(live_text, sizeof(live_text), "%u", ring_lives[l]);
            snprintf(pairs_text, sizeof(pairs_text), "%d", RING_TIMED_PAIRS);
            char *arguments[] = {"--ring",   live_text, memalign ? "1" : "0",
                                 pairs_text, "time",    NULL};
            double without[64], with[64], ratios[64];
            int done = 0;
            for (int r = 0; r < rounds && r < 64; r++) {
                double ns[2] = {-1, -1};
                for (int arm = 0; arm < 2; arm++) {
                    /* Alternate which arm goes first, so drift hits both. */
                    bool shim = (arm + r) % 2 == 1;
                    struct run run = {arguments, NULL, shim, NULL};
                    char output[256] = "";
                    long long value = -1;
                    const char *line;
                    if (run_child(&run, output, sizeof(output)) == 0 &&
                        (line = strstr(output, "ns ")) != NULL &&
                        sscanf(line, "ns %lld", &value) == 1)
                        ns[shim] = (double)value;
                }
                if (ns[0] <= 0 || ns[1] <= 0)
                    continue;
                without[done] = ns[0];
                with[done] = ns[1];
                ratios[done] = ns[1] / ns[0];
                done++;
            }
            if (done == 0) {
                printf("%-15s %7u  run failed\n", memalign ? "posix_memalign" : "malloc only",
                       ring_lives[l]);
                continue;
            }
            qsort(without, (size_t)done, sizeof(double), compare_doubles);
            qsort(with, (size_t)done, sizeof(double), compare_doubles);
            qsort(ratios, (size_t)done, sizeof(double), compare_doubles);
            printf("%-15s %7u %14.2f %14.2f %8.3f\n", memalign ? "posix_memalign" : "malloc only",
                   ring_lives[l], without[done / 2] / RING_TIMED_PAIRS,
                   with[done / 2] / RING_TIMED_PAIRS, ratios[done / 2]);
            json_row("{\"condition\": \"ring-timed\", \"loop\": \"%s\", \"locked\": %u, "
                     "\"rounds\": %d, \"without_ns_per_pair\": %.3f, \"with_ns_per_pair\": %.3f, "
                     "\"median_ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f}",
                     memalign ? "posix_memalign" : "malloc only", ring_lives[l], done,
                     without[done / 2] / RING_TIMED_PAIRS, with[done / 2] / RING_TIMED_PAIRS,
                     ratios[done / 2], ratios[0], ratios[done - 1]);
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--child") == 0)
        return child(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10));
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "--ring") == 0)
        return ring_child((unsigned)atoi(argv[2]), atoi(argv[3]) != 0, strtoull(argv[4], NULL, 10),
                          argc == 6 ? argv[5] : NULL);
    if (argc == 6 && strcmp(argv[1], "--valgrind-none") == 0) {
        /* The ring under valgrind without a tool's counting: its heap. */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        execlp("valgrind", "valgrind", "--tool=none", "-q", self, "--ring", argv[2], argv[3],
               argv[4], argv[5], (char *)NULL);
        return 127;
    }
    bool check = false, timed = false, layout = false;
    int rounds = 11;
    const char *json_path = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--check") == 0)
            check = true;
        else if (strcmp(argv[i], "--timed") == 0)
            timed = true;
        else if (strcmp(argv[i], "--ring-layout") == 0)
            layout = true;
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: free_instructions [--check] [--json FILE] [--only CONDITION] | "
                            "--timed [--rounds N] [--json FILE] | --ring-layout\n");
            return 2;
        }
    }
    if (getenv("PINSHIM_LIB") == NULL || getenv("FAKE_CUDART") == NULL) {
        fprintf(stderr, "free_instructions: PINSHIM_LIB and FAKE_CUDART must be set\n");
        return 2;
    }
    if (layout)
        return ring_layout();
    json = json_path != NULL ? fopen(json_path, "w") : NULL;
    if (json != NULL)
        fprintf(json,
                "{\"tool\": \"%s\", \"pairs\": [%d, %d], \"ring_pairs\": [%d, %d], "
                "\"results\": [",
                timed ? "clock" : "callgrind", SHORT_PAIRS, LONG_PAIRS, RING_SHORT_PAIRS,
                RING_LONG_PAIRS);
    int over = 0, failed = 0, runs = 0;
    if (timed) {
        ring_timed(rounds < 1 ? 1 : rounds);
    } else {
        run_layouts(only, &runs, &over, &failed);
        run_ring(only, &runs, &over, &failed);
    }
    if (json != NULL) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    if (timed)
        return 0;
    if (runs == 0) {
        fprintf(stderr, "free_instructions: no condition %s\n", only != NULL ? only : "");
        return 2;
    }
    printf("%d within budget, %d over, %d failed\n", runs - over - failed, over, failed);
    return check && (over != 0 || failed != 0) ? 1 : 0;
}
