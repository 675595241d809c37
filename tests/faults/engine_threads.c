/* Many threads drive one engine at once over overlapping pages, through an
 * in-process backend that keeps CUDA's rules: lock, unlock (sometimes failing
 * and put back), frees of blocks, the program's own registrations, queries
 * and counters, while the backend fails some calls; once with registration in
 * the locking threads and once with a registration thread. Plain C without
 * Criterion, so that it also runs under ThreadSanitizer (scripts/sanitize),
 * where Criterion cannot start.
 *
 * Checks: the backend never sees an overlapping registration or an unknown
 * base, the engine's counters agree with the backend's, and after the
 * shutdown nothing is left registered. Exit status 0 when all hold. */
#include "engine.h"
#include "mock_codes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 6
#define OPERATIONS 4000
#define PAGE ((uintptr_t)4096)
#define AREA_PAGES 512
#define AREA_BASE ((uintptr_t)0x200000000)
#define MAX_RANGES 4096

struct backend_range {
    uintptr_t base, length;
    bool program; /* registered by the "program" itself */
};

static struct {
    pthread_mutex_t mutex;
    struct backend_range ranges[MAX_RANGES];
    size_t count;
    uint64_t register_calls, unregister_calls, register_ok, unregister_ok;
    uint64_t overlaps, unknown_bases, program_ranges;
    uint64_t over_program; /* the shim met the program's registration: 712, as CUDA says */
} backend = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static enum engine_choice backend_choose(void *context, bool from_worker,
                                         const struct range_place *hint, struct range_place *place)
{
    (void)context;
    (void)from_worker;
    (void)hint;
    *place = (struct range_place){.device = 0};
    return ENGINE_PLACE_READY;
}

/* Every 7th register and every 11th unregister fail, as an unreliable runtime. */
static int backend_register_code(void *context, struct range_place *place, void *base,
                                 size_t length)
{
    (void)context;
    (void)place;
    pthread_mutex_lock(&backend.mutex);
    int result = 0;
    uintptr_t start = (uintptr_t)base, end = start + length;
    if (++backend.register_calls % 7 == 0) {
        result = 2; /* cudaErrorMemoryAllocation */
    } else {
        bool program = false;
        for (size_t i = 0; i < backend.count && result == 0; i++)
            if (start < backend.ranges[i].base + backend.ranges[i].length &&
                backend.ranges[i].base < end) {
                result = MOCK_ALREADY_REGISTERED;
                program = backend.ranges[i].program;
            }
        /* The program's registration outlives an unmap or free of its memory
         * (its own bug), and the shim then meets it: legitimate. Meeting the
         * shim's own registration is not. */
        if (result != 0 && program) {
            backend.over_program++;
        } else if (result != 0) {
            backend.overlaps++;
        } else if (backend.count == MAX_RANGES) {
            result = 2;
        } else {
            backend.ranges[backend.count++] = (struct backend_range){start, length, false};
            backend.register_ok++;
        }
    }
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static struct engine_result backend_register(void *context, struct range_place *place, void *base,
                                             size_t length)
{
    return mock_result(backend_register_code(context, place, base, length));
}

static int backend_unregister_code(void *context, const struct range_place *place, void *base)
{
    (void)context;
    (void)place;
    pthread_mutex_lock(&backend.mutex);
    int result = MOCK_NOT_REGISTERED;
    size_t i = 0;
    while (i < backend.count && backend.ranges[i].base != (uintptr_t)base)
        i++;
    if (i == backend.count) {
        backend.unknown_bases++;
    } else if (++backend.unregister_calls % 11 == 0) {
        /* Fails without effect; the engine forgets the range anyway, so drop it
         * here too or later registrations of these pages would overlap. */
        backend.ranges[i] = backend.ranges[--backend.count];
        result = 2;
    } else {
        backend.ranges[i] = backend.ranges[--backend.count];
        backend.unregister_ok++;
        result = 0;
    }
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static struct engine_result backend_unregister(void *context, const struct range_place *place,
                                               void *base, size_t length)
{
    (void)length;
    return mock_result(backend_unregister_code(context, place, base));
}

static struct engine engine;
static atomic_ulong queries;
static atomic_int worker_running;

static void *registration_thread(void *argument)
{
    (void)argument;
    engine_worker_run(&engine, 1000000, false);
    atomic_store(&worker_running, 0);
    return NULL;
}

static void backend_wake(void *context)
{
    (void)context;
    pthread_t thread;
    atomic_store(&worker_running, 1);
    if (pthread_create(&thread, NULL, registration_thread, NULL) == 0)
        pthread_detach(thread);
    else
        engine_worker_run(&engine, 0, true);
}

static const struct engine_backend test_backend = {
    .choose_place = backend_choose,
    .register_range = backend_register,
    .unregister_range = backend_unregister,
    .error_name = NULL,
    .wake_worker = backend_wake,
};

static long succeed(void *arguments)
{
    (void)arguments;
    return 0;
}

static long fail(void *arguments)
{
    (void)arguments;
    return -1;
}

/* The program's own cudaHostRegister of [start, end): the backend's table. */
static long program_register(void *arguments)
{
    uintptr_t *range = arguments;
    pthread_mutex_lock(&backend.mutex);
    long result = 0;
    for (size_t i = 0; i < backend.count && result == 0; i++)
        if (range[0] < backend.ranges[i].base + backend.ranges[i].length &&
            backend.ranges[i].base < range[1])
            result = MOCK_ALREADY_REGISTERED;
    if (result == 0 && backend.count < MAX_RANGES) {
        backend.ranges[backend.count++] =
            (struct backend_range){range[0], range[1] - range[0], true};
        backend.program_ranges++;
    }
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static long program_unregister(void *arguments)
{
    uintptr_t *range = arguments;
    pthread_mutex_lock(&backend.mutex);
    long result = MOCK_NOT_REGISTERED;
    for (size_t i = 0; i < backend.count; i++)
        if (backend.ranges[i].base == range[0] && backend.ranges[i].length == range[1] - range[0]) {
            backend.ranges[i] = backend.ranges[--backend.count];
            backend.program_ranges--;
            result = 0;
            break;
        }
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static uint32_t next_random(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    return *state >> 8;
}

static void *work(void *argument)
{
    uint32_t state = (uint32_t)(uintptr_t)argument;
    struct pinshim_counters counters;
    for (int i = 0; i < OPERATIONS; i++) {
        uintptr_t first = next_random(&state) % AREA_PAGES;
        uintptr_t pages = 1 + next_random(&state) % 48;
        if (first + pages > AREA_PAGES)
            pages = AREA_PAGES - first;
        uintptr_t start = AREA_BASE + first * PAGE, end = start + pages * PAGE;
        struct engine_call ok = {succeed, NULL, "test"}, failing = {fail, NULL, "test"};
        switch (next_random(&state) % 8) {
        case 0:
        case 1:
            /* A lock of an unaligned byte range, as a program gives it. */
            engine_lock(&engine, start + 100, (size_t)(end - start) - 200, 0, &ok);
            break;
        case 2:
            engine_unlock(&engine, start, end, RELEASE_MUNLOCK, ENGINE_FAILED_CHANGED_NOTHING, &ok);
            break;
        case 3:
            /* An unmap that fails: what was released is put back. */
            engine_unlock(&engine, start, end, RELEASE_MUNMAP, ENGINE_FAILED_CHANGED_NOTHING,
                          next_random(&state) % 2 ? &failing : &ok);
            break;
        case 4:
            /* A heap block's bytes go back to the allocator. */
            engine_release_block(&engine, start + 24, end - 40, RELEASE_FREE, false, &ok);
            break;
        case 5: {
            /* The program registers (and at once unregisters) a range itself. */
            uintptr_t range[2] = {start, end};
            struct engine_program_call registering = {{program_register, range, "test"}, MOCK_OK};
            struct engine_program_call unregistering = {{program_unregister, range, "test"},
                                                        MOCK_OK};
            if (engine_program_register(&engine, start, end - start, 0, &registering) == 0)
                engine_program_unregister(&engine, start, &unregistering);
            break;
        }
        default:
            atomic_fetch_add(&queries, (unsigned long)engine_is_registered(&engine, start));
            engine_get_counters(&engine, &counters);
            /* With a registration thread: let it catch up now and then, so
             * releases meet registered ranges too, not only queued ones. */
            if (next_random(&state) % 2)
                engine_drain(&engine, false);
            break;
        }
    }
    return NULL;
}

static int run(bool asynchronous)
{
    memset((void *)backend.ranges, 0, sizeof(backend.ranges));
    backend.count = 0;
    backend.register_calls = backend.unregister_calls = backend.register_ok =
        backend.unregister_ok = backend.overlaps = backend.unknown_bases = backend.program_ranges =
            backend.over_program = 0;
    struct engine_options options = {.min_bytes = 64 * 1024,
                                     .max_registration_bytes = 32 * PAGE,
                                     .asynchronous = asynchronous,
                                     .page_size = PAGE};
    if (!engine_init(&engine, &test_backend, &options)) {
        fprintf(stderr, "engine_init failed\n");
        return 1;
    }
    pthread_t threads[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, work, (void *)(i * 7919 + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    engine_drain(&engine, false);
    engine_shutdown(&engine);
    while (atomic_load(&worker_running))
        sched_yield();

    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    int failures = 0;
#define CHECK(condition, ...)                                                                      \
    do {                                                                                           \
        if (!(condition)) {                                                                        \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
    CHECK(backend.overlaps == 0, "%llu overlapping registrations reached the backend",
          (unsigned long long)backend.overlaps);
    CHECK(backend.unknown_bases == 0, "%llu unregistrations of unknown bases",
          (unsigned long long)backend.unknown_bases);
    CHECK(backend.count == backend.program_ranges,
          "%zu ranges left registered by the shim after the shutdown",
          backend.count - (size_t)backend.program_ranges);
    CHECK(counters.register_ok == backend.register_ok, "register_ok %llu, backend %llu",
          (unsigned long long)counters.register_ok, (unsigned long long)backend.register_ok);
    CHECK(counters.unregister_ok == backend.unregister_ok, "unregister_ok %llu, backend %llu",
          (unsigned long long)counters.unregister_ok, (unsigned long long)backend.unregister_ok);
    CHECK(counters.live_ranges == 0 && counters.live_bytes == 0, "live %llu ranges",
          (unsigned long long)counters.live_ranges);
    CHECK(counters.register_ok > 0 &&
              counters.unregister_munlock + counters.unregister_free + counters.unregister_munmap >
                  0 &&
              counters.program_registrations > 0,
          "the workload did too little");
    CHECK(counters.register_already_registered == backend.over_program,
          "%llu registrations met the program's, the engine counted %llu",
          (unsigned long long)backend.over_program,
          (unsigned long long)counters.register_already_registered);
    printf("%s (%s): %llu registrations, %llu unregistrations, %llu failed, %llu by the program, "
           "%lu positive queries\n",
           failures ? "FAIL" : "PASS", asynchronous ? "registration thread" : "in the caller",
           (unsigned long long)counters.register_ok, (unsigned long long)counters.unregister_ok,
           (unsigned long long)(counters.register_failed + counters.unregister_failed),
           (unsigned long long)counters.program_registrations, atomic_load(&queries));
    engine_destroy(&engine);
    return failures;
}

int main(void)
{
    int failures = run(false);
    failures += run(true);
    return failures ? 1 : 0;
}
