/* lock_latency: how long the PROGRAM waits inside mlock() under the shim when
 * registration is synchronous (PINSHIM_ASYNC=off, the default since issue 17:
 * cudaHostRegister runs inside the lock call, so the buffer is pinned when
 * mlock returns) and when it is asynchronous (PINSHIM_ASYNC=on: the lock call
 * returns once the kernel has locked the pages and a shim thread registers
 * them), and how long until the range is registered
 * (pinshim_drain() returns). A third arm runs without the shim: the kernel's
 * own mlock time, for reference.
 *
 * Each arm runs as one child process per round (this program re-executed, under
 * LD_PRELOAD=libpinshim.so for sync and async) that does what a framework
 * does: dlopen the CUDA runtime, cudaFree(NULL) so the program has a context
 * (PINSHIM_CONTEXT=program registers into it), then per size and repetition
 * time mlock, pinshim_drain and munlock with CLOCK_MONOTONIC.
 *
 * By default the runtime is the fake one of the test suite on the fake driver
 * with FAKE_CUDA_REGISTER_SECONDS_PER_GIB=0.1 (about what an H200 system
 * takes, vLLM #51081); --real uses the real libcudart found the way the shim
 * finds it (PINSHIM_CUDART left unset) and needs a GPU.
 *
 * Memory: a size that fits in half of MemAvailable is a private anonymous
 * mapping touched page by page before it is locked (a real lock of resident
 * memory). A larger one is reserved with MAP_NORESERVE and locked with
 * mlock2(MLOCK_ONFAULT) under PINSHIM_ONFAULT=all, so the shim registers the
 * whole range while no page is faulted in: it costs no memory with the fake
 * driver (which never touches the pages), and the kernel's part of the lock
 * is then almost nothing. Every row says which it used. */
#include "bench_util.h"
#include "lock_latency_deepspeed.h"

#include "pinshim.h"

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
#include <unistd.h>

#ifndef BENCH_SHIM_PATH
#define BENCH_SHIM_PATH ""
#endif
#ifndef BENCH_FAKE_CUDART_PATH
#define BENCH_FAKE_CUDART_PATH ""
#endif
#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

#define GIB ((size_t)1 << 30)
#define MAX_SIZES 8
#define MAX_REPS 32
#define WARMUP_BYTES ((size_t)1 << 20)
#define EXIT_NO_GPU 2

enum method { METHOD_TOUCH, METHOD_ONFAULT };
static const char *const method_names[] = {"touch", "onfault"};

enum arm { ARM_NONE, ARM_SYNC, ARM_ASYNC, ARM_COUNT };
static const char *const arm_names[] = {"none", "sync", "async"};
static const char *const arm_titles[] = {"without the shim", "PINSHIM_ASYNC=off",
                                         "PINSHIM_ASYNC=on"};

/* ------------------------------------------------------------------------ */
/* Child: one arm.                                                           */

static int (*cuda_free)(void *);
static const char *(*cuda_error_name)(int);

/* The runtime the program loads: the path given, else (the real runtime) the
 * names the shim searches, then the Toolkit's lib64. NULL when none loads. */
static void *load_runtime(const char *path, char *loaded, size_t loaded_size)
{
    if (path != NULL && path[0] != '\0') {
        snprintf(loaded, loaded_size, "%s", path);
        return dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    const char *home = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11",
                                        "libcudart.so"};
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++) {
            char candidate[PATH_MAX];
            if (pass == 0)
                snprintf(candidate, sizeof(candidate), "%s", names[i]);
            else
                snprintf(candidate, sizeof(candidate), "%s/lib64/%s", home, names[i]);
            void *handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
            if (handle != NULL) {
                snprintf(loaded, loaded_size, "%s", candidate);
                return handle;
            }
        }
    }
    return NULL;
}

struct child_size {
    size_t bytes;
    enum method method;
};

static double seconds_since(double began)
{
    return bench_now_seconds() - began;
}

static int lock_range(void *buffer, size_t bytes, enum method method)
{
    /* glibc's mlock2, not syscall(2): the shim interposes the function. */
    if (method == METHOD_ONFAULT)
        return mlock2(buffer, bytes, MLOCK_ONFAULT);
    return mlock(buffer, bytes);
}

/* A mapping of bytes, touched page by page (METHOD_TOUCH) or only reserved. */
static void *map_buffer(size_t bytes, enum method method, double *touch_seconds)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (method == METHOD_ONFAULT ? MAP_NORESERVE : 0);
    unsigned char *buffer = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (buffer == MAP_FAILED)
        return NULL;
    double began = bench_now_seconds();
    if (method == METHOD_TOUCH) {
        long page = sysconf(_SC_PAGESIZE);
        for (size_t offset = 0; offset < bytes; offset += (size_t)page)
            buffer[offset] = 1;
    }
    *touch_seconds = seconds_since(began);
    return buffer;
}

static int child_main(const struct child_size *sizes, size_t size_count, int reps,
                      const char *runtime_path)
{
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    if (setrlimit(RLIMIT_MEMLOCK, &unlimited) != 0)
        printf("INFO cannot raise RLIMIT_MEMLOCK: %s\n", strerror(errno));

    char loaded[PATH_MAX] = "";
    void *runtime = load_runtime(runtime_path, loaded, sizeof(loaded));
    if (runtime == NULL) {
        printf("SKIP cannot load a CUDA runtime (%s): %s\n",
               runtime_path && runtime_path[0] ? runtime_path : "libcudart search", dlerror());
        return EXIT_NO_GPU;
    }
    *(void **)&cuda_free = dlsym(runtime, "cudaFree");
    *(void **)&cuda_error_name = dlsym(runtime, "cudaGetErrorName");
    if (cuda_free == NULL) {
        printf("ERROR %s has no cudaFree\n", loaded);
        return 1;
    }
    /* The program's context, made before any lock, as a framework does. */
    int error = cuda_free(NULL);
    if (error != 0) {
        printf("SKIP cudaFree(NULL) returned %d (%s): no usable GPU\n", error,
               cuda_error_name ? cuda_error_name(error) : "?");
        return EXIT_NO_GPU;
    }
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    printf("INFO runtime=%s shim=%d\n", loaded, drain != NULL);

    /* The first lock of the process also loads the shim's CUDA side and
     * starts its thread: done here, outside the figures. */
    double touch;
    void *warm = map_buffer(WARMUP_BYTES, METHOD_TOUCH, &touch);
    if (warm != NULL) {
        double began = bench_now_seconds();
        int locked = mlock(warm, WARMUP_BYTES);
        double lock = seconds_since(began);
        began = bench_now_seconds();
        if (drain != NULL)
            drain();
        double drained = seconds_since(began);
        munlock(warm, WARMUP_BYTES);
        munmap(warm, WARMUP_BYTES);
        printf("WARMUP ok=%d lock=%.9f drain=%.9f\n", locked == 0, lock, drained);
    }

    for (size_t s = 0; s < size_count; s++) {
        size_t bytes = sizes[s].bytes;
        enum method method = sizes[s].method;
        void *buffer = map_buffer(bytes, method, &touch);
        if (buffer == NULL) {
            printf("ERROR size=%zu mmap failed: %s\n", bytes, strerror(errno));
            continue;
        }
        printf("SETUP size=%zu method=%s touch=%.6f\n", bytes, method_names[method], touch);
        for (int rep = 0; rep < reps; rep++) {
            double began = bench_now_seconds();
            int locked = lock_range(buffer, bytes, method);
            double lock = seconds_since(began);
            if (locked != 0) {
                printf("ERROR size=%zu rep=%d lock failed: %s\n", bytes, rep, strerror(errno));
                break;
            }
            /* What is_pinned() would say right when the lock returns. */
            int at_return = is_registered ? is_registered(buffer) : -1;
            began = bench_now_seconds();
            if (drain != NULL)
                drain();
            double drained = seconds_since(began);
            int after_drain = is_registered ? is_registered(buffer) : -1;
            began = bench_now_seconds();
            munlock(buffer, bytes);
            double unlock = seconds_since(began);
            printf("REP size=%zu rep=%d lock=%.9f drain=%.9f unlock=%.9f at_return=%d "
                   "after_drain=%d\n",
                   bytes, rep, lock, drained, unlock, at_return, after_drain);
        }
        munmap(buffer, bytes);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Parent.                                                                   */

struct arm_result {
    bool ran;
    int exit_code;
    double lock[MAX_SIZES][MAX_REPS], drain[MAX_SIZES][MAX_REPS], unlock[MAX_SIZES][MAX_REPS];
    int at_return[MAX_SIZES][MAX_REPS], after_drain[MAX_SIZES][MAX_REPS];
    int reps_done[MAX_SIZES];
    double touch[MAX_SIZES];
    double warmup_lock, warmup_drain;
    bool have_stats;
    double wait_seconds, background_seconds, register_seconds, unregister_seconds;
    char message[256]; /* a SKIP or ERROR line, when there was one */
};

static struct {
    double sizes_gib[MAX_SIZES];
    size_t size_count;
    size_t bytes[MAX_SIZES];
    enum method method[MAX_SIZES];
    char why[MAX_SIZES][160];
    int reps;
    int rounds;                /* each runs every arm once, in alternating order */
    const char *forced_method; /* NULL: auto */
    const char *seconds_per_gib;
    bool real;
    const char *json_path;
} options;

static struct arm_result arms[ARM_COUNT];

static int size_index(size_t bytes)
{
    for (size_t i = 0; i < options.size_count; i++)
        if (options.bytes[i] == bytes)
            return (int)i;
    return -1;
}

/* Stores the child's repetitions from index first on (the rounds before it
 * filled the earlier slots). */
static void parse_child_output(const char *output, struct arm_result *arm, int first)
{
    const char *line = output;
    while (line != NULL && *line != '\0') {
        size_t bytes;
        int rep, at_return, after_drain, ok;
        double lock, drain, unlock, touch;
        char method[16];
        if (sscanf(line,
                   "REP size=%zu rep=%d lock=%lf drain=%lf unlock=%lf at_return=%d "
                   "after_drain=%d",
                   &bytes, &rep, &lock, &drain, &unlock, &at_return, &after_drain) == 7) {
            int s = size_index(bytes);
            rep += first;
            if (s >= 0 && rep >= first && rep < MAX_REPS) {
                arm->lock[s][rep] = lock;
                arm->drain[s][rep] = drain;
                arm->unlock[s][rep] = unlock;
                arm->at_return[s][rep] = at_return;
                arm->after_drain[s][rep] = after_drain;
                if (rep + 1 > arm->reps_done[s])
                    arm->reps_done[s] = rep + 1;
            }
        } else if (sscanf(line, "SETUP size=%zu method=%15s touch=%lf", &bytes, method, &touch) ==
                   3) {
            int s = size_index(bytes);
            if (s >= 0)
                arm->touch[s] = touch;
        } else if (sscanf(line, "WARMUP ok=%d lock=%lf drain=%lf", &ok, &lock, &drain) == 3) {
            arm->warmup_lock = lock;
            arm->warmup_drain = drain;
        } else if (strncmp(line, "SKIP ", 5) == 0 || strncmp(line, "ERROR ", 6) == 0) {
            const char *end = strchr(line, '\n');
            size_t length = end ? (size_t)(end - line) : strlen(line);
            if (length >= sizeof(arm->message))
                length = sizeof(arm->message) - 1;
            memcpy(arm->message, line, length);
            arm->message[length] = '\0';
        }
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
}

static void run_arm(enum arm which, int round, const char *shim, const char *runtime)
{
    struct arm_result *arm = &arms[which];
    struct bench_env env;
    bench_env_from_current(&env);
    char stats_path[PATH_MAX];
    snprintf(stats_path, sizeof(stats_path), "/tmp/pinshim-lock-latency.%d.%s.json", (int)getpid(),
             arm_names[which]);
    unlink(stats_path);
    if (which != ARM_NONE) {
        bench_env_set(&env, "LD_PRELOAD", shim);
        bench_env_set(&env, "PINSHIM_ASYNC", which == ARM_ASYNC ? "on" : "off");
        bench_env_set(&env, "PINSHIM_CONTEXT", "program");
        bench_env_set(&env, "PINSHIM_ONFAULT", "all");
        bench_env_set(&env, "PINSHIM_STATS", stats_path);
        if (!options.real)
            bench_env_set(&env, "PINSHIM_CUDART", runtime);
    }
    if (!options.real) {
        char unregister[64];
        snprintf(unregister, sizeof(unregister), "%g", strtod(options.seconds_per_gib, NULL) / 10);
        bench_env_set(&env, "FAKE_CUDA_REGISTER_SECONDS_PER_GIB", options.seconds_per_gib);
        bench_env_set(&env, "FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB", unregister);
        /* The double's /proc/self/smaps checks are test machinery, not CUDA's cost. */
        bench_env_set(&env, "FAKE_CUDART_CHECK", "0");
    }

    char sizes[MAX_SIZES * 40] = "";
    for (size_t i = 0; i < options.size_count; i++)
        snprintf(sizes + strlen(sizes), sizeof(sizes) - strlen(sizes), "%s%zu:%s", i ? "," : "",
                 options.bytes[i], method_names[options.method[i]]);
    char reps[16];
    snprintf(reps, sizeof(reps), "%d", options.reps);
    char *argv[] = {(char *)bench_self_path(),
                    "--child",
                    sizes,
                    reps,
                    (char *)(options.real ? "" : runtime),
                    NULL};
    fprintf(stderr, "lock_latency: round %d, arm %s (%s)\n", round + 1, arm_names[which],
            arm_titles[which]);
    struct bench_run run;
    bool ran = bench_run_process(argv, &env, true, false, &run);
    arm->ran = round == 0 ? ran : arm->ran && ran;
    if (round == 0 || run.exit_code != 0)
        arm->exit_code = run.exit_code;
    if (run.output != NULL)
        parse_child_output(run.output, arm, round * options.reps);
    bench_run_free(&run);
    bench_env_free(&env);

    /* Summed over the rounds. */
    char *stats = which != ARM_NONE ? bench_read_file(stats_path) : NULL;
    double wait = 0, background = 0, registering = 0, unregistering = 0;
    bool have = stats != NULL && bench_json_number(stats, "thread", "wait_seconds", &wait) &&
                bench_json_number(stats, "thread", "background_seconds", &background) &&
                bench_json_number(stats, "register", "seconds", &registering) &&
                bench_json_number(stats, "unregister", "seconds", &unregistering);
    arm->have_stats = round == 0 ? have : arm->have_stats && have;
    arm->wait_seconds += wait;
    arm->background_seconds += background;
    arm->register_seconds += registering;
    arm->unregister_seconds += unregistering;
    free(stats);
    unlink(stats_path);
}

static double median_of(const double *values, int count)
{
    return bench_median(values, (size_t)count);
}

/* Whether every repetition of an arm and size gave value for a flag. */
static const char *flag_summary(const int *flags, int count)
{
    int ones = 0, unknown = 0;
    for (int i = 0; i < count; i++) {
        ones += flags[i] == 1;
        unknown += flags[i] < 0;
    }
    if (count == 0 || unknown == count)
        return "n/a";
    if (ones == count)
        return "yes";
    if (ones == 0)
        return "no";
    return "sometimes";
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

static bool arm_has(enum arm which, size_t s)
{
    return arms[which].reps_done[s] > 0;
}

static double lock_median(enum arm which, size_t s)
{
    return median_of(arms[which].lock[s], arms[which].reps_done[s]);
}

static void print_tables(void)
{
    printf("\nMedians of %d repetitions per size (min in brackets): %d round(s) of one process "
           "per arm, the order alternating, %d repetitions each.\n\n",
           options.reps * options.rounds, options.rounds, options.reps);
    printf("| size | memory | mlock, without the shim | mlock, sync | mlock, async | sync / async "
           "| added by the shim to mlock, sync / async | async: mlock + pinshim_drain (until "
           "registered) | registered when mlock returned, sync / async | munlock, sync / async "
           "|\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t s = 0; s < options.size_count; s++) {
        char cells[ARM_COUNT][64], added[2][32], until[32], unlock[2][32];
        for (int a = 0; a < ARM_COUNT; a++) {
            char median[24], minimum[24];
            snprintf(cells[a], sizeof(cells[a]), "n/a");
            if (!arm_has((enum arm)a, s))
                continue;
            format_seconds(median, sizeof(median), lock_median((enum arm)a, s));
            format_seconds(minimum, sizeof(minimum),
                           bench_minimum(arms[a].lock[s], (size_t)arms[a].reps_done[s]));
            snprintf(cells[a], sizeof(cells[a]), "%s (%s)", median, minimum);
        }
        char ratio[32] = "n/a";
        if (arm_has(ARM_SYNC, s) && arm_has(ARM_ASYNC, s) && lock_median(ARM_ASYNC, s) > 0)
            snprintf(ratio, sizeof(ratio), "%.1fx",
                     lock_median(ARM_SYNC, s) / lock_median(ARM_ASYNC, s));
        for (int k = 0; k < 2; k++) {
            enum arm which = k == 0 ? ARM_SYNC : ARM_ASYNC;
            snprintf(added[k], sizeof(added[k]), "n/a");
            snprintf(unlock[k], sizeof(unlock[k]), "n/a");
            if (!arm_has(which, s))
                continue;
            if (arm_has(ARM_NONE, s)) {
                double difference = lock_median(which, s) - lock_median(ARM_NONE, s);
                char magnitude[24];
                format_seconds(magnitude, sizeof(magnitude),
                               difference < 0 ? -difference : difference);
                snprintf(added[k], sizeof(added[k]), "%s%s", difference < 0 ? "-" : "+", magnitude);
            }
            format_seconds(unlock[k], sizeof(unlock[k]),
                           median_of(arms[which].unlock[s], arms[which].reps_done[s]));
        }
        snprintf(until, sizeof(until), "n/a");
        if (arm_has(ARM_ASYNC, s)) {
            double total[MAX_REPS];
            for (int r = 0; r < arms[ARM_ASYNC].reps_done[s]; r++)
                total[r] = arms[ARM_ASYNC].lock[s][r] + arms[ARM_ASYNC].drain[s][r];
            format_seconds(until, sizeof(until), median_of(total, arms[ARM_ASYNC].reps_done[s]));
        }
        printf("| %g GiB | %s | %s | %s | %s | %s | %s / %s | %s | %s / %s | %s / %s |\n",
               options.sizes_gib[s], options.method[s] == METHOD_TOUCH ? "touched" : "on fault",
               cells[ARM_NONE], cells[ARM_SYNC], cells[ARM_ASYNC], ratio, added[0], added[1], until,
               flag_summary(arms[ARM_SYNC].at_return[s], arms[ARM_SYNC].reps_done[s]),
               flag_summary(arms[ARM_ASYNC].at_return[s], arms[ARM_ASYNC].reps_done[s]), unlock[0],
               unlock[1]);
    }
    for (int a = ARM_SYNC; a <= ARM_ASYNC; a++) {
        int reps = 0, registered = 0;
        for (size_t s = 0; s < options.size_count; s++)
            for (int r = 0; r < arms[a].reps_done[s]; r++) {
                reps++;
                registered += arms[a].after_drain[s][r] == 1;
            }
        printf("\n%s: pinshim_is_registered() after pinshim_drain() in %d of %d repetitions",
               arm_names[a], registered, reps);
    }
    printf("\n\nMemory per size:\n");
    for (size_t s = 0; s < options.size_count; s++)
        printf("  %g GiB: %s\n", options.sizes_gib[s], options.why[s]);

    printf("\nTime the program waited inside the shim vs in the background (the shim's stats, "
           "thread.wait_seconds / thread.background_seconds; summed over all sizes, "
           "repetitions, rounds and 1 MiB warm-ups, registrations and unregistrations):\n");
    for (int a = ARM_SYNC; a <= ARM_ASYNC; a++) {
        if (arms[a].have_stats)
            printf("  %-5s (%s): program waited %.3f s, background %.3f s (cudaHostRegister "
                   "%.3f s, cudaHostUnregister %.3f s in all)\n",
                   arm_names[a], arm_titles[a], arms[a].wait_seconds, arms[a].background_seconds,
                   arms[a].register_seconds, arms[a].unregister_seconds);
        else
            printf("  %-5s (%s): no stats file\n", arm_names[a], arm_titles[a]);
    }
    for (int a = 0; a < ARM_COUNT; a++)
        if (arms[a].message[0] != '\0' || arms[a].exit_code != 0)
            printf("  arm %s: exit %d%s%s\n", arm_names[a], arms[a].exit_code,
                   arms[a].message[0] ? ", " : "", arms[a].message);
}

static void json_series(FILE *out, const char *name, const double *values, int count)
{
    fprintf(out, ", \"%s\": [", name);
    for (int i = 0; i < count; i++)
        fprintf(out, "%s%.9f", i ? ", " : "", values[i]);
    fprintf(out, "], \"%s_median\": %.9f", name, count ? median_of(values, count) : 0.0);
}

static bool write_json(const char *path, const char *command, const char *shim, const char *runtime)
{
    FILE *out = bench_json_open(path, "lock_latency");
    if (out == NULL)
        return false;
    fprintf(out, ", \"command\": ");
    bench_json_string(out, command);
    fprintf(out, ", \"shim\": ");
    bench_json_string(out, shim);
    fprintf(out, ", \"runtime\": ");
    bench_json_string(out, options.real ? "real libcudart (search)" : runtime);
    fprintf(out, ", \"real\": %s, \"register_seconds_per_gib\": ", options.real ? "true" : "false");
    if (options.real)
        fprintf(out, "null");
    else
        fprintf(out, "%s", options.seconds_per_gib);
    fprintf(out,
            ", \"reps\": %d, \"rounds\": %d, \"order\": \"none sync async, then reversed; "
            "each series holds the rounds one after the other\",\n \"arms\": {",
            options.reps, options.rounds);
    for (int a = 0; a < ARM_COUNT; a++) {
        const struct arm_result *arm = &arms[a];
        fprintf(out, "%s\n  \"%s\": {\"title\": ", a ? "," : "", arm_names[a]);
        bench_json_string(out, arm_titles[a]);
        fprintf(out, ", \"exit_code\": %d, \"message\": ", arm->exit_code);
        bench_json_string(out, arm->message[0] ? arm->message : NULL);
        fprintf(out, ", \"warmup_lock_s\": %.9f, \"warmup_drain_s\": %.9f", arm->warmup_lock,
                arm->warmup_drain);
        if (arm->have_stats)
            fprintf(out,
                    ", \"stats\": {\"wait_seconds\": %.6f, \"background_seconds\": %.6f, "
                    "\"register_seconds\": %.6f, \"unregister_seconds\": %.6f}",
                    arm->wait_seconds, arm->background_seconds, arm->register_seconds,
                    arm->unregister_seconds);
        else
            fprintf(out, ", \"stats\": null");
        fprintf(out, ", \"sizes\": [");
        for (size_t s = 0; s < options.size_count; s++) {
            int n = arm->reps_done[s];
            fprintf(out, "%s\n   {\"bytes\": %zu, \"method\": \"%s\", \"touch_s\": %.6f",
                    s ? "," : "", options.bytes[s], method_names[options.method[s]], arm->touch[s]);
            json_series(out, "lock_s", arm->lock[s], n);
            json_series(out, "drain_s", arm->drain[s], n);
            json_series(out, "unlock_s", arm->unlock[s], n);
            fprintf(out, ", \"registered_at_return\": \"%s\", \"registered_after_drain\": \"%s\"}",
                    flag_summary(arm->at_return[s], n), flag_summary(arm->after_drain[s], n));
        }
        fprintf(out, "]}");
    }
    fprintf(out, "},\n \"memory\": [");
    for (size_t s = 0; s < options.size_count; s++) {
        fprintf(out, "%s{\"bytes\": %zu, \"method\": \"%s\", \"why\": ", s ? ", " : "",
                options.bytes[s], method_names[options.method[s]]);
        bench_json_string(out, options.why[s]);
        fprintf(out, "}");
    }
    fprintf(out, "]}\n");
    return fclose(out) == 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: lock_latency [--sizes GIB,...] [--reps N] [--rounds N]\n"
            "                    [--method auto|touch|onfault]\n"
            "                    [--seconds-per-gib S] [--real] [--cudart LIB] [--shim LIB]\n"
            "                    [--json FILE]\n"
            "       lock_latency --deepspeed [--sizes GIB,...] [--rounds N] [--pause S]\n"
            "                    [--fragmented | --fragmented-only] [--shim LIB] [--json FILE]\n"
            "What the program sees inside mlock() under the shim, registration synchronous\n"
            "(PINSHIM_ASYNC=off) vs asynchronous (on), and the time until pinshim_drain()\n"
            "says the range is registered; plus mlock without the shim.\n"
            "  --sizes            GiB per buffer (default 1,4,16)\n"
            "  --reps             repetitions per size and process (default 5)\n"
            "  --rounds           processes per arm, the order of the arms alternating\n"
            "                     (default 2); medians over all repetitions are reported\n"
            "  --method           auto (default): touched memory when the size fits in half of\n"
            "                     MemAvailable, else MAP_NORESERVE + mlock2(MLOCK_ONFAULT) with\n"
            "                     PINSHIM_ONFAULT=all (no memory used with the fake driver)\n"
            "  --seconds-per-gib  the fake driver's registration latency (default 0.1;\n"
            "                     unregistration a tenth of it)\n"
            "  --cudart LIB       runtime for the program and the shim (default: PINSHIM_CUDART,\n"
            "                     else the test suite's fake runtime)\n"
            "  --real             the real libcudart instead (PINSHIM_CUDART unset); needs a GPU\n"
            "  --deepspeed        DeepSpeed's native pinning instead (posix_memalign(4096),\n"
            "                     untouched, mlock): without the shim, under it with huge pages\n"
            "                     (PINSHIM_HUGEPAGES=auto) and with =off; first runs after a\n"
            "                     pause (default 5 s) and warm runs apart (sizes default\n"
            "                     0.0625,1,4; 3 rounds); --fragmented adds 1 GiB locked while\n"
            "                     free memory is in small pieces\n"
            "Exit status: 0, 1 on errors, 2 when the runtime finds no usable GPU.\n");
}

static bool parse_child_sizes(char *list, struct child_size *sizes, size_t *count)
{
    *count = 0;
    for (char *item = strtok(list, ","); item != NULL; item = strtok(NULL, ",")) {
        char method[16];
        if (*count == MAX_SIZES || sscanf(item, "%zu:%15s", &sizes[*count].bytes, method) != 2)
            return false;
        sizes[*count].method = strcmp(method, "onfault") == 0 ? METHOD_ONFAULT : METHOD_TOUCH;
        (*count)++;
    }
    return *count > 0;
}

static bool parse_sizes(const char *text)
{
    options.size_count = 0;
    const char *cursor = text;
    while (*cursor != '\0') {
        char *end;
        double gib = strtod(cursor, &end);
        if (end == cursor || gib <= 0 || options.size_count == MAX_SIZES ||
            (*end != ',' && *end != '\0'))
            return false;
        options.sizes_gib[options.size_count++] = gib;
        cursor = *end == ',' ? end + 1 : end;
    }
    return options.size_count > 0;
}

/* Decides per size: touched memory when it fits comfortably, else on fault. */
static void choose_methods(void)
{
    long page = sysconf(_SC_PAGESIZE);
    double available = bench_proc_kib("/proc/meminfo", "MemAvailable") * 1024;
    for (size_t s = 0; s < options.size_count; s++) {
        size_t bytes = (size_t)(options.sizes_gib[s] * (double)GIB);
        bytes = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
        options.bytes[s] = bytes;
        bool fits = (double)bytes <= available / 2;
        if (options.forced_method != NULL) {
            options.method[s] =
                strcmp(options.forced_method, "onfault") == 0 ? METHOD_ONFAULT : METHOD_TOUCH;
            snprintf(options.why[s], sizeof(options.why[s]),
                     "%s (--method %s; MemAvailable %.1f GiB)",
                     options.method[s] == METHOD_TOUCH
                         ? "private anonymous mapping, every page touched before the first lock"
                         : "MAP_NORESERVE + mlock2(MLOCK_ONFAULT), PINSHIM_ONFAULT=all",
                     options.forced_method, available / (double)GIB);
        } else if (fits) {
            options.method[s] = METHOD_TOUCH;
            snprintf(options.why[s], sizeof(options.why[s]),
                     "private anonymous mapping, every page touched before the first lock "
                     "(fits in half of MemAvailable, %.1f GiB)",
                     available / (double)GIB);
        } else {
            options.method[s] = METHOD_ONFAULT;
            snprintf(options.why[s], sizeof(options.why[s]),
                     "MAP_NORESERVE + mlock2(MLOCK_ONFAULT), PINSHIM_ONFAULT=all: nothing faulted "
                     "in (more than half of MemAvailable, %.1f GiB)",
                     available / (double)GIB);
        }
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 5 && strcmp(argv[1], "--child") == 0) {
        struct child_size sizes[MAX_SIZES];
        size_t count;
        int reps = atoi(argv[3]);
        if (!parse_child_sizes(argv[2], sizes, &count) || reps < 1 || reps > MAX_REPS)
            return 64;
        int status = child_main(sizes, count, reps, argv[4]);
        fflush(NULL);
        return status; /* exit(): the shim writes its stats */
    }

    if (argc == 4 && strcmp(argv[1], "--deepspeed-child") == 0)
        return lock_latency_deepspeed_child(strtoull(argv[2], NULL, 10), atoi(argv[3]) != 0);
    if (argc == 3 && strcmp(argv[1], "--memory-child") == 0)
        return lock_latency_memory_child(strtoull(argv[2], NULL, 10));
    if (argc == 3 && strcmp(argv[1], "--warm-up-child") == 0)
        return lock_latency_warm_up_child(strtoull(argv[2], NULL, 10));
    bool deepspeed = false;
    const char *deepspeed_shim = NULL;
    for (int i = 1; i < argc; i++) {
        deepspeed |= strcmp(argv[i], "--deepspeed") == 0;
        if (strcmp(argv[i], "--shim") == 0 && i + 1 < argc)
            deepspeed_shim = argv[i + 1];
    }
    if (deepspeed) {
        const char *found =
            bench_find_library(deepspeed_shim, BENCH_SHIM_PATH, "../src/libpinshim.so");
        if (found == NULL) {
            fprintf(stderr, "lock_latency: libpinshim.so not found; pass --shim PATH\n");
            return 1;
        }
        static char deepspeed_shim_path[PATH_MAX];
        snprintf(deepspeed_shim_path, sizeof(deepspeed_shim_path), "%s", found);
        return lock_latency_deepspeed_main(argc, argv, deepspeed_shim_path);
    }

    options.reps = 5;
    options.rounds = 2;
    options.seconds_per_gib = "0.1";
    parse_sizes("1,4,16");
    const char *shim_option = NULL, *cudart_option = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--real") == 0) {
            options.real = true;
        } else if (value == NULL) {
            fprintf(stderr, "lock_latency: unknown option or missing value: %s\n", arg);
            usage(stderr);
            return 64;
        } else if (strcmp(arg, "--sizes") == 0 && parse_sizes(value)) {
            i++;
        } else if (strcmp(arg, "--reps") == 0 && atoi(value) >= 1 && atoi(value) <= MAX_REPS) {
            options.reps = atoi(value), i++;
        } else if (strcmp(arg, "--rounds") == 0 && atoi(value) >= 1 && atoi(value) <= MAX_REPS) {
            options.rounds = atoi(value), i++;
        } else if (strcmp(arg, "--method") == 0 &&
                   (strcmp(value, "auto") == 0 || strcmp(value, "touch") == 0 ||
                    strcmp(value, "onfault") == 0)) {
            options.forced_method = strcmp(value, "auto") == 0 ? NULL : value, i++;
        } else if (strcmp(arg, "--seconds-per-gib") == 0 && strtod(value, NULL) >= 0) {
            options.seconds_per_gib = value, i++;
        } else if (strcmp(arg, "--cudart") == 0) {
            cudart_option = value, i++;
        } else if (strcmp(arg, "--shim") == 0) {
            shim_option = value, i++;
        } else if (strcmp(arg, "--json") == 0) {
            options.json_path = value, i++;
        } else {
            fprintf(stderr, "lock_latency: bad option or value: %s %s\n", arg, value);
            usage(stderr);
            return 64;
        }
    }

    if (options.reps * options.rounds > MAX_REPS) {
        fprintf(stderr, "lock_latency: --reps x --rounds must be at most %d\n", MAX_REPS);
        return 64;
    }
    static char shim[PATH_MAX], runtime[PATH_MAX];
    const char *found = bench_find_library(shim_option, BENCH_SHIM_PATH, "../src/libpinshim.so");
    if (found == NULL) {
        fprintf(stderr, "lock_latency: libpinshim.so not found; pass --shim PATH\n");
        return 1;
    }
    snprintf(shim, sizeof(shim), "%s", found);
    if (!options.real) {
        if (cudart_option == NULL)
            cudart_option = getenv("PINSHIM_CUDART");
        found = bench_find_library(cudart_option, BENCH_FAKE_CUDART_PATH,
                                   "../tests/fake_cudart/libfake_cudart.so");
        if (found == NULL) {
            fprintf(stderr, "lock_latency: no CUDA runtime (the fake one of the test suite is "
                            "built with -Dtests=true); pass --cudart LIB, or --real\n");
            return 1;
        }
        snprintf(runtime, sizeof(runtime), "%s", found);
    }
    choose_methods();

    char command[2048] = "";
    for (int i = 0; i < argc; i++)
        snprintf(command + strlen(command), sizeof(command) - strlen(command), "%s%s", i ? " " : "",
                 argv[i]);
    printf("lock_latency: shim %s\n", shim);
    if (options.real)
        printf("runtime: the real libcudart, found by the program as the shim would find it "
               "(PINSHIM_CUDART unset)\n");
    else
        printf("runtime: %s on the fake driver, FAKE_CUDA_REGISTER_SECONDS_PER_GIB=%s "
               "(unregistration a tenth), FAKE_CUDART_CHECK=0\n",
               runtime, options.seconds_per_gib);
    printf("arms: none = %s; sync = LD_PRELOAD + %s; async = LD_PRELOAD + %s; "
           "PINSHIM_CONTEXT=program, the program's context made by cudaFree(NULL) first\n",
           arm_titles[ARM_NONE], arm_titles[ARM_SYNC], arm_titles[ARM_ASYNC]);

    /* Rounds alternate the order (none, sync, async, then async, sync, none)
     * so that a drift of a shared machine, or whatever the first process
     * meets, does not land on one arm only. */
    double began = bench_now_seconds();
    for (int round = 0; round < options.rounds; round++) {
        for (int k = 0; k < ARM_COUNT; k++) {
            enum arm which = (enum arm)(round % 2 == 0 ? k : ARM_COUNT - 1 - k);
            run_arm(which, round, shim, runtime);
            if (arms[which].exit_code == EXIT_NO_GPU) {
                /* The other arms would find the same runtime and no GPU. */
                printf("lock_latency: no usable GPU, nothing measured (%s)\n", arms[which].message);
                return EXIT_NO_GPU;
            }
        }
    }
    print_tables();
    printf("\ntotal time %.1f s\n", bench_now_seconds() - began);

    if (options.json_path != NULL && !write_json(options.json_path, command, shim, runtime)) {
        fprintf(stderr, "lock_latency: cannot write %s: %s\n", options.json_path, strerror(errno));
        return 1;
    }
    for (int a = 0; a < ARM_COUNT; a++)
        if (arms[a].exit_code == EXIT_NO_GPU) {
            printf("lock_latency: no usable GPU (%s)\n", arms[a].message);
            return EXIT_NO_GPU;
        }
    for (int a = 0; a < ARM_COUNT; a++)
        if (!arms[a].ran || arms[a].exit_code != 0)
            return 1;
    return 0;
}
