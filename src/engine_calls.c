/* The backend's register and unregister calls: made with the mutex dropped
 * (the caller's claim covers the record), timed, traced (NVTX), counted by
 * cause and by error, with the NUMA placement of what was registered; and
 * a refused range cut by the kinds of mapping it spans. */
#include "engine_internal.h"
#include "trace.h"

#include "log.h"

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
        engine->backend->unregister_range(engine->backend->context, &place, (void *)base, length);
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
