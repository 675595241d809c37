/* The program's own registrations: cudaHostRegister, hipHostRegister, a
 * Level Zero import, and their undoing, that the program (or its framework)
 * calls itself. The pages become the
 * program's while it holds them registered, and the shim's again after. */
#include "engine_internal.h"

#include <errno.h>

/* [start, end) is locked now: the parts of the program's own registrations
 * there are marked, to be taken back when the program unregisters them (the
 * registry, kept equal to what is locked, answers; no /proc read). */
void engine_mark_program_locked_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    uintptr_t cursor = start;
    while (cursor < end) {
        struct range_record *record = range_registry_first_overlap(&engine->registry, cursor, end);
        if (record == NULL)
            return;
        cursor = record->end;
        if (record->state != RANGE_PROGRAM || record->program_locked)
            continue;
        struct range_record *part =
            engine_isolate_locked(engine, record->base, engine_max_address(record->base, start),
                                  engine_min_address(record->end, end));
        if (part != NULL)
            part->program_locked = 1;
    }
}

/* Whether the two places are the same context: the same device and, when
 * it is not that device's primary context, the same context handle; or both
 * registrations hold in every context. */
static bool same_context(const struct range_place *a, const struct range_place *b)
{
    if ((a->flags & RANGE_PLACE_ANY_CONTEXT) && (b->flags & RANGE_PLACE_ANY_CONTEXT))
        return a->context == b->context; /* the same driver (Level Zero), or none (HIP) */
    return a->device >= 0 && a->device == b->device && a->context == b->context;
}

/* The context a registration call made now on this thread goes to, when the
 * backend can tell. Called without the mutex (the driver may call back into the
 * shim). */
static bool calling_thread_place(struct engine *engine, struct range_place *place)
{
    *place = (struct range_place){.device = -1};
    return engine->backend->thread_place != NULL &&
           engine->backend->thread_place(engine->backend->context, place);
}

/* The program asks for exactly the registration the shim holds: the record
 * at pages_start is registered, covers [pages_start, pages_end) whole, was
 * made with flags that mean what the program's mean, in the context its
 * call would use, and the program's pointer is its base (the pointer its
 * cudaHostUnregister will pass). Then the registration is handed over: it
 * becomes the program's, and no call is made. */
static bool hand_over_locked(struct engine *engine, uintptr_t start, size_t length,
                             uintptr_t pages_start, uintptr_t pages_end, unsigned flags,
                             const struct range_place *caller, bool caller_known)
{
    struct range_record *record = range_registry_find(&engine->registry, pages_start);
    if (!caller_known || start != pages_start || record == NULL ||
        record->state != RANGE_REGISTERED || record->end != pages_end ||
        record->place.register_flags != engine_normalized_flags(flags) ||
        !same_context(&record->place, caller))
        return false;
    record->state = RANGE_PROGRAM;
    record->program_locked = 1;
    record->program_start = start;
    record->program_end = start + length;
    engine_lock_bytes_add_locked(engine, start, start + length);
    struct pinshim_counters *counters = &engine_stats(engine)->counters;
    counters->live_ranges--;
    engine_note_change_locked(engine);
    counters->live_bytes -= pages_end - pages_start;
    engine_stats(engine)->program_registrations++;
    engine_stats(engine)->program_handed_over++;
    if (engine->backend->registered != NULL) {
        pthread_mutex_unlock(&engine->mutex);
        engine->backend->registered(engine->backend->context, pages_start, pages_end, false);
        pthread_mutex_lock(&engine->mutex);
    }
    return true;
}

long engine_program_register(struct engine *engine, uintptr_t start, size_t length, unsigned flags,
                             const struct engine_program_call *program_call)
{
    const struct engine_call *call = &program_call->call;
    uintptr_t pages_start, pages_end;
    if (!engine_active(engine) || length == 0 ||
        !engine_byte_range_pages(engine, start, length, &pages_start, &pages_end))
        return engine_run_plain(call);
    struct range_place caller;
    bool caller_known = calling_thread_place(engine, &caller);
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    engine_claim_locked(&op, &pages_start, &pages_end, 1, true, false);
    if (hand_over_locked(engine, start, length, pages_start, pages_end, flags, &caller,
                         caller_known)) {
        engine_op_end(&op);
        errno = op.program_errno;
        return program_call->success;
    }
    /* Every page the program's range touches becomes the program's: the
     * shim's registrations there go (the parts outside are registered again),
     * queued and pending ones are dropped, before the program's call. */
    struct engine_ticket ticket = {0};
    struct release_request request = {pages_start, pages_end, RELEASE_PROGRAM, &ticket, false,
                                      0,           0};
    engine_release_locked(&op, &request);
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    if (result == program_call->success) {
        engine_stats(engine)->program_registrations++;
        /* Where the call registered: the context it made current, if it had
         * to (the runtime's primary context), else the one that was. */
        struct range_place place = caller;
        pthread_mutex_unlock(&engine->mutex);
        if (!calling_thread_place(engine, &place))
            place = (struct range_place){.device = -1};
        pthread_mutex_lock(&engine->mutex);
        place.register_flags = (uint8_t)engine_normalized_flags(flags);
        struct range_registry *registry = &engine->registry;
        uintptr_t cursor = pages_start;
        while (cursor < pages_end) {
            uintptr_t gap_start, gap_end = pages_end;
            if (!page_index_find_next(&registry->index, PAGE_INDEX_USED, false, cursor, pages_end,
                                      &gap_start))
                break;
            if (!page_index_find_next(&registry->index, PAGE_INDEX_USED, true, gap_start, pages_end,
                                      &gap_end))
                gap_end = pages_end;
            struct range_record record = {.base = gap_start,
                                          .end = gap_end,
                                          .program_start = start,
                                          .program_end = start + length,
                                          .place = place,
                                          .state = RANGE_PROGRAM};
            if (engine_insert_record_locked(engine, &record) == NULL)
                break; /* out of memory: a later lock there gets 712, counted */
            cursor = gap_end;
        }
        /* A free of the program's buffer gives its pages up (the free rule
         * reads lock bytes): its bytes are in danger as a lock's are. */
        engine_lock_bytes_add_locked(engine, start, start + length);
        /* What the shim held there was locked, and still is. */
        for (struct engine_piece *piece = ticket.head; piece != NULL; piece = piece->next)
            if (piece->state != RANGE_PROGRAM || piece->program_locked)
                engine_mark_program_locked_locked(engine,
                                                  engine_max_address(piece->start, pages_start),
                                                  engine_min_address(piece->end, pages_end));
        engine_ticket_discard_locked(engine, &ticket);
    } else {
        engine_restore_locked(&op, &ticket, 0, UINTPTR_MAX, false);
    }
    engine_op_end(&op);
    errno = call_errno;
    return result;
}

/* The state of the record holding addr, or -1 when none does. */
int engine_state_at(struct engine *engine, uintptr_t addr)
{
    if (!engine_may_overlap(engine, addr, addr + 1))
        return -1;
    pthread_mutex_lock(&engine->mutex);
    struct range_record *record = range_registry_containing(&engine->registry, addr);
    int state = record != NULL ? record->state : -1;
    pthread_mutex_unlock(&engine->mutex);
    return state;
}

bool engine_is_shim_registration(struct engine *engine, uintptr_t addr)
{
    int state = engine_state_at(engine, addr);
    return state >= 0 && state != RANGE_PROGRAM;
}

/* The program unregisters, by its base, a registration whose pages it
 * still holds locked, and that registration is one the shim would make for
 * them: one record, the program's pointer page-aligned, the shim's flags,
 * at most one chunk, in the context the shim would register those pages in
 * now. Then the shim keeps it as its own and no call is made. The op claims
 * the registration's pages. */
static bool keep_locked(struct engine *engine, uintptr_t start)
{
    struct range_record *record = range_registry_find(&engine->registry, start);
    if (record == NULL || record->state != RANGE_PROGRAM || !record->program_locked ||
        record->program_start != start ||
        record->end != engine_page_ceil(engine, record->program_end) ||
        (record->place.device < 0 && !(record->place.flags & RANGE_PLACE_ANY_CONTEXT)) ||
        record->place.register_flags != engine_normalized_flags(engine->options.register_flags) ||
        record->end - record->base < engine->options.min_bytes || engine->shut_down)
        return false;
    /* The run the shim would register holds no more than these pages: no
     * locked neighbour of the shim's continues it. */
    uintptr_t base = record->base, end_page = record->end;
    struct range_record probe = *record;
    probe.state = RANGE_HELD;
    probe.held = RANGE_HELD_NEW;
    struct range_record *left =
        base > 0 ? range_registry_containing(&engine->registry, base - 1) : NULL;
    struct range_record *right = range_registry_find(&engine->registry, end_page);
    if ((left != NULL && engine_run_continues(engine, left, &probe)) ||
        (right != NULL && engine_run_continues(engine, &probe, right)))
        return false;
    struct range_place held = record->place, chosen = {.device = -1};
    pthread_mutex_unlock(&engine->mutex);
    enum engine_choice choice =
        engine->backend->choose_place(engine->backend->context, false, NULL, &chosen);
    pthread_mutex_lock(&engine->mutex);
    if (choice != ENGINE_PLACE_READY || !same_context(&held, &chosen))
        return false;
    record = range_registry_find(&engine->registry, start);
    uintptr_t end = record->end;
    record->state = RANGE_REGISTERED;
    record->program_locked = 0;
    record->kept_start = record->kept_end = 0;
    struct pinshim_counters *counters = &engine_stats(engine)->counters;
    counters->live_ranges++;
    engine_note_change_locked(engine);
    counters->live_bytes += end - start;
    if (counters->live_bytes > counters->peak_bytes)
        counters->peak_bytes = counters->live_bytes;
    engine_stats(engine)->program_unregistrations++;
    engine_stats(engine)->program_kept++;
    if (engine->backend->registered != NULL) {
        pthread_mutex_unlock(&engine->mutex);
        engine->backend->registered(engine->backend->context, start, end, true);
        pthread_mutex_lock(&engine->mutex);
    }
    return true;
}

long engine_program_unregister(struct engine *engine, uintptr_t start,
                               const struct engine_program_call *program_call)
{
    const struct engine_call *call = &program_call->call;
    uintptr_t page = engine_page_floor(engine, start);
    if (!engine_active(engine) || page >= PAGE_INDEX_LIMIT ||
        !engine_may_overlap(engine, page, page + engine->options.page_size))
        return engine_run_plain(call);
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    uintptr_t claim_start = page, claim_end = page + engine->options.page_size;
    engine_claim_locked(&op, &claim_start, &claim_end, 1, true, false);
    struct range_record *record = range_registry_containing(&engine->registry, start);
    struct range_record program = {0};
    uintptr_t whole_start = 0, whole_end = 0;
    if (record != NULL && record->state == RANGE_PROGRAM) {
        program = *record;
        /* One registration may be several records (the parts the program
         * holds locked are apart): claim all of them. */
        whole_start = engine_page_floor(engine, program.program_start);
        whole_end = engine_page_ceil(engine, program.program_end);
        if (!engine_op_claims(&op, whole_start, whole_end)) {
            engine_drop_claim_locked(&op);
            engine_claim_locked(&op, &whole_start, &whole_end, 1, true, false);
            record = range_registry_containing(&engine->registry, start);
            if (record == NULL || record->state != RANGE_PROGRAM ||
                record->program_start != program.program_start ||
                record->program_end != program.program_end)
                program.base = 0;
        }
    }
    if (program.base != 0 && keep_locked(engine, start)) {
        engine_op_end(&op);
        errno = op.program_errno;
        return program_call->success;
    }
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
    if (result == program_call->success && program.base != 0) {
        engine_stats(engine)->program_unregistrations++;
        /* The records of this registration go; the parts the program still
         * holds locked are the shim's again (queued when registration is
         * asynchronous, so that an unlock right after costs no CUDA call). */
        bool place_chosen = false, took_back = false;
        enum engine_choice choice = ENGINE_PLACE_DISABLED;
        struct range_place place = {.device = -1};
        uintptr_t cursor = whole_start;
        while (cursor < whole_end) {
            struct range_record *next =
                range_registry_first_overlap(&engine->registry, cursor, whole_end);
            if (next == NULL)
                break;
            uintptr_t base = next->base, end = next->end;
            cursor = end;
            if (next->state != RANGE_PROGRAM || next->program_start != program.program_start ||
                next->program_end != program.program_end)
                continue;
            bool locked = next->program_locked;
            /* Its bytes leave the danger the free rule reads; pages still
             * locked come back as a lock's, whole. */
            engine_forget_record_locked(engine, base);
            if (!locked)
                continue;
            if (!place_chosen) {
                /* The calling thread's context: the program's, as it has
                 * just unregistered through it. */
                pthread_mutex_unlock(&engine->mutex);
                choice =
                    engine->backend->choose_place(engine->backend->context, false, NULL, &place);
                pthread_mutex_lock(&engine->mutex);
                place_chosen = true;
            }
            engine_add_range_locked(&op, base, end, base, end, choice, &place, RANGE_HELD_NEW);
            took_back = true;
        }
        if (took_back)
            engine_stats(engine)->program_took_back++;
    }
    engine_op_end(&op);
    errno = call_errno;
    return result;
}
