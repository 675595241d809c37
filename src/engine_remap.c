/* mremap: a locked mapping moved, grown or shrunk keeps its lock (Linux
 * carries VM_LOCKED with the mapping), so its registrations follow it. */
#include "engine_internal.h"

#include <errno.h>

#ifndef MREMAP_MAYMOVE
#define MREMAP_MAYMOVE 1
#endif
#ifndef MREMAP_FIXED
#define MREMAP_FIXED 2
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* Tracks at new_start what the ticket released in [old_start, old_end), with
 * its lock bytes: a moved or resized locked mapping stays locked (Linux
 * carries VM_LOCKED with the mapping), and growth of a locked mapping is
 * locked too. Then the runs there are settled. */
static void register_moved_locked(struct engine_op *op, struct engine_ticket *ticket,
                                  uintptr_t old_start, uintptr_t old_end, uintptr_t new_start,
                                  uintptr_t new_end)
{
    struct engine *engine = op->engine;
    uintptr_t kept_end = engine_min_address(old_end, old_start + (new_end - new_start));
    if (new_start != old_start) {
        engine_lock_bytes_move_locked(engine, old_start, kept_end, new_start);
        engine_lock_bytes_remove_locked(engine, old_start, old_end);
    } else if (kept_end < old_end) {
        engine_lock_bytes_remove_locked(engine, kept_end, old_end);
    }
    for (struct engine_piece *piece = ticket->head; piece != NULL; piece = piece->next) {
        if (piece->end <= old_start || piece->start >= old_end)
            continue; /* released with the old mapping, not moved */
        uintptr_t from = engine_max_address(piece->start, old_start);
        uintptr_t to = engine_min_address(piece->end, old_end);
        uintptr_t start = new_start + (from - old_start);
        uintptr_t end = new_start + (to - old_start);
        if (to == old_end || end > new_end) {
            uintptr_t tail = end; /* the grown tail's first byte */
            if (tail < new_end)
                engine_lock_bytes_add_locked(engine, tail, new_end);
            end = new_end;
        }
        if (start < end)
            engine_track_range_locked(op, start, end, engine_piece_choice(piece), &piece->place,
                                      engine_piece_hold(piece));
    }
    engine_settle_locked(op, new_start, new_end);
}

struct locked_part_context {
    struct engine_op *op;
    const struct engine_piece *piece;
};

static void register_locked_part(void *context, uintptr_t start, uintptr_t end)
{
    struct locked_part_context *part = context;
    struct engine *engine = part->op->engine;
    pthread_mutex_lock(&engine->mutex);
    if (engine_op_claims(part->op, start, end))
        engine_add_range_locked(part->op, start, end, start, end, engine_piece_choice(part->piece),
                                &part->piece->place, engine_piece_hold(part->piece));
    pthread_mutex_unlock(&engine->mutex);
}

/* Registers the parts of [start, end) that the kernel holds locked, as the
 * piece they came from was (registered, or pending). */
static void register_where_locked_locked(struct engine_op *op, const struct engine_piece *piece,
                                         uintptr_t start, uintptr_t end)
{
    struct engine *engine = op->engine;
    if (start >= end || engine->backend->locked_parts == NULL)
        return;
    struct locked_part_context context = {op, piece};
    pthread_mutex_unlock(&engine->mutex);
    engine->backend->locked_parts(engine->backend->context, start, end, register_locked_part,
                                  &context);
    pthread_mutex_lock(&engine->mutex);
}

long engine_remap(struct engine *engine, uintptr_t old_start, size_t old_size, size_t new_size,
                  int flags, uintptr_t new_address, const struct engine_call *call)
{
    uintptr_t old_end = 0, target_start = 0, target_end = 0;
    bool fixed = (flags & MREMAP_FIXED) != 0;
    bool dontunmap = (flags & MREMAP_DONTUNMAP) != 0 && old_size != 0;
    if (!engine_active(engine) || old_start % engine->options.page_size != 0)
        return engine_run_plain(call);
    if (old_size != 0 &&
        !engine_byte_range_pages(engine, old_start, old_size, &old_start, &old_end))
        return engine_run_plain(call);
    if (fixed &&
        !engine_byte_range_pages(engine, new_address, new_size, &target_start, &target_end))
        fixed = false; /* the call fails with EINVAL; nothing to release there */
    bool involved = (old_size != 0 && engine_may_overlap(engine, old_start, old_end)) ||
                    (dontunmap && engine_has_registrations(engine)) ||
                    (fixed && engine_may_overlap(engine, target_start, target_end));
    if (!involved)
        return engine_run_plain(call);

    /* MREMAP_DONTUNMAP changes locks beyond the moved range: Linux clears the
     * lock of the mapping the old range lies in, and since 6.17 the moved
     * range may first merge with its neighbours, so which pages stay locked
     * depends on how the kernel merges mappings. The call is rare: release
     * the registrations of the whole mappings around the old range, and
     * register again only what /proc/self/smaps says is still locked. */
    uintptr_t span_start = old_start, span_end = old_end;
    if (dontunmap && engine->backend->mapping_bounds != NULL) {
        uintptr_t low, high;
        if (engine->backend->mapping_bounds(engine->backend->context, old_start, &low, &high))
            span_start = engine_min_address(span_start, low);
        if (engine->backend->mapping_bounds(engine->backend->context, old_end - 1, &low, &high))
            span_end = engine_max_address(span_end, high);
    }

    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    uintptr_t starts[2] = {span_start, target_start}, ends[2] = {span_end, target_end};
    unsigned ranges = fixed ? 2 : 1;
    if (old_size == 0) {
        starts[0] = target_start;
        ends[0] = target_end;
        ranges = fixed ? 1 : 0;
    }
    if (ranges > 0)
        engine_claim_locked(&op, starts, ends, ranges, true, false);
    struct engine_ticket moved = {0}, replaced = {0};
    if (old_size != 0) {
        struct release_request request = {span_start, span_end, RELEASE_MREMAP, &moved, false,
                                          0,          0};
        engine_release_locked(&op, &request);
    }
    if (fixed) {
        struct release_request request = {
            target_start, target_end, RELEASE_MREMAP, &replaced, false, 0, 0};
        engine_release_locked(&op, &request);
    }
    /* The call moves the mappings' bounds with it (the interposer's
     * run_mremap, mapping_bounds.h): they are where the call left them by
     * the time it returns. */
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    bool failed = result == -1; /* MAP_FAILED */
    uintptr_t new_start = failed ? 0 : (uintptr_t)result, new_end = 0;
    if (!failed)
        new_end = engine_page_ceil(engine, new_start + new_size);
    if (failed) {
        if (dontunmap) {
            /* A failed call changed nothing: put back what is still locked. */
            for (struct engine_piece *piece = moved.head; piece != NULL; piece = piece->next)
                register_where_locked_locked(&op, piece, piece->start, piece->end);
            for (struct engine_piece *piece = replaced.head; piece != NULL; piece = piece->next)
                register_where_locked_locked(&op, piece, piece->start, piece->end);
            engine_ticket_discard_locked(engine, &moved);
            engine_ticket_discard_locked(engine, &replaced);
        } else {
            engine_restore_locked(&op, &moved, 0, UINTPTR_MAX, false);
            engine_restore_locked(&op, &replaced, 0, UINTPTR_MAX, true);
        }
        engine_op_end(&op);
        errno = call_errno;
        return result;
    }
    /* What the target held is gone. */
    for (struct engine_piece *piece = replaced.head; piece != NULL; piece = piece->next)
        engine_lock_bytes_remove_locked(engine, piece->start, piece->end);
    if (dontunmap) {
        /* What stays at the old place, while the old place is claimed. After
         * success a fixed target holds the moved pages, not what was
         * registered there. The lock bytes there are those of what is still
         * locked, whole pages. */
        engine_lock_bytes_remove_locked(engine, span_start, span_end);
        uintptr_t cut_start = fixed ? target_start : 0, cut_end = fixed ? target_end : 0;
        for (struct engine_piece *piece = moved.head; piece != NULL; piece = piece->next) {
            register_where_locked_locked(&op, piece, piece->start,
                                         engine_min_address(piece->end, cut_start));
            register_where_locked_locked(&op, piece, engine_max_address(piece->start, cut_end),
                                         piece->end);
        }
    }
    /* The moved pages' new home: claimed already when fixed or in place;
     * else a range the kernel just found free, which another operation may
     * still claim (an unmap that gave those addresses back and has not
     * finished). Waiting for it while holding the old range could deadlock
     * two moves into each other's old places, so the old claim goes first
     * (its work is done) and the new range is claimed holding nothing. */
    bool may_register_new = engine_op_claims(&op, new_start, new_end);
    if (!may_register_new && moved.head != NULL) {
        engine_drop_claim_locked(&op);
        may_register_new = engine_claim_locked(&op, &new_start, &new_end, 1, true, true);
    }
    if (may_register_new && dontunmap) {
        for (struct engine_piece *piece = moved.head; piece != NULL; piece = piece->next) {
            if (piece->end <= old_start || piece->start >= old_end)
                continue;
            uintptr_t from = engine_max_address(piece->start, old_start);
            uintptr_t to = engine_min_address(piece->end, old_end);
            register_where_locked_locked(&op, piece, new_start + (from - old_start),
                                         new_start + (to - old_start));
        }
    } else if (may_register_new) {
        register_moved_locked(&op, &moved, old_start, old_end, new_start, new_end);
    } else if (!dontunmap) {
        engine_lock_bytes_remove_locked(engine, old_start, old_end); /* shutting down */
    }
    engine_ticket_discard_locked(engine, &moved);
    engine_ticket_discard_locked(engine, &replaced);
    engine_op_end(&op);
    errno = call_errno;
    return result;
}
