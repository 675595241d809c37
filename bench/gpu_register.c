/* gpu_register: the numbers that decide how registration should be made fast
 * (issue 30), measured on the driver itself, without the shim:
 *
 *   r  cuMemHostRegister time on memory that is already locked, per size
 *      (--sizes, GiB), with 1, 2, 4, 8 threads registering disjoint chunks of
 *      the same buffer at once (--threads), on 4 KiB pages (MADV_NOHUGEPAGE)
 *      and on transparent huge pages (MADV_HUGEPAGE before the first touch);
 *      the smaps AnonHugePages share says what the kernel actually gave.
 *   w  how long another thread's small cudaMemcpy (4 KiB, pageable, H2D) waits
 *      while one registration of the largest size runs.
 *   s  H2D and D2H bandwidth of one copy that spans two separately registered
 *      chunks, against the same copy inside one registration (and whether the
 *      data arrives), and what each copy returns.
 *   m  a program's two adjacent mlock calls, then one copy across both: run
 *      once plain and once under LD_PRELOAD=libpinshim.so, it shows whether
 *      the shim's one registration per lock changes what the copy returns.
 *   u  whether cuMemHostUnregister waits for an asynchronous copy from the
 *      range that is still in flight: a 1 GiB H2D cudaMemcpyAsync, then the
 *      unregister at once; its time, the stream's state when it returned, the
 *      copy's error, and what the copy delivered (also with the range's last
 *      64 MiB, which the copy reads last, overwritten as soon as the unregister
 *      returns).
 *
 * The runtime and the driver are reached with dlopen/dlsym (the CUDA headers
 * give the types only), so that a dry run with the fake driver exercises what
 * it can: --cudart LIB and --driver LIB choose them. A section whose calls the
 * runtime lacks says so and is skipped. Prints tables; --json FILE writes
 * every figure. Exits 2 when there is no usable GPU.
 *
 *   gpu_register [--only rwsmu] [--sizes 1,4,16] [--threads 1,2,4,8]
 *                [--pages 4k,thp] [--reps N] [--span-mib 512] [--inflight-mib 1024]
 *                [--json FILE] [--cudart LIB] [--driver LIB] */
#include "bench_util.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)
#define HUGE_BYTES ((size_t)2 << 20)
#define MAX_LIST 8
#define MAX_THREADS 64
#define SMALL_COPY_BYTES 4096
#define MAX_SMALL_COPIES (1 << 21)

/* ---- the runtime and the driver, by dlsym ---- */

struct runtime {
    cudaError_t (*get_device_count)(int *);
    cudaError_t (*free_)(void *);
    const char *(*error_name)(cudaError_t);
    cudaError_t (*get_last_error)(void);
    cudaError_t (*pointer_attributes)(struct cudaPointerAttributes *, const void *);
    /* the copy sections' calls; NULL when the runtime lacks them */
    cudaError_t (*malloc_)(void **, size_t);
    cudaError_t (*memset_)(void *, int, size_t);
    cudaError_t (*memcpy_)(void *, const void *, size_t, enum cudaMemcpyKind);
    cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
    cudaError_t (*stream_create)(cudaStream_t *, unsigned);
    cudaError_t (*stream_query)(cudaStream_t);
    cudaError_t (*stream_synchronize)(cudaStream_t);
    cudaError_t (*event_create)(cudaEvent_t *);
    cudaError_t (*event_record)(cudaEvent_t, cudaStream_t);
    cudaError_t (*event_synchronize)(cudaEvent_t);
    cudaError_t (*event_elapsed)(float *, cudaEvent_t, cudaEvent_t);
};

struct driver {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*host_register)(void *, size_t, unsigned);
    CUresult (*host_unregister)(void *);
    CUresult (*error_name)(CUresult, const char **);
    CUresult (*driver_version)(int *);
};

static struct runtime rt;
static struct driver drv;
static CUcontext context;
static bool have_copies;

static void *symbol(void *library, const char *name)
{
    return library != NULL ? dlsym(library, name) : NULL;
}

#define BIND(table, library, field, name) (*(void **)&(table).field = symbol(library, name))

static const char *cu_name(CUresult result)
{
    const char *name = NULL;
    if (drv.error_name == NULL || drv.error_name(result, &name) != CUDA_SUCCESS || name == NULL)
        return "CUDA_ERROR_?";
    return name;
}

static const char *rt_name(cudaError_t error)
{
    return rt.error_name != NULL ? rt.error_name(error) : "cudaError?";
}

/* The driver the runtime loaded (by its soname), else the one named. */
static void *open_driver(const char *explicit_path)
{
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == NULL && explicit_path != NULL)
        handle = dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == NULL)
        handle =
            dlopen(explicit_path != NULL ? explicit_path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return handle;
}

/* 0 when ready, 2 when there is no usable GPU (a SKIP line says why). */
static int setup_cuda(const char *cudart_path, const char *driver_path)
{
    void *runtime = bench_open_cudart(cudart_path);
    if (runtime == NULL) {
        printf("SKIP no CUDA runtime (%s)\n", dlerror());
        return 2;
    }
    BIND(rt, runtime, get_device_count, "cudaGetDeviceCount");
    BIND(rt, runtime, free_, "cudaFree");
    BIND(rt, runtime, error_name, "cudaGetErrorName");
    BIND(rt, runtime, get_last_error, "cudaGetLastError");
    BIND(rt, runtime, pointer_attributes, "cudaPointerGetAttributes");
    BIND(rt, runtime, malloc_, "cudaMalloc");
    BIND(rt, runtime, memset_, "cudaMemset");
    BIND(rt, runtime, memcpy_, "cudaMemcpy");
    BIND(rt, runtime, memcpy_async, "cudaMemcpyAsync");
    BIND(rt, runtime, stream_create, "cudaStreamCreateWithFlags");
    BIND(rt, runtime, stream_query, "cudaStreamQuery");
    BIND(rt, runtime, stream_synchronize, "cudaStreamSynchronize");
    BIND(rt, runtime, event_create, "cudaEventCreate");
    BIND(rt, runtime, event_record, "cudaEventRecord");
    BIND(rt, runtime, event_synchronize, "cudaEventSynchronize");
    BIND(rt, runtime, event_elapsed, "cudaEventElapsedTime");
    if (rt.get_device_count == NULL || rt.free_ == NULL) {
        printf("SKIP the runtime lacks cudaGetDeviceCount or cudaFree\n");
        return 2;
    }
    int devices = 0;
    cudaError_t error = rt.get_device_count(&devices);
    if (error != cudaSuccess || devices == 0) {
        printf("SKIP no usable CUDA device (%s)\n",
               error != cudaSuccess ? rt_name(error) : "0 devices");
        return 2;
    }
    error = rt.free_(NULL); /* the primary context, made current on this thread */
    if (error != cudaSuccess) {
        printf("SKIP cudaFree(NULL): %s\n", rt_name(error));
        return 2;
    }
    void *driver = open_driver(driver_path);
    BIND(drv, driver, ctx_get_current, "cuCtxGetCurrent");
    BIND(drv, driver, ctx_set_current, "cuCtxSetCurrent");
    BIND(drv, driver, host_register, "cuMemHostRegister_v2");
    BIND(drv, driver, host_unregister, "cuMemHostUnregister");
    BIND(drv, driver, error_name, "cuGetErrorName");
    BIND(drv, driver, driver_version, "cuDriverGetVersion");
    if (drv.ctx_get_current == NULL || drv.ctx_set_current == NULL || drv.host_register == NULL ||
        drv.host_unregister == NULL) {
        printf("SKIP the driver (libcuda.so.1) lacks the context or registration calls\n");
        return 2;
    }
    CUresult result = drv.ctx_get_current(&context);
    if (result != CUDA_SUCCESS || context == NULL) {
        printf("SKIP no current context after cudaFree(NULL) (%s)\n", cu_name(result));
        return 2;
    }
    have_copies = rt.malloc_ != NULL && rt.memset_ != NULL && rt.memcpy_ != NULL &&
                  rt.memcpy_async != NULL && rt.stream_create != NULL && rt.stream_query != NULL &&
                  rt.stream_synchronize != NULL && rt.event_create != NULL &&
                  rt.event_record != NULL && rt.event_synchronize != NULL &&
                  rt.event_elapsed != NULL;
    return 0;
}

/* ---- host buffers ---- */

enum page_kind { PAGES_4K, PAGES_THP };
static const char *const page_names[] = {"4k", "thp"};

struct host_buffer {
    unsigned char *base; /* 2 MiB aligned */
    size_t bytes;
    void *mapping;
    size_t mapping_bytes;
    double touch_seconds, lock_seconds;
    size_t huge_bytes; /* AnonHugePages of the range, from smaps */
    int lock_error;    /* errno of mlock, 0 when locked */
};

struct touch_job {
    unsigned char *from;
    size_t bytes;
    unsigned char seed;
};

static void *touch_worker(void *argument)
{
    struct touch_job *job = argument;
    for (size_t offset = 0; offset < job->bytes; offset += 4096)
        job->from[offset] = (unsigned char)(job->seed + (offset >> 12));
    return NULL;
}

/* Touches every page, with up to 8 threads (placement is irrelevant here). */
static void touch_pages(unsigned char *base, size_t bytes, unsigned char seed)
{
    enum { TOUCHERS = 8 };
    pthread_t threads[TOUCHERS];
    struct touch_job jobs[TOUCHERS];
    size_t share = (bytes / TOUCHERS) & ~(HUGE_BYTES - 1);
    int started = 0;
    for (int i = 0; i < TOUCHERS; i++) {
        size_t from = (size_t)i * share;
        jobs[i] = (struct touch_job){base + from, i == TOUCHERS - 1 ? bytes - from : share, seed};
        if (pthread_create(&threads[i], NULL, touch_worker, &jobs[i]) == 0)
            started |= 1 << i;
        else
            touch_worker(&jobs[i]);
    }
    for (int i = 0; i < TOUCHERS; i++)
        if (started & (1 << i))
            pthread_join(threads[i], NULL);
}

/* AnonHugePages (bytes) of the mapping that holds address, from smaps. */
static size_t huge_bytes_of(const void *address)
{
    FILE *smaps = fopen("/proc/self/smaps", "r");
    if (smaps == NULL)
        return 0;
    char line[512];
    bool inside = false;
    size_t kib = 0;
    while (fgets(line, sizeof(line), smaps) != NULL) {
        uintptr_t start, end;
        /* a mapping's header line; field lines ("Rss:   4 kB") do not parse */
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &start, &end) == 2) {
            inside = (uintptr_t)address >= start && (uintptr_t)address < end;
            continue;
        }
        if (inside && sscanf(line, "AnonHugePages: %zu kB", &kib) == 1)
            break;
    }
    fclose(smaps);
    return kib * 1024;
}

static bool buffer_make(struct host_buffer *buffer, size_t bytes, enum page_kind pages)
{
    memset(buffer, 0, sizeof(*buffer));
    buffer->mapping_bytes = bytes + HUGE_BYTES;
    buffer->mapping = mmap(NULL, buffer->mapping_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (buffer->mapping == MAP_FAILED) {
        buffer->mapping = NULL;
        buffer->lock_error = errno;
        return false;
    }
    uintptr_t aligned =
        ((uintptr_t)buffer->mapping + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
    buffer->base = (unsigned char *)aligned;
    buffer->bytes = bytes;
    madvise(buffer->base, bytes, pages == PAGES_THP ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    double began = bench_now_seconds();
    touch_pages(buffer->base, bytes, (unsigned char)pages);
    buffer->touch_seconds = bench_now_seconds() - began;
    began = bench_now_seconds();
    buffer->lock_error = mlock(buffer->base, bytes) == 0 ? 0 : errno;
    buffer->lock_seconds = bench_now_seconds() - began;
    buffer->huge_bytes = huge_bytes_of(buffer->base);
    return buffer->lock_error == 0;
}

static void buffer_release(struct host_buffer *buffer)
{
    if (buffer->mapping != NULL)
        munmap(buffer->mapping, buffer->mapping_bytes);
    memset(buffer, 0, sizeof(*buffer));
}

/* ---- options ---- */

struct options {
    const char *only;
    size_t sizes[MAX_LIST]; /* bytes */
    size_t size_count;
    int threads[MAX_LIST];
    size_t thread_count;
    bool pages[2];
    int reps;
    size_t span_bytes, inflight_bytes;
    const char *json_path;
    const char *cudart, *driver;
};

static struct options options = {
    .only = "rwsmu",
    .sizes = {1 * GIB, 4 * GIB, 16 * GIB},
    .size_count = 3,
    .threads = {1, 2, 4, 8},
    .thread_count = 4,
    .pages = {true, true},
    .reps = 1,
    .span_bytes = 512 * MIB,
    .inflight_bytes = 1024 * MIB,
};

static bool section_wanted(char section)
{
    return strchr(options.only, section) != NULL;
}

/* ---- r: registration time, threads registering disjoint chunks at once ---- */

struct register_row {
    enum page_kind pages;
    size_t bytes;
    int threads;
    int rep;
    double register_seconds;   /* first start to last return */
    double slowest_thread;     /* the longest single call */
    double unregister_seconds; /* the same threads, each its own chunk */
    char error[96];
};

static struct register_row register_rows[2 * MAX_LIST * MAX_LIST * 8];
static size_t register_row_count;

struct buffer_row {
    enum page_kind pages;
    size_t bytes;
    double touch_seconds, lock_seconds;
    size_t huge_bytes;
    int lock_error;
};
static struct buffer_row buffer_rows[2];
static size_t buffer_row_count;

struct chunk_job {
    unsigned char *base;
    size_t bytes;
    bool unregister;
    pthread_barrier_t *barrier;
    double started, ended;
    CUresult result;
};

static void *chunk_worker(void *argument)
{
    struct chunk_job *job = argument;
    CUresult result = drv.ctx_set_current(context);
    pthread_barrier_wait(job->barrier);
    job->started = bench_now_seconds();
    if (result == CUDA_SUCCESS)
        result = job->unregister ? drv.host_unregister(job->base)
                                 : drv.host_register(job->base, job->bytes, 0);
    job->ended = bench_now_seconds();
    job->result = result;
    return NULL;
}

/* Runs one call per chunk in threads started together; the wall time from
 * the first start to the last return, or -1 with error filled. */
static double chunks_run(struct chunk_job *jobs, int threads, bool unregister, double *slowest,
                         char *error, size_t error_size)
{
    pthread_t ids[MAX_THREADS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    int started = 0;
    for (int i = 0; i < threads; i++) {
        jobs[i].unregister = unregister;
        jobs[i].barrier = &barrier;
        jobs[i].result = CUDA_SUCCESS;
        if (pthread_create(&ids[i], NULL, chunk_worker, &jobs[i]) != 0)
            break;
        started++;
    }
    if (started < threads) {
        /* The barrier cannot be passed: never reached with a sane thread limit. */
        fprintf(stderr, "gpu_register: pthread_create failed after %d threads\n", started);
        exit(1);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    pthread_barrier_destroy(&barrier);
    double first = jobs[0].started, last = jobs[0].ended, longest = 0;
    bool failed = false;
    for (int i = 0; i < threads; i++) {
        if (jobs[i].started < first)
            first = jobs[i].started;
        if (jobs[i].ended > last)
            last = jobs[i].ended;
        if (jobs[i].ended - jobs[i].started > longest)
            longest = jobs[i].ended - jobs[i].started;
        if (jobs[i].result != CUDA_SUCCESS && !failed) {
            snprintf(error, error_size, "%s %s in thread %d",
                     unregister ? "cuMemHostUnregister" : "cuMemHostRegister",
                     cu_name(jobs[i].result), i);
            failed = true;
        }
    }
    if (slowest != NULL)
        *slowest = longest;
    return failed ? -1 : last - first;
}

/* Splits [base, base + bytes) into threads chunks, 2 MiB aligned. */
static void chunks_split(struct chunk_job *jobs, unsigned char *base, size_t bytes, int threads)
{
    size_t share = (bytes / (size_t)threads) & ~(HUGE_BYTES - 1);
    for (int i = 0; i < threads; i++) {
        size_t from = (size_t)i * share;
        jobs[i] = (struct chunk_job){.base = base + from,
                                     .bytes = i == threads - 1 ? bytes - from : share};
    }
}

static void register_measure(const struct host_buffer *buffer, enum page_kind pages)
{
    for (size_t s = 0; s < options.size_count; s++) {
        size_t bytes = options.sizes[s];
        if (bytes > buffer->bytes)
            continue;
        for (int rep = 0; rep < options.reps; rep++) {
            for (size_t t = 0; t < options.thread_count; t++) {
                int threads = options.threads[t];
                struct register_row *row = &register_rows[register_row_count++];
                *row = (struct register_row){.pages = pages,
                                             .bytes = bytes,
                                             .threads = threads,
                                             .rep = rep,
                                             .unregister_seconds = -1};
                struct chunk_job jobs[MAX_THREADS];
                chunks_split(jobs, buffer->base, bytes, threads);
                row->register_seconds = chunks_run(jobs, threads, false, &row->slowest_thread,
                                                   row->error, sizeof(row->error));
                /* Unregister what was registered, whatever failed. */
                for (int i = 0; i < threads; i++)
                    jobs[i].base = jobs[i].result == CUDA_SUCCESS ? jobs[i].base : NULL;
                int registered = 0;
                for (int i = 0; i < threads; i++)
                    if (jobs[i].base != NULL)
                        jobs[registered++] = jobs[i];
                if (registered == threads) {
                    row->unregister_seconds =
                        chunks_run(jobs, threads, true, NULL, row->error, sizeof(row->error));
                } else {
                    for (int i = 0; i < registered; i++)
                        drv.host_unregister(jobs[i].base);
                }
                printf("register  %-3s %6.2f GiB  %d thread(s)  rep %d  %s\n", page_names[pages],
                       (double)bytes / (double)GIB, threads, rep,
                       row->register_seconds < 0 ? row->error : "done");
            }
        }
    }
}

/* ---- w: another thread's small copies while a registration runs ---- */

struct copy_sample {
    double started, seconds;
};

struct copy_summary {
    size_t count;
    double median, p99, max;
};

struct wait_row {
    bool done;
    enum page_kind pages;
    size_t bytes;
    double register_seconds, unregister_seconds;
    struct copy_summary before, during_register, during_unregister;
    bool longest_spans_register; /* a copy started before the registration ended after it */
    char error[96];
};

static struct wait_row wait_rows[2];
static size_t wait_row_count;

struct copier {
    void *device;
    unsigned char host[SMALL_COPY_BYTES];
    struct copy_sample *samples;
    size_t count;
    volatile int stop;
    cudaError_t error;
};

static void *copier_worker(void *argument)
{
    struct copier *copier = argument;
    while (!copier->stop && copier->count < MAX_SMALL_COPIES) {
        double started = bench_now_seconds();
        cudaError_t error =
            rt.memcpy_(copier->device, copier->host, SMALL_COPY_BYTES, cudaMemcpyHostToDevice);
        copier->samples[copier->count++] =
            (struct copy_sample){started, bench_now_seconds() - started};
        if (error != cudaSuccess) {
            copier->error = error;
            break;
        }
    }
    return NULL;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The copies that overlap [from, to). */
static struct copy_summary summarize(const struct copier *copier, double from, double to)
{
    struct copy_summary summary = {0};
    double *values = malloc(copier->count * sizeof(*values));
    if (values == NULL)
        return summary;
    for (size_t i = 0; i < copier->count; i++) {
        const struct copy_sample *sample = &copier->samples[i];
        if (sample->started < to && sample->started + sample->seconds > from)
            values[summary.count++] = sample->seconds;
    }
    if (summary.count > 0) {
        qsort(values, summary.count, sizeof(*values), compare_doubles);
        summary.median = values[summary.count / 2];
        summary.p99 = values[(summary.count * 99) / 100];
        summary.max = values[summary.count - 1];
    }
    free(values);
    return summary;
}

static void wait_measure(const struct host_buffer *buffer, enum page_kind pages)
{
    struct wait_row *row = &wait_rows[wait_row_count++];
    *row = (struct wait_row){.pages = pages, .bytes = buffer->bytes};
    struct copier *copier = calloc(1, sizeof(*copier));
    if (copier == NULL ||
        (copier->samples = malloc(MAX_SMALL_COPIES * sizeof(struct copy_sample))) == NULL) {
        snprintf(row->error, sizeof(row->error), "out of memory");
        free(copier);
        return;
    }
    cudaError_t error = rt.malloc_(&copier->device, SMALL_COPY_BYTES);
    if (error != cudaSuccess) {
        snprintf(row->error, sizeof(row->error), "cudaMalloc: %s", rt_name(error));
        free(copier->samples);
        free(copier);
        return;
    }
    pthread_t thread;
    if (pthread_create(&thread, NULL, copier_worker, copier) != 0) {
        snprintf(row->error, sizeof(row->error), "pthread_create failed");
        rt.free_(copier->device);
        free(copier->samples);
        free(copier);
        return;
    }
    usleep(500 * 1000); /* the copies' own pace first */
    double register_from = bench_now_seconds();
    CUresult result = drv.host_register(buffer->base, buffer->bytes, 0);
    double register_to = bench_now_seconds();
    usleep(200 * 1000);
    double unregister_from = bench_now_seconds(), unregister_to = unregister_from;
    if (result == CUDA_SUCCESS) {
        CUresult undone = drv.host_unregister(buffer->base);
        unregister_to = bench_now_seconds();
        if (undone != CUDA_SUCCESS)
            snprintf(row->error, sizeof(row->error), "cuMemHostUnregister: %s", cu_name(undone));
    } else {
        snprintf(row->error, sizeof(row->error), "cuMemHostRegister: %s", cu_name(result));
    }
    usleep(200 * 1000);
    copier->stop = 1;
    pthread_join(thread, NULL);
    if (copier->error != cudaSuccess && row->error[0] == '\0')
        snprintf(row->error, sizeof(row->error), "cudaMemcpy: %s", rt_name(copier->error));
    row->register_seconds = register_to - register_from;
    row->unregister_seconds = unregister_to - unregister_from;
    row->before = summarize(copier, 0, register_from);
    row->during_register = summarize(copier, register_from, register_to);
    row->during_unregister = summarize(copier, unregister_from, unregister_to);
    for (size_t i = 0; i < copier->count; i++) {
        const struct copy_sample *sample = &copier->samples[i];
        if (sample->started <= register_from && sample->started + sample->seconds >= register_to)
            row->longest_spans_register = true;
    }
    row->done = result == CUDA_SUCCESS;
    rt.free_(copier->device);
    free(copier->samples);
    free(copier);
    printf("wait      %-3s %6.2f GiB  %s\n", page_names[pages], (double)buffer->bytes / (double)GIB,
           row->error[0] ? row->error : "done");
}

/* ---- timing copies with events ---- */

#define SPAN_WARMUP 3
#define SPAN_ITERS 20

/* The median seconds of SPAN_ITERS copies after SPAN_WARMUP; -1 on error. */
static double time_copies(void *to, const void *from, size_t bytes, enum cudaMemcpyKind kind,
                          cudaStream_t stream, char *error, size_t error_size)
{
    cudaEvent_t events[SPAN_ITERS + 1];
    double seconds[SPAN_ITERS];
    cudaError_t status = cudaSuccess;
    int made = 0;
    for (; made <= SPAN_ITERS && status == cudaSuccess; made++)
        status = rt.event_create(&events[made]);
    for (int i = 0; i < SPAN_WARMUP && status == cudaSuccess; i++)
        status = rt.memcpy_async(to, from, bytes, kind, stream);
    if (status == cudaSuccess)
        status = rt.event_record(events[0], stream);
    for (int i = 0; i < SPAN_ITERS && status == cudaSuccess; i++) {
        status = rt.memcpy_async(to, from, bytes, kind, stream);
        if (status == cudaSuccess)
            status = rt.event_record(events[i + 1], stream);
    }
    if (status == cudaSuccess)
        status = rt.stream_synchronize(stream);
    for (int i = 0; i < SPAN_ITERS && status == cudaSuccess; i++) {
        float milliseconds = 0;
        status = rt.event_elapsed(&milliseconds, events[i], events[i + 1]);
        seconds[i] = milliseconds / 1e3;
    }
    (void)made; /* events are few and the process is short-lived: not destroyed */
    if (status != cudaSuccess) {
        snprintf(error, error_size, "copy timing: %s", rt_name(status));
        if (rt.get_last_error != NULL)
            rt.get_last_error();
        return -1;
    }
    return bench_median(seconds, SPAN_ITERS);
}

/* ---- s: a copy across two registrations ---- */

enum span_arm { SPAN_LOCKED, SPAN_ONE, SPAN_TWO, SPAN_ARMS };
static const char *const span_names[] = {"locked only", "one registration", "two registrations"};

/* The copies each arm tries, with what each returned: whether one copy may
 * span two registrations is the question. */
enum span_probe {
    PROBE_H2D,         /* cudaMemcpy of the whole buffer to the device */
    PROBE_H2D_ASYNC,   /* cudaMemcpyAsync of it, then cudaStreamSynchronize */
    PROBE_D2H,         /* cudaMemcpy of the whole buffer back into it */
    PROBE_STRADDLE,    /* 2 MiB across the middle, to the device */
    PROBE_SECOND_HALF, /* 2 MiB inside the second half, to the device */
    PROBES
};
static const char *const probe_names[] = {"h2d", "h2d_async", "d2h", "straddle", "second_half"};

struct span_row {
    bool done;
    int pointer_type_first, pointer_type_last;
    cudaError_t probe[PROBES];
    bool data_ok;
    double h2d_seconds, d2h_seconds;
    char error[96];
};
static struct span_row span_rows[SPAN_ARMS];
static bool span_ran;

static int pointer_type(const void *pointer)
{
    struct cudaPointerAttributes attributes;
    memset(&attributes, 0, sizeof(attributes));
    if (rt.pointer_attributes == NULL ||
        rt.pointer_attributes(&attributes, pointer) != cudaSuccess) {
        if (rt.get_last_error != NULL)
            rt.get_last_error();
        return -1;
    }
    return (int)attributes.type;
}

static cudaError_t clear_error(cudaError_t status)
{
    if (status != cudaSuccess && rt.get_last_error != NULL)
        rt.get_last_error();
    return status;
}

/* Each probe copy with its result; the data of the whole buffer's H2D is
 * checked through a pageable buffer (back) before the D2H overwrites the
 * host buffer with the same bytes. */
static void span_probes(struct span_row *row, unsigned char *host, void *device,
                        unsigned char *back, size_t bytes, cudaStream_t stream)
{
    size_t half = bytes / 2;
    row->probe[PROBE_H2D] = clear_error(rt.memcpy_(device, host, bytes, cudaMemcpyHostToDevice));
    if (row->probe[PROBE_H2D] == cudaSuccess) {
        memset(back, 0xA5, bytes);
        row->data_ok = rt.memcpy_(back, device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
                       memcmp(back, host, bytes) == 0;
    }
    cudaError_t status = rt.memcpy_async(device, host, bytes, cudaMemcpyHostToDevice, stream);
    if (status == cudaSuccess)
        status = rt.stream_synchronize(stream);
    row->probe[PROBE_H2D_ASYNC] = clear_error(status);
    row->probe[PROBE_D2H] = clear_error(rt.memcpy_(host, device, bytes, cudaMemcpyDeviceToHost));
    row->probe[PROBE_STRADDLE] = clear_error(
        rt.memcpy_(device, host + half - HUGE_BYTES / 2, HUGE_BYTES, cudaMemcpyHostToDevice));
    row->probe[PROBE_SECOND_HALF] =
        clear_error(rt.memcpy_(device, host + half, HUGE_BYTES, cudaMemcpyHostToDevice));
}

static void span_measure(void)
{
    span_ran = true;
    struct host_buffer buffer;
    size_t bytes = options.span_bytes, half = bytes / 2;
    bool made = buffer_make(&buffer, bytes, PAGES_4K);
    void *device = NULL;
    unsigned char *back = malloc(bytes);
    cudaStream_t stream = NULL;
    cudaError_t error =
        made && back != NULL ? rt.malloc_(&device, bytes) : cudaErrorMemoryAllocation;
    if (error == cudaSuccess)
        error = rt.stream_create(&stream, cudaStreamNonBlocking);
    for (int arm = 0; arm < SPAN_ARMS; arm++) {
        struct span_row *row = &span_rows[arm];
        if (!made || back == NULL || error != cudaSuccess) {
            snprintf(row->error, sizeof(row->error), "setup: %s",
                     !made ? strerror(buffer.lock_error) : rt_name(error));
            continue;
        }
        CUresult result = CUDA_SUCCESS;
        if (arm == SPAN_ONE)
            result = drv.host_register(buffer.base, bytes, 0);
        if (arm == SPAN_TWO) {
            result = drv.host_register(buffer.base, half, 0);
            if (result == CUDA_SUCCESS &&
                (result = drv.host_register(buffer.base + half, bytes - half, 0)) != CUDA_SUCCESS)
                drv.host_unregister(buffer.base);
        }
        if (result != CUDA_SUCCESS) {
            snprintf(row->error, sizeof(row->error), "cuMemHostRegister: %s", cu_name(result));
            continue;
        }
        row->pointer_type_first = pointer_type(buffer.base);
        row->pointer_type_last = pointer_type(buffer.base + bytes - 1);
        cudaError_t status = rt.memset_(device, 0, bytes);
        if (status != cudaSuccess) {
            snprintf(row->error, sizeof(row->error), "cudaMemset: %s", rt_name(status));
        } else {
            span_probes(row, buffer.base, device, back, bytes, stream);
            if (row->probe[PROBE_H2D] != cudaSuccess || row->probe[PROBE_D2H] != cudaSuccess) {
                snprintf(row->error, sizeof(row->error), "copy of the whole buffer: H2D %s, D2H %s",
                         rt_name(row->probe[PROBE_H2D]), rt_name(row->probe[PROBE_D2H]));
            } else {
                row->h2d_seconds = time_copies(device, buffer.base, bytes, cudaMemcpyHostToDevice,
                                               stream, row->error, sizeof(row->error));
                row->d2h_seconds = time_copies(buffer.base, device, bytes, cudaMemcpyDeviceToHost,
                                               stream, row->error, sizeof(row->error));
                row->done = row->h2d_seconds > 0 && row->d2h_seconds > 0;
            }
        }
        if (arm == SPAN_ONE)
            drv.host_unregister(buffer.base);
        if (arm == SPAN_TWO) {
            drv.host_unregister(buffer.base);
            drv.host_unregister(buffer.base + half);
        }
        printf("span      %-18s %s\n", span_names[arm], row->done ? "done" : row->error);
    }
    if (device != NULL)
        rt.free_(device);
    free(back);
    buffer_release(&buffer);
}

/* ---- m: a program's two adjacent mlock calls, then one copy across both ---- */

/* Without the shim the buffer is pageable to CUDA; under it each lock is a
 * registration of its own, so a copy across both is one across two
 * registrations: run it both ways to see whether the shim changes what the
 * copy returns. */
static void pattern_fill(unsigned char *base, size_t from, size_t to);

static struct {
    bool ran, shim;
    int registered[2], type[2];
    cudaError_t probe[PROBES];
    char error[96];
} adjacent;

static void adjacent_measure(void)
{
    adjacent.ran = true;
    size_t bytes = options.span_bytes, half = bytes / 2;
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    adjacent.shim = is_registered != NULL;
    unsigned char *host = NULL, *back = malloc(bytes);
    void *device = NULL;
    cudaStream_t stream = NULL;
    if (back == NULL || posix_memalign((void **)&host, HUGE_BYTES, bytes) != 0) {
        snprintf(adjacent.error, sizeof(adjacent.error), "out of memory");
        free(back);
        return;
    }
    pattern_fill(host, 0, bytes);
    cudaError_t status = rt.malloc_(&device, bytes);
    if (status == cudaSuccess)
        status = rt.stream_create(&stream, cudaStreamNonBlocking);
    if (status == cudaSuccess)
        status = rt.memset_(device, 0, bytes);
    if (status != cudaSuccess || mlock(host, half) != 0 || mlock(host + half, bytes - half) != 0) {
        snprintf(adjacent.error, sizeof(adjacent.error), "setup: %s / %s", rt_name(status),
                 strerror(errno));
    } else {
        if (drain != NULL)
            drain();
        for (int i = 0; i < 2; i++) {
            adjacent.registered[i] = is_registered != NULL ? is_registered(host + i * half) : -1;
            adjacent.type[i] = pointer_type(host + i * half);
        }
        struct span_row row;
        memset(&row, 0, sizeof(row));
        span_probes(&row, host, device, back, bytes, stream);
        memcpy(adjacent.probe, row.probe, sizeof(adjacent.probe));
        if (row.probe[PROBE_H2D] == cudaSuccess && !row.data_ok)
            snprintf(adjacent.error, sizeof(adjacent.error), "the data arrived WRONG");
    }
    munlock(host, bytes);
    free(host);
    free(back);
    if (device != NULL)
        rt.free_(device);
    printf("adjacent  %s  %s\n", adjacent.shim ? "under the shim" : "no shim",
           adjacent.error[0] ? adjacent.error : "done");
}

/* ---- u: unregistering while a copy from the range is in flight ---- */

#define TAIL_BYTES (64 * MIB)

static uint64_t pattern_word(size_t index)
{
    return (uint64_t)index * 0x9E3779B97F4A7C15ull ^ 0x5A5A5A5A5A5A5A5Aull;
}

static void pattern_fill(unsigned char *base, size_t from, size_t to)
{
    uint64_t *words = (uint64_t *)base;
    for (size_t i = from / 8; i < to / 8; i++)
        words[i] = pattern_word(i);
}

struct inflight_row {
    bool overwrite_tail; /* the last 64 MiB overwritten as soon as the unregister returned */
    double copy_alone_seconds;
    cudaError_t query_before; /* the stream just before the unregister */
    CUresult unregister_result;
    double unregister_seconds;
    cudaError_t query_after;       /* the stream as soon as the unregister returned */
    cudaError_t copy_result;       /* cudaStreamSynchronize */
    double copy_seconds;           /* enqueue to synchronize */
    size_t head_words_wrong;       /* words of the first bytes - 64 MiB not as sent */
    size_t tail_words_wrong;       /* ... of the last 64 MiB */
    size_t tail_words_overwritten; /* tail words that arrived as the overwrite */
    bool done;
    char error[96];
};
static struct inflight_row inflight_rows[2];
static size_t inflight_row_count;
static double inflight_copy_alone = -1;

static void inflight_measure(void)
{
    struct host_buffer buffer;
    size_t bytes = options.inflight_bytes;
    bool made = buffer_make(&buffer, bytes, PAGES_4K);
    uint64_t *back = malloc(bytes);
    void *device = NULL;
    cudaStream_t stream = NULL;
    cudaError_t error =
        made && back != NULL ? rt.malloc_(&device, bytes) : cudaErrorMemoryAllocation;
    if (error == cudaSuccess)
        error = rt.stream_create(&stream, cudaStreamNonBlocking);
    if (made)
        pattern_fill(buffer.base, 0, bytes);
    if (back != NULL)
        memset(back, 0, bytes);
    for (int variant = 0; variant < 2; variant++) {
        struct inflight_row *row = &inflight_rows[inflight_row_count++];
        *row = (struct inflight_row){.overwrite_tail = variant == 1};
        if (!made || back == NULL || error != cudaSuccess) {
            snprintf(row->error, sizeof(row->error), "setup: %s",
                     !made ? strerror(buffer.lock_error) : rt_name(error));
            continue;
        }
        CUresult result = drv.host_register(buffer.base, bytes, 0);
        if (result != CUDA_SUCCESS) {
            snprintf(row->error, sizeof(row->error), "cuMemHostRegister: %s", cu_name(result));
            continue;
        }
        cudaError_t status = cudaSuccess;
        if (inflight_copy_alone < 0) {
            /* the copy alone, registered throughout: how long "in flight" is */
            double began = bench_now_seconds();
            status = rt.memcpy_async(device, buffer.base, bytes, cudaMemcpyHostToDevice, stream);
            if (status == cudaSuccess)
                status = rt.stream_synchronize(stream);
            inflight_copy_alone = status == cudaSuccess ? bench_now_seconds() - began : -1;
        }
        row->copy_alone_seconds = inflight_copy_alone;
        if (status == cudaSuccess)
            status = rt.memset_(device, 0, bytes);
        if (status == cudaSuccess)
            status = rt.memcpy_(back, device, 8, cudaMemcpyDeviceToHost); /* orders the memset */
        if (status != cudaSuccess) {
            snprintf(row->error, sizeof(row->error), "preparing: %s", rt_name(status));
            drv.host_unregister(buffer.base);
            continue;
        }
        double began = bench_now_seconds();
        status = rt.memcpy_async(device, buffer.base, bytes, cudaMemcpyHostToDevice, stream);
        row->query_before = rt.stream_query(stream);
        double unregister_from = bench_now_seconds();
        row->unregister_result = drv.host_unregister(buffer.base);
        row->unregister_seconds = bench_now_seconds() - unregister_from;
        row->query_after = rt.stream_query(stream);
        if (row->overwrite_tail)
            memset(buffer.base + bytes - TAIL_BYTES, 0xFF, TAIL_BYTES);
        row->copy_result = status != cudaSuccess ? status : rt.stream_synchronize(stream);
        row->copy_seconds = bench_now_seconds() - began;
        if (rt.get_last_error != NULL)
            rt.get_last_error();
        status = rt.memcpy_(back, device, bytes, cudaMemcpyDeviceToHost);
        if (status != cudaSuccess) {
            snprintf(row->error, sizeof(row->error), "reading the device back: %s",
                     rt_name(status));
        } else {
            size_t head_words = (bytes - TAIL_BYTES) / 8;
            for (size_t i = 0; i < bytes / 8; i++) {
                if (back[i] == pattern_word(i))
                    continue;
                if (i < head_words)
                    row->head_words_wrong++;
                else
                    row->tail_words_wrong++;
                if (i >= head_words && back[i] == UINT64_MAX)
                    row->tail_words_overwritten++;
            }
            row->done = true;
        }
        if (row->overwrite_tail)
            pattern_fill(buffer.base, bytes - TAIL_BYTES, bytes);
        printf("inflight  %-26s %s\n",
               row->overwrite_tail ? "tail overwritten after" : "host left alone",
               row->done ? "done" : row->error);
    }
    if (device != NULL)
        rt.free_(device);
    free(back);
    buffer_release(&buffer);
}

/* ---- output ---- */

static double gib_per_second(size_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / (double)GIB / seconds : 0;
}

static void print_tables(void)
{
    if (buffer_row_count > 0) {
        printf("\nbuffers (touched, then mlock'ed; huge = smaps AnonHugePages)\n");
        printf("%-5s %8s %9s %9s %7s\n", "pages", "GiB", "touch s", "mlock s", "huge %");
        for (size_t i = 0; i < buffer_row_count; i++) {
            const struct buffer_row *b = &buffer_rows[i];
            if (b->lock_error != 0) {
                printf("%-5s %8.2f  mlock failed: %s\n", page_names[b->pages],
                       (double)b->bytes / (double)GIB, strerror(b->lock_error));
                continue;
            }
            printf("%-5s %8.2f %9.3f %9.3f %7.1f\n", page_names[b->pages],
                   (double)b->bytes / (double)GIB, b->touch_seconds, b->lock_seconds,
                   100.0 * (double)b->huge_bytes / (double)b->bytes);
        }
    }
    if (register_row_count > 0) {
        printf(
            "\ncuMemHostRegister of locked memory, threads registering disjoint chunks at once\n");
        printf("%-5s %6s %7s %4s %11s %9s %11s %13s\n", "pages", "GiB", "threads", "rep",
               "register s", "GiB/s", "slowest s", "unregister s");
        for (size_t i = 0; i < register_row_count; i++) {
            const struct register_row *r = &register_rows[i];
            if (r->register_seconds < 0 || r->unregister_seconds < 0) {
                printf("%-5s %6.2f %7d %4d  failed: %s\n", page_names[r->pages],
                       (double)r->bytes / (double)GIB, r->threads, r->rep, r->error);
                continue;
            }
            printf("%-5s %6.2f %7d %4d %11.4f %9.2f %11.4f %13.4f\n", page_names[r->pages],
                   (double)r->bytes / (double)GIB, r->threads, r->rep, r->register_seconds,
                   gib_per_second(r->bytes, r->register_seconds), r->slowest_thread,
                   r->unregister_seconds);
        }
    }
    if (wait_row_count > 0) {
        printf("\nanother thread's 4 KiB cudaMemcpy (pageable, H2D) around one registration, ms\n");
        printf("%-5s %6s %10s | %-26s | %-26s | %-26s\n", "pages", "GiB", "register s",
               "before: n median p99 max", "during register", "during unregister");
        for (size_t i = 0; i < wait_row_count; i++) {
            const struct wait_row *w = &wait_rows[i];
            const struct copy_summary *parts[] = {&w->before, &w->during_register,
                                                  &w->during_unregister};
            printf("%-5s %6.2f %10.3f", page_names[w->pages], (double)w->bytes / (double)GIB,
                   w->register_seconds);
            for (int p = 0; p < 3; p++)
                printf(" | %6zu %5.3f %6.3f %7.1f", parts[p]->count, parts[p]->median * 1e3,
                       parts[p]->p99 * 1e3, parts[p]->max * 1e3);
            printf("%s%s\n",
                   w->longest_spans_register ? "  (one copy waited the whole registration)" : "",
                   w->error[0] ? w->error : "");
        }
    }
    if (span_ran) {
        printf("\none copy of %zu MiB: locked only, inside one registration, across two\n",
               options.span_bytes / MIB);
        printf("%-18s %6s %6s %8s %9s %9s\n", "arm", "type0", "typeN", "data", "H2D GB/s",
               "D2H GB/s");
        for (int arm = 0; arm < SPAN_ARMS; arm++) {
            const struct span_row *s = &span_rows[arm];
            if (!s->done) {
                printf("%-18s failed: %s\n", span_names[arm], s->error);
                continue;
            }
            printf("%-18s %6d %6d %8s %9.2f %9.2f\n", span_names[arm], s->pointer_type_first,
                   s->pointer_type_last, s->data_ok ? "ok" : "WRONG",
                   (double)options.span_bytes / s->h2d_seconds / 1e9,
                   (double)options.span_bytes / s->d2h_seconds / 1e9);
        }
        printf("what each copy returned (whole buffer H2D, H2D async, D2H; 2 MiB across the "
               "middle; 2 MiB inside the second half):\n");
        for (int arm = 0; arm < SPAN_ARMS; arm++) {
            printf("  %-18s", span_names[arm]);
            for (int p = 0; p < PROBES; p++)
                printf(" %s=%s", probe_names[p], rt_name(span_rows[arm].probe[p]));
            printf("\n");
        }
    }
    if (adjacent.ran) {
        printf("\ntwo adjacent mlock calls (%zu MiB each)%s: pinshim_is_registered %d %d, pointer "
               "type %d %d;",
               options.span_bytes / 2 / MIB, adjacent.shim ? " under the shim" : ", no shim",
               adjacent.registered[0], adjacent.registered[1], adjacent.type[0], adjacent.type[1]);
        for (int p = 0; p < PROBES; p++)
            printf(" %s=%s", probe_names[p], rt_name(adjacent.probe[p]));
        printf("%s%s\n", adjacent.error[0] ? " " : "", adjacent.error);
    }
    if (inflight_row_count > 0) {
        printf(
            "\ncuMemHostUnregister with a %zu MiB H2D cudaMemcpyAsync from the range in flight\n",
            options.inflight_bytes / MIB);
        for (size_t i = 0; i < inflight_row_count; i++) {
            const struct inflight_row *u = &inflight_rows[i];
            if (!u->done) {
                printf("  %s: failed: %s\n", u->overwrite_tail ? "tail overwritten" : "left alone",
                       u->error);
                continue;
            }
            printf("  %s: copy alone %.4f s; stream before unregister %s; unregister %s in %.4f s; "
                   "stream right after %s; copy %s after %.4f s; wrong words head %zu tail %zu "
                   "(overwrite seen %zu)\n",
                   u->overwrite_tail ? "tail 64 MiB overwritten after the unregister"
                                     : "host left alone",
                   u->copy_alone_seconds, rt_name(u->query_before), cu_name(u->unregister_result),
                   u->unregister_seconds, rt_name(u->query_after), rt_name(u->copy_result),
                   u->copy_seconds, u->head_words_wrong, u->tail_words_wrong,
                   u->tail_words_overwritten);
        }
    }
}

static void json_summary(FILE *out, const char *name, const struct copy_summary *s)
{
    fprintf(out, "\"%s\": {\"count\": %zu, \"median_s\": %.9f, \"p99_s\": %.9f, \"max_s\": %.9f}",
            name, s->count, s->median, s->p99, s->max);
}

static void write_json(const char *path, int driver_version)
{
    FILE *out = bench_json_open(path, "gpu_register");
    if (out == NULL) {
        fprintf(stderr, "gpu_register: cannot write %s\n", path);
        return;
    }
    fprintf(out, ", \"driver_version\": %d, \"flags\": 0", driver_version);
    fprintf(out, ",\n \"buffers\": [");
    for (size_t i = 0; i < buffer_row_count; i++) {
        const struct buffer_row *b = &buffer_rows[i];
        fprintf(out,
                "%s\n  {\"pages\": \"%s\", \"bytes\": %zu, \"touch_s\": %.6f, \"mlock_s\": %.6f, "
                "\"huge_bytes\": %zu, \"mlock_errno\": %d}",
                i ? "," : "", page_names[b->pages], b->bytes, b->touch_seconds, b->lock_seconds,
                b->huge_bytes, b->lock_error);
    }
    fprintf(out, "],\n \"register\": [");
    for (size_t i = 0; i < register_row_count; i++) {
        const struct register_row *r = &register_rows[i];
        fprintf(out,
                "%s\n  {\"pages\": \"%s\", \"bytes\": %zu, \"threads\": %d, \"rep\": %d, "
                "\"register_s\": %.6f, \"slowest_thread_s\": %.6f, \"unregister_s\": %.6f, "
                "\"error\": ",
                i ? "," : "", page_names[r->pages], r->bytes, r->threads, r->rep,
                r->register_seconds, r->slowest_thread, r->unregister_seconds);
        bench_json_string(out, r->error);
        fputc('}', out);
    }
    fprintf(out, "],\n \"small_copy_wait\": [");
    for (size_t i = 0; i < wait_row_count; i++) {
        const struct wait_row *w = &wait_rows[i];
        fprintf(out,
                "%s\n  {\"pages\": \"%s\", \"bytes\": %zu, \"copy_bytes\": %d, "
                "\"register_s\": %.6f, \"unregister_s\": %.6f, ",
                i ? "," : "", page_names[w->pages], w->bytes, SMALL_COPY_BYTES, w->register_seconds,
                w->unregister_seconds);
        json_summary(out, "before", &w->before);
        fputs(", ", out);
        json_summary(out, "during_register", &w->during_register);
        fputs(", ", out);
        json_summary(out, "during_unregister", &w->during_unregister);
        fprintf(out, ", \"a_copy_spanned_the_registration\": %s, \"error\": ",
                w->longest_spans_register ? "true" : "false");
        bench_json_string(out, w->error);
        fputc('}', out);
    }
    fprintf(out, "],\n \"span\": [");
    for (int arm = 0; span_ran && arm < SPAN_ARMS; arm++) {
        const struct span_row *s = &span_rows[arm];
        fprintf(out,
                "%s\n  {\"arm\": \"%s\", \"bytes\": %zu, \"done\": %s, \"pointer_type_first\": %d, "
                "\"pointer_type_last\": %d, \"data_ok\": %s, \"h2d_median_s\": %.9f, "
                "\"d2h_median_s\": %.9f, \"iters\": %d, ",
                arm ? "," : "", span_names[arm], options.span_bytes, s->done ? "true" : "false",
                s->pointer_type_first, s->pointer_type_last, s->data_ok ? "true" : "false",
                s->h2d_seconds, s->d2h_seconds, SPAN_ITERS);
        for (int p = 0; p < PROBES; p++)
            fprintf(out, "\"copy_%s\": \"%s\", ", probe_names[p], rt_name(s->probe[p]));
        fprintf(out, "\"error\": ");
        bench_json_string(out, s->error);
        fputc('}', out);
    }
    fprintf(out, "],\n \"adjacent_locks\": ");
    if (adjacent.ran) {
        fprintf(out,
                "{\"bytes_each\": %zu, \"shim\": %s, \"registered\": [%d, %d], "
                "\"pointer_type\": [%d, %d], ",
                options.span_bytes / 2, adjacent.shim ? "true" : "false", adjacent.registered[0],
                adjacent.registered[1], adjacent.type[0], adjacent.type[1]);
        for (int p = 0; p < PROBES; p++)
            fprintf(out, "\"copy_%s\": \"%s\", ", probe_names[p], rt_name(adjacent.probe[p]));
        fprintf(out, "\"error\": ");
        bench_json_string(out, adjacent.error);
        fputc('}', out);
    } else {
        fprintf(out, "null");
    }
    fprintf(out, ",\n \"unregister_in_flight\": [");
    for (size_t i = 0; i < inflight_row_count; i++) {
        const struct inflight_row *u = &inflight_rows[i];
        fprintf(out,
                "%s\n  {\"bytes\": %zu, \"overwrite_tail_bytes\": %zu, \"done\": %s, "
                "\"copy_alone_s\": %.6f, \"stream_before\": \"%s\", \"unregister\": \"%s\", "
                "\"unregister_s\": %.6f, \"stream_after\": \"%s\", \"copy_result\": \"%s\", "
                "\"copy_s\": %.6f, \"head_words_wrong\": %zu, \"tail_words_wrong\": %zu, "
                "\"tail_words_overwritten\": %zu, \"error\": ",
                i ? "," : "", options.inflight_bytes, u->overwrite_tail ? (size_t)TAIL_BYTES : 0,
                u->done ? "true" : "false", u->copy_alone_seconds, rt_name(u->query_before),
                cu_name(u->unregister_result), u->unregister_seconds, rt_name(u->query_after),
                rt_name(u->copy_result), u->copy_seconds, u->head_words_wrong, u->tail_words_wrong,
                u->tail_words_overwritten);
        bench_json_string(out, u->error);
        fputc('}', out);
    }
    fprintf(out, "]}\n");
    fclose(out);
}

/* ---- main ---- */

static size_t parse_list(const char *text, double scale, size_t *sizes, int *ints)
{
    size_t count = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL && count < MAX_LIST;
         item = strtok_r(NULL, ",", &save)) {
        char *end;
        double value = strtod(item, &end);
        if (end == item || *end != '\0' || value <= 0) {
            fprintf(stderr, "gpu_register: '%s' is not a positive number\n", item);
            exit(64);
        }
        if (sizes != NULL)
            sizes[count++] = ((size_t)(value * scale) + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
        else if (value > MAX_THREADS) {
            fprintf(stderr, "gpu_register: at most %d threads\n", MAX_THREADS);
            exit(64);
        } else
            ints[count++] = (int)value;
    }
    free(copy);
    return count;
}

static void usage(FILE *to)
{
    fprintf(to, "usage: gpu_register [--only rwsmu] [--sizes 1,4,16] [--threads 1,2,4,8]\n"
                "                    [--pages 4k,thp] [--reps N] [--span-mib 512]\n"
                "                    [--inflight-mib 1024] [--json FILE] [--cudart LIB]\n"
                "                    [--driver LIB]\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (value == NULL) {
            usage(stderr);
            return 64;
        }
        i++;
        if (strcmp(arg, "--only") == 0)
            options.only = value;
        else if (strcmp(arg, "--sizes") == 0)
            options.size_count = parse_list(value, (double)GIB, options.sizes, NULL);
        else if (strcmp(arg, "--threads") == 0)
            options.thread_count = parse_list(value, 1, NULL, options.threads);
        else if (strcmp(arg, "--pages") == 0) {
            options.pages[PAGES_4K] = strstr(value, "4k") != NULL;
            options.pages[PAGES_THP] = strstr(value, "thp") != NULL;
        } else if (strcmp(arg, "--reps") == 0)
            options.reps = atoi(value) > 0 ? atoi(value) : 1;
        else if (strcmp(arg, "--span-mib") == 0)
            options.span_bytes =
                ((size_t)atol(value) * MIB + 2 * HUGE_BYTES - 1) & ~(2 * HUGE_BYTES - 1);
        else if (strcmp(arg, "--inflight-mib") == 0)
            options.inflight_bytes =
                ((size_t)atol(value) * MIB + TAIL_BYTES - 1) & ~(TAIL_BYTES - 1);
        else if (strcmp(arg, "--json") == 0)
            options.json_path = value;
        else if (strcmp(arg, "--cudart") == 0)
            options.cudart = value;
        else if (strcmp(arg, "--driver") == 0)
            options.driver = value;
        else {
            usage(stderr);
            return 64;
        }
    }
    if (options.size_count == 0 || options.thread_count == 0 || options.span_bytes == 0 ||
        options.inflight_bytes < 2 * TAIL_BYTES) {
        fprintf(stderr, "gpu_register: sizes, threads, --span-mib and --inflight-mib (128 or more) "
                        "must be given values\n");
        return 64;
    }
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);
    int status = setup_cuda(options.cudart, options.driver);
    if (status != 0)
        return status;
    int driver_version = 0;
    if (drv.driver_version != NULL)
        drv.driver_version(&driver_version);
    printf("driver version %d; registrations with flags 0 (cuMemHostRegister_v2), on the primary "
           "context of device 0\n",
           driver_version);
    if (!have_copies && strpbrk(options.only, "wsmu") != NULL)
        printf("NOTE the runtime lacks the copy calls: sections w, s, m and u are skipped\n");

    size_t largest = 0;
    for (size_t s = 0; s < options.size_count; s++)
        if (options.sizes[s] > largest)
            largest = options.sizes[s];
    if (section_wanted('r') || (section_wanted('w') && have_copies)) {
        for (int pages = PAGES_4K; pages <= PAGES_THP; pages++) {
            if (!options.pages[pages])
                continue;
            struct host_buffer buffer;
            bool made = buffer_make(&buffer, largest, (enum page_kind)pages);
            buffer_rows[buffer_row_count++] = (struct buffer_row){
                (enum page_kind)pages, largest,
                buffer.touch_seconds,  buffer.lock_seconds,
                buffer.huge_bytes,     made ? 0 : (buffer.lock_error ? buffer.lock_error : ENOMEM)};
            printf("buffer    %-3s %6.2f GiB  %s\n", page_names[pages],
                   (double)largest / (double)GIB,
                   made ? "touched and locked" : strerror(buffer.lock_error));
            if (made && section_wanted('r'))
                register_measure(&buffer, (enum page_kind)pages);
            if (made && section_wanted('w') && have_copies)
                wait_measure(&buffer, (enum page_kind)pages);
            buffer_release(&buffer);
        }
    }
    if (section_wanted('s') && have_copies)
        span_measure();
    if (section_wanted('m') && have_copies)
        adjacent_measure();
    if (section_wanted('u') && have_copies)
        inflight_measure();
    print_tables();
    if (options.json_path != NULL)
        write_json(options.json_path, driver_version);
    return 0;
}
