/* h2d_d2h: host-to-device and device-to-host bandwidth for each kind of host
 * buffer, timed with CUDA events around cudaMemcpyAsync on a non-default
 * stream. Arms:
 *   pageable   malloc
 *   hostalloc  cudaHostAlloc
 *   mlock      posix_memalign + mlock, without the shim
 *   shim       the same under LD_PRELOAD=libpinshim.so (this program re-executes
 *              itself; the child prints ROW lines that the parent parses)
 *   register   posix_memalign + explicit cudaHostRegister
 * For each arm it reports what cudaPointerGetAttributes says of the buffer
 * (type 1 = host/pinned, what torch.is_pinned asks) and how long making the
 * buffer took; for the shim arm also the shim's own registration time, read
 * from its JSON statistics (PINSHIM_STATS). Exits 2 when there is no GPU. */
#include "bench_util.h"

#include <cuda_runtime_api.h>

#include "bench_cuda.h"
#include <dlfcn.h>
#include <errno.h>
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

#define MAX_SIZES 16
#define MAX_ITERS 10000

enum arm { ARM_PAGEABLE, ARM_HOSTALLOC, ARM_MLOCK, ARM_SHIM, ARM_REGISTER, ARM_COUNT };
static const char *const arm_names[ARM_COUNT] = {"pageable", "hostalloc", "mlock", "shim",
                                                 "register"};

struct row {
    bool done;
    char error[160];
    int pointer_type;     /* cudaPointerGetAttributes type, -1 when it failed */
    int shim_registered;  /* pinshim_is_registered, -1 when not under the shim */
    double setup_seconds; /* allocation + touch + lock/register */
    double h2d_median_s, h2d_min_s, d2h_median_s, d2h_min_s;
};

struct config {
    size_t sizes[MAX_SIZES];
    size_t size_count;
    int warmup;
    int iters;
    const char *json_path;
    const char *shim;
};

static struct config config;
static struct row rows[ARM_COUNT][MAX_SIZES];
static double shim_register_seconds = -1, shim_unregister_seconds = -1;
static double shim_register_ok = -1;

#define CUDA_TRY(call, row)                                                                        \
    do {                                                                                           \
        cudaError_t cuda_try_error = (call);                                                       \
        if (cuda_try_error != cudaSuccess) {                                                       \
            snprintf((row)->error, sizeof((row)->error), "%s: %s", #call,                          \
                     cudaGetErrorName(cuda_try_error));                                            \
            goto failed;                                                                           \
        }                                                                                          \
    } while (0)

/* Times iters copies (after warmup) one way; per-copy median and minimum. */
static bool time_copies(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                        cudaStream_t stream, double *median, double *minimum, struct row *row)
{
    int iters = config.iters;
    cudaEvent_t *events = calloc((size_t)iters + 1, sizeof(*events));
    double *seconds = calloc((size_t)iters, sizeof(*seconds));
    int created = 0;
    bool ok = false;
    for (int i = 0; i < config.warmup; i++)
        CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, stream), row);
    for (; created <= iters; created++)
        CUDA_TRY(cudaEventCreate(&events[created]), row);
    CUDA_TRY(cudaEventRecord(events[0], stream), row);
    for (int i = 0; i < iters; i++) {
        CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, stream), row);
        CUDA_TRY(cudaEventRecord(events[i + 1], stream), row);
    }
    CUDA_TRY(cudaStreamSynchronize(stream), row);
    for (int i = 0; i < iters; i++) {
        float ms = 0;
        CUDA_TRY(cudaEventElapsedTime(&ms, events[i], events[i + 1]), row);
        seconds[i] = ms / 1e3;
    }
    *median = bench_median(seconds, (size_t)iters);
    *minimum = bench_minimum(seconds, (size_t)iters);
    ok = true;
failed:
    for (int i = 0; i < created; i++)
        cudaEventDestroy(events[i]);
    free(events);
    free(seconds);
    return ok;
}

static void *aligned_buffer(size_t bytes)
{
    void *memory = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (posix_memalign(&memory, (size_t)(page > 0 ? page : 4096), bytes) != 0)
        return NULL;
    return memory;
}

/* Runs one arm at one size; fills row. */
static void run_arm(enum arm arm, size_t bytes, void *device, cudaStream_t stream, struct row *row)
{
    memset(row, 0, sizeof(*row));
    row->pointer_type = -1;
    row->shim_registered = -1;
    void *host = NULL;
    bool locked = false, registered = false;
    double began = bench_now_seconds();
    switch (arm) {
    case ARM_PAGEABLE:
        host = malloc(bytes);
        break;
    case ARM_HOSTALLOC:
        CUDA_TRY(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), row);
        break;
    case ARM_MLOCK:
    case ARM_SHIM:
    case ARM_REGISTER:
        host = aligned_buffer(bytes);
        break;
    case ARM_COUNT:
        break;
    }
    if (host == NULL) {
        snprintf(row->error, sizeof(row->error), "allocating %zu bytes failed", bytes);
        goto failed;
    }
    memset(host, 0x5a, bytes);
    if (arm == ARM_MLOCK || arm == ARM_SHIM) {
        if (mlock(host, bytes) != 0) {
            snprintf(row->error, sizeof(row->error), "mlock of %zu bytes failed: %s", bytes,
                     strerror(errno));
            goto failed;
        }
        locked = true;
        /* Registration is asynchronous by default: the set-up lasts until the
         * shim has registered the buffer, as a program that needs it pinned
         * waits (no-op without the shim). */
        size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
        if (drain != NULL)
            drain();
    } else if (arm == ARM_REGISTER) {
        CUDA_TRY(cudaHostRegister(host, bytes, cudaHostRegisterDefault), row);
        registered = true;
    }
    row->setup_seconds = bench_now_seconds() - began;
    row->pointer_type = bench_pointer_type(host);
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    if (is_registered != NULL)
        row->shim_registered = is_registered(host);
    if (!time_copies(device, host, bytes, cudaMemcpyHostToDevice, stream, &row->h2d_median_s,
                     &row->h2d_min_s, row) ||
        !time_copies(host, device, bytes, cudaMemcpyDeviceToHost, stream, &row->d2h_median_s,
                     &row->d2h_min_s, row))
        goto failed;
    row->done = true;
failed:
    cudaGetLastError();
    if (registered)
        cudaHostUnregister(host);
    if (locked)
        munlock(host, bytes);
    if (host != NULL) {
        if (arm == ARM_HOSTALLOC)
            cudaFreeHost(host);
        else
            free(host);
    }
}

/* Runs arms [first, last] in this process at every size. */
static int run_arms_here(const enum arm *arms, size_t arm_count, bool print_rows)
{
    size_t largest = 0;
    for (size_t s = 0; s < config.size_count; s++)
        if (config.sizes[s] > largest)
            largest = config.sizes[s];
    void *device = NULL;
    cudaStream_t stream;
    cudaError_t error = cudaMalloc(&device, largest);
    if (error != cudaSuccess) {
        fprintf(stderr, "h2d_d2h: cudaMalloc(%zu) failed: %s\n", largest, cudaGetErrorName(error));
        return 1;
    }
    if ((error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
        fprintf(stderr, "h2d_d2h: cudaStreamCreate failed: %s\n", cudaGetErrorName(error));
        return 1;
    }
    for (size_t a = 0; a < arm_count; a++) {
        for (size_t s = 0; s < config.size_count; s++) {
            struct row *row = &rows[arms[a]][s];
            run_arm(arms[a], config.sizes[s], device, stream, row);
            if (print_rows)
                printf("ROW arm=%s size=%zu done=%d type=%d shim_registered=%d setup=%.9f "
                       "h2d_median=%.9f h2d_min=%.9f d2h_median=%.9f d2h_min=%.9f error=%s\n",
                       arm_names[arms[a]], config.sizes[s], row->done, row->pointer_type,
                       row->shim_registered, row->setup_seconds, row->h2d_median_s, row->h2d_min_s,
                       row->d2h_median_s, row->d2h_min_s, row->error[0] ? row->error : "-");
            fprintf(stderr, "h2d_d2h: %-9s %6zu MiB %s\n", arm_names[arms[a]],
                    config.sizes[s] >> 20, row->done ? "done" : row->error);
        }
    }
    cudaStreamDestroy(stream);
    cudaFree(device);
    return 0;
}

/* The value of " key=" in line: up to the next space, or with rest_of_line up
 * to the end of the line. */
static bool line_field(const char *line, const char *key, bool rest_of_line, char *out,
                       size_t out_size)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), " %s=", key);
    const char *field = strstr(line, pattern);
    const char *end_of_line = strchr(line, '\n');
    if (field == NULL || (end_of_line != NULL && field > end_of_line))
        return false;
    field += strlen(pattern);
    size_t length = strcspn(field, rest_of_line ? "\n" : " \n");
    snprintf(out, out_size, "%.*s", (int)length, field);
    return true;
}

/* Runs the shim arm in a child under LD_PRELOAD and reads its ROW lines and the
 * shim's statistics. */
static void run_shim_arm(const char *shim)
{
    char stats_path[] = "/tmp/pinshim-h2d-stats-XXXXXX";
    int fd = mkstemp(stats_path);
    if (fd >= 0)
        close(fd);
    char warmup[16], iters[16], sizes[256] = "";
    snprintf(warmup, sizeof(warmup), "%d", config.warmup);
    snprintf(iters, sizeof(iters), "%d", config.iters);
    for (size_t s = 0; s < config.size_count; s++) {
        size_t used = strlen(sizes);
        snprintf(sizes + used, sizeof(sizes) - used, "%s%zu", s ? "," : "", config.sizes[s] >> 20);
    }
    char *argv[] = {(char *)bench_self_path(),
                    "--child-shim",
                    "--sizes",
                    sizes,
                    "--warmup",
                    warmup,
                    "--iters",
                    iters,
                    NULL};
    struct bench_env env;
    bench_env_from_current(&env);
    bench_env_set(&env, "LD_PRELOAD", shim);
    bench_env_set(&env, "PINSHIM_STATS", stats_path);
    struct bench_run run;
    bool started = bench_run_process(argv, &env, true, false, &run);
    bench_env_free(&env);
    for (size_t s = 0; s < config.size_count; s++) {
        struct row *row = &rows[ARM_SHIM][s];
        memset(row, 0, sizeof(*row));
        row->pointer_type = -1;
        row->shim_registered = -1;
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "ROW arm=shim size=%zu ", config.sizes[s]);
        const char *line = started && run.output ? strstr(run.output, prefix) : NULL;
        if (line == NULL) {
            snprintf(row->error, sizeof(row->error), "child under the shim exited with %d",
                     run.exit_code);
            continue;
        }
        char value[160];
        if (line_field(line, "done", false, value, sizeof(value)))
            row->done = atoi(value) == 1;
        if (line_field(line, "type", false, value, sizeof(value)))
            row->pointer_type = atoi(value);
        if (line_field(line, "shim_registered", false, value, sizeof(value)))
            row->shim_registered = atoi(value);
        double *targets[] = {&row->setup_seconds, &row->h2d_median_s, &row->h2d_min_s,
                             &row->d2h_median_s, &row->d2h_min_s};
        const char *keys[] = {"setup", "h2d_median", "h2d_min", "d2h_median", "d2h_min"};
        for (int k = 0; k < 5; k++)
            if (line_field(line, keys[k], false, value, sizeof(value)))
                *targets[k] = strtod(value, NULL);
        if (line_field(line, "error", true, value, sizeof(value)) && strcmp(value, "-") != 0)
            snprintf(row->error, sizeof(row->error), "%s", value);
    }
    char *stats = bench_read_file(stats_path);
    if (stats == NULL || !bench_json_number(stats, "register", "seconds", &shim_register_seconds))
        fprintf(stderr, "h2d_d2h: no shim statistics in %s\n", stats_path);
    bench_json_number(stats, "register", "ok", &shim_register_ok);
    bench_json_number(stats, "unregister", "seconds", &shim_unregister_seconds);
    free(stats);
    unlink(stats_path);
    bench_run_free(&run);
}

static double gigabytes_per_second(size_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / seconds / 1e9 : 0.0;
}

static void print_table(void)
{
    printf("\n%-10s %8s %5s %4s %10s %10s %10s %10s %10s  %s\n", "arm", "MiB", "type", "reg",
           "setup ms", "H2D GB/s", "H2D best", "D2H GB/s", "D2H best", "note");
    for (int a = 0; a < ARM_COUNT; a++) {
        for (size_t s = 0; s < config.size_count; s++) {
            const struct row *row = &rows[a][s];
            size_t bytes = config.sizes[s];
            if (!row->done) {
                printf("%-10s %8zu  failed: %s\n", arm_names[a], bytes >> 20, row->error);
                continue;
            }
            printf("%-10s %8zu %5d %4d %10.2f %10.2f %10.2f %10.2f %10.2f  %s\n", arm_names[a],
                   bytes >> 20, row->pointer_type, row->shim_registered, row->setup_seconds * 1e3,
                   gigabytes_per_second(bytes, row->h2d_median_s),
                   gigabytes_per_second(bytes, row->h2d_min_s),
                   gigabytes_per_second(bytes, row->d2h_median_s),
                   gigabytes_per_second(bytes, row->d2h_min_s),
                   row->pointer_type == 1 ? "pinned" : "not pinned");
        }
    }
    printf("  type: cudaPointerGetAttributes().type (1 = host, pinned; 0 = unregistered); reg: "
           "pinshim_is_registered (-1: shim absent)\n"
           "  GB/s from the median (and best) of %d timed copies after %d warm-up copies\n",
           config.iters, config.warmup);
    if (shim_register_seconds >= 0)
        printf("  shim (PINSHIM_STATS): %.0f registrations took %.3f s in cudaHostRegister, "
               "unregistrations %.3f s\n",
               shim_register_ok, shim_register_seconds, shim_unregister_seconds);
}

static bool write_json(const char *path, const char *device_name, const char *shim)
{
    FILE *out = bench_json_open(path, "h2d_d2h");
    if (out == NULL)
        return false;
    int runtime_version = 0, driver_version = 0;
    cudaRuntimeGetVersion(&runtime_version);
    cudaDriverGetVersion(&driver_version);
    fprintf(out, ", \"device\": ");
    bench_json_string(out, device_name);
    fprintf(out, ", \"cuda_runtime\": %d, \"cuda_driver\": %d, \"shim\": ", runtime_version,
            driver_version);
    bench_json_string(out, shim);
    fprintf(out,
            ", \"warmup\": %d, \"iters\": %d,\n \"shim_stats\": {\"register_ok\": %.0f, "
            "\"register_seconds\": %.6f, \"unregister_seconds\": %.6f},\n \"results\": [",
            config.warmup, config.iters, shim_register_ok, shim_register_seconds,
            shim_unregister_seconds);
    bool first = true;
    for (int a = 0; a < ARM_COUNT; a++) {
        for (size_t s = 0; s < config.size_count; s++) {
            const struct row *row = &rows[a][s];
            size_t bytes = config.sizes[s];
            fprintf(out, "%s\n  {\"arm\": \"%s\", \"bytes\": %zu, \"ok\": %s, \"error\": ",
                    first ? "" : ",", arm_names[a], bytes, row->done ? "true" : "false");
            first = false;
            bench_json_string(out, row->error[0] ? row->error : NULL);
            fprintf(out,
                    ", \"pointer_type\": %d, \"pinned\": %s, \"shim_registered\": %d, "
                    "\"setup_s\": %.6f, \"h2d_median_s\": %.9f, \"h2d_min_s\": %.9f, "
                    "\"d2h_median_s\": %.9f, \"d2h_min_s\": %.9f, \"h2d_gbps\": %.3f, "
                    "\"h2d_best_gbps\": %.3f, \"d2h_gbps\": %.3f, \"d2h_best_gbps\": %.3f}",
                    row->pointer_type, row->pointer_type == 1 ? "true" : "false",
                    row->shim_registered, row->setup_seconds, row->h2d_median_s, row->h2d_min_s,
                    row->d2h_median_s, row->d2h_min_s,
                    gigabytes_per_second(bytes, row->h2d_median_s),
                    gigabytes_per_second(bytes, row->h2d_min_s),
                    gigabytes_per_second(bytes, row->d2h_median_s),
                    gigabytes_per_second(bytes, row->d2h_min_s));
        }
    }
    fprintf(out, "]}\n");
    return fclose(out) == 0;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: h2d_d2h [--sizes MIB,...] [--warmup N] [--iters N] [--json FILE] "
                 "[--shim LIB]\n"
                 "Host<->device copy bandwidth for pageable, cudaHostAlloc, mlock, mlock under\n"
                 "LD_PRELOAD=libpinshim.so, and cudaHostRegister'ed buffers. Defaults: sizes\n"
                 "4,64,256,1024 MiB, --warmup 10, --iters 50. Exits 2 without a usable GPU.\n");
}

static bool parse_sizes(const char *list)
{
    config.size_count = 0;
    const char *cursor = list;
    while (*cursor != '\0') {
        char *end;
        unsigned long long mib = strtoull(cursor, &end, 10);
        if (end == cursor || mib == 0 || config.size_count == MAX_SIZES ||
            (*end != ',' && *end != '\0'))
            return false;
        config.sizes[config.size_count++] = (size_t)mib << 20;
        cursor = *end == ',' ? end + 1 : end;
    }
    return config.size_count > 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    config.warmup = 10;
    config.iters = 50;
    parse_sizes("4,64,256,1024");
    bool child = false;
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--child-shim") == 0) {
            child = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (value == NULL) {
            fprintf(stderr, "h2d_d2h: unknown option or missing value: %s\n", argv[i]);
            usage(stderr);
            return 64;
        } else if (strcmp(argv[i], "--sizes") == 0) {
            if (!parse_sizes(value)) {
                fprintf(stderr, "h2d_d2h: bad --sizes %s (MiB, comma separated)\n", value);
                return 64;
            }
            i++;
        } else if (strcmp(argv[i], "--warmup") == 0 || strcmp(argv[i], "--iters") == 0) {
            int number = atoi(value);
            if (number < (argv[i][2] == 'w' ? 0 : 1) || number > MAX_ITERS) {
                fprintf(stderr, "h2d_d2h: bad %s %s\n", argv[i], value);
                return 64;
            }
            *(argv[i][2] == 'w' ? &config.warmup : &config.iters) = number;
            i++;
        } else if (strcmp(argv[i], "--json") == 0) {
            config.json_path = argv[++i];
        } else if (strcmp(argv[i], "--shim") == 0) {
            config.shim = argv[++i];
        } else {
            fprintf(stderr, "h2d_d2h: unknown option %s\n", argv[i]);
            usage(stderr);
            return 64;
        }
    }

    int devices = 0;
    cudaError_t error = cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || devices == 0) {
        fprintf(stderr,
                "h2d_d2h: no usable CUDA device (%s: %s); nothing measured. This benchmark "
                "needs an NVIDIA GPU and its driver.\n",
                error != cudaSuccess ? cudaGetErrorName(error) : "cudaGetDeviceCount",
                error != cudaSuccess ? cudaGetErrorString(error) : "0 devices");
        return 2;
    }
    if (child) {
        enum arm shim_arm[] = {ARM_SHIM};
        return run_arms_here(shim_arm, 1, true);
    }

    /* Locking a GiB needs RLIMIT_MEMLOCK; raise it when allowed (root). */
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);

    struct cudaDeviceProp properties;
    char device_name[300] = "unknown";
    if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess)
        snprintf(device_name, sizeof(device_name), "%s", properties.name);
    const char *shim = bench_find_library(config.shim, BENCH_SHIM_PATH, "../src/libpinshim.so");
    static char shim_path[PATH_MAX];
    if (shim != NULL)
        snprintf(shim_path, sizeof(shim_path), "%s", shim);
    fprintf(stderr, "h2d_d2h: device %s, shim %s\n", device_name,
            shim ? shim_path : "(not found: the shim arm is skipped)");

    enum arm here[] = {ARM_PAGEABLE, ARM_HOSTALLOC, ARM_MLOCK, ARM_REGISTER};
    int status = run_arms_here(here, 4, false);
    if (status != 0)
        return status;
    if (shim != NULL) {
        run_shim_arm(shim_path);
    } else {
        for (size_t s = 0; s < config.size_count; s++)
            snprintf(rows[ARM_SHIM][s].error, sizeof(rows[ARM_SHIM][s].error),
                     "libpinshim.so not found (pass --shim PATH)");
    }
    printf("device: %s\n", device_name);
    print_table();
    if (config.json_path != NULL && !write_json(config.json_path, device_name, shim_path)) {
        fprintf(stderr, "h2d_d2h: cannot write %s: %s\n", config.json_path, strerror(errno));
        return 1;
    }
    return 0;
}
