#include "engine.h"

#include "log.h"

#include <string.h>
#include <time.h>

static uint64_t now_nanoseconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Before a record is inserted: the span grows to hold it, or starts at it when
 * no record exists (a reader that still sees the old count only skips blocks
 * that held records now gone). */
static void widen_span_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    bool first = engine->registry.count == 0;
    if (first || start < engine->span_start)
        __atomic_store_n(&engine->span_start, start, __ATOMIC_RELAXED);
    if (first || end > engine->span_end)
        __atomic_store_n(&engine->span_end, end, __ATOMIC_RELAXED);
}

static void publish_record_count(struct engine *engine)
{
    __atomic_store_n(&engine->record_count, engine->registry.count, __ATOMIC_RELAXED);
}

static const char *error_name(struct engine *engine, int error)
{
    const char *name = NULL;
    if (engine->backend->error_name != NULL)
        name = engine->backend->error_name(engine->backend->context, error);
    return name != NULL ? name : "unknown CUDA error";
}

/* Counts error and tells whether this is its first occurrence for the operation. */
static bool note_error(struct engine *engine, int error, uint32_t *warned)
{
    for (size_t i = 0; i < ENGINE_ERROR_SLOTS; i++) {
        struct engine_error_count *slot = &engine->errors[i];
        if (slot->count == 0 || slot->code == error) {
            slot->code = error;
            slot->count++;
            bool first = !warned[i];
            warned[i] = 1;
            return first;
        }
    }
    return false; /* table full: counted nowhere, never warned again */
}

bool engine_init(struct engine *engine, const struct engine_backend *backend, uint64_t min_bytes,
                 uintptr_t page_size)
{
    memset(engine, 0, sizeof(*engine));
    pthread_mutex_init(&engine->mutex, NULL);
    pthread_cond_init(&engine->changed, NULL);
    engine->backend = backend;
    engine->min_bytes = min_bytes;
    engine->page_size = page_size < PAGE_INDEX_GRANULE ? PAGE_INDEX_GRANULE : page_size;
    node_pool_init(&engine->piece_pool, sizeof(struct engine_ticket_piece));
    engine->registry_ok = range_registry_init(&engine->registry);
    return engine->registry_ok;
}

void engine_destroy(struct engine *engine)
{
    if (engine->registry_ok)
        range_registry_destroy(&engine->registry);
    node_pool_destroy(&engine->piece_pool);
    pthread_cond_destroy(&engine->changed);
    pthread_mutex_destroy(&engine->mutex);
    engine->registry_ok = false;
    engine->record_count = 0;
}

void engine_reset_after_fork(struct engine *engine)
{
    /* Only the forking thread exists here; the parent's locks and pending
     * operations mean nothing to the child. */
    const struct engine_backend *backend = engine->backend;
    uint64_t min_bytes = engine->min_bytes;
    uintptr_t page_size = engine->page_size;
    engine_destroy(engine);
    engine_init(engine, backend, min_bytes, page_size);
}

/* Waits while a pending registration overlaps [start, end). Returns true if it
 * waited (the caller re-reads the registry), false if none is pending. */
static bool wait_for_pending_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    struct range_registry *registry = &engine->registry;
    for (struct range_record *record = range_registry_first_overlap(registry, start, end);
         record != NULL; record = range_registry_first_overlap(registry, record->end, end)) {
        if (record->state != RANGE_REGISTERED) {
            pthread_cond_wait(&engine->changed, &engine->mutex);
            return true;
        }
    }
    return false;
}

static void note_unlock_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    uint64_t sequence = engine->unlock_sequence + 1;
    engine->recent_unlocks[sequence % ENGINE_RECENT_UNLOCKS] =
        (struct engine_unlock_note){start, end, sequence};
    __atomic_store_n(&engine->unlock_sequence, sequence, __ATOMIC_RELEASE);
}

int engine_begin_unlock(struct engine *engine, uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&engine->mutex);
    int token = -1;
    for (int i = 0; i < ENGINE_UNLOCKS_IN_FLIGHT && token < 0; i++) {
        if (engine->unlocks_in_flight[i].sequence == 0) {
            engine->unlocks_in_flight[i] = (struct engine_unlock_note){start, end, 1};
            token = i;
        }
    }
    if (token < 0)
        engine->unlocks_in_flight_overflow++;
    pthread_mutex_unlock(&engine->mutex);
    return token;
}

void engine_end_unlock(struct engine *engine, int token, uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&engine->mutex);
    if (token >= 0)
        engine->unlocks_in_flight[token].sequence = 0;
    else
        engine->unlocks_in_flight_overflow--;
    note_unlock_locked(engine, start, end);
    pthread_mutex_unlock(&engine->mutex);
}

void engine_note_unlock(struct engine *engine, uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&engine->mutex);
    note_unlock_locked(engine, start, end);
    pthread_mutex_unlock(&engine->mutex);
}

/* Widens the conflict found so far to the lowest part of [start, end) that
 * note touches. */
static bool note_conflict(const struct engine_unlock_note *note, uintptr_t start, uintptr_t end,
                          bool found, uintptr_t *conflict_start, uintptr_t *conflict_end)
{
    uintptr_t from = note->start > start ? note->start : start;
    uintptr_t to = note->end < end ? note->end : end;
    if (from < to && (!found || from < *conflict_start)) {
        *conflict_start = from;
        *conflict_end = to;
        return true;
    }
    return found;
}

/* The lowest part of [start, end) that a running unlock, or one that ended
 * after since, touches, as [*conflict_start, *conflict_end); false if none.
 * When more unlocks ended or ran than the notes hold, all of it is touched. */
enum unlock_conflict { UNLOCK_CONFLICT_NONE, UNLOCK_CONFLICT_FOUND, UNLOCK_CONFLICT_UNKNOWN };

static enum unlock_conflict find_unlock_conflict_locked(const struct engine *engine, uint64_t since,
                                                        uintptr_t start, uintptr_t end,
                                                        uintptr_t *conflict_start,
                                                        uintptr_t *conflict_end)
{
    if (since == ENGINE_NO_UNLOCK_CHECK)
        return UNLOCK_CONFLICT_NONE;
    if (engine->unlocks_in_flight_overflow > 0 ||
        engine->unlock_sequence - since > ENGINE_RECENT_UNLOCKS) {
        *conflict_start = start;
        *conflict_end = end;
        return UNLOCK_CONFLICT_UNKNOWN;
    }
    bool found = false;
    for (int i = 0; i < ENGINE_UNLOCKS_IN_FLIGHT; i++)
        if (engine->unlocks_in_flight[i].sequence != 0)
            found = note_conflict(&engine->unlocks_in_flight[i], start, end, found, conflict_start,
                                  conflict_end);
    for (uint64_t sequence = since + 1; sequence <= engine->unlock_sequence; sequence++)
        found = note_conflict(&engine->recent_unlocks[sequence % ENGINE_RECENT_UNLOCKS], start, end,
                              found, conflict_start, conflict_end);
    return found ? UNLOCK_CONFLICT_FOUND : UNLOCK_CONFLICT_NONE;
}

static void register_gaps_locked(struct engine *engine, uintptr_t start, uintptr_t end,
                                 uint64_t unlocks_before, bool may_ask_kernel);

struct kernel_recheck {
    struct engine *engine;
    uint64_t unlocks_before;
};

static void register_part_still_locked(void *context, uintptr_t start, uintptr_t end)
{
    struct kernel_recheck *recheck = context;
    pthread_mutex_lock(&recheck->engine->mutex);
    register_gaps_locked(recheck->engine, start, end, recheck->unlocks_before, false);
    pthread_mutex_unlock(&recheck->engine->mutex);
}

/* Reserves [gap_start, gap_end), registers it with the mutex dropped, and
 * records the outcome. False when the registry has no memory for it. */
static bool register_one_gap_locked(struct engine *engine, uintptr_t gap_start, uintptr_t gap_end)
{
    struct range_registry *registry = &engine->registry;
    engine->insert_generation++;
    widen_span_locked(engine, gap_start, gap_end);
    if (!range_registry_insert(registry, gap_start, gap_end, RANGE_REGISTERING)) {
        engine->counters.register_failed++;
        log_warn("out of memory for the range registry; %#lx + %lu bytes stay unregistered",
                 (unsigned long)gap_start, (unsigned long)(gap_end - gap_start));
        return false;
    }
    publish_record_count(engine);
    size_t length = gap_end - gap_start;

    pthread_mutex_unlock(&engine->mutex);
    uint64_t began = now_nanoseconds();
    int error =
        engine->backend->register_range(engine->backend->context, (void *)gap_start, length);
    uint64_t took = now_nanoseconds() - began;
    pthread_mutex_lock(&engine->mutex);

    struct pinshim_counters *counters = &engine->counters;
    counters->register_nanoseconds += took;
    if (error == ENGINE_CUDA_SUCCESS) {
        range_registry_find(registry, gap_start)->state = RANGE_REGISTERED;
        counters->register_ok++;
        counters->register_bytes += length;
        counters->live_ranges++;
        counters->live_bytes += length;
        if (counters->live_bytes > counters->peak_bytes)
            counters->peak_bytes = counters->live_bytes;
        log_info("registered %#lx + %lu bytes in %.3f ms", (unsigned long)gap_start,
                 (unsigned long)length, (double)took / 1e6);
    } else {
        range_registry_remove(registry, gap_start);
        publish_record_count(engine);
        bool first = note_error(engine, error, engine->warned_register);
        if (error == ENGINE_CUDA_ALREADY_REGISTERED) {
            /* The program or its framework registered it: not ours to unregister. */
            counters->register_already_registered++;
            log_info("%#lx + %lu bytes are already registered by the program; left alone",
                     (unsigned long)gap_start, (unsigned long)length);
        } else {
            counters->register_failed++;
            if (first)
                log_warn("cudaHostRegister(%#lx, %lu) failed: %s (%d); the range stays "
                         "mlocked only; further %s failures are counted, not logged",
                         (unsigned long)gap_start, (unsigned long)length, error_name(engine, error),
                         error, error_name(engine, error));
        }
    }
    pthread_cond_broadcast(&engine->changed);
    return true;
}

/* Registers every page of [start, end) that no registration covers, one gap at a
 * time. Pages an unlock may have touched since unlocks_before are registered
 * only where the kernel says they are still locked (may_ask_kernel), else left
 * out. Called and returns with the mutex held; drops it around backend calls. */
static void register_gaps_locked(struct engine *engine, uintptr_t start, uintptr_t end,
                                 uint64_t unlocks_before, bool may_ask_kernel)
{
    struct range_registry *registry = &engine->registry;
    uintptr_t cursor = start;
    while (cursor < end && !engine->shut_down) {
        uintptr_t gap_start, gap_end = end;
        bool have_gap =
            page_index_find_next(&registry->index, PAGE_INDEX_USED, false, cursor, end, &gap_start);
        if (have_gap && !page_index_find_next(&registry->index, PAGE_INDEX_USED, true, gap_start,
                                              end, &gap_end))
            gap_end = end;
        /* Only the records before the end of this gap can change it; waiting on
         * every record up to end made each step cost O(records): quadratic. */
        if (wait_for_pending_locked(engine, cursor, gap_end))
            continue;
        if (!have_gap)
            break;
        uintptr_t conflict_start = 0, conflict_end = 0;
        enum unlock_conflict conflict = find_unlock_conflict_locked(
            engine, unlocks_before, gap_start, gap_end, &conflict_start, &conflict_end);
        if (conflict != UNLOCK_CONFLICT_NONE && may_ask_kernel &&
            engine->backend->locked_parts != NULL) {
            /* An unlock may have touched these pages since the lock (or more
             * unlocks came than the notes hold, or the unlock was of an older
             * mapping at these addresses): ask the kernel what is locked now,
             * and register that, checked against the unlocks that come after
             * this question. */
            struct kernel_recheck recheck = {engine, engine->unlock_sequence};
            pthread_mutex_unlock(&engine->mutex);
            engine->backend->locked_parts(engine->backend->context, gap_start, gap_end,
                                          register_part_still_locked, &recheck);
            pthread_mutex_lock(&engine->mutex);
            cursor = gap_end;
            continue;
        }
        if (conflict != UNLOCK_CONFLICT_NONE) {
            if (conflict_start == gap_start) {
                engine->skipped_race += (conflict_end - conflict_start) / engine->page_size;
                cursor = conflict_end;
                continue;
            }
            gap_end = conflict_start; /* the rest is looked at next time round */
        }
        if (!register_one_gap_locked(engine, gap_start, gap_end))
            break;
        cursor = gap_end;
    }
}

static void register_pages(struct engine *engine, uintptr_t start, uintptr_t end,
                           uint64_t unlocks_before)
{
    if (!engine->registry_ok || start >= end || end > PAGE_INDEX_LIMIT)
        return;
    if (!engine->backend->ready(engine->backend->context)) {
        __atomic_fetch_add(&engine->skipped_disabled, 1, __ATOMIC_RELAXED);
        return;
    }
    pthread_mutex_lock(&engine->mutex);
    register_gaps_locked(engine, start, end, unlocks_before, true);
    pthread_mutex_unlock(&engine->mutex);
}

void engine_register_pages(struct engine *engine, uintptr_t start, uintptr_t end)
{
    register_pages(engine, start, end, ENGINE_NO_UNLOCK_CHECK);
}

void engine_after_lock(struct engine *engine, uintptr_t addr, size_t length,
                       uint64_t unlocks_before)
{
    if (length < engine->min_bytes) {
        engine_count(&engine->skipped_small);
        return;
    }
    uintptr_t page_mask = engine->page_size - 1;
    uintptr_t start = addr & ~page_mask;
    uintptr_t end = addr + length;
    if (end < addr || end > PAGE_INDEX_LIMIT) {
        engine_count(&engine->skipped_address);
        return;
    }
    end = (end + page_mask) & ~page_mask;
    if (__atomic_load_n(&engine->shut_down, __ATOMIC_RELAXED))
        return;
    register_pages(engine, start, end, unlocks_before);
}

static uint64_t *reason_counter(struct pinshim_counters *counters, enum release_reason reason)
{
    switch (reason) {
    case RELEASE_MUNLOCK:
        return &counters->unregister_munlock;
    case RELEASE_FREE:
        return &counters->unregister_free;
    case RELEASE_REALLOC:
        return &counters->unregister_realloc;
    case RELEASE_MUNMAP:
        return &counters->unregister_munmap;
    case RELEASE_MREMAP:
        return &counters->unregister_mremap;
    case RELEASE_MMAP_FIXED:
        return &counters->unregister_mmap_fixed;
    case RELEASE_EXIT:
    case RELEASE_REASON_COUNT:
        break;
    }
    return &counters->unregister_exit;
}

static void ticket_add(struct engine *engine, struct engine_ticket *ticket, uintptr_t start,
                       uintptr_t end)
{
    struct engine_ticket_piece *piece = node_pool_get(&engine->piece_pool);
    if (piece == NULL) {
        log_warn("out of memory recording %#lx + %lu bytes; they will not be re-registered if "
                 "the call fails",
                 (unsigned long)start, (unsigned long)(end - start));
        return;
    }
    piece->start = start;
    piece->end = end;
    piece->next = ticket->head;
    ticket->head = piece;
}

void engine_release(struct engine *engine, uintptr_t start, uintptr_t end,
                    enum release_reason reason, struct engine_ticket *ticket)
{
    if (!engine_may_overlap(engine, start, end))
        return;
    struct range_registry *registry = &engine->registry;
    pthread_mutex_lock(&engine->mutex);
    /* Records below cursor are gone: rescanning them (and the cleared pages)
     * on every step made releasing N records cost O(N^2). A registration made
     * meanwhile by another thread sends the cursor back to start. */
    uintptr_t cursor = start;
    uint64_t generation = engine->insert_generation;
    for (;;) {
        struct range_record *record = range_registry_first_overlap(registry, cursor, end);
        if (record == NULL)
            break;
        if (record->state != RANGE_REGISTERED) {
            pthread_cond_wait(&engine->changed, &engine->mutex);
            if (engine->insert_generation != generation) {
                cursor = start;
                generation = engine->insert_generation;
            }
            continue;
        }
        struct range_record removed = *record;
        record->state = RANGE_UNREGISTERING;

        pthread_mutex_unlock(&engine->mutex);
        uint64_t began = now_nanoseconds();
        int error =
            engine->backend->unregister_range(engine->backend->context, (void *)removed.base);
        uint64_t took = now_nanoseconds() - began;
        pthread_mutex_lock(&engine->mutex);

        struct pinshim_counters *counters = &engine->counters;
        size_t length = removed.end - removed.base;
        range_registry_remove(registry, removed.base);
        publish_record_count(engine);
        counters->unregister_nanoseconds += took;
        counters->live_ranges--;
        counters->live_bytes -= length;
        (*reason_counter(counters, reason))++;
        if (error == ENGINE_CUDA_SUCCESS) {
            counters->unregister_ok++;
            log_info("unregistered %#lx + %lu bytes in %.3f ms", (unsigned long)removed.base,
                     (unsigned long)length, (double)took / 1e6);
        } else if (reason == RELEASE_EXIT && error == ENGINE_CUDA_UNLOADING) {
            /* The runtime tore itself down first; the kernel drops the pins. */
            engine->exit_unloading++;
            note_error(engine, error, engine->warned_unregister);
        } else {
            counters->unregister_failed++;
            if (note_error(engine, error, engine->warned_unregister))
                log_warn("cudaHostUnregister(%#lx) failed: %s (%d); further %s failures are "
                         "counted, not logged",
                         (unsigned long)removed.base, error_name(engine, error), error,
                         error_name(engine, error));
        }
        if (ticket != NULL)
            ticket_add(engine, ticket, removed.base > start ? removed.base : start,
                       removed.end < end ? removed.end : end);
        pthread_cond_broadcast(&engine->changed);
        /* CUDA cannot unregister part of a range: put back what stays locked,
         * unless the runtime still holds the old registration. */
        if (error == ENGINE_CUDA_SUCCESS || error == ENGINE_CUDA_NOT_REGISTERED) {
            if (removed.base < start)
                register_gaps_locked(engine, removed.base, start, ENGINE_NO_UNLOCK_CHECK, false);
            if (removed.end > end)
                register_gaps_locked(engine, end, removed.end, ENGINE_NO_UNLOCK_CHECK, false);
        }
        if (engine->insert_generation != generation) {
            cursor = start;
            generation = engine->insert_generation;
        } else {
            cursor = removed.end;
        }
    }
    pthread_mutex_unlock(&engine->mutex);
}

void engine_ticket_discard(struct engine *engine, struct engine_ticket *ticket)
{
    if (ticket->head == NULL)
        return;
    pthread_mutex_lock(&engine->mutex);
    while (ticket->head != NULL) {
        struct engine_ticket_piece *piece = ticket->head;
        ticket->head = piece->next;
        node_pool_put(&engine->piece_pool, piece);
    }
    pthread_mutex_unlock(&engine->mutex);
}

void engine_restore(struct engine *engine, struct engine_ticket *ticket, uintptr_t clip_start,
                    uintptr_t clip_end)
{
    if (ticket->head == NULL)
        return;
    pthread_mutex_lock(&engine->mutex);
    while (ticket->head != NULL) {
        struct engine_ticket_piece *piece = ticket->head;
        ticket->head = piece->next;
        uintptr_t start = piece->start > clip_start ? piece->start : clip_start;
        uintptr_t end = piece->end < clip_end ? piece->end : clip_end;
        node_pool_put(&engine->piece_pool, piece);
        if (start < end)
            register_gaps_locked(engine, start, end, ENGINE_NO_UNLOCK_CHECK, false);
    }
    pthread_mutex_unlock(&engine->mutex);
}

void engine_shutdown(struct engine *engine)
{
    if (!engine->registry_ok)
        return;
    pthread_mutex_lock(&engine->mutex);
    engine->live_ranges_at_exit = engine->counters.live_ranges;
    engine->live_bytes_at_exit = engine->counters.live_bytes;
    __atomic_store_n(&engine->shut_down, true, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&engine->mutex);
    engine_release(engine, 0, PAGE_INDEX_LIMIT, RELEASE_EXIT, NULL);
}

bool engine_is_registered(struct engine *engine, uintptr_t addr)
{
    if (!engine_may_overlap(engine, addr, addr + 1))
        return false;
    pthread_mutex_lock(&engine->mutex);
    struct range_record *record = range_registry_containing(&engine->registry, addr);
    bool registered = record != NULL && record->state == RANGE_REGISTERED;
    pthread_mutex_unlock(&engine->mutex);
    return registered;
}

void engine_get_counters(struct engine *engine, struct pinshim_counters *out)
{
    pthread_mutex_lock(&engine->mutex);
    *out = engine->counters;
    pthread_mutex_unlock(&engine->mutex);
    out->register_skipped_small = __atomic_load_n(&engine->skipped_small, __ATOMIC_RELAXED);
    out->mlockall_calls = __atomic_load_n(&engine->mlockall_calls, __ATOMIC_RELAXED);
    out->lock_calls = __atomic_load_n(&engine->lock_calls, __ATOMIC_RELAXED);
    out->unlock_calls = __atomic_load_n(&engine->unlock_calls, __ATOMIC_RELAXED);
}

size_t engine_get_errors(struct engine *engine, struct engine_error_count *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&engine->mutex);
    for (size_t i = 0; i < ENGINE_ERROR_SLOTS && n < max; i++)
        if (engine->errors[i].count != 0)
            out[n++] = engine->errors[i];
    pthread_mutex_unlock(&engine->mutex);
    return n;
}
