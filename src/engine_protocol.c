/* The protocol: how a lock registers, how an unlock, unmap or free releases,
 * and how a failed call puts back what it took. Each entry point below
 * claims its pages (and the runs they touch), releases what must go before
 * the real call, runs it, tracks, settles (engine_runs.c) or restores what
 * the outcome asks for, and ends. */
#include "engine_internal.h"
#include "trace.h"

#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static uint64_t now_nanoseconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *error_name(struct engine *engine, int error)
{
    const char *name = NULL;
    if (engine->backend->error_name != NULL)
        name = engine->backend->error_name(engine->backend->context, error);
    return name != NULL ? name : "unknown error";
}

static const char *call_name(struct engine *engine, bool unregister)
{
    const char *name = NULL;
    if (engine->backend->call_name != NULL)
        name = engine->backend->call_name(engine->backend->context, unregister);
    return name != NULL ? name : unregister ? "unregister" : "register";
}

/* Counts error and tells whether this is its first occurrence for the operation. */
static bool note_error(struct engine *engine, int error, uint32_t *warned)
{
    for (size_t i = 0; i < ENGINE_ERROR_SLOTS; i++) {
        struct engine_error_count *slot = &engine_stats(engine)->errors[i];
        if (slot->count == 0 || slot->code == error) {
            if (slot->count == 0) {
                /* Named before it is counted: a reader that sees the count
                 * sees the name. */
                const char *name = error_name(engine, error);
                size_t length = 0;
                while (name[length] != '\0' && length + 1 < sizeof(slot->name))
                    length++;
                memcpy(slot->name, name, length);
                slot->name[length] = '\0';
            }
            slot->code = error;
            slot->count++;
            bool first = !warned[i];
            warned[i] = 1;
            return first;
        }
    }
    return false; /* table full: counted nowhere, never warned again */
}

/* ---- registering ---- */

static void count_device_locked(struct engine *engine, const struct range_place *place,
                                uint64_t bytes)
{
    if (place->device >= 0 && place->device < ENGINE_MAX_DEVICES) {
        engine_stats(engine)->devices[place->device].registrations++;
        engine_stats(engine)->devices[place->device].bytes += bytes;
    }
}

/* Where the pages of a registration lie (options.numa), and the node of its
 * device; called without the mutex (a system call or two). */
static bool locate_pages(struct engine *engine, const struct range_place *place, uintptr_t base,
                         size_t length, struct numa_placement *placement, int *device_node)
{
    const struct engine_backend *backend = engine->backend;
    if (!engine->options.numa || backend->page_nodes == NULL)
        return false;
    memset(placement, 0, sizeof(*placement));
    backend->page_nodes(backend->context, base, base + length, placement);
    *device_node =
        backend->device_node != NULL ? backend->device_node(backend->context, place) : -1;
    return true;
}

/* Counts a registration's bytes by node, local or remote to its device's
 * node, and warns once per process about remote memory. */
static void count_numa_locked(struct engine *engine, const struct range_place *place,
                              const struct numa_placement *placement, int device_node,
                              size_t length)
{
    struct engine_statistics *statistics = engine_stats(engine);
    if (place->device >= 0 && place->device < ENGINE_MAX_DEVICES)
        statistics->device_nodes[place->device] = device_node;
    statistics->numa_unknown_bytes += placement->unknown_bytes;
    uint64_t remote = 0;
    int remote_node = -1;
    for (int node = 0; node < NUMA_PLACEMENT_MAX_NODES; node++) {
        uint64_t bytes = placement->bytes[node];
        if (bytes == 0)
            continue;
        statistics->numa_nodes[node].bytes += bytes;
        if (device_node < 0)
            continue;
        if (node == device_node) {
            statistics->numa_nodes[node].local_bytes += bytes;
        } else {
            remote += bytes;
            if (remote_node < 0 || bytes > placement->bytes[remote_node])
                remote_node = node;
        }
    }
    statistics->numa_remote_bytes += remote;
    if (remote == 0 || engine->warned_remote_numa)
        return;
    engine->warned_remote_numa = true;
    char size[32], of[32];
    log_format_bytes(remote, size, sizeof(size));
    log_format_bytes(length, of, sizeof(of));
    log_warn("%s of %s registered for device %d lies on NUMA node %d, but the device is nearest "
             "node %d: every copy of it crosses between the nodes; run the process on the "
             "device's node (numactl --cpunodebind=%d --membind=%d, or the launcher's binding "
             "options) (warned once)",
             size, of, (int)place->device, remote_node, device_node, device_node, device_node);
}

struct engine_result engine_try_register_locked(struct engine *engine, uintptr_t base,
                                                bool on_worker)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    struct range_place place = record->place;
    if (place.register_flags == 0)
        place.register_flags = (uint8_t)engine_normalized_flags(engine->options.register_flags);
    size_t length = record->end - record->base;

    pthread_mutex_unlock(&engine->mutex);
    bool traced =
        trace_begin("register", length, on_worker ? "pinshim thread" : engine_thread_cause());
    uint64_t began = now_nanoseconds();
    struct engine_result result =
        engine->backend->register_range(engine->backend->context, &place, (void *)base, length);
    if (result.outcome == ENGINE_OK && engine->backend->registered != NULL)
        engine->backend->registered(engine->backend->context, base, base + length, true);
    uint64_t took = now_nanoseconds() - began;
    trace_end(traced);
    struct numa_placement placement;
    int device_node = -1;
    bool located = result.outcome == ENGINE_OK &&
                   locate_pages(engine, &place, base, length, &placement, &device_node);
    pthread_mutex_lock(&engine->mutex);

    record = range_registry_find(&engine->registry, base);
    struct pinshim_counters *counters = &engine_stats(engine)->counters;
    counters->register_nanoseconds += took;
    if (on_worker)
        engine_stats(engine)->background_nanoseconds += took;
    else
        engine_stats(engine)->wait_nanoseconds += took;
    if (result.outcome == ENGINE_OK) {
        record->state = RANGE_REGISTERED;
        record->place = place;
        counters->register_ok++;
        counters->register_bytes += length;
        counters->live_ranges++;
        engine_note_change_locked(engine);
        counters->live_bytes += length;
        if (counters->live_bytes > counters->peak_bytes)
            counters->peak_bytes = counters->live_bytes;
        count_device_locked(engine, &place, length);
        if ((place.register_flags & ENGINE_REGISTER_READ_ONLY) &&
            !(engine->options.register_flags & ENGINE_REGISTER_READ_ONLY))
            engine_stats(engine)->read_only_registrations++; /* for read-only pages */
        if (located)
            count_numa_locked(engine, &place, &placement, device_node, length);
        char where[32] = "for every device";
        if (!(place.flags & RANGE_PLACE_ANY_CONTEXT) || place.device >= 0)
            snprintf(where, sizeof(where), "on device %d", (int)place.device);
        log_info("registered %#lx + %lu bytes %s in %.3f ms%s", (unsigned long)base,
                 (unsigned long)length, where, (double)took / 1e6,
                 on_worker ? " (in the background)" : "");
    } else if (result.outcome == ENGINE_NO_CONTEXT) {
        /* The context it was meant for went away: wait for one. */
        engine_stats(engine)->deferred_total++;
        engine_set_state_locked(engine, record, RANGE_PENDING);
    }
    pthread_cond_broadcast(&engine->changed);
    return result;
}

bool engine_registration_failed(struct engine_result result)
{
    return result.outcome != ENGINE_OK && result.outcome != ENGINE_NO_CONTEXT;
}

void engine_count_register_failure_locked(struct engine *engine, uintptr_t base,
                                          struct engine_result result)
{
    int error = result.code;
    struct range_record *record = range_registry_find(&engine->registry, base);
    size_t length = record->end - record->base;
    struct pinshim_counters *counters = &engine_stats(engine)->counters;
    bool first = note_error(engine, error, engine->warned_register);
    if (result.outcome == ENGINE_ALREADY_REGISTERED) {
        /* The program or its framework registered it: not ours to unregister. */
        counters->register_already_registered++;
        log_info("%#lx + %lu bytes are already registered by the program; left alone",
                 (unsigned long)base, (unsigned long)length);
    } else {
        counters->register_failed++;
        engine_note_change_locked(engine);
        if (first)
            log_warn("%s(%#lx, %lu) failed: %s (%d); the range stays mlocked only unless it "
                     "can be registered in parts; further %s failures are counted, not logged",
                     call_name(engine, false), (unsigned long)base, (unsigned long)length,
                     error_name(engine, error), error, error_name(engine, error));
    }
    pthread_cond_broadcast(&engine->changed);
}

/* ---- cutting a refused range by mapping kind ---- */

#define ENGINE_MAPPING_PIECES 64

struct mapping_pieces {
    size_t count;
    bool overflow;
    uintptr_t start[ENGINE_MAPPING_PIECES], end[ENGINE_MAPPING_PIECES];
    uint8_t kind[ENGINE_MAPPING_PIECES];
};

static void collect_piece(void *context, uintptr_t start, uintptr_t end,
                          enum engine_mapping_kind kind)
{
    struct mapping_pieces *pieces = context;
    if (pieces->count == ENGINE_MAPPING_PIECES) {
        pieces->overflow = true;
        return;
    }
    pieces->start[pieces->count] = start;
    pieces->end[pieces->count] = end;
    pieces->kind[pieces->count] = (uint8_t)kind;
    pieces->count++;
}

static const char *const mapping_kind_names[ENGINE_MAPPING_KIND_COUNT] = {
    [ENGINE_MAPPING_WRITABLE] = "writable",
    [ENGINE_MAPPING_READ_ONLY] = "read-only",
    [ENGINE_MAPPING_NO_ACCESS] = "without access (PROT_NONE)",
    [ENGINE_MAPPING_IO] = "I/O or PFN-mapped (VM_IO, VM_PFNMAP)",
    [ENGINE_MAPPING_SHARED_FILE] = "a writable shared file mapping (Linux 6.5+ refuses it)",
    [ENGINE_MAPPING_UNMAPPED] = "unmapped",
};

/* A piece no registration can cover: held, counted, named once per kind.
 * Pages no copy can cross cut the run; the others hold it whole, since
 * registering the rest would make a copy across them fail. */
static void hold_piece_locked(struct engine *engine, struct range_record *part, int kind,
                              bool no_read_only)
{
    uintptr_t base = part->base, end = part->end;
    bool cuts = kind == ENGINE_MAPPING_NO_ACCESS || kind == ENGINE_MAPPING_UNMAPPED;
    engine_set_held_locked(engine, part, cuts ? RANGE_HELD_NO_ACCESS : RANGE_HELD_REFUSED);
    unsigned bit = no_read_only ? 31u : (unsigned)kind;
    if (no_read_only)
        engine_stats(engine)->skipped_read_only_unsupported++;
    else
        engine_stats(engine)->skipped_pieces[kind]++;
    if (engine->logged_skips & ((uint64_t)1 << bit))
        return;
    engine->logged_skips |= (uint64_t)1 << bit;
    if (no_read_only)
        log_info("%#lx + %lu bytes are mapped read-only and the device takes no READ_ONLY "
                 "registrations: the run of locked pages they are in stays unregistered, so "
                 "that every copy of it works (logged once)",
                 (unsigned long)base, (unsigned long)(end - base));
    else if (cuts)
        log_info("%#lx + %lu bytes are %s: no copy crosses them, and the locked pages on "
                 "either side are registered apart (logged once)",
                 (unsigned long)base, (unsigned long)(end - base), mapping_kind_names[kind]);
    else
        log_info("%#lx + %lu bytes are %s: no driver pins them, and the run of locked pages "
                 "they are in stays unregistered, so that every copy of it works (logged once)",
                 (unsigned long)base, (unsigned long)(end - base), mapping_kind_names[kind]);
}

bool engine_cut_by_mapping_kinds_locked(struct engine *engine, uintptr_t base)
{
    const struct engine_backend *backend = engine->backend;
    if (backend->mapping_kinds == NULL)
        return false;
    struct range_record *record = range_registry_find(&engine->registry, base);
    uintptr_t end = record->end;
    struct range_place place = record->place;
    static struct mapping_pieces none;
    struct mapping_pieces pieces = none;
    pthread_mutex_unlock(&engine->mutex);
    bool read = backend->mapping_kinds(backend->context, base, end, collect_piece, &pieces);
    bool mixed = false, read_only = false;
    for (size_t i = 0; i < pieces.count; i++) {
        mixed = mixed || pieces.kind[i] != ENGINE_MAPPING_WRITABLE;
        read_only = read_only || pieces.kind[i] == ENGINE_MAPPING_READ_ONLY;
    }
    bool read_only_taken = (place.register_flags & ENGINE_REGISTER_READ_ONLY) ||
                           (read_only && backend->read_only_supported != NULL &&
                            backend->read_only_supported(backend->context, &place));
    pthread_mutex_lock(&engine->mutex);
    if (!read || !mixed || pieces.overflow || pieces.count == 0 || pieces.start[0] != base ||
        pieces.end[pieces.count - 1] != end ||
        !range_registry_reserve(&engine->registry, 2 * pieces.count))
        return false;
    engine_stats(engine)->registered_by_pieces++;
    for (size_t i = 0; i < pieces.count; i++) {
        struct range_record *part = engine_isolate_locked(
            engine, range_registry_containing(&engine->registry, pieces.start[i])->base,
            pieces.start[i], pieces.end[i]);
        /* isolate cannot fail: room was reserved. */
        part->kept_start = part->kept_end = 0;
        int kind = pieces.kind[i];
        if (kind == ENGINE_MAPPING_WRITABLE ||
            (kind == ENGINE_MAPPING_READ_ONLY && read_only_taken)) {
            if (kind == ENGINE_MAPPING_READ_ONLY)
                part->place.register_flags |= ENGINE_REGISTER_READ_ONLY;
            engine_set_held_locked(engine, part, RANGE_HELD_NEW);
        } else {
            hold_piece_locked(engine, part, kind, kind == ENGINE_MAPPING_READ_ONLY);
        }
    }
    return true;
}

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

static uint64_t *reason_counter(struct engine *engine, enum release_reason reason)
{
    struct pinshim_counters *counters = &engine_stats(engine)->counters;
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
    case RELEASE_PROGRAM:
        return &counters->unregister_program;
    case RELEASE_MPROTECT:
        return &counters->unregister_mprotect;
    case RELEASE_JOIN:
        return &counters->unregister_join;
    case RELEASE_EXIT:
    case RELEASE_REASON_COUNT:
        break;
    }
    return &counters->unregister_exit;
}

/* What led to an unregistration, for NVTX ranges: the stats' key. */
static const char *release_reason_name(enum release_reason reason)
{
    static const char *const names[RELEASE_REASON_COUNT] = {
        [RELEASE_MUNLOCK] = "munlock",   [RELEASE_FREE] = "free",
        [RELEASE_REALLOC] = "realloc",   [RELEASE_MUNMAP] = "munmap",
        [RELEASE_MREMAP] = "mremap",     [RELEASE_MMAP_FIXED] = "mmap_fixed",
        [RELEASE_EXIT] = "exit",         [RELEASE_PROGRAM] = "the program's own registration",
        [RELEASE_MPROTECT] = "mprotect", [RELEASE_JOIN] = "a run registered again whole",
    };
    return reason < RELEASE_REASON_COUNT ? names[reason] : "?";
}

struct engine_result engine_unregister_record_locked(struct engine *engine, uintptr_t base,
                                                     enum release_reason reason, bool on_worker)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    record->state = RANGE_UNREGISTERING;
    struct range_place place = record->place;
    size_t length = record->end - record->base;

    pthread_mutex_unlock(&engine->mutex);
    bool traced = trace_begin("unregister", length,
                              on_worker ? "pinshim thread" : release_reason_name(reason));
    uint64_t began = now_nanoseconds();
    if (engine->backend->registered != NULL)
        engine->backend->registered(engine->backend->context, base, base + length, false);
    struct engine_result result =
        engine->backend->unregister_range(engine->backend->context, &place, (void *)base);
    int error = result.code;
    uint64_t took = now_nanoseconds() - began;
    trace_end(traced);
    pthread_mutex_lock(&engine->mutex);

    struct pinshim_counters *counters = &engine_stats(engine)->counters;
    counters->unregister_nanoseconds += took;
    if (on_worker)
        engine_stats(engine)->background_nanoseconds += took;
    else
        engine_stats(engine)->wait_nanoseconds += took;
    counters->live_ranges--;
    engine_note_change_locked(engine);
    counters->live_bytes -= length;
    (*reason_counter(engine, reason))++;
    if (result.outcome == ENGINE_OK) {
        counters->unregister_ok++;
        log_info("unregistered %#lx + %lu bytes in %.3f ms", (unsigned long)base,
                 (unsigned long)length, (double)took / 1e6);
    } else if (reason == RELEASE_EXIT && result.outcome == ENGINE_UNLOADING) {
        /* The runtime tore itself down first; the kernel drops the pins. */
        engine_stats(engine)->exit_unloading++;
        note_error(engine, error, engine->warned_unregister);
    } else if (result.outcome == ENGINE_NOT_REGISTERED) {
        /* Gone already: with its context (destroyed by the program), or
         * unregistered by the program through a path the shim cannot see. */
        engine_stats(engine)->gone_with_context++;
        note_error(engine, error, engine->warned_unregister);
        log_info("%#lx was no longer registered (its context was destroyed, or the program "
                 "unregistered it itself)",
                 (unsigned long)base);
    } else {
        counters->unregister_failed++;
        engine_note_change_locked(engine);
        if (note_error(engine, error, engine->warned_unregister))
            log_warn("%s(%#lx) failed: %s (%d); further %s failures are "
                     "counted, not logged",
                     call_name(engine, true), (unsigned long)base, error_name(engine, error), error,
                     error_name(engine, error));
    }
    return result;
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
         * overlap. Forget the whole registration. */
        engine_remove_record_locked(engine, base);
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
        /* As it was: what holds its run keeps holding it; the rest is new,
         * and its run says what it becomes. */
        enum range_held hold = RANGE_HELD_NEW;
        if (piece->state == RANGE_HELD &&
            (piece->held == RANGE_HELD_ONFAULT || piece->held == RANGE_HELD_REFUSED ||
             piece->held == RANGE_HELD_NO_ACCESS))
            hold = (enum range_held)piece->held;
        enum engine_choice choice =
            piece->state == RANGE_PENDING || (piece->place.flags & RANGE_PLACE_DEFERRED)
                ? ENGINE_PLACE_DEFER
                : ENGINE_PLACE_READY;
        engine_track_range_locked(op, start, end, choice, &piece->place, hold);
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

long engine_unlock(struct engine *engine, uintptr_t start, uintptr_t end,
                   enum release_reason reason, enum engine_failure_rule failure,
                   const struct engine_call *call)
{
    if (!engine_active(engine) || start >= end)
        return engine_run_plain(call);
    if (end > PAGE_INDEX_LIMIT)
        end = PAGE_INDEX_LIMIT;
    /* Only munlock must claim pages that hold no record: a lock of a buffer
     * sharing a page may be running, and munlock undoes its lock. */
    if (reason != RELEASE_MUNLOCK && !engine_may_overlap(engine, start, end))
        return engine_run_plain(call);
    struct engine_op op;
    engine_op_begin(&op, engine, call->name);
    engine_prefetch_locked(engine, start, end);
    uintptr_t claim_start = start, claim_end = end;
    engine_claim_locked(&op, &claim_start, &claim_end, 1, true, false);
    struct engine_ticket ticket = {0};
    struct release_request request = {start, end, reason, &ticket, false, 0, 0};
    engine_release_locked(&op, &request);
    int call_errno;
    long result = engine_op_run(&op, call, &call_errno);
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
