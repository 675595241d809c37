/* The registration thread: registers what is queued (PINSHIM_ASYNC=on) and,
 * as the watcher, looks for a context while ranges wait for one. */
#include "engine_internal.h"

#include <time.h>

/* Registers one queued record (a stale entry is skipped). The claim takes
 * in the run around it: should the driver refuse it, the run is cut or held
 * as its pieces say. */
static void register_queued_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    if (record == NULL || record->state != RANGE_QUEUED)
        return;
    struct engine_op op = {.engine = engine, .slot = -1};
    uintptr_t start = record->base, end = record->end;
    if (!engine_claim_locked(&op, &start, &end, 1, true, true))
        return; /* shutting down */
    record = range_registry_find(&engine->registry, base);
    if (record != NULL && record->state == RANGE_QUEUED) {
        end = record->end;
        engine->worker_busy = true;
        engine_set_state_locked(engine, record, RANGE_REGISTERING);
        uint64_t before = engine_stats(engine)->background_nanoseconds;
        struct engine_result result = engine_try_register_locked(engine, base, true);
        engine->last_background_ns = engine_stats(engine)->background_nanoseconds - before;
        if (engine_registration_failed(result) &&
            engine_registration_failed_locked(&op, base, result, true))
            engine_settle_locked(&op, base, end);
        engine->worker_busy = false;
    }
    engine_drop_claim_locked(&op);
}

/* Asks the backend, for each pending record, whether a context exists now;
 * those that have one are queued. Returns the backend's last answer. */
static enum engine_choice place_pending_locked(struct engine *engine)
{
    struct engine_waiting *head = engine->pending_head;
    engine->pending_head = engine->pending_tail = NULL;
    enum engine_choice last = ENGINE_PLACE_DEFER;
    while (head != NULL) {
        struct engine_waiting *entry = head;
        head = entry->next;
        struct range_record *record = range_registry_find(&engine->registry, entry->base);
        if (record == NULL || record->state != RANGE_PENDING) {
            node_pool_put(&engine->waiting_pool, entry);
            continue;
        }
        struct range_place hint = record->place, place = {.device = -1};
        pthread_mutex_unlock(&engine->mutex);
        last = engine->backend->choose_place(engine->backend->context, true, &hint, &place);
        pthread_mutex_lock(&engine->mutex);
        record = range_registry_find(&engine->registry, entry->base);
        if (record != NULL && record->state == RANGE_PENDING) {
            if (last == ENGINE_PLACE_READY) {
                place.register_flags = record->place.register_flags; /* how, kept */
                record->place = place;
                engine_stats(engine)->deferred_registered++;
                engine_account_state_locked(engine, record, -1);
                record->state = RANGE_QUEUED;
                engine_account_state_locked(engine, record, 1);
            } else if (last == ENGINE_PLACE_DISABLED) {
                engine_stats(engine)->dropped_pending++;
                engine_forget_record_locked(engine, entry->base);
            } else {
                /* Still waiting: back on the list (the entry is reused). */
                entry->next = NULL;
                if (engine->pending_tail != NULL)
                    engine->pending_tail->next = entry;
                else
                    engine->pending_head = entry;
                engine->pending_tail = entry;
                entry = NULL;
            }
        }
        if (entry != NULL)
            node_pool_put(&engine->waiting_pool, entry);
        if (last != ENGINE_PLACE_READY && last != ENGINE_PLACE_DISABLED) {
            /* No context yet: the rest wait as they are. */
            if (head != NULL) {
                if (engine->pending_tail != NULL)
                    engine->pending_tail->next = head;
                else
                    engine->pending_head = head;
                while (head->next != NULL)
                    head = head->next;
                engine->pending_tail = head;
            }
            break;
        }
    }
    return last;
}

void engine_worker_run(struct engine *engine, uint64_t poll_nanoseconds, bool queued_only)
{
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    pthread_mutex_lock(&engine->mutex);
    uint64_t backoff = 10ull * 1000 * 1000; /* 10 ms, doubling up to poll_nanoseconds */
    if (backoff > poll_nanoseconds)
        backoff = poll_nanoseconds;
    while (!engine->shut_down) {
        if (engine->queue_head != NULL && engine->drains_waiting == 0 && !queued_only) {
            /* A burst of locks still coming: let it settle first. */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            uint64_t quiet = 2 * engine->last_background_ns;
            if (quiet < ENGINE_QUEUE_QUIET_NANOSECONDS)
                quiet = ENGINE_QUEUE_QUIET_NANOSECONDS;
            if (quiet > ENGINE_QUEUE_QUIET_MAX_NANOSECONDS)
                quiet = ENGINE_QUEUE_QUIET_MAX_NANOSECONDS;
            uint64_t at = engine->queue_changed_ns + quiet;
            uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
            if (now_ns < at) {
                struct timespec until = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
                pthread_cond_timedwait(&engine->changed, &engine->mutex, &until);
                continue;
            }
        }
        struct engine_waiting *entry =
            engine_waiting_pop_locked(&engine->queue_head, &engine->queue_tail);
        if (entry != NULL) {
            uintptr_t base = entry->base;
            node_pool_put(&engine->waiting_pool, entry);
            register_queued_locked(engine, base);
            continue;
        }
        if (engine->pending_ranges == 0 || queued_only)
            break;
        enum engine_choice choice = place_pending_locked(engine);
        engine->pending_passes++;
        pthread_cond_broadcast(&engine->changed);
        if (choice == ENGINE_PLACE_READY || choice == ENGINE_PLACE_DISABLED) {
            backoff =
                10ull * 1000 * 1000 < poll_nanoseconds ? 10ull * 1000 * 1000 : poll_nanoseconds;
            continue;
        }
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t at = (uint64_t)deadline.tv_nsec + backoff;
        deadline.tv_sec += (time_t)(at / 1000000000u);
        deadline.tv_nsec = (long)(at % 1000000000u);
        pthread_cond_timedwait(&engine->changed, &engine->mutex, &deadline);
        backoff = backoff * 2 < poll_nanoseconds ? backoff * 2 : poll_nanoseconds;
    }
    engine->worker_active = false;
    pthread_cond_broadcast(&engine->changed);
    pthread_mutex_unlock(&engine->mutex);
    int ignored;
    pthread_setcancelstate(cancel_state, &ignored);
}

size_t engine_drain(struct engine *engine, bool look_for_context)
{
    if (!engine->registry_ok)
        return 0;
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    pthread_mutex_lock(&engine->mutex);
    engine->drains_waiting++;
    pthread_cond_broadcast(&engine->changed); /* no quiet period while a drain waits */
    if (look_for_context && engine->pending_ranges != 0 && !engine->shut_down) {
        /* The thread may sleep in its back-off or not run at all: wake it
         * and wait for one whole look, rather than look here (one thread
         * places pending ranges, so their order and counts stay simple). */
        uint64_t pass = engine->pending_passes;
        pthread_mutex_unlock(&engine->mutex);
        engine_worker_poke(engine);
        pthread_mutex_lock(&engine->mutex);
        while (!engine->shut_down && engine->worker_active && engine->pending_ranges != 0 &&
               engine->pending_passes == pass)
            pthread_cond_wait(&engine->changed, &engine->mutex);
    }
    while (!engine->shut_down && engine->worker_active &&
           (engine->queued_ranges != 0 || engine->worker_busy))
        pthread_cond_wait(&engine->changed, &engine->mutex);
    size_t pending = engine->pending_ranges;
    engine->drains_waiting--;
    pthread_mutex_unlock(&engine->mutex);
    int ignored;
    pthread_setcancelstate(cancel_state, &ignored);
    return pending;
}

void engine_worker_poke(struct engine *engine)
{
    if (!engine_active(engine) || !engine_worker_has_work(engine))
        return;
    struct engine_op op;
    engine_op_begin(&op, engine, NULL);
    engine_want_worker_locked(&op);
    engine_op_end(&op);
}
