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
 * Usage:
 *   free_instructions [--check] [--json FILE] [--only CONDITION]   runs every
 *       condition (or one); with --check exits 1 when one exceeds its budget
 *       (8 with no locks, 20 with)
 *   free_instructions --child CONDITION THREADS PAIRS   one run (under callgrind)
 * Environment: PINSHIM_LIB, FAKE_CUDART (set by meson for the test). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
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

/* Instructions inside free_malloc_loop (all threads), or -1. */
static double count(const char *which, int threads, size_t pairs, bool with_shim, unsigned *locked)
{
    char out[] = "/tmp/pinshim-free-instructions-XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0)
        return -1;
    close(fd);
    char out_option[64], threads_text[16], pairs_text[32];
    snprintf(out_option, sizeof(out_option), "--callgrind-out-file=%s", out);
    snprintf(threads_text, sizeof(threads_text), "%d", threads);
    snprintf(pairs_text, sizeof(pairs_text), "%zu", pairs);
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
        if (with_shim) {
            setenv("LD_PRELOAD", getenv("PINSHIM_LIB"), 1);
            setenv("PINSHIM_CUDART", getenv("FAKE_CUDART"), 1);
            setenv("PINSHIM_CONTEXT", "create", 1);
            setenv("PINSHIM_ASYNC", "off", 1);
            setenv("FAKE_CUDART_CHECK", "0", 1);
        }
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        execlp("valgrind", "valgrind", "--tool=callgrind", "--toggle-collect=free_malloc_loop",
               out_option, "-q", self, "--child", which, threads_text, pairs_text, (char *)NULL);
        _exit(127);
    }
    close(pipe_fds[1]);
    char output[256] = "";
    ssize_t got = read(pipe_fds[0], output, sizeof(output) - 1);
    output[got > 0 ? got : 0] = '\0';
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    sscanf(output, "locked %u", locked);
    double total = -1;
    FILE *profile = fopen(out, "r");
    char line[512];
    while (profile != NULL && fgets(line, sizeof(line), profile) != NULL)
        if (strncmp(line, "totals: ", 8) == 0)
            total = strtod(line + 8, NULL);
    if (profile != NULL)
        fclose(profile);
    unlink(out);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? total : -1;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--child") == 0)
        return child(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10));
    bool check = false;
    const char *json_path = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--check") == 0)
            check = true;
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr,
                    "usage: free_instructions [--check] [--json FILE] [--only CONDITION]\n");
            return 2;
        }
    }
    if (getenv("PINSHIM_LIB") == NULL || getenv("FAKE_CUDART") == NULL) {
        fprintf(stderr, "free_instructions: PINSHIM_LIB and FAKE_CUDART must be set\n");
        return 2;
    }
    static const char *const conditions[] = {"none",        "below", "above",
                                             "interleaved", "slack", "shared"};
    FILE *json = json_path != NULL ? fopen(json_path, "w") : NULL;
    if (json != NULL)
        fprintf(json, "{\"tool\": \"callgrind\", \"pairs\": [%d, %d], \"results\": [", SHORT_PAIRS,
                LONG_PAIRS);
    printf("extra instructions per free + malloc pair (callgrind, %d - %d pairs per thread)\n",
           LONG_PAIRS, SHORT_PAIRS);
    printf("%-12s %7s %8s %12s %12s %7s %7s\n", "condition", "threads", "locked", "without/pair",
           "with/pair", "extra", "budget");
    int over = 0, failed = 0, runs = 0;
    bool first = true;
    for (size_t c = 0; c < sizeof(conditions) / sizeof(*conditions); c++) {
        if (only != NULL && strcmp(only, conditions[c]) != 0)
            continue;
        for (int threads = 1; threads <= MAX_THREADS; threads++) {
            runs++;
            unsigned locked = 0, ignored = 0;
            double without_short = count(conditions[c], threads, SHORT_PAIRS, false, &ignored);
            double without_long = count(conditions[c], threads, LONG_PAIRS, false, &ignored);
            double with_short = count(conditions[c], threads, SHORT_PAIRS, true, &locked);
            double with_long = count(conditions[c], threads, LONG_PAIRS, true, &ignored);
            double pairs = (double)(LONG_PAIRS - SHORT_PAIRS) * threads;
            double budget = c == 0 ? 8 : 20;
            if (without_short < 0 || without_long < 0 || with_short < 0 || with_long < 0) {
                printf("%-12s %7d  run failed (valgrind missing, or the child failed)\n",
                       conditions[c], threads);
                failed++;
                continue;
            }
            double without = (without_long - without_short) / pairs;
            double with = (with_long - with_short) / pairs;
            double extra = with - without;
            bool within = extra <= budget;
            over += !within;
            printf("%-12s %7d %8u %12.2f %12.2f %7.2f %7.0f%s\n", conditions[c], threads, locked,
                   without, with, extra, budget, within ? "" : "  OVER");
            if (json != NULL)
                fprintf(json,
                        "%s\n  {\"condition\": \"%s\", \"threads\": %d, \"locked\": %u, "
                        "\"without\": %.3f, \"with\": %.3f, \"extra\": %.3f, \"budget\": %.0f}",
                        first ? "" : ",", conditions[c], threads, locked, without, with, extra,
                        budget);
            first = false;
        }
    }
    if (json != NULL) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    printf("%d within budget, %d over, %d failed\n", runs - over - failed, over, failed);
    return check && (over != 0 || failed != 0) ? 1 : 0;
}
