/* The engine's set-up, fork, exit and queries (the protocol itself is in
 * engine_protocol.c; engine_internal.h lists the rooms). */
#include "engine_internal.h"

#include <stddef.h>
#include <string.h>
#include <time.h>

bool engine_init(struct engine *engine, const struct engine_backend *backend,
                 const struct engine_options *options)
{
    memset(engine, 0, sizeof(*engine));
    pthread_mutex_init(&engine->mutex, NULL);
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&engine->changed, &attributes);
    pthread_condattr_destroy(&attributes);
    engine->backend = backend;
    engine->statistics = &engine->own_statistics;
    for (size_t i = 0; i < ENGINE_MAX_DEVICES; i++)
        engine->own_statistics.device_nodes[i] = -1;
    engine->gate = &engine->free_view.gate;
    engine->options = *options;
    if (engine->options.page_size < PAGE_INDEX_GRANULE)
        engine->options.page_size = PAGE_INDEX_GRANULE;
    if (engine->options.max_registration_bytes == 0)
        engine->options.max_registration_bytes = UINT64_MAX;
    node_pool_init(&engine->piece_pool, sizeof(struct engine_piece));
    node_pool_init(&engine->waiting_pool, sizeof(struct engine_waiting));
    lock_bytes_init(&engine->lock_bytes);
    engine->registry_ok = range_registry_init(&engine->registry);
    return engine->registry_ok;
}

/* Frees what the engine holds; its mutex and condition variable are left
 * to the caller (a fork child must not destroy them: see below). */
static void engine_release_memory(struct engine *engine)
{
    if (engine->registry_ok)
        range_registry_destroy(&engine->registry);
    internal_unmap(engine->window_entries, ENGINE_WINDOW_MAP_BYTES);
    engine->window_entries = NULL;
    memset(&engine->free_view, 0, sizeof(engine->free_view));
    if (engine->gate != NULL)
        __atomic_store_n(engine->gate, 0, __ATOMIC_RELAXED);
    node_pool_destroy(&engine->piece_pool);
    node_pool_destroy(&engine->waiting_pool);
    lock_bytes_destroy(&engine->lock_bytes);
    engine->registry_ok = false;
    engine->record_count = 0;
}

void engine_destroy(struct engine *engine)
{
    engine_release_memory(engine);
    pthread_cond_destroy(&engine->changed);
    pthread_mutex_destroy(&engine->mutex);
}

void engine_reset_after_fork(struct engine *engine)
{
    /* Only the forking thread exists here; the parent's locks, claims and
     * queued work mean nothing to the child. */
    const struct engine_backend *backend = engine->backend;
    struct engine_options options = engine->options;
    bool window_allowed = engine->window_allowed;
    uintptr_t *gate = engine->gate;
    /* The child has its parent's mappings: their bounds stay. */
    struct mapping_bounds *bounds = engine->bounds;
    /* Not engine_destroy: in the child the mutex is held (the fork handler
     * took it) and the condition variable may count the parent's waiting
     * registration thread, which does not exist here, so destroying it would
     * wait for that thread forever. engine_init makes both anew. */
    engine_release_memory(engine);
    engine_init(engine, backend, &options);
    engine->bounds = bounds;
    engine->window_allowed = window_allowed;
    if (gate != &engine->free_view.gate) {
        *gate = 0;
        engine->gate = gate;
    }
}

void engine_set_mapping_bounds(struct engine *engine, struct mapping_bounds *bounds)
{
    engine->bounds = bounds;
}

/* The fields counted outside the lock, by relaxed atomics: contiguous, from
 * skipped_small to skipped_onfault_pages. */
#define RELAXED_FIRST offsetof(struct engine_statistics, skipped_small)
#define RELAXED_END offsetof(struct engine_statistics, read_only_registrations)
_Static_assert(offsetof(struct engine_statistics, skipped_onfault_pages) + sizeof(uint64_t) ==
                   RELAXED_END,
               "the relaxed counters run from skipped_small to skipped_onfault_pages");

void engine_statistics_move_to(struct engine *engine, struct engine_statistics *place)
{
    pthread_mutex_lock(&engine->mutex);
    struct engine_statistics *old = engine->statistics;
    if (old == place) {
        pthread_mutex_unlock(&engine->mutex);
        return;
    }
    /* What the mutex guards is copied; the relaxed counters are taken over
     * after the switch, so that counts racing it are carried over too. */
    memcpy(place, old, RELAXED_FIRST);
    memcpy((char *)place + RELAXED_END, (const char *)old + RELAXED_END,
           sizeof(*place) - RELAXED_END);
    memset((char *)place + RELAXED_FIRST, 0, RELAXED_END - RELAXED_FIRST);
    __atomic_store_n(&engine->statistics, place, __ATOMIC_RELEASE);
    for (size_t offset = RELAXED_FIRST; offset < RELAXED_END; offset += sizeof(uint64_t)) {
        uint64_t moved =
            __atomic_exchange_n((uint64_t *)((char *)old + offset), 0, __ATOMIC_RELAXED);
        __atomic_fetch_add((uint64_t *)((char *)place + offset), moved, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&engine->mutex);
}

/* ---- exit and queries ---- */

/* What the statistics report as "at exit": what is live, pending and queued. */
static void record_exit_counts_locked(struct engine *engine)
{
    engine->live_ranges_at_exit = engine_stats(engine)->counters.live_ranges;
    engine->live_bytes_at_exit = engine_stats(engine)->counters.live_bytes;
    engine->pending_ranges_at_exit = engine->pending_ranges;
    engine->pending_bytes_at_exit = engine->pending_bytes;
    engine->queued_ranges_at_exit = engine->queued_ranges;
}

void engine_shutdown(struct engine *engine)
{
    /* Once: the exit handler that runs before the runtimes end, then the
     * destructor, may both ask. */
    if (!engine->registry_ok || __atomic_load_n(&engine->shut_down, __ATOMIC_RELAXED))
        return;
    struct engine_op op;
    engine_op_begin(&op, engine, "exit");
    __atomic_store_n(&engine->shut_down, true, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&engine->changed);
    /* Waits for the operations in flight, the registration thread's
     * current call included; nothing new starts after shut_down. */
    uintptr_t start = 0, end = PAGE_INDEX_LIMIT;
    engine_claim_locked(&op, &start, &end, 1, false, false);
    record_exit_counts_locked(engine);
    struct release_request request = {0, PAGE_INDEX_LIMIT, RELEASE_EXIT, NULL, false, 0, 0};
    engine_release_locked(&op, &request);
    engine_op_end(&op);
}

bool engine_note_immediate_exit(struct engine *engine)
{
    if (!engine->registry_ok)
        return false;
    bool locked = false;
    for (int attempt = 0; attempt < 100 && !locked; attempt++) {
        locked = pthread_mutex_trylock(&engine->mutex) == 0;
        if (!locked) {
            struct timespec pause = {0, 1000L * 1000};
            nanosleep(&pause, NULL);
        }
    }
    if (!locked)
        return false;
    __atomic_store_n(&engine->shut_down, true, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&engine->changed);
    /* Operations in flight (a registration the thread is making, another
     * thread's unlock) end in bounded time and start nothing new now: wait
     * for them, as exit does, so that a range being registered is counted as
     * registered, not lost between the counts. Bounded, should one hang. */
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += 5;
    for (;;) {
        bool busy = engine->worker_busy || engine->claims_taken != 0;
        if (!busy || pthread_cond_timedwait(&engine->changed, &engine->mutex, &deadline) != 0)
            break;
    }
    record_exit_counts_locked(engine);
    pthread_mutex_unlock(&engine->mutex);
    return true;
}

bool engine_is_registered(struct engine *engine, uintptr_t addr)
{
    return engine_state_at(engine, addr) == RANGE_REGISTERED;
}

void engine_get_counters(struct engine *engine, struct pinshim_counters *out)
{
    pthread_mutex_lock(&engine->mutex);
    *out = engine_stats(engine)->counters;
    out->program_registrations = engine_stats(engine)->program_registrations;
    out->pending_ranges = engine->pending_ranges;
    out->pending_bytes = engine->pending_bytes;
    out->queued_ranges = engine->queued_ranges;
    pthread_mutex_unlock(&engine->mutex);
    out->register_skipped_small =
        __atomic_load_n(&engine_stats(engine)->skipped_small, __ATOMIC_RELAXED);
    out->mlockall_calls = __atomic_load_n(&engine_stats(engine)->mlockall_calls, __ATOMIC_RELAXED);
    out->lock_calls = __atomic_load_n(&engine_stats(engine)->lock_calls, __ATOMIC_RELAXED);
    out->unlock_calls = __atomic_load_n(&engine_stats(engine)->unlock_calls, __ATOMIC_RELAXED);
    pthread_mutex_lock(&engine->mutex);
    out->held_ranges = engine_stats(engine)->held_ranges;
    out->held_bytes = engine_stats(engine)->held_bytes;
    pthread_mutex_unlock(&engine->mutex);
}

size_t engine_get_errors(struct engine *engine, struct engine_error_count *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&engine->mutex);
    for (size_t i = 0; i < ENGINE_ERROR_SLOTS && n < max; i++)
        if (engine_stats(engine)->errors[i].count != 0)
            out[n++] = engine_stats(engine)->errors[i];
    pthread_mutex_unlock(&engine->mutex);
    return n;
}

size_t engine_get_devices(struct engine *engine, struct engine_device_counts *out, size_t max)
{
    size_t used = 0;
    pthread_mutex_lock(&engine->mutex);
    for (size_t i = 0; i < ENGINE_MAX_DEVICES && i < max; i++) {
        out[i] = engine_stats(engine)->devices[i];
        if (out[i].registrations != 0)
            used = i + 1;
    }
    pthread_mutex_unlock(&engine->mutex);
    return used;
}

uint64_t engine_live_bytes(struct engine *engine)
{
    pthread_mutex_lock(&engine->mutex);
    uint64_t bytes = engine_stats(engine)->counters.live_bytes;
    pthread_mutex_unlock(&engine->mutex);
    return bytes;
}
