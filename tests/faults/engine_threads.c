/* Many threads drive one engine at once over overlapping pages, through an
 * in-process backend that keeps CUDA's rules: lock, unlock (sometimes failing
 * and put back from the ticket), queries and counters, while the backend fails
 * some calls. Plain C without Criterion, so that it also runs under
 * ThreadSanitizer (scripts/sanitize), where Criterion cannot start.
 *
 * Checks: the backend never sees an overlapping registration or an unknown
 * base, the engine's counters agree with the backend's, and after the
 * shutdown nothing is left registered. Exit status 0 when all hold. */
#include "engine.h"

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
};

static struct {
    pthread_mutex_t mutex;
    struct backend_range ranges[MAX_RANGES];
    size_t count;
    uint64_t register_calls, unregister_calls, register_ok, unregister_ok;
    uint64_t overlaps, unknown_bases;
} backend = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static bool backend_ready(void *context)
{
    (void)context;
    return true;
}

/* Every 7th register and every 11th unregister fail, as an unreliable runtime. */
static int backend_register(void *context, void *base, size_t length)
{
    (void)context;
    pthread_mutex_lock(&backend.mutex);
    int result = 0;
    uintptr_t start = (uintptr_t)base, end = start + length;
    if (++backend.register_calls % 7 == 0) {
        result = 2; /* cudaErrorMemoryAllocation */
    } else {
        for (size_t i = 0; i < backend.count && result == 0; i++)
            if (start < backend.ranges[i].base + backend.ranges[i].length &&
                backend.ranges[i].base < end)
                result = ENGINE_CUDA_ALREADY_REGISTERED;
        if (result != 0) {
            backend.overlaps++;
        } else if (backend.count == MAX_RANGES) {
            result = 2;
        } else {
            backend.ranges[backend.count++] = (struct backend_range){start, length};
            backend.register_ok++;
        }
    }
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static int backend_unregister(void *context, void *base)
{
    (void)context;
    pthread_mutex_lock(&backend.mutex);
    int result = ENGINE_CUDA_NOT_REGISTERED;
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

static const struct engine_backend test_backend = {
    .ready = backend_ready,
    .register_range = backend_register,
    .unregister_range = backend_unregister,
    .error_name = NULL,
};

static struct engine engine;
static atomic_ulong queries;

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
        switch (next_random(&state) % 6) {
        case 0:
        case 1: {
            /* A lock of an unaligned byte range, as a program gives it, checked
             * against the unlocks that happen meanwhile (as mlock does). */
            uint64_t unlocks_before = engine_unlock_sequence(&engine);
            engine_after_lock(&engine, start + 100, (size_t)(end - start) - 200, unlocks_before);
            break;
        }
        case 2:
            engine_note_unlock(&engine, start, end);
            engine_release(&engine, start, end, RELEASE_MUNLOCK, NULL);
            break;
        case 3: {
            /* An munlock that fails: what was released is put back. */
            struct engine_ticket ticket = {0};
            engine_release(&engine, start, end, RELEASE_MUNMAP, &ticket);
            if (next_random(&state) % 2)
                engine_restore(&engine, &ticket, 0, UINTPTR_MAX);
            else
                engine_ticket_discard(&engine, &ticket);
            break;
        }
        case 4:
            engine_register_pages(&engine, start, end);
            break;
        default:
            atomic_fetch_add(&queries, (unsigned long)engine_is_registered(&engine, start));
            engine_get_counters(&engine, &counters);
            break;
        }
    }
    return NULL;
}

int main(void)
{
    if (!engine_init(&engine, &test_backend, 64 * 1024, PAGE)) {
        fprintf(stderr, "engine_init failed\n");
        return 1;
    }
    pthread_t threads[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, work, (void *)(i * 7919 + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    engine_shutdown(&engine);

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
    CHECK(backend.count == 0, "%zu ranges left registered after the shutdown", backend.count);
    CHECK(counters.register_ok == backend.register_ok, "register_ok %llu, backend %llu",
          (unsigned long long)counters.register_ok, (unsigned long long)backend.register_ok);
    CHECK(counters.unregister_ok == backend.unregister_ok, "unregister_ok %llu, backend %llu",
          (unsigned long long)counters.unregister_ok, (unsigned long long)backend.unregister_ok);
    CHECK(counters.live_ranges == 0 && counters.live_bytes == 0, "live %llu ranges",
          (unsigned long long)counters.live_ranges);
    CHECK(counters.register_ok > 0 && counters.unregister_munlock > 0,
          "the workload did too little");
    printf("%s: %llu registrations, %llu unregistrations, %llu failed, %lu positive queries\n",
           failures ? "FAIL" : "PASS", (unsigned long long)counters.register_ok,
           (unsigned long long)counters.unregister_ok,
           (unsigned long long)(counters.register_failed + counters.unregister_failed),
           atomic_load(&queries));
    engine_destroy(&engine);
    return failures ? 1 : 0;
}
