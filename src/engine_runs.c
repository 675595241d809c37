/* Runs of locked pages: one registration each. A copy whose host range
 * leaves the registration it starts in fails (NVIDIA: "Memory regions
 * requested must be either entirely registered with CUDA, or ... not
 * registered at all"; ROCm's CLR refuses a size past the registration it
 * finds; measured on an H200: cudaErrorInvalidValue), and no driver grows or
 * cuts a registration in place. So the engine keeps, for every run of
 * locked pages that a copy may cross, one registration, or none:
 *
 *  - A run is a chain of records, each ending where the next begins, of
 *    the shim's (never the program's own registrations), not cut by a page
 *    no copy crosses (PROT_NONE, unmapped: HELD NO_ACCESS), nor by the
 *    start or end of a mapping the program made (mapping_bounds.h: two
 *    mappings are two objects, and no valid copy spans two objects).
 *  - A run that holds pages no registration may cover (HELD ONFAULT: locked
 *    with MLOCK_ONFAULT and not all resident; HELD REFUSED: a mapping the
 *    driver refuses) is held whole: registering the rest would make a copy
 *    across the held pages fail where it works unregistered. So is a run
 *    in which the program locked fewer than min_bytes (HELD SMALL).
 *  - Otherwise the run's records join into as few registrations as its
 *    pages allow: one, unless parts need other flags (READ_ONLY for
 *    read-only memory), another context, or are chunks of a run the driver
 *    refused whole. Registered parts are unregistered first (no call can
 *    grow a registration; on the H200 cuMemHostUnregister waited for a
 *    copy in flight, whose data arrived), then the whole is registered, or
 *    queued for the registration thread, or left pending for a context.
 *  - When the driver refuses the whole: the run is cut by mapping kind where
 *    those are mixed; else a run larger than max_registration_bytes goes in
 *    chunks of that size; else the part that was registered before is
 *    registered again as it was, and the rest beside it on its own (a copy
 *    across those joints fails, as before the run grew; warned once).
 *
 * Every function runs with the engine's mutex held, inside an operation
 * whose claim covers the runs it touches (engine_extend_to_runs_locked made
 * the claim so); a record outside the claim is never touched: the run is
 * taken to end there. */
#include "engine_internal.h"

#include "log.h"

#include <stdio.h>

/* A record that may be part of a run with others. */
static bool may_join(const struct range_record *record)
{
    return record->state != RANGE_PROGRAM &&
           !(record->state == RANGE_HELD && record->held == RANGE_HELD_NO_ACCESS);
}

bool engine_run_continues(struct engine *engine, const struct range_record *left,
                          const struct range_record *right)
{
    return left->end == right->base && may_join(left) && may_join(right) &&
           !mapping_bounds_split_at(engine->bounds, right->base);
}

static uintptr_t page_size_of(const struct engine *engine)
{
    return engine->options.page_size;
}

/* The first record of the run that holds record (op NULL: any record;
 * else only records the op claims). */
static struct range_record *run_first(struct engine *engine, const struct engine_op *op,
                                      struct range_record *record)
{
    while (record->base > 0) {
        struct range_record *left = range_registry_containing(&engine->registry, record->base - 1);
        if (left == NULL || !engine_run_continues(engine, left, record) ||
            (op != NULL && !engine_op_claims(op, left->base, left->end)))
            break;
        record = left;
    }
    return record;
}

static struct range_record *run_last(struct engine *engine, const struct engine_op *op,
                                     struct range_record *record)
{
    for (;;) {
        struct range_record *right = range_registry_find(&engine->registry, record->end);
        if (right == NULL || !engine_run_continues(engine, record, right) ||
            (op != NULL && !engine_op_claims(op, right->base, right->end)))
            break;
        record = right;
    }
    return record;
}

void engine_extend_to_runs_locked(struct engine *engine, uintptr_t *start, uintptr_t *end)
{
    uintptr_t page = page_size_of(engine);
    /* The whole records at the ends, */
    struct range_record *first = range_registry_containing(&engine->registry, *start);
    if (first != NULL && first->base < *start)
        *start = first->base;
    struct range_record *last =
        *end > *start ? range_registry_containing(&engine->registry, *end - 1) : NULL;
    if (last != NULL && last->end > *end)
        *end = last->end;
    /* then the runs that end right before them or start right after. */
    struct range_record *left =
        *start >= page ? range_registry_containing(&engine->registry, *start - page) : NULL;
    if (left != NULL) {
        uintptr_t base = run_first(engine, NULL, left)->base;
        if (base < *start)
            *start = base;
    }
    struct range_record *right =
        *end < PAGE_INDEX_LIMIT ? range_registry_containing(&engine->registry, *end) : NULL;
    if (right != NULL) {
        uintptr_t last_end = run_last(engine, NULL, right)->end;
        if (last_end > *end)
            *end = last_end;
    }
}

/* ---- places ---- */

/* Whether the place was chosen (a context known), not deferred. */
static bool place_chosen(const struct range_place *place)
{
    return !(place->flags & RANGE_PLACE_DEFERRED);
}

/* Whether two places are the same context: the same device and, when it is
 * not that device's primary context, the same context handle; or both hold
 * in every context (of the same driver). */
static bool same_place(const struct range_place *a, const struct range_place *b)
{
    if ((a->flags & RANGE_PLACE_ANY_CONTEXT) && (b->flags & RANGE_PLACE_ANY_CONTEXT))
        return a->context == b->context;
    return a->device == b->device && a->context == b->context &&
           (a->flags & RANGE_PLACE_THREAD_CONTEXT) == (b->flags & RANGE_PLACE_THREAD_CONTEXT);
}

/* ---- holding a run ---- */

static bool holds_run(const struct range_record *record)
{
    return record->state == RANGE_HELD &&
           (record->held == RANGE_HELD_ONFAULT || record->held == RANGE_HELD_REFUSED);
}

/* Takes the registration of a REGISTERED record away so that it can join
 * others or be held; false when the runtime may still hold it (then it is
 * forgotten, as a failed unregistration is: its record is held FAILED). */
static bool undo_registration_locked(struct engine *engine, uintptr_t base)
{
    struct engine_result result =
        engine_unregister_record_locked(engine, base, RELEASE_JOIN, false);
    struct range_record *record = range_registry_find(&engine->registry, base);
    bool undone = result.outcome == ENGINE_OK || result.outcome == ENGINE_NOT_REGISTERED;
    engine_set_held_locked(engine, record, undone ? RANGE_HELD_NEW : RANGE_HELD_FAILED);
    return undone;
}

/* Holds every record of the run [start, end): those that hold it keep their
 * reason, the others take reason (SMALL or BESIDE); neighbours held for the
 * same reason join. */
static void hold_run_locked(struct engine *engine, uintptr_t start, uintptr_t end,
                            enum range_held reason)
{
    uintptr_t cursor = start;
    while (cursor < end) {
        struct range_record *record = range_registry_find(&engine->registry, cursor);
        if (record == NULL)
            break;
        uintptr_t base = record->base;
        cursor = record->end;
        if (record->state == RANGE_REGISTERED) {
            undo_registration_locked(engine, base);
            record = range_registry_find(&engine->registry, base);
        }
        if (!holds_run(record))
            engine_set_held_locked(engine, record, reason);
    }
    /* Fewer records: neighbours held alike become one. */
    for (struct range_record *record = range_registry_find(&engine->registry, start);
         record != NULL && record->end < end;) {
        struct range_record *next = range_registry_find(&engine->registry, record->end);
        if (next != NULL && next->held == record->held &&
            next->place.register_flags == record->place.register_flags &&
            place_chosen(&next->place) == place_chosen(&record->place) &&
            (!place_chosen(&record->place) || same_place(&next->place, &record->place)))
            record = engine_join_locked(engine, record->base);
        else
            record = next;
    }
}

/* ---- registering a run ---- */

/* Whether next may share one registration with the records before it
 * (whose place, if chosen, is place). */
static bool shares_registration(const struct range_record *first, const struct range_place *place,
                                const struct range_record *next)
{
    if (first->chunk || next->chunk)
        return false;
    if (first->place.register_flags != next->place.register_flags)
        return false;
    return !place_chosen(place) || !place_chosen(&next->place) || same_place(place, &next->place);
}

/* The state a record of this place waits in before registration. */
static enum range_state waiting_state(const struct engine *engine, const struct range_place *place)
{
    if (!place_chosen(place))
        return RANGE_PENDING;
    if (engine->options.asynchronous && !(place->flags & RANGE_PLACE_THREAD_CONTEXT))
        return RANGE_QUEUED;
    return RANGE_REGISTERING;
}

/* A group of one record is already what it should be: registered, queued
 * (its place chosen), or pending (none yet). */
static bool group_settled(const struct range_record *record)
{
    return record->state == RANGE_REGISTERED ||
           (record->state == RANGE_QUEUED && place_chosen(&record->place)) ||
           (record->state == RANGE_PENDING && !place_chosen(&record->place));
}

/* Registers the group of records [start, end) as one: registered parts are
 * unregistered, the records join, and the whole is registered, queued or
 * left pending. Returns true when the run must be settled again. */
static bool register_group_locked(struct engine_op *op, uintptr_t start, uintptr_t end,
                                  struct range_place place)
{
    struct engine *engine = op->engine;
    struct range_record *first = range_registry_find(&engine->registry, start);
    if (first->end == end && group_settled(first))
        return false;
    if (!place_chosen(&place)) {
        /* Made of locks too small to ask where they would go (no runtime is
         * touched for those): asked now, as a lock of this size would. */
        struct range_place chosen = {.device = -1};
        pthread_mutex_unlock(&engine->mutex);
        enum engine_choice choice =
            engine->backend->choose_place(engine->backend->context, false, NULL, &chosen);
        pthread_mutex_lock(&engine->mutex);
        if (choice == ENGINE_PLACE_READY) {
            chosen.register_flags = place.register_flags;
            place = chosen;
        }
    }
    /* The largest part registered now, to register again as it was should
     * the whole be refused. */
    uintptr_t kept_start = 0, kept_end = 0;
    bool again = false;
    for (uintptr_t cursor = start; cursor < end;) {
        struct range_record *record = range_registry_find(&engine->registry, cursor);
        uintptr_t base = record->base;
        cursor = record->end;
        if (record->state == RANGE_REGISTERED) {
            if (record->end - base > kept_end - kept_start) {
                kept_start = base;
                kept_end = record->end;
            }
            if (!undo_registration_locked(engine, base))
                again = true; /* stuck in the runtime: the group is cut there */
        } else if (record->state != RANGE_HELD) {
            engine_set_held_locked(engine, record, RANGE_HELD_NEW);
        }
    }
    if (again)
        return true;
    struct range_record *whole = range_registry_find(&engine->registry, start);
    while (whole != NULL && whole->end < end)
        whole = engine_join_locked(engine, start);
    if (whole == NULL)
        return false;
    bool registered_before = kept_end != 0;
    whole->kept_start =
        registered_before && (kept_start != start || kept_end != end) ? kept_start : 0;
    whole->kept_end = whole->kept_start != 0 ? kept_end : 0;
    whole->place = place;
    whole->held = RANGE_HELD_NEW;
    enum range_state state = waiting_state(engine, &place);
    engine_set_state_locked(engine, whole, state);
    if (registered_before)
        engine_stats(engine)->runs_joined++;
    if (state == RANGE_PENDING) {
        engine_stats(engine)->deferred_total++;
        engine_want_worker_locked(op); /* the watcher */
        return false;
    }
    if (state == RANGE_QUEUED) {
        engine_want_worker_locked(op);
        return false;
    }
    struct engine_result result = engine_try_register_locked(engine, start, false);
    return engine_registration_failed(result) &&
           engine_registration_failed_locked(op, start, result, false);
}

/* One pass over the run [start, end); true when it must be looked at again
 * (a failure cut it by mapping kind, or a registration is stuck). */
static bool settle_run_locked(struct engine_op *op, uintptr_t start, uintptr_t end)
{
    struct engine *engine = op->engine;
    bool held = false;
    for (uintptr_t cursor = start; cursor < end;) {
        struct range_record *record = range_registry_find(&engine->registry, cursor);
        if (record == NULL)
            return false;
        held = held || holds_run(record);
        cursor = record->end;
    }
    /* A run's size is what the program locked in it: a lock shorter than
     * min_bytes alone is not registered, whatever pages it touches. */
    uint64_t min_bytes = engine->options.min_bytes;
    if (held || (min_bytes != 0 &&
                 lock_bytes_count(&engine->lock_bytes, start, end, min_bytes) < min_bytes)) {
        hold_run_locked(engine, start, end, held ? RANGE_HELD_BESIDE : RANGE_HELD_SMALL);
        return false;
    }
    /* Groups of records that may share a registration, each registered as
     * one. The place of a group: its first registered part's, else its
     * first chosen one's, else none yet (pending). */
    uintptr_t cursor = start;
    bool again = false;
    while (cursor < end) {
        struct range_record *first = range_registry_find(&engine->registry, cursor);
        uintptr_t group_start = first->base, group_end = first->end;
        struct range_place place = first->place;
        bool from_registered = first->state == RANGE_REGISTERED;
        for (;;) {
            struct range_record *next = range_registry_find(&engine->registry, group_end);
            if (group_end >= end || next == NULL || !shares_registration(first, &place, next))
                break;
            if (!from_registered && place_chosen(&next->place) &&
                (next->state == RANGE_REGISTERED || !place_chosen(&place))) {
                place = next->place;
                from_registered = next->state == RANGE_REGISTERED;
            }
            group_end = next->end;
            first = range_registry_find(&engine->registry, group_start);
        }
        cursor = group_end;
        if (register_group_locked(op, group_start, group_end, place))
            again = true;
    }
    return again;
}

void engine_settle_locked(struct engine_op *op, uintptr_t start, uintptr_t end)
{
    struct engine *engine = op->engine;
    if (engine->shut_down)
        return;
    uintptr_t page = page_size_of(engine);
    uintptr_t from = start >= page ? start - page : 0;
    uintptr_t to = end <= PAGE_INDEX_LIMIT - page ? end + page : PAGE_INDEX_LIMIT;
    uintptr_t cursor = from;
    unsigned passes = 0;
    while (cursor < to) {
        struct range_record *record = range_registry_first_overlap(&engine->registry, cursor, to);
        if (record == NULL)
            break;
        if (!may_join(record) || !engine_op_claims(op, record->base, record->end)) {
            cursor = record->end;
            continue;
        }
        uintptr_t run_start = run_first(engine, op, record)->base;
        uintptr_t run_end = run_last(engine, op, record)->end;
        /* A pass that cut the run (by mapping kind, or around a stuck
         * registration) is followed by one over what it became; a few at
         * most, each cut making the parts smaller. */
        if (settle_run_locked(op, run_start, run_end) && ++passes < 8) {
            cursor = run_start;
            continue;
        }
        cursor = run_end;
    }
}

/* ---- when the driver refuses a run ---- */

/* Registers the record at base alone; a refusal holds it FAILED (counted
 * by the caller's first failure). */
static void register_piece_locked(struct engine *engine, uintptr_t base, bool on_worker)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    record->kept_start = record->kept_end = 0;
    engine_set_state_locked(engine, record, RANGE_REGISTERING);
    struct engine_result result = engine_try_register_locked(engine, base, on_worker);
    if (engine_registration_failed(result)) {
        engine_count_register_failure_locked(engine, base, result);
        engine_set_held_locked(engine, range_registry_find(&engine->registry, base),
                               RANGE_HELD_FAILED);
    }
}

/* Says once per process, and per kind, that a run went in pieces. */
static void warn_once(struct engine *engine, uint32_t bit, const char *what, uintptr_t base,
                      size_t length, int code, const char *how)
{
    if (__atomic_fetch_or(&engine->warned_runs, bit, __ATOMIC_RELAXED) & bit)
        return;
    char size[32];
    log_format_bytes(length, size, sizeof(size));
    log_warn("the driver refused the run of locked pages at %#lx (%s) %s (code %d); %s; a copy "
             "across those joints fails where it works without the shim (warned once)",
             (unsigned long)base, size, what, code, how);
}

bool engine_registration_failed_locked(struct engine_op *op, uintptr_t base,
                                       struct engine_result result, bool on_worker)
{
    struct engine *engine = op->engine;
    /* A 712 comes from a registration the shim did not make (counted as
     * such at once): the mappings are not why. Mixed mappings: pieces of
     * one kind each, settled again. */
    bool already = result.outcome == ENGINE_ALREADY_REGISTERED;
    if (already)
        engine_count_register_failure_locked(engine, base, result);
    else if (engine_cut_by_mapping_kinds_locked(engine, base))
        return true;
    struct range_record *record = range_registry_find(&engine->registry, base);
    uintptr_t end = record->end, length = end - base;
    /* What was registered before, within the record as it is now (a release
     * since may have cut the record). */
    uintptr_t kept_start = engine_max_address(record->kept_start, base);
    uintptr_t kept_end = engine_min_address(record->kept_end, end);
    if (record->kept_end == 0 || kept_start >= kept_end || (kept_start == base && kept_end == end))
        kept_start = kept_end = 0;
    uint64_t chunk = engine->options.max_registration_bytes;
    uintptr_t page = page_size_of(engine);
    if (chunk < page)
        chunk = page;
    chunk &= ~(uint64_t)(page - 1);
    if (!already && length > chunk &&
        range_registry_reserve(&engine->registry, (size_t)(length / chunk) + 1)) {
        /* Too large for one call (R580 drivers refuse 512 GiB and more):
         * chunks, each joined with nothing from now on. */
        engine_stats(engine)->runs_chunked++;
        warn_once(engine, ENGINE_WARNED_CHUNKED, "in one call", base, length, result.code,
                  "it is registered in chunks of PINSHIM_MAX_REGISTRATION");
        for (uintptr_t at = base; at < end; at += chunk) {
            uintptr_t stop = end - at > chunk ? at + chunk : end;
            struct range_record *part = engine_isolate_locked(
                engine, range_registry_containing(&engine->registry, at)->base, at, stop);
            part->chunk = 1;
            register_piece_locked(engine, at, on_worker);
        }
        return false;
    }
    if (kept_end != 0 && range_registry_reserve(&engine->registry, 2)) {
        /* The run grew (or joined others) and the whole is refused: what was
         * registered before is registered again as it was, the rest apart. */
        engine_stats(engine)->join_failed++;
        warn_once(engine, ENGINE_WARNED_JOIN_FAILED, "after it grew", base, length, result.code,
                  "its old registration is made again and the pages beside it apart");
        uintptr_t cuts[4] = {base, kept_start, kept_end, end};
        for (int i = 0; i < 3; i++)
            if (cuts[i] < cuts[i + 1])
                engine_isolate_locked(engine,
                                      range_registry_containing(&engine->registry, cuts[i])->base,
                                      cuts[i], cuts[i + 1]); /* room was reserved */
        for (int i = 0; i < 3; i++)
            if (cuts[i] < cuts[i + 1])
                register_piece_locked(engine, cuts[i], on_worker);
        return false;
    }
    /* Held FAILED: counted, and tried again whenever its run changes. */
    if (!already)
        engine_count_register_failure_locked(engine, base, result);
    record = range_registry_find(&engine->registry, base);
    record->kept_start = record->kept_end = 0;
    engine_set_held_locked(engine, record, RANGE_HELD_FAILED);
    return false;
}
