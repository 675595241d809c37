/* The protocol: how a lock registers, how an unlock, unmap or free releases,
 * and how a failed call puts back what it took. Each entry point below
 * claims its pages (and the runs they touch), releases what must go before
 * the real call, runs it, tracks, settles (engine_runs.c) or restores what
 * the outcome asks for, and ends. */
#include "engine_internal.h"

#include "log.h"

#include <errno.h>

/* A release runs before the real munlock, free or munmap: a mapping the
 * shim made there could fill a hole the program's call is about to meet (it
 * did under qemu-user, whose mmap goes upwards: the piece pool's first chunk
 * landed right past a mapping that the model then unlocked across its end,
 * and munlock returned 0 instead of ENOMEM). So what a release needs (its
 * ticket's pieces, the registry's slots for splitting a range at both ends)
 * is made ready here, after a lock or map call has returned. A release that
 * needs more still gets it, as before. */
#define RELEASE_RESERVED_PIECES 64
#define RELEASE_RESERVED_SPLITS 2

static void reserve_for_releases_locked(struct engine *engine)
{
    node_pool_reserve(&engine->piece_pool, RELEASE_RESERVED_PIECES);
    range_registry_reserve(&engine->registry, RELEASE_RESERVED_SPLITS);
}

bool engine_track_range_locked(struct engine_op *op, uintptr_t start, uintptr_t end,
                               enum engine_choice choice, const struct range_place *place,
                               enum range_held hold)
{
    struct engine *engine = op->engine;
    struct range_registry *registry = &engine->registry;
    if (engine_stats(engine)->program_registrations != 0)
        engine_mark_program_locked_locked(engine, start, end);
    struct range_place chosen = *place;
    if (chosen.register_flags == 0)
        chosen.register_flags = (uint8_t)engine_normalized_flags(engine->options.register_flags);
    if (choice != ENGINE_PLACE_READY)
        chosen.flags |= RANGE_PLACE_DEFERRED;
    else
        chosen.flags &= (uint16_t)~RANGE_PLACE_DEFERRED;
    uintptr_t cursor = start;
    while (cursor < end) {
        uintptr_t gap_start, gap_end = end;
        if (!page_index_find_next(&registry->index, PAGE_INDEX_USED, false, cursor, end,
                                  &gap_start))
            break;
        if (!page_index_find_next(&registry->index, PAGE_INDEX_USED, true, gap_start, end,
                                  &gap_end))
            gap_end = end;
        /* A record never spans the bound between two mappings: runs are cut
         * between records only. */
        gap_end = mapping_bounds_next_split(engine->bounds, gap_start, gap_end);
        cursor = gap_end;
        struct range_record record = {
            .base = gap_start,
            .end = gap_end,
            .place = chosen,
            .state = RANGE_HELD,
            .held = (uint8_t)hold,
        };
        if (engine_insert_record_locked(engine, &record) == NULL) {
            engine_stats(engine)->counters.register_failed++;
            engine_note_change_locked(engine);
            log_warn("out of memory for the range registry; %#lx + %lu bytes stay unregistered",
                     (unsigned long)gap_start, (unsigned long)(gap_end - gap_start));
            return false;
        }
    }
    if (hold != RANGE_HELD_NEW)
        return true;
    /* A plain lock faults every page in: pages an MLOCK_ONFAULT lock left
     * held are resident now. */
    for (cursor = start; cursor < end;) {
        struct range_record *record = range_registry_first_overlap(registry, cursor, end);
        if (record == NULL)
            break;
        cursor = record->end;
        if (record->state != RANGE_HELD || record->held != RANGE_HELD_ONFAULT)
            continue;
        struct range_record *part =
            engine_isolate_locked(engine, record->base, engine_max_address(record->base, start),
                                  engine_min_address(record->end, end));
        if (part != NULL)
            part->held = RANGE_HELD_NEW;
    }
    return true;
}

void engine_add_range_locked(struct engine_op *op, uintptr_t start, uintptr_t end,
                             uintptr_t lock_start, uintptr_t lock_end, enum engine_choice choice,
                             const struct range_place *place, enum range_held hold)
{
    struct engine *engine = op->engine;
    if (choice == ENGINE_PLACE_DISABLED || engine->shut_down)
        return;
    engine_track_range_locked(op, start, end, choice, place, hold);
    engine_lock_bytes_add_locked(engine, engine_max_address(lock_start, start),
                                 engine_min_address(lock_end, end));
    engine_settle_locked(op, start, end);
    reserve_for_releases_locked(engine);
}

/* ---- releasing ---- */

static void ticket_add_locked(struct engine *engine, struct engine_ticket *ticket,
                              const struct range_record *record, uintptr_t start, uintptr_t end,
                              uint8_t state)
{
    if (ticket == NULL)
        return;
    struct engine_piece *piece = node_pool_get(&engine->piece_pool);
    if (piece == NULL) {
        log_warn("out of memory recording %#lx + %lu bytes; they will not be registered again "
                 "if the call fails",
                 (unsigned long)start, (unsigned long)(end - start));
        return;
    }
    piece->start = start;
    piece->end = end;
    if (record->state == RANGE_PROGRAM) {
        piece->program_start = record->program_start;
        piece->program_end = record->program_end;
    }
    piece->place = record->place;
    piece->state = state;
    piece->program_locked = record->program_locked;
    piece->held = record->held;
    piece->next = ticket->head;
    ticket->head = piece;
}

void engine_ticket_discard_locked(struct engine *engine, struct engine_ticket *ticket)
{
    while (ticket->head != NULL) {
        struct engine_piece *piece = ticket->head;
        ticket->head = piece->next;
        node_pool_put(&engine->piece_pool, piece);
    }
}

/* The call that released the ticket's pieces (and a freed block's bytes)
 * succeeded: their lock bytes go. */
static void commit_release_locked(struct engine *engine, struct engine_ticket *ticket,
                                  const struct release_request *request)
{
    if (ticket != NULL) {
        for (struct engine_piece *piece = ticket->head; piece != NULL; piece = piece->next)
            engine_lock_bytes_remove_locked(engine, piece->start, piece->end);
        engine_ticket_discard_locked(engine, ticket);
    }
    if (request->block)
        engine_lock_bytes_remove_locked(engine, request->block_start, request->block_end);
}

/* Releases the part [start, end) of the record at base. What is left of a
 * registered record is held, to be registered again as its run says (no
 * runtime unregisters part of a registration). */
static void release_part_locked(struct engine_op *op, uintptr_t base, uintptr_t start,
                                uintptr_t end, const struct release_request *request)
{
    struct engine *engine = op->engine;
    struct range_record *record = range_registry_find(&engine->registry, base);
    uint8_t state = record->state;
    if (state != RANGE_REGISTERED) {
        /* Nothing was registered by the shim: no backend call. */
        struct range_record *part = engine_isolate_locked(engine, base, start, end);
        if (part == NULL) {
            log_warn("out of memory splitting a record; %#lx + %lu bytes are forgotten",
                     (unsigned long)base, (unsigned long)(record->end - base));
            part = range_registry_find(&engine->registry, base);
            start = part->base;
            end = part->end;
        }
        if (request->reason != RELEASE_EXIT && state == RANGE_PENDING)
            engine_stats(engine)->dropped_pending++;
        else if (request->reason != RELEASE_EXIT && state == RANGE_QUEUED)
            engine_stats(engine)->cancelled_queued++;
        ticket_add_locked(engine, request->ticket, part, start, end, state);
        engine_remove_record_locked(engine, start);
        return;
    }
    /* RANGE_REGISTERED (claims keep the in-flight states away). Split first,
     * while nothing is in flight, so the remainder keeps its pages marked. */
    uintptr_t whole_start = record->base, whole_end = record->end;
    struct range_record saved = *record;
    if (!range_registry_reserve(&engine->registry, 2)) {
        start = whole_start; /* cannot split: the whole registration goes */
        end = whole_end;
    }
    struct engine_result result =
        engine_unregister_record_locked(engine, base, request->reason, false);
    bool can_reregister = result.outcome == ENGINE_OK || result.outcome == ENGINE_NOT_REGISTERED;
    if (!can_reregister || request->reason == RELEASE_EXIT) {
        /* The runtime may still hold it: registering parts again would
         * overlap. Forget the whole registration, and the lock bytes of its
         * pages outside the call's (untracked now; the call's own go when it
         * succeeds). */
        engine_remove_record_locked(engine, base);
        if (request->reason != RELEASE_EXIT) {
            uintptr_t left_end = start, right_start = end;
            engine_lock_bytes_remove_locked(engine, whole_start, left_end);
            engine_lock_bytes_remove_locked(engine, right_start, whole_end);
        }
        return;
    }
    ticket_add_locked(engine, request->ticket, &saved, start, end, RANGE_REGISTERED);
    struct range_record *part = engine_isolate_locked(engine, base, start, end);
    /* isolate cannot fail here: room was reserved. */
    engine_remove_record_locked(engine, part->base);
    uintptr_t rests[2] = {whole_start < start ? whole_start : 0, end < whole_end ? end : 0};
    for (int i = 0; i < 2; i++) {
        if (rests[i] == 0)
            continue;
        struct range_record *rest = range_registry_find(&engine->registry, rests[i]);
        rest->kept_start = rest->kept_end = 0;
        engine_set_held_locked(engine, rest, RANGE_HELD_NEW);
    }
}

/* Whether the page at page holds lock bytes outside the block [start, end). */
static bool page_keeps_other_bytes(struct engine *engine, uintptr_t page, uintptr_t start,
                                   uintptr_t end)
{
    uintptr_t page_end = page + engine->options.page_size;
    return lock_bytes_any(&engine->lock_bytes, page, engine_min_address(start, page_end)) ||
           lock_bytes_any(&engine->lock_bytes, engine_max_address(end, page), page_end);
}

/* Releases every record overlapping request's pages (for a block: those
 * the block rule gives back), then settles the runs around them. The op's
 * claim covers them and the runs they are in. */
void engine_release_locked(struct engine_op *op, const struct release_request *request)
{
    struct engine *engine = op->engine;
    uintptr_t page = engine->options.page_size;
    uintptr_t release_start = request->start, release_end = request->end;
    if (request->block && release_start < release_end) {
        /* Every page the block touches goes, but for a first or last page
         * that holds lock bytes of other memory: a neighbour's lock that
         * shares it, which free does not undo. */
        if (page_keeps_other_bytes(engine, release_start, request->block_start, request->block_end))
            release_start += page;
        if (release_start < release_end &&
            page_keeps_other_bytes(engine, release_end - page, request->block_start,
                                   request->block_end))
            release_end -= page;
    }
    uintptr_t cursor = release_start;
    while (cursor < release_end) {
        struct range_record *record =
            range_registry_first_overlap(&engine->registry, cursor, release_end);
        if (record == NULL)
            break;
        uintptr_t base = record->base, record_end = record->end;
        uintptr_t start = engine_max_address(base, release_start);
        uintptr_t end = engine_min_address(record_end, release_end);
        cursor = record_end;
        if (record->state == RANGE_PROGRAM &&
            (request->reason == RELEASE_MUNLOCK || request->reason == RELEASE_EXIT ||
             request->reason == RELEASE_PROGRAM)) {
            /* The program's registration does not depend on the lock; the
             * unlocked pages are no longer to be taken back when the program
             * unregisters (should munlock fail, they stay unmarked: no
             * take-back, never a registration of unlocked memory). */
            if (request->reason == RELEASE_MUNLOCK && record->program_locked) {
                struct range_record *part = engine_isolate_locked(engine, base, start, end);
                if (part != NULL)
                    part->program_locked = 0;
            }
            continue;
        }
        release_part_locked(op, base, start, end, request);
    }
    if (request->reason != RELEASE_EXIT)
        engine_settle_locked(op, request->start, request->end);
}

void engine_restore_locked(struct engine_op *op, struct engine_ticket *ticket, uintptr_t clip_start,
                           uintptr_t clip_end, bool only_mapped)
{
    struct engine *engine = op->engine;
    uintptr_t low = UINTPTR_MAX, high = 0;
    for (struct engine_piece *piece = ticket->head; piece != NULL; piece = piece->next) {
        uintptr_t start = engine_max_address(piece->start, clip_start);
        uintptr_t end = engine_min_address(piece->end, clip_end);
        if (start >= end)
            continue;
        if (only_mapped && engine->backend->is_mapped != NULL &&
            !engine->backend->is_mapped(engine->backend->context, start, end))
            continue;
        low = engine_min_address(low, start);
        high = engine_max_address(high, end);
        if (piece->state == RANGE_PROGRAM) {
            /* The call failed: the memory, and the program's registration of
             * it, are still there. */
            struct range_record record = {.base = start,
                                          .end = end,
                                          .program_start = piece->program_start,
                                          .program_end = piece->program_end,
                                          .place = piece->place,
                                          .state = RANGE_PROGRAM,
                                          .program_locked = piece->program_locked};
            engine_insert_record_locked(engine, &record);
            continue;
        }
        engine_track_range_locked(op, start, end, engine_piece_choice(piece), &piece->place,
                                  engine_piece_hold(piece));
    }
    engine_ticket_discard_locked(engine, ticket);
    if (low < high)
        engine_settle_locked(op, low, high);
}

/* ---- entry points ---- */

static void count_resident_part(void *context, uintptr_t start, uintptr_t end)
{
    *(uint64_t *)context += end - start;
}

/* What an MLOCK_ONFAULT lock of [start, end) leaves: held (ONFAULT) unless
 * PINSHIM_ONFAULT says to register it whole, or every page is resident.
 * Called without the mutex. */
static enum range_held onfault_hold(struct engine *engine, uintptr_t start, uintptr_t end)
{
    uint64_t total = end - start, resident = 0;
    if (engine->options.onfault == ENGINE_ONFAULT_ALL)
        return RANGE_HELD_NEW;
    if (engine->options.onfault == ENGINE_ONFAULT_RESIDENT) {
        if (engine->backend->resident_parts == NULL)
            return RANGE_HELD_NEW;
        engine->backend->resident_parts(engine->backend->context, start, end, count_resident_part,
                                        &resident);
        if (resident >= total)
            return RANGE_HELD_NEW;
    }
    __atomic_fetch_add(&engine_stats(engine)->skipped_onfault_pages,
                       (total - resident) / engine->options.page_size, __ATOMIC_RELAXED);
    if (!(__atomic_fetch_or(&engine->warned_runs, ENGINE_WARNED_HELD_ONFAULT, __ATOMIC_RELAXED) &
          ENGINE_WARNED_HELD_ONFAULT))
        log_info("mlock2(MLOCK_ONFAULT) left %lu of %lu bytes at %#lx not resident: the run of "
                 "locked pages they are in stays unregistered until they are locked whole "
                 "(PINSHIM_ONFAULT; logged once)",
                 (unsigned long)(total - resident), (unsigned long)total, (unsigned long)start);
    return RANGE_HELD_ONFAULT;
}

long engine_lock(struct engine *engine, uintptr_t addr, size_t length, unsigned flags,
                 const struct engine_call *call)
{
    if (!engine_active(engine))
        return engine_run_plain(call);
    uintptr_t start, end;
    /* A lock of no bytes (the kernel still locks the page of an unaligned
     * address) asks for nothing the shim keeps: it would be a page tracked
     * with no lock bytes, which no free could find again. */
    if (length == 0)
        return engine_run_plain(call);
    if (!engine_byte_range_pages(engine, addr, length, &start, &end)) {
        engine_count(&engine_stats(engine)->skipped_address);
        return engine_run_plain(call);
    }
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    engine_claim_locked(&op, &start, &end, 1, true, false);
    engine_prefetch_locked(engine, start, end); /* arrives during the real call */
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    if (result == 0 && !engine->shut_down) {
        pthread_mutex_unlock(&engine->mutex);
        /* A lock below min_bytes asks the runtime nothing (a process that
         * locks only small things never loads one): its place is chosen if
         * its run grows large enough to be registered. */
        struct range_place place = {.device = -1};
        enum engine_choice choice =
            length < engine->options.min_bytes
                ? ENGINE_PLACE_DEFER
                : engine->backend->choose_place(engine->backend->context, false, NULL, &place);
        enum range_held hold = RANGE_HELD_NEW;
        if (choice != ENGINE_PLACE_DISABLED && (flags & ENGINE_LOCK_ONFAULT))
            hold = onfault_hold(engine, start, end);
        pthread_mutex_lock(&engine->mutex);
        if (choice == ENGINE_PLACE_DISABLED) {
            engine_count(&engine_stats(engine)->skipped_disabled);
        } else {
            engine_add_range_locked(&op, start, end, addr, addr + length, choice, &place, hold);
            struct range_record *record = range_registry_containing(&engine->registry, start);
            if (length < engine->options.min_bytes && record != NULL && record->state == RANGE_HELD)
                engine_count(&engine_stats(engine)->skipped_small);
        }
    }
    engine_op_end(&op);
    errno = call_errno;
    return result;
}

long engine_map(struct engine *engine, uintptr_t fixed_start, size_t length, bool replaces,
                bool locks, const struct engine_call *call)
{
    uintptr_t start = 0, end = 0;
    if (!engine_active(engine) ||
        (replaces && !engine_byte_range_pages(engine, fixed_start, length, &start, &end)) ||
        (replaces && !locks && !engine_may_overlap(engine, start, end))) {
        long result = engine_run_plain(call);
        uintptr_t map_start, map_end;
        if (result != -1 &&
            engine_byte_range_pages(engine, (uintptr_t)result, length, &map_start, &map_end))
            mapping_bounds_note_mapped(engine->bounds, map_start, map_end);
        return result;
    }
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    struct engine_ticket ticket = {0};
    struct release_request request = {start, end, RELEASE_MMAP_FIXED, &ticket, false, 0, 0};
    if (replaces) {
        engine_claim_locked(&op, &start, &end, 1, true, false);
        request.start = start;
        request.end = end;
        engine_release_locked(&op, &request);
    }
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    bool failed = result == -1; /* MAP_FAILED */
    if (failed) {
        /* MAP_FIXED may have unmapped the old pages before failing. */
        engine_restore_locked(&op, &ticket, 0, UINTPTR_MAX, true);
    } else {
        commit_release_locked(engine, &ticket, &request);
        uintptr_t map_start, map_end;
        bool pages =
            engine_byte_range_pages(engine, (uintptr_t)result, length, &map_start, &map_end);
        /* A new object: its locked pages join no neighbour's run. */
        if (pages)
            mapping_bounds_note_mapped(engine->bounds, map_start, map_end);
        if (locks && pages) {
            pthread_mutex_unlock(&engine->mutex);
            struct range_place place = {.device = -1};
            enum engine_choice choice =
                engine->backend->choose_place(engine->backend->context, false, NULL, &place);
            pthread_mutex_lock(&engine->mutex);
            if (choice == ENGINE_PLACE_DISABLED)
                engine_count(&engine_stats(engine)->skipped_disabled);
            /* A new mapping: only a racing call on addresses it did not own
             * yet could claim it; then it stays unregistered. */
            else if (engine_op_claims(&op, map_start, map_end) ||
                     (op.slot < 0 ? engine_claim_locked(&op, &map_start, &map_end, 1, false, true)
                                  : engine_claim_more_locked(&op, map_start, map_end)))
                engine_add_range_locked(&op, map_start, map_end, (uintptr_t)result,
                                        (uintptr_t)result + length, choice, &place, RANGE_HELD_NEW);
        }
    }
    engine_op_end(&op);
    errno = call_errno;
    return result;
}

/* The first page in [start, end) that is not mapped, or end (binary search
 * on the length of the mapped prefix). */
static uintptr_t first_unmapped_page(struct engine *engine, uintptr_t start, uintptr_t end)
{
    bool (*is_mapped)(void *, uintptr_t, uintptr_t) = engine->backend->is_mapped;
    void *context = engine->backend->context;
    if (is_mapped == NULL || is_mapped(context, start, end))
        return end;
    uintptr_t page = engine->options.page_size;
    uintptr_t mapped_pages = 0, total_pages = (end - start) / page;
    while (total_pages - mapped_pages > 1) {
        uintptr_t middle = mapped_pages + (total_pages - mapped_pages) / 2;
        if (is_mapped(context, start, start + middle * page))
            mapped_pages = middle;
        else
            total_pages = middle;
    }
    return start + mapped_pages * page;
}

/* munmap with the op holding [start, end): its bounds go with the call
 * (mapping_bounds_unmap_begin). Before the op held the pages, another op
 * could take the pages on both sides of a bound for one run and register
 * them as one. */
struct unmapping_call {
    const struct engine_call *call;
    struct mapping_bounds *bounds;
    uintptr_t start, end;
};

static long run_unmapping(void *arguments)
{
    struct unmapping_call *unmapping = arguments;
    struct mapping_bounds_unmap unmap;
    mapping_bounds_unmap_begin(unmapping->bounds, &unmap, unmapping->start, unmapping->end);
    long result = unmapping->call->run(unmapping->call->arguments);
    int call_errno = errno;
    mapping_bounds_unmap_end(unmapping->bounds, &unmap, result == 0);
    errno = call_errno;
    return result;
}

/* The call, with munmap's range leaving the bounds before it where no page
 * of it is tracked. */
static long run_plain_release(struct engine *engine, uintptr_t start, uintptr_t end,
                              enum release_reason reason, const struct engine_call *call)
{
    if (reason == RELEASE_MUNMAP) {
        int saved_errno = errno;
        mapping_bounds_note_unmapped(engine->bounds, start, end);
        errno = saved_errno;
    }
    return engine_run_plain(call);
}

long engine_unlock(struct engine *engine, uintptr_t start, uintptr_t end,
                   enum release_reason reason, enum engine_failure_rule failure,
                   const struct engine_call *call)
{
    if (end > PAGE_INDEX_LIMIT)
        end = PAGE_INDEX_LIMIT;
    if (!engine_active(engine) || start >= end)
        return run_plain_release(engine, start, end, reason, call);
    /* Only munlock must claim pages that hold no record: a lock of a buffer
     * sharing a page may be running, and munlock undoes its lock. */
    if (reason != RELEASE_MUNLOCK && !engine_may_overlap(engine, start, end))
        return run_plain_release(engine, start, end, reason, call);
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    engine_prefetch_locked(engine, start, end);
    uintptr_t claim_start = start, claim_end = end;
    engine_claim_locked(&op, &claim_start, &claim_end, 1, true, false);
    struct engine_ticket ticket = {0};
    struct release_request request = {start, end, reason, &ticket, false, 0, 0};
    engine_release_locked(&op, &request);
    struct unmapping_call unmapping = {call, engine->bounds, start, end};
    struct engine_call unmapping_call = {run_unmapping, &unmapping, call->name};
    int call_errno;
    long result =
        engine_op_run(&op, reason == RELEASE_MUNMAP ? &unmapping_call : call, &call_errno);
    if (result != 0) {
        uintptr_t still_locked_from = start;
        if (failure == ENGINE_FAILED_UNLOCKED_TO_HOLE && call_errno == ENOMEM) {
            pthread_mutex_unlock(&engine->mutex);
            still_locked_from = first_unmapped_page(engine, start, end);
            pthread_mutex_lock(&engine->mutex);
            /* What was unlocked up to the hole is released for good. */
            for (struct engine_piece *piece = ticket.head; piece != NULL; piece = piece->next)
                if (piece->start < still_locked_from)
                    engine_lock_bytes_remove_locked(
                        engine, piece->start, engine_min_address(piece->end, still_locked_from));
        }
        engine_restore_locked(&op, &ticket, still_locked_from, UINTPTR_MAX,
                              failure == ENGINE_FAILED_MAY_HAVE_UNMAPPED);
    } else {
        commit_release_locked(engine, &ticket, &request);
    }
    engine_op_end(&op);
    errno = call_errno;
    return result;
}

long engine_release_block(struct engine *engine, uintptr_t start, uintptr_t end,
                          enum release_reason reason, bool can_fail, const struct engine_call *call)
{
    uintptr_t pages_start = engine_page_floor(engine, start),
              pages_end = engine_page_ceil(engine, end);
    if (!engine_active(engine) || pages_end > PAGE_INDEX_LIMIT ||
        !engine_may_overlap(engine, pages_start, pages_end))
        return engine_run_plain(call);
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    engine_prefetch_locked(engine, pages_start, pages_end);
    uintptr_t claim_start = pages_start, claim_end = pages_end;
    engine_claim_locked(&op, &claim_start, &claim_end, 1, true, false);
    struct engine_ticket ticket = {0};
    struct release_request request = {pages_start, pages_end, reason, can_fail ? &ticket : NULL,
                                      true,        start,     end};
    engine_release_locked(&op, &request);
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    if (can_fail && result == 0)
        engine_restore_locked(&op, &ticket, 0, UINTPTR_MAX, false); /* the block is as it was */
    else
        commit_release_locked(engine, can_fail ? &ticket : NULL, &request);
    engine_op_end(&op);
    errno = call_errno;
    return result;
}

long engine_protect(struct engine *engine, uintptr_t start, uintptr_t end, bool writable,
                    const struct engine_call *call)
{
    if (!engine_active(engine) || start >= end || end > PAGE_INDEX_LIMIT ||
        !engine_may_overlap(engine, start, end))
        return engine_run_plain(call);
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    uintptr_t claim_start = start, claim_end = end;
    engine_claim_locked(&op, &claim_start, &claim_end, 1, true, false);
    /* The READ_ONLY registrations there (not the user's PINSHIM_FLAGS=readonly)
     * go before the call when it makes them writable; the parts outside it
     * are registered again as their runs say. */
    bool forced = engine->options.register_flags & ENGINE_REGISTER_READ_ONLY;
    struct engine_ticket ticket = {0};
    struct release_request request = {start, end, RELEASE_MPROTECT, &ticket, false, 0, 0};
    uintptr_t cursor = start;
    while (writable && !forced && cursor < end) {
        struct range_record *record = range_registry_first_overlap(&engine->registry, cursor, end);
        if (record == NULL)
            break;
        uintptr_t base = record->base;
        cursor = record->end;
        if (record->state == RANGE_REGISTERED &&
            (record->place.register_flags & ENGINE_REGISTER_READ_ONLY))
            release_part_locked(&op, base, engine_max_address(base, start),
                                engine_min_address(record->end, end), &request);
    }
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    if (result == 0) {
        /* Writable now: registered with the flags chosen for writable memory. */
        for (struct engine_piece *piece = ticket.head; piece != NULL && writable;
             piece = piece->next)
            piece->place.register_flags = 0;
        /* Pages that no registration could cover for their protection may
         * be registrable now: their runs are looked at again. */
        for (cursor = start; cursor < end;) {
            struct range_record *record =
                range_registry_first_overlap(&engine->registry, cursor, end);
            if (record == NULL)
                break;
            cursor = record->end;
            if (record->state == RANGE_HELD && (record->held == RANGE_HELD_NO_ACCESS ||
                                                (writable && record->held == RANGE_HELD_REFUSED))) {
                struct range_record *part = engine_isolate_locked(
                    engine, record->base, engine_max_address(record->base, start),
                    engine_min_address(record->end, end));
                if (part != NULL) {
                    part->held = RANGE_HELD_NEW;
                    if (writable)
                        part->place.register_flags =
                            (uint8_t)engine_normalized_flags(engine->options.register_flags);
                }
            }
        }
    }
    engine_restore_locked(&op, &ticket, 0, UINTPTR_MAX, false);
    engine_settle_locked(&op, start, end);
    engine_op_end(&op);
    errno = call_errno;
    return result;
}
