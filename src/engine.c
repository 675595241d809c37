#include "engine.h"

#include "log.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

/* ---- small helpers ---- */

/* An entry of the lists of records waiting for the registration thread. */
struct engine_waiting {
    uintptr_t base;
    struct engine_waiting *next;
};

/* A piece of a record that a release removed, so a failed call can put it
 * back, or mremap can move it. */
struct engine_piece {
    uintptr_t start, end, lock_start, lock_end;
    struct range_place place;
    uint8_t state; /* RANGE_REGISTERED, QUEUED, PENDING or PROGRAM before the release */
    uint8_t program_locked;
    struct engine_piece *next;
};

struct engine_ticket {
    struct engine_piece *head;
};

/* One running entry point: its claim, its cancellation state, the errno the
 * program had, and whether it must start the registration thread. */
struct engine_op {
    struct engine *engine;
    int slot;
    int cancel_state;
    int program_errno;
    bool start_worker;
};

static uint64_t now_nanoseconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uintptr_t max_address(uintptr_t a, uintptr_t b)
{
    return a > b ? a : b;
}

static uintptr_t min_address(uintptr_t a, uintptr_t b)
{
    return a < b ? a : b;
}

static uintptr_t page_floor(const struct engine *engine, uintptr_t addr)
{
    return addr & ~(engine->options.page_size - 1);
}

/* Rounds up; an address in the last page rounds to the highest page boundary
 * below the index's limit (such pages are refused earlier). */
static uintptr_t page_ceil(const struct engine *engine, uintptr_t addr)
{
    uintptr_t mask = engine->options.page_size - 1;
    uintptr_t rounded = (addr + mask) & ~mask;
    return rounded < addr ? UINTPTR_MAX & ~mask : rounded;
}

/* The pages [*start, *end) of the byte range [addr, addr + length); false when
 * they reach above the indexed address space. */
static bool byte_range_pages(const struct engine *engine, uintptr_t addr, size_t length,
                             uintptr_t *start, uintptr_t *end)
{
    uintptr_t last = addr + length;
    if (last < addr)
        last = UINTPTR_MAX;
    *start = page_floor(engine, addr);
    *end = page_ceil(engine, last);
    return *end <= PAGE_INDEX_LIMIT && *start < *end;
}

static const char *error_name(struct engine *engine, int error)
{
    const char *name = NULL;
    if (engine->backend->error_name != NULL)
        name = engine->backend->error_name(engine->backend->context, error);
    return name != NULL ? name : "unknown CUDA error";
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

/* ---- records ---- */

static void publish_record_count(struct engine *engine)
{
    __atomic_store_n(&engine->record_count, engine->registry.count, __ATOMIC_RELAXED);
    if (engine->registry.count == 0)
        __atomic_store_n(engine->gate, 0, __ATOMIC_RELAXED);
}

/* The window's map (see struct engine_free_view): granules [first, last) of
 * it become covered (mark), or not (unmark), and the distances before them
 * follow. Values here are in granules (0..255); the map keeps them in bytes.
 * Only this thread writes the map (under the mutex); a reader may see a mix
 * of old and new entries, each a distance that held before or holds after,
 * so it never clears a block that overlaps a record that stays. */
static void window_store(uint64_t *map, uintptr_t at, unsigned value)
{
    __atomic_store_n(&map[at], (uint64_t)value << PAGE_INDEX_GRANULE_SHIFT, __ATOMIC_RELAXED);
}

static unsigned window_value(const uint64_t *map, uintptr_t at)
{
    return (unsigned)(map[at] >> PAGE_INDEX_GRANULE_SHIFT);
}

static void window_update(struct engine *engine, uintptr_t start, uintptr_t end, bool cover)
{
    uint64_t *map = engine->window_entries;
    uintptr_t base = engine->free_view.window_before + 1;
    uintptr_t granules = ENGINE_WINDOW_ENTRIES;
    if (map == NULL || end <= base)
        return;
    uintptr_t first = start > base ? (start - base) >> PAGE_INDEX_GRANULE_SHIFT : 0;
    uintptr_t last = (end - base + PAGE_INDEX_GRANULE - 1) >> PAGE_INDEX_GRANULE_SHIFT;
    if (first >= granules)
        return;
    if (last > granules)
        last = granules;
    uintptr_t reach_start = first > ENGINE_WINDOW_REACH ? first - ENGINE_WINDOW_REACH : 0;
    if (cover) {
        for (uintptr_t at = first; at < last; at++)
            window_store(map, at, ENGINE_WINDOW_REACH);
        for (uintptr_t at = first; at-- > reach_start;) {
            unsigned value = ENGINE_WINDOW_REACH - (unsigned)(first - at);
            if (window_value(map, at) >= value)
                break; /* nearer coverage already, from here on down */
            window_store(map, at, value);
        }
        return;
    }
    /* Uncovered: each entry from last - 1 down follows from the next one; the
     * granules before first keep their own coverage. */
    unsigned next = last < granules ? window_value(map, last) : 0;
    for (uintptr_t at = last; at-- > reach_start;) {
        unsigned value;
        if (at < first && window_value(map, at) == ENGINE_WINDOW_REACH)
            value = ENGINE_WINDOW_REACH;
        else
            value = next > 0 ? next - 1 : 0;
        if (at < first && window_value(map, at) == value)
            break; /* unchanged here: unchanged further down */
        window_store(map, at, value);
        next = value;
    }
}

/* The window goes where the first record is, once; a failed mapping leaves
 * free on the page index alone. */
static void window_place(struct engine *engine, uintptr_t address)
{
    if (engine->window_placed)
        return;
    engine->window_placed = true;
    engine->free_view.window_before = (address & ~(ENGINE_WINDOW_BYTES - 1)) - 1;
    engine->window_entries = internal_map(ENGINE_WINDOW_MAP_BYTES);
    /* Sparse: 4 KiB pages, so that marking a few records touches kilobytes,
     * not a 2 MiB huge page per record far from the others. */
    if (engine->window_entries != NULL)
        syscall(SYS_madvise, engine->window_entries, ENGINE_WINDOW_MAP_BYTES, MADV_NOHUGEPAGE);
    __atomic_store_n(&engine->free_view.window, engine->window_entries, __ATOMIC_RELAXED);
    if (engine->window_entries != NULL && engine->window_allowed)
        __atomic_store_n(&engine->free_view.window_size, ENGINE_WINDOW_BYTES, __ATOMIC_RELEASE);
}

void engine_keep_gate_at(struct engine *engine, uintptr_t *gate)
{
    pthread_mutex_lock(&engine->mutex);
    __atomic_store_n(gate, __atomic_load_n(engine->gate, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_store_n(&engine->free_view.gate, 0, __ATOMIC_RELAXED);
    engine->gate = gate;
    pthread_mutex_unlock(&engine->mutex);
}

void engine_enable_window(struct engine *engine)
{
    pthread_mutex_lock(&engine->mutex);
    engine->window_allowed = true;
    if (engine->registry.count != 0)
        __atomic_store_n(&engine->free_view.below, engine->span_start, __ATOMIC_RELAXED);
    if (engine->window_entries != NULL)
        __atomic_store_n(&engine->free_view.window_size, ENGINE_WINDOW_BYTES, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&engine->mutex);
}

/* Before a record is inserted: the span grows to hold it, or starts at it when
 * no record exists (a reader that still sees the old count only skips blocks
 * that held records now gone). */
static void widen_span_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    bool first = engine->registry.count == 0;
    if (first || start < engine->span_start) {
        __atomic_store_n(&engine->span_start, start, __ATOMIC_RELAXED);
        if (engine->window_allowed)
            __atomic_store_n(&engine->free_view.below, start, __ATOMIC_RELAXED);
    }
    if (first || end > engine->span_end)
        __atomic_store_n(&engine->span_end, end, __ATOMIC_RELAXED);
}

static void waiting_push_locked(struct engine *engine, struct engine_waiting **head,
                                struct engine_waiting **tail, uintptr_t base)
{
    struct engine_waiting *entry = node_pool_get(&engine->waiting_pool);
    if (entry == NULL) {
        log_warn("out of memory queueing %#lx for registration; it stays mlocked only",
                 (unsigned long)base);
        return;
    }
    entry->base = base;
    entry->next = NULL;
    if (*tail != NULL)
        (*tail)->next = entry;
    else
        *head = entry;
    *tail = entry;
}

static struct engine_waiting *waiting_pop_locked(struct engine_waiting **head,
                                                 struct engine_waiting **tail)
{
    struct engine_waiting *entry = *head;
    if (entry != NULL) {
        *head = entry->next;
        if (*head == NULL)
            *tail = NULL;
    }
    return entry;
}

/* Keeps the counts of queued and pending records (read without the lock by
 * the worker checks) and their lists in step with a record entering (sign 1)
 * or leaving (-1) a state. */
static void account_state_locked(struct engine *engine, const struct range_record *record, int sign)
{
    uint64_t bytes = record->end - record->base;
    if (record->state == RANGE_QUEUED) {
        __atomic_store_n(&engine->queued_ranges, engine->queued_ranges + (size_t)(long)sign,
                         __ATOMIC_RELAXED);
        if (sign > 0)
            waiting_push_locked(engine, &engine->queue_head, &engine->queue_tail, record->base);
    } else if (record->state == RANGE_PENDING) {
        __atomic_store_n(&engine->pending_ranges, engine->pending_ranges + (size_t)(long)sign,
                         __ATOMIC_RELAXED);
        engine->pending_bytes += sign > 0 ? bytes : (uint64_t)0 - bytes;
        if (sign > 0)
            waiting_push_locked(engine, &engine->pending_head, &engine->pending_tail, record->base);
    }
}

static void set_state_locked(struct engine *engine, struct range_record *record,
                             enum range_state state)
{
    account_state_locked(engine, record, -1);
    record->state = (uint8_t)state;
    account_state_locked(engine, record, 1);
}

static struct range_record *insert_record_locked(struct engine *engine,
                                                 const struct range_record *record)
{
    widen_span_locked(engine, record->base, record->end);
    struct range_record *stored = range_registry_insert(&engine->registry, record);
    if (stored == NULL)
        return NULL;
    window_place(engine, record->base);
    window_update(engine, record->base, record->end, true);
    publish_record_count(engine);
    __atomic_store_n(engine->gate, engine->span_end - 1, __ATOMIC_RELAXED);
    account_state_locked(engine, stored, 1);
    return stored;
}

static void remove_record_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    if (record == NULL)
        return;
    account_state_locked(engine, record, -1);
    window_update(engine, record->base, record->end, false);
    range_registry_remove(&engine->registry, base);
    publish_record_count(engine);
}

/* Splits the record at base so that one record covers exactly [start, end)
 * (inside it) and returns that record, or NULL when out of memory (nothing
 * changed). The pieces outside keep the record's fields; their pages stay
 * marked throughout, so a lock-free reader never sees them uncovered. */
static struct range_record *isolate_locked(struct engine *engine, uintptr_t base, uintptr_t start,
                                           uintptr_t end)
{
    struct range_registry *registry = &engine->registry;
    if (!range_registry_reserve(registry, 2))
        return NULL;
    struct range_record *record = range_registry_find(registry, base);
    if (record == NULL)
        return NULL;
    if (start > record->base) {
        record = range_registry_split(registry, record->base, start);
        account_state_locked(engine, record, 1);
    }
    if (end < record->end) {
        struct range_record *right = range_registry_split(registry, record->base, end);
        account_state_locked(engine, right, 1);
        record = range_registry_find(registry, start);
    }
    publish_record_count(engine);
    return record;
}

/* ---- claims ---- */

static bool ranges_overlap(uintptr_t a_start, uintptr_t a_end, uintptr_t b_start, uintptr_t b_end)
{
    return a_start < b_end && b_start < a_end;
}

static bool claims_conflict_locked(const struct engine *engine, const uintptr_t *starts,
                                   const uintptr_t *ends, unsigned count, int ignore_slot)
{
    for (int slot = 0; slot < ENGINE_CLAIMS; slot++) {
        const struct engine_claim *claim = &engine->claims[slot];
        if (claim->count == 0 || slot == ignore_slot)
            continue;
        for (unsigned i = 0; i < claim->count; i++)
            for (unsigned j = 0; j < count; j++)
                if (ranges_overlap(claim->start[i], claim->end[i], starts[j], ends[j]))
                    return true;
    }
    return false;
}

/* Widens [*start, *end) to the whole records that straddle its ends: a
 * release registers again the parts of a record outside the range, so it
 * needs those pages too. */
static void extend_to_records_locked(struct engine *engine, uintptr_t *start, uintptr_t *end)
{
    struct range_record *first = range_registry_containing(&engine->registry, *start);
    if (first != NULL && first->base < *start)
        *start = first->base;
    struct range_record *last = range_registry_containing(&engine->registry, *end - 1);
    if (last != NULL && last->end > *end)
        *end = last->end;
}

/* Waits until no other operation claims any page of the ranges, then claims
 * them (widened to whole records when extend is set). Returns false, with
 * nothing claimed, at shut-down when give_up_at_shutdown is set. */
static bool claim_locked(struct engine_op *op, const uintptr_t *starts, const uintptr_t *ends,
                         unsigned count, bool extend, bool give_up_at_shutdown)
{
    struct engine *engine = op->engine;
    for (;;) {
        if (give_up_at_shutdown && engine->shut_down)
            return false;
        uintptr_t wanted_start[2], wanted_end[2];
        for (unsigned i = 0; i < count; i++) {
            wanted_start[i] = starts[i];
            wanted_end[i] = ends[i];
            if (extend)
                extend_to_records_locked(engine, &wanted_start[i], &wanted_end[i]);
        }
        int free_slot = -1;
        for (int slot = 0; slot < ENGINE_CLAIMS && free_slot < 0; slot++)
            if (engine->claims[slot].count == 0)
                free_slot = slot;
        if (free_slot >= 0 &&
            !claims_conflict_locked(engine, wanted_start, wanted_end, count, -1)) {
            struct engine_claim *claim = &engine->claims[free_slot];
            for (unsigned i = 0; i < count; i++) {
                claim->start[i] = wanted_start[i];
                claim->end[i] = wanted_end[i];
            }
            claim->count = count;
            op->slot = free_slot;
            return true;
        }
        pthread_cond_wait(&engine->changed, &engine->mutex);
    }
}

/* Adds [start, end) to the op's claim when no other operation claims any of
 * it; never waits (the op already holds pages). False when it cannot. */
static bool claim_more_locked(struct engine_op *op, uintptr_t start, uintptr_t end)
{
    struct engine *engine = op->engine;
    struct engine_claim *claim = &engine->claims[op->slot];
    if (claim->count >= 2 || claims_conflict_locked(engine, &start, &end, 1, op->slot))
        return false;
    claim->start[claim->count] = start;
    claim->end[claim->count] = end;
    claim->count++;
    return true;
}

static bool op_claims(const struct engine_op *op, uintptr_t start, uintptr_t end)
{
    if (op->slot < 0)
        return false;
    const struct engine_claim *claim = &op->engine->claims[op->slot];
    for (unsigned i = 0; i < claim->count; i++)
        if (claim->start[i] <= start && end <= claim->end[i])
            return true;
    return false;
}

/* ---- operations: begin and end ---- */

/* Cancellation is off for the whole operation: the engine waits on condition
 * variables (cancellation points that free and munlock must not have), and a
 * thread cancelled there would die holding the mutex or a claim. */
static void op_begin(struct engine_op *op, struct engine *engine)
{
    op->engine = engine;
    op->slot = -1;
    op->start_worker = false;
    op->program_errno = errno;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &op->cancel_state);
    pthread_mutex_lock(&engine->mutex);
}

static void op_end(struct engine_op *op)
{
    struct engine *engine = op->engine;
    if (op->slot >= 0) {
        engine->claims[op->slot].count = 0;
        pthread_cond_broadcast(&engine->changed);
    }
    pthread_mutex_unlock(&engine->mutex);
    if (op->start_worker && engine->backend->wake_worker != NULL)
        engine->backend->wake_worker(engine->backend->context);
    int ignored;
    pthread_setcancelstate(op->cancel_state, &ignored);
}

/* Runs the real call with the mutex dropped and the program's errno in place;
 * returns its result and leaves its errno in *call_errno. */
static long op_run(struct engine_op *op, const struct engine_call *call, int *call_errno)
{
    pthread_mutex_unlock(&op->engine->mutex);
    errno = op->program_errno;
    long result = call->run(call->arguments);
    *call_errno = errno;
    pthread_mutex_lock(&op->engine->mutex);
    return result;
}

/* Work for the registration thread was added: wake it, or have the op start
 * one once it has dropped the mutex. */
static void want_worker_locked(struct engine_op *op)
{
    struct engine *engine = op->engine;
    if (engine->worker_active) {
        pthread_cond_broadcast(&engine->changed);
        return;
    }
    engine->worker_active = true;
    op->start_worker = true;
}

/* ---- registering ---- */

static void count_device_locked(struct engine *engine, const struct range_place *place,
                                uint64_t bytes)
{
    if (place->device >= 0 && place->device < ENGINE_MAX_DEVICES) {
        engine->devices[place->device].registrations++;
        engine->devices[place->device].bytes += bytes;
    }
}

/* The record at base is REGISTERING: makes the backend call with the mutex
 * dropped (the caller's claim covers the record) and records the outcome. */
static void register_record_locked(struct engine *engine, uintptr_t base, bool on_worker)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    struct range_place place = record->place;
    size_t length = record->end - record->base;

    pthread_mutex_unlock(&engine->mutex);
    uint64_t began = now_nanoseconds();
    int error =
        engine->backend->register_range(engine->backend->context, &place, (void *)base, length);
    if (error == ENGINE_CUDA_SUCCESS && engine->backend->registered != NULL)
        engine->backend->registered(engine->backend->context, base, base + length, true);
    uint64_t took = now_nanoseconds() - began;
    pthread_mutex_lock(&engine->mutex);

    record = range_registry_find(&engine->registry, base);
    struct pinshim_counters *counters = &engine->counters;
    counters->register_nanoseconds += took;
    if (on_worker)
        engine->background_nanoseconds += took;
    else
        engine->wait_nanoseconds += took;
    if (error == ENGINE_CUDA_SUCCESS) {
        record->state = RANGE_REGISTERED;
        record->place = place;
        counters->register_ok++;
        counters->register_bytes += length;
        counters->live_ranges++;
        counters->live_bytes += length;
        if (counters->live_bytes > counters->peak_bytes)
            counters->peak_bytes = counters->live_bytes;
        count_device_locked(engine, &place, length);
        log_info("registered %#lx + %lu bytes on device %d in %.3f ms%s", (unsigned long)base,
                 (unsigned long)length, (int)place.device, (double)took / 1e6,
                 on_worker ? " (in the background)" : "");
    } else if (error == ENGINE_CUDA_NO_CONTEXT) {
        /* The context it was meant for went away: wait for one. */
        engine->deferred_total++;
        set_state_locked(engine, record, RANGE_PENDING);
    } else {
        remove_record_locked(engine, base);
        bool first = note_error(engine, error, engine->warned_register);
        if (error == ENGINE_CUDA_ALREADY_REGISTERED) {
            /* The program or its framework registered it: not ours to unregister. */
            counters->register_already_registered++;
            log_info("%#lx + %lu bytes are already registered by the program; left alone",
                     (unsigned long)base, (unsigned long)length);
        } else {
            counters->register_failed++;
            if (first)
                log_warn("%s(%#lx, %lu) failed: %s (%d); the range stays "
                         "mlocked only; further %s failures are counted, not logged",
                         call_name(engine, false), (unsigned long)base, (unsigned long)length,
                         error_name(engine, error), error, error_name(engine, error));
        }
    }
    pthread_cond_broadcast(&engine->changed);
}

/* Adds records for the pages of [start, end) that no record covers, in
 * chunks of at most max_registration_bytes: registered at once, queued for
 * the registration thread, or pending until the process has a context, as
 * choice and the options say. The op's claim covers [start, end). */
/* [start, end) is locked now: the parts of the program's own registrations
 * there are marked, to be taken back when the program unregisters them (the
 * registry, kept equal to what is locked, answers; no /proc read). */
static void mark_program_locked_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    uintptr_t cursor = start;
    while (cursor < end) {
        struct range_record *record = range_registry_first_overlap(&engine->registry, cursor, end);
        if (record == NULL)
            return;
        cursor = record->end;
        if (record->state != RANGE_PROGRAM || record->program_locked)
            continue;
        struct range_record *part = isolate_locked(
            engine, record->base, max_address(record->base, start), min_address(record->end, end));
        if (part != NULL)
            part->program_locked = 1;
    }
}

static void add_range_locked(struct engine_op *op, uintptr_t start, uintptr_t end,
                             uintptr_t lock_start, uintptr_t lock_end, enum engine_choice choice,
                             const struct range_place *place)
{
    struct engine *engine = op->engine;
    struct range_registry *registry = &engine->registry;
    if (choice == ENGINE_PLACE_DISABLED || engine->shut_down)
        return;
    if (engine->program_registrations != 0)
        mark_program_locked_locked(engine, start, end);
    uint64_t chunk = engine->options.max_registration_bytes;
    if (chunk < engine->options.page_size)
        chunk = engine->options.page_size;
    chunk &= ~(uint64_t)(engine->options.page_size - 1);
    uintptr_t cursor = start;
    while (cursor < end && !engine->shut_down) {
        uintptr_t gap_start, gap_end = end;
        if (!page_index_find_next(&registry->index, PAGE_INDEX_USED, false, cursor, end,
                                  &gap_start))
            break;
        if (!page_index_find_next(&registry->index, PAGE_INDEX_USED, true, gap_start, end,
                                  &gap_end))
            gap_end = end;
        if (gap_end - gap_start > chunk)
            gap_end = gap_start + chunk;
        cursor = gap_end;

        struct range_record record = {
            .base = gap_start,
            .end = gap_end,
            .lock_start = lock_start,
            .lock_end = lock_end,
            .place = *place,
        };
        bool deferred = choice != ENGINE_PLACE_READY;
        if (deferred)
            record.state = RANGE_PENDING;
        else if (engine->options.asynchronous && !(place->flags & RANGE_PLACE_THREAD_CONTEXT))
            record.state = RANGE_QUEUED;
        else
            record.state = RANGE_REGISTERING;
        if (insert_record_locked(engine, &record) == NULL) {
            engine->counters.register_failed++;
            log_warn("out of memory for the range registry; %#lx + %lu bytes stay unregistered",
                     (unsigned long)gap_start, (unsigned long)(gap_end - gap_start));
            return;
        }
        if (deferred) {
            engine->deferred_total++;
            want_worker_locked(op); /* the watcher */
        } else if (record.state == RANGE_QUEUED) {
            want_worker_locked(op);
        } else {
            register_record_locked(engine, gap_start, false);
        }
    }
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
    piece->lock_start = record->lock_start;
    piece->lock_end = record->lock_end;
    piece->place = record->place;
    piece->state = state;
    piece->program_locked = record->program_locked;
    piece->next = ticket->head;
    ticket->head = piece;
}

static void ticket_discard_locked(struct engine *engine, struct engine_ticket *ticket)
{
    while (ticket->head != NULL) {
        struct engine_piece *piece = ticket->head;
        ticket->head = piece->next;
        node_pool_put(&engine->piece_pool, piece);
    }
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
    case RELEASE_PROGRAM:
        return &counters->unregister_program;
    case RELEASE_EXIT:
    case RELEASE_REASON_COUNT:
        break;
    }
    return &counters->unregister_exit;
}

/* Unregisters the REGISTERED record at base (the mutex dropped around the
 * call) and counts it; returns the backend's answer. The record stays, in
 * state UNREGISTERING, for the caller to cut. */
static int unregister_record_locked(struct engine *engine, uintptr_t base,
                                    enum release_reason reason, bool on_worker)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    record->state = RANGE_UNREGISTERING;
    struct range_place place = record->place;
    size_t length = record->end - record->base;

    pthread_mutex_unlock(&engine->mutex);
    uint64_t began = now_nanoseconds();
    if (engine->backend->registered != NULL)
        engine->backend->registered(engine->backend->context, base, base + length, false);
    int error = engine->backend->unregister_range(engine->backend->context, &place, (void *)base);
    uint64_t took = now_nanoseconds() - began;
    pthread_mutex_lock(&engine->mutex);

    struct pinshim_counters *counters = &engine->counters;
    counters->unregister_nanoseconds += took;
    if (on_worker)
        engine->background_nanoseconds += took;
    else
        engine->wait_nanoseconds += took;
    counters->live_ranges--;
    counters->live_bytes -= length;
    (*reason_counter(counters, reason))++;
    if (error == ENGINE_CUDA_SUCCESS) {
        counters->unregister_ok++;
        log_info("unregistered %#lx + %lu bytes in %.3f ms", (unsigned long)base,
                 (unsigned long)length, (double)took / 1e6);
    } else if (reason == RELEASE_EXIT && error == ENGINE_CUDA_DEINITIALIZED) {
        /* The runtime tore itself down first; the kernel drops the pins. */
        engine->exit_unloading++;
        note_error(engine, error, engine->warned_unregister);
    } else if (error == ENGINE_CUDA_NOT_REGISTERED) {
        /* Gone already: with its context (destroyed by the program), or
         * unregistered by the program through a path the shim cannot see. */
        engine->gone_with_context++;
        note_error(engine, error, engine->warned_unregister);
        log_info("%#lx was no longer registered (its context was destroyed, or the program "
                 "unregistered it itself)",
                 (unsigned long)base);
    } else {
        counters->unregister_failed++;
        if (note_error(engine, error, engine->warned_unregister))
            log_warn("%s(%#lx) failed: %s (%d); further %s failures are "
                     "counted, not logged",
                     call_name(engine, true), (unsigned long)base, error_name(engine, error), error,
                     error_name(engine, error));
    }
    return error;
}

/* What a release asks for. */
struct release_request {
    uintptr_t start, end; /* pages */
    enum release_reason reason;
    struct engine_ticket *ticket; /* NULL: nothing will be put back */
    /* free/realloc: the block's bytes, for the rule on shared pages */
    bool block;
    uintptr_t block_start, block_end;
};

/* A part of a record left outside a release, after the record's
 * registration was undone: registered again (now, or by the registration
 * thread), since CUDA cannot unregister part of a registration. */
static void reregister_part_locked(struct engine_op *op, uintptr_t base)
{
    struct engine *engine = op->engine;
    struct range_record *part = range_registry_find(&engine->registry, base);
    bool asynchronous =
        engine->options.asynchronous && !(part->place.flags & RANGE_PLACE_THREAD_CONTEXT);
    set_state_locked(engine, part, asynchronous ? RANGE_QUEUED : RANGE_REGISTERING);
    if (asynchronous)
        want_worker_locked(op);
    else
        register_record_locked(engine, base, false);
}

/* Releases the part [start, end) of the record at base. */
static void release_part_locked(struct engine_op *op, uintptr_t base, uintptr_t start,
                                uintptr_t end, const struct release_request *request)
{
    struct engine *engine = op->engine;
    struct range_record *record = range_registry_find(&engine->registry, base);
    uint8_t state = record->state;
    if (state == RANGE_PENDING || state == RANGE_QUEUED || state == RANGE_PROGRAM) {
        /* Nothing was registered by the shim: no CUDA call. */
        struct range_record *part = isolate_locked(engine, base, start, end);
        if (part == NULL) {
            log_warn("out of memory splitting a record; %#lx + %lu bytes are forgotten",
                     (unsigned long)base, (unsigned long)(record->end - base));
            part = range_registry_find(&engine->registry, base);
            start = part->base;
            end = part->end;
        }
        if (request->reason != RELEASE_EXIT && state == RANGE_PENDING)
            engine->dropped_pending++;
        else if (request->reason != RELEASE_EXIT && state == RANGE_QUEUED)
            engine->cancelled_queued++;
        ticket_add_locked(engine, request->ticket, part, start, end, state);
        remove_record_locked(engine, start);
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
    int error = unregister_record_locked(engine, base, request->reason, false);
    bool can_reregister = error == ENGINE_CUDA_SUCCESS || error == ENGINE_CUDA_NOT_REGISTERED;
    if (!can_reregister || request->reason == RELEASE_EXIT) {
        /* The runtime may still hold it: registering parts again would
         * overlap. Forget the whole registration. */
        remove_record_locked(engine, base);
        return;
    }
    ticket_add_locked(engine, request->ticket, &saved, start, end, RANGE_REGISTERED);
    struct range_record *part = isolate_locked(engine, base, start, end);
    /* isolate cannot fail here: room was reserved. */
    remove_record_locked(engine, part->base);
    if (whole_start < start)
        reregister_part_locked(op, whole_start);
    if (end < whole_end)
        reregister_part_locked(op, end);
}

/* Releases every record overlapping request's pages (for a block: as the
 * block rule says). The op's claim covers them and the records around. */
static void release_locked(struct engine_op *op, const struct release_request *request)
{
    struct engine *engine = op->engine;
    uintptr_t cursor = request->start;
    uintptr_t page = engine->options.page_size;
    while (cursor < request->end) {
        struct range_record *record =
            range_registry_first_overlap(&engine->registry, cursor, request->end);
        if (record == NULL)
            break;
        uintptr_t base = record->base, record_end = record->end;
        uintptr_t start = max_address(base, request->start);
        uintptr_t end = min_address(record_end, request->end);
        cursor = record_end;
        if (record->state == RANGE_PROGRAM &&
            (request->reason == RELEASE_MUNLOCK || request->reason == RELEASE_EXIT ||
             request->reason == RELEASE_PROGRAM)) {
            /* The program's registration does not depend on the lock; the
             * unlocked pages are no longer to be taken back when the program
             * unregisters (should munlock fail, they stay unmarked: no
             * take-back, never a registration of unlocked memory). */
            if (request->reason == RELEASE_MUNLOCK && record->program_locked) {
                struct range_record *part = isolate_locked(engine, base, start, end);
                if (part != NULL)
                    part->program_locked = 0;
            }
            continue;
        }
        if (request->block && !ranges_overlap(record->lock_start, record->lock_end,
                                              request->block_start, request->block_end)) {
            /* Registered for other memory: only the pages the block covers
             * whole can go back to the allocator; a page it shares with a
             * live neighbour cannot. */
            uintptr_t inner_start = (request->block_start + page - 1) & ~(page - 1);
            uintptr_t inner_end = request->block_end & ~(page - 1);
            start = max_address(start, inner_start);
            end = min_address(end, inner_end);
            if (start >= end)
                continue;
        }
        release_part_locked(op, base, start, end, request);
    }
}

/* Registers again (or queues, or keeps pending) the ticket's pieces, clipped
 * to [clip_start, clip_end); only the parts is_wanted accepts when given. */
static void restore_locked(struct engine_op *op, struct engine_ticket *ticket, uintptr_t clip_start,
                           uintptr_t clip_end, bool only_mapped)
{
    struct engine *engine = op->engine;
    for (struct engine_piece *piece = ticket->head; piece != NULL; piece = piece->next) {
        uintptr_t start = max_address(piece->start, clip_start);
        uintptr_t end = min_address(piece->end, clip_end);
        if (start >= end)
            continue;
        if (only_mapped && engine->backend->is_mapped != NULL &&
            !engine->backend->is_mapped(engine->backend->context, start, end))
            continue;
        if (piece->state == RANGE_PROGRAM) {
            /* The call failed: the memory, and the program's registration of
             * it, are still there. */
            struct range_record record = {.base = start,
                                          .end = end,
                                          .lock_start = piece->lock_start,
                                          .lock_end = piece->lock_end,
                                          .place = piece->place,
                                          .state = RANGE_PROGRAM,
                                          .program_locked = piece->program_locked};
            insert_record_locked(engine, &record);
            continue;
        }
        enum engine_choice choice =
            piece->state == RANGE_PENDING ? ENGINE_PLACE_DEFER : ENGINE_PLACE_READY;
        add_range_locked(op, start, end, piece->lock_start, piece->lock_end, choice, &piece->place);
    }
    ticket_discard_locked(engine, ticket);
}

/* ---- lifecycle ---- */

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
    engine->gate = &engine->free_view.gate;
    engine->options = *options;
    if (engine->options.page_size < PAGE_INDEX_GRANULE)
        engine->options.page_size = PAGE_INDEX_GRANULE;
    if (engine->options.max_registration_bytes == 0)
        engine->options.max_registration_bytes = UINT64_MAX;
    node_pool_init(&engine->piece_pool, sizeof(struct engine_piece));
    node_pool_init(&engine->waiting_pool, sizeof(struct engine_waiting));
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
    /* Not engine_destroy: in the child the mutex is held (the fork handler
     * took it) and the condition variable may count the parent's waiting
     * registration thread, which does not exist here, so destroying it would
     * wait for that thread forever. engine_init makes both anew. */
    engine_release_memory(engine);
    engine_init(engine, backend, &options);
    engine->window_allowed = window_allowed;
    if (gate != &engine->free_view.gate) {
        *gate = 0;
        engine->gate = gate;
    }
}

/* ---- entry points ---- */

static bool engine_active(struct engine *engine)
{
    return engine->registry_ok && !__atomic_load_n(&engine->shut_down, __ATOMIC_RELAXED);
}

static long run_plain(const struct engine_call *call)
{
    return call->run(call->arguments);
}

struct onfault_context {
    struct engine_op *op;
    uintptr_t lock_start, lock_end;
    enum engine_choice choice;
    const struct range_place *place;
    uint64_t resident_pages;
};

static void register_resident_part(void *context, uintptr_t start, uintptr_t end)
{
    struct onfault_context *onfault = context;
    struct engine *engine = onfault->op->engine;
    onfault->resident_pages += (end - start) / engine->options.page_size;
    pthread_mutex_lock(&engine->mutex);
    add_range_locked(onfault->op, start, end, onfault->lock_start, onfault->lock_end,
                     onfault->choice, onfault->place);
    pthread_mutex_unlock(&engine->mutex);
}

long engine_lock(struct engine *engine, uintptr_t addr, size_t length, unsigned flags,
                 const struct engine_call *call)
{
    if (!engine_active(engine))
        return run_plain(call);
    if (length < engine->options.min_bytes) {
        engine_count(&engine->skipped_small);
        return run_plain(call);
    }
    uintptr_t start, end;
    if (!byte_range_pages(engine, addr, length, &start, &end)) {
        engine_count(&engine->skipped_address);
        return run_plain(call);
    }
    bool onfault = (flags & ENGINE_LOCK_ONFAULT) != 0;
    if (onfault && engine->options.onfault == ENGINE_ONFAULT_SKIP) {
        __atomic_fetch_add(&engine->skipped_onfault_pages,
                           (end - start) / engine->options.page_size, __ATOMIC_RELAXED);
        return run_plain(call);
    }

    struct engine_op op;
    op_begin(&op, engine);
    claim_locked(&op, &start, &end, 1, false, false);
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    if (result == 0 && !engine->shut_down) {
        pthread_mutex_unlock(&engine->mutex);
        struct range_place place = {.device = -1};
        enum engine_choice choice =
            engine->backend->choose_place(engine->backend->context, false, NULL, &place);
        if (choice == ENGINE_PLACE_DISABLED) {
            engine_count(&engine->skipped_disabled);
        } else if (onfault && engine->options.onfault == ENGINE_ONFAULT_RESIDENT &&
                   engine->backend->resident_parts != NULL) {
            /* Only what is resident: registering faults pages in, and
             * MLOCK_ONFAULT asked to keep resident only what is touched. */
            struct onfault_context context = {&op, addr, addr + length, choice, &place, 0};
            engine->backend->resident_parts(engine->backend->context, start, end,
                                            register_resident_part, &context);
            __atomic_fetch_add(&engine->skipped_onfault_pages,
                               (end - start) / engine->options.page_size - context.resident_pages,
                               __ATOMIC_RELAXED);
        } else {
            pthread_mutex_lock(&engine->mutex);
            add_range_locked(&op, start, end, addr, addr + length, choice, &place);
            pthread_mutex_unlock(&engine->mutex);
        }
        pthread_mutex_lock(&engine->mutex);
    }
    op_end(&op);
    errno = call_errno;
    return result;
}

long engine_map(struct engine *engine, uintptr_t fixed_start, size_t length, bool replaces,
                bool locks, const struct engine_call *call)
{
    uintptr_t start = 0, end = 0;
    if (!engine_active(engine) ||
        (replaces && !byte_range_pages(engine, fixed_start, length, &start, &end)))
        return run_plain(call);
    if (replaces && !locks && !engine_may_overlap(engine, start, end))
        return run_plain(call);
    struct engine_op op;
    op_begin(&op, engine);
    struct engine_ticket ticket = {0};
    if (replaces) {
        claim_locked(&op, &start, &end, 1, true, false);
        struct release_request request = {start, end, RELEASE_MMAP_FIXED, &ticket, false, 0, 0};
        release_locked(&op, &request);
    }
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    bool failed = result == -1; /* MAP_FAILED */
    if (failed) {
        /* MAP_FIXED may have unmapped the old pages before failing. */
        restore_locked(&op, &ticket, 0, UINTPTR_MAX, true);
    } else {
        ticket_discard_locked(engine, &ticket);
        uintptr_t map_start, map_end;
        if (locks && length >= engine->options.min_bytes &&
            byte_range_pages(engine, (uintptr_t)result, length, &map_start, &map_end)) {
            pthread_mutex_unlock(&engine->mutex);
            struct range_place place = {.device = -1};
            enum engine_choice choice =
                engine->backend->choose_place(engine->backend->context, false, NULL, &place);
            pthread_mutex_lock(&engine->mutex);
            if (choice == ENGINE_PLACE_DISABLED)
                engine_count(&engine->skipped_disabled);
            /* A new mapping: only a racing call on addresses it did not own
             * yet could claim it; then it stays unregistered. */
            else if (op_claims(&op, map_start, map_end) ||
                     (op.slot < 0 ? claim_locked(&op, &map_start, &map_end, 1, false, true)
                                  : claim_more_locked(&op, map_start, map_end)))
                add_range_locked(&op, map_start, map_end, (uintptr_t)result,
                                 (uintptr_t)result + length, choice, &place);
        } else if (locks && length < engine->options.min_bytes) {
            engine_count(&engine->skipped_small);
        }
    }
    op_end(&op);
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
        return run_plain(call);
    if (end > PAGE_INDEX_LIMIT)
        end = PAGE_INDEX_LIMIT;
    /* Only munlock must claim pages that hold no record: a lock of a buffer
     * sharing a page may be running, and munlock undoes its lock. */
    if (reason != RELEASE_MUNLOCK && !engine_may_overlap(engine, start, end))
        return run_plain(call);
    struct engine_op op;
    op_begin(&op, engine);
    claim_locked(&op, &start, &end, 1, true, false);
    struct engine_ticket ticket = {0};
    struct release_request request = {start, end, reason, &ticket, false, 0, 0};
    release_locked(&op, &request);
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    if (result != 0) {
        uintptr_t still_locked_from = start;
        if (failure == ENGINE_FAILED_UNLOCKED_TO_HOLE && call_errno == ENOMEM) {
            pthread_mutex_unlock(&engine->mutex);
            still_locked_from = first_unmapped_page(engine, start, end);
            pthread_mutex_lock(&engine->mutex);
        }
        restore_locked(&op, &ticket, still_locked_from, UINTPTR_MAX,
                       failure == ENGINE_FAILED_MAY_HAVE_UNMAPPED);
    } else {
        ticket_discard_locked(engine, &ticket);
    }
    op_end(&op);
    errno = call_errno;
    return result;
}

long engine_release_block(struct engine *engine, uintptr_t start, uintptr_t end,
                          enum release_reason reason, bool can_fail, const struct engine_call *call)
{
    uintptr_t pages_start = page_floor(engine, start), pages_end = page_ceil(engine, end);
    if (!engine_active(engine) || pages_end > PAGE_INDEX_LIMIT ||
        !engine_may_overlap(engine, pages_start, pages_end))
        return run_plain(call);
    struct engine_op op;
    op_begin(&op, engine);
    claim_locked(&op, &pages_start, &pages_end, 1, true, false);
    struct engine_ticket ticket = {0};
    struct release_request request = {pages_start, pages_end, reason, can_fail ? &ticket : NULL,
                                      true,        start,     end};
    release_locked(&op, &request);
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    if (can_fail && result == 0)
        restore_locked(&op, &ticket, 0, UINTPTR_MAX, false); /* the block is as it was */
    else
        ticket_discard_locked(engine, &ticket);
    op_end(&op);
    errno = call_errno;
    return result;
}

/* ---- mremap ---- */

#ifndef MREMAP_MAYMOVE
#define MREMAP_MAYMOVE 1
#endif
#ifndef MREMAP_FIXED
#define MREMAP_FIXED 2
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* Registers at new_start what the ticket released in [old_start, old_end): a
 * moved or resized locked mapping stays locked (Linux carries VM_LOCKED with
 * the mapping), and growth of a locked mapping is locked too. */
static void register_moved_locked(struct engine_op *op, struct engine_ticket *ticket,
                                  uintptr_t old_start, uintptr_t old_end, uintptr_t new_start,
                                  uintptr_t new_end)
{
    for (struct engine_piece *piece = ticket->head; piece != NULL; piece = piece->next) {
        if (piece->end <= old_start || piece->start >= old_end)
            continue; /* released with the old mapping, not moved */
        uintptr_t from = max_address(piece->start, old_start);
        uintptr_t to = min_address(piece->end, old_end);
        uintptr_t start = new_start + (from - old_start);
        uintptr_t end = new_start + (to - old_start);
        if (to == old_end || end > new_end)
            end = new_end;
        if (start < end)
            add_range_locked(op, start, end, start, end,
                             piece->state == RANGE_PENDING ? ENGINE_PLACE_DEFER
                                                           : ENGINE_PLACE_READY,
                             &piece->place);
    }
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
    if (op_claims(part->op, start, end))
        add_range_locked(part->op, start, end, start, end,
                         part->piece->state == RANGE_PENDING ? ENGINE_PLACE_DEFER
                                                             : ENGINE_PLACE_READY,
                         &part->piece->place);
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
        return run_plain(call);
    if (old_size != 0 && !byte_range_pages(engine, old_start, old_size, &old_start, &old_end))
        return run_plain(call);
    if (fixed && !byte_range_pages(engine, new_address, new_size, &target_start, &target_end))
        fixed = false; /* the call fails with EINVAL; nothing to release there */
    bool involved = (old_size != 0 && engine_may_overlap(engine, old_start, old_end)) ||
                    (dontunmap && engine_has_registrations(engine)) ||
                    (fixed && engine_may_overlap(engine, target_start, target_end));
    if (!involved)
        return run_plain(call);

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
            span_start = min_address(span_start, low);
        if (engine->backend->mapping_bounds(engine->backend->context, old_end - 1, &low, &high))
            span_end = max_address(span_end, high);
    }

    struct engine_op op;
    op_begin(&op, engine);
    uintptr_t starts[2] = {span_start, target_start}, ends[2] = {span_end, target_end};
    unsigned ranges = fixed ? 2 : 1;
    if (old_size == 0) {
        starts[0] = target_start;
        ends[0] = target_end;
        ranges = fixed ? 1 : 0;
    }
    if (ranges > 0)
        claim_locked(&op, starts, ends, ranges, true, false);
    struct engine_ticket moved = {0}, replaced = {0};
    if (old_size != 0) {
        struct release_request request = {span_start, span_end, RELEASE_MREMAP, &moved, false,
                                          0,          0};
        release_locked(&op, &request);
    }
    if (fixed) {
        struct release_request request = {
            target_start, target_end, RELEASE_MREMAP, &replaced, false, 0, 0};
        release_locked(&op, &request);
    }
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    bool failed = result == -1; /* MAP_FAILED */
    uintptr_t new_start = failed ? 0 : (uintptr_t)result, new_end = 0;
    if (!failed)
        new_end = page_ceil(engine, new_start + new_size);
    if (failed) {
        if (dontunmap) {
            /* A failed call changed nothing: put back what is still locked. */
            for (struct engine_piece *piece = moved.head; piece != NULL; piece = piece->next)
                register_where_locked_locked(&op, piece, piece->start, piece->end);
            for (struct engine_piece *piece = replaced.head; piece != NULL; piece = piece->next)
                register_where_locked_locked(&op, piece, piece->start, piece->end);
            ticket_discard_locked(engine, &moved);
            ticket_discard_locked(engine, &replaced);
        } else {
            restore_locked(&op, &moved, 0, UINTPTR_MAX, false);
            restore_locked(&op, &replaced, 0, UINTPTR_MAX, true);
        }
        op_end(&op);
        errno = call_errno;
        return result;
    }
    if (dontunmap) {
        /* What stays at the old place, while the old place is claimed. After
         * success a fixed target holds the moved pages, not what was
         * registered there. */
        uintptr_t cut_start = fixed ? target_start : 0, cut_end = fixed ? target_end : 0;
        for (struct engine_piece *piece = moved.head; piece != NULL; piece = piece->next) {
            register_where_locked_locked(&op, piece, piece->start,
                                         min_address(piece->end, cut_start));
            register_where_locked_locked(&op, piece, max_address(piece->start, cut_end),
                                         piece->end);
        }
    }
    /* The moved pages' new home: claimed already when fixed or in place;
     * else a range the kernel just found free, which another operation may
     * still claim (an unmap that gave those addresses back and has not
     * finished). Waiting for it while holding the old range could deadlock
     * two moves into each other's old places, so the old claim goes first
     * (its work is done) and the new range is claimed holding nothing. */
    bool may_register_new = op_claims(&op, new_start, new_end);
    if (!may_register_new && moved.head != NULL) {
        engine->claims[op.slot].count = 0;
        pthread_cond_broadcast(&engine->changed);
        op.slot = -1;
        may_register_new = claim_locked(&op, &new_start, &new_end, 1, false, true);
    }
    if (may_register_new && dontunmap) {
        for (struct engine_piece *piece = moved.head; piece != NULL; piece = piece->next) {
            if (piece->end <= old_start || piece->start >= old_end)
                continue;
            uintptr_t from = max_address(piece->start, old_start);
            uintptr_t to = min_address(piece->end, old_end);
            register_where_locked_locked(&op, piece, new_start + (from - old_start),
                                         new_start + (to - old_start));
        }
    } else if (may_register_new) {
        register_moved_locked(&op, &moved, old_start, old_end, new_start, new_end);
    }
    ticket_discard_locked(engine, &moved);
    ticket_discard_locked(engine, &replaced);
    op_end(&op);
    errno = call_errno;
    return result;
}

/* ---- the program's own registrations ---- */

long engine_program_register(struct engine *engine, uintptr_t start, size_t length,
                             const struct engine_call *call)
{
    uintptr_t pages_start, pages_end;
    if (!engine_active(engine) || length == 0 ||
        !byte_range_pages(engine, start, length, &pages_start, &pages_end))
        return run_plain(call);
    struct engine_op op;
    op_begin(&op, engine);
    claim_locked(&op, &pages_start, &pages_end, 1, true, false);
    /* Every page the program's range touches becomes the program's: the
     * shim's registrations there go (the parts outside are registered again),
     * queued and pending ones are dropped, before the program's call. */
    struct engine_ticket ticket = {0};
    struct release_request request = {pages_start, pages_end, RELEASE_PROGRAM, &ticket, false,
                                      0,           0};
    release_locked(&op, &request);
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    if (result == ENGINE_CUDA_SUCCESS) {
        engine->program_registrations++;
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
                                          .lock_start = start,
                                          .lock_end = start + length,
                                          .place = {.device = -1},
                                          .state = RANGE_PROGRAM};
            if (insert_record_locked(engine, &record) == NULL)
                break; /* out of memory: a later lock there gets 712, counted */
            cursor = gap_end;
        }
        /* What the shim held there was locked, and still is. */
        for (struct engine_piece *piece = ticket.head; piece != NULL; piece = piece->next)
            if (piece->state != RANGE_PROGRAM || piece->program_locked)
                mark_program_locked_locked(engine, max_address(piece->start, pages_start),
                                           min_address(piece->end, pages_end));
        ticket_discard_locked(engine, &ticket);
    } else {
        restore_locked(&op, &ticket, 0, UINTPTR_MAX, false);
    }
    op_end(&op);
    errno = call_errno;
    return result;
}

/* The state of the record holding addr, or -1 when none does. */
static int state_at(struct engine *engine, uintptr_t addr)
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
    int state = state_at(engine, addr);
    return state >= 0 && state != RANGE_PROGRAM;
}

long engine_program_unregister(struct engine *engine, uintptr_t start,
                               const struct engine_call *call)
{
    uintptr_t page = page_floor(engine, start);
    if (!engine_active(engine) || page >= PAGE_INDEX_LIMIT ||
        !engine_may_overlap(engine, page, page + engine->options.page_size))
        return run_plain(call);
    struct engine_op op;
    op_begin(&op, engine);
    uintptr_t claim_start = page, claim_end = page + engine->options.page_size;
    claim_locked(&op, &claim_start, &claim_end, 1, true, false);
    struct range_record *record = range_registry_containing(&engine->registry, start);
    struct range_record program = {0};
    uintptr_t whole_start = 0, whole_end = 0;
    if (record != NULL && record->state == RANGE_PROGRAM) {
        program = *record;
        /* One registration may be several records (the parts the program
         * holds locked are apart): claim all of them. */
        whole_start = page_floor(engine, program.lock_start);
        whole_end = page_ceil(engine, program.lock_end);
        if (!op_claims(&op, whole_start, whole_end)) {
            engine->claims[op.slot].count = 0;
            pthread_cond_broadcast(&engine->changed);
            op.slot = -1;
            claim_locked(&op, &whole_start, &whole_end, 1, true, false);
            record = range_registry_containing(&engine->registry, start);
            if (record == NULL || record->state != RANGE_PROGRAM ||
                record->lock_start != program.lock_start || record->lock_end != program.lock_end)
                program.base = 0;
        }
    }
    int call_errno;
    long result = op_run(&op, call, &call_errno);
    if (result == ENGINE_CUDA_SUCCESS && program.base != 0) {
        engine->program_unregistrations++;
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
            if (next->state != RANGE_PROGRAM || next->lock_start != program.lock_start ||
                next->lock_end != program.lock_end)
                continue;
            bool locked = next->program_locked;
            remove_record_locked(engine, base);
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
            add_range_locked(&op, base, end, base, end, choice, &place);
            took_back = true;
        }
        if (took_back)
            engine->program_took_back++;
    }
    op_end(&op);
    errno = call_errno;
    return result;
}

/* ---- the registration thread ---- */

/* Registers one queued record; false when the entry was stale. */
static void register_queued_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    if (record == NULL || record->state != RANGE_QUEUED)
        return;
    struct engine_op op = {.engine = engine, .slot = -1};
    uintptr_t start = record->base, end = record->end;
    if (!claim_locked(&op, &start, &end, 1, false, true))
        return; /* shutting down */
    record = range_registry_find(&engine->registry, base);
    if (record != NULL && record->state == RANGE_QUEUED) {
        engine->worker_busy = true;
        set_state_locked(engine, record, RANGE_REGISTERING);
        register_record_locked(engine, base, true);
        engine->worker_busy = false;
    }
    engine->claims[op.slot].count = 0;
    pthread_cond_broadcast(&engine->changed);
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
                record->place = place;
                engine->deferred_registered++;
                account_state_locked(engine, record, -1);
                record->state = RANGE_QUEUED;
                account_state_locked(engine, record, 1);
            } else if (last == ENGINE_PLACE_DISABLED) {
                engine->dropped_pending++;
                remove_record_locked(engine, entry->base);
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
        struct engine_waiting *entry = waiting_pop_locked(&engine->queue_head, &engine->queue_tail);
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
    op_begin(&op, engine);
    want_worker_locked(&op);
    op_end(&op);
}

/* ---- exit and queries ---- */

/* What the statistics report as "at exit": what is live, pending and queued. */
static void record_exit_counts_locked(struct engine *engine)
{
    engine->live_ranges_at_exit = engine->counters.live_ranges;
    engine->live_bytes_at_exit = engine->counters.live_bytes;
    engine->pending_ranges_at_exit = engine->pending_ranges;
    engine->pending_bytes_at_exit = engine->pending_bytes;
    engine->queued_ranges_at_exit = engine->queued_ranges;
}

void engine_shutdown(struct engine *engine)
{
    if (!engine->registry_ok)
        return;
    struct engine_op op;
    op_begin(&op, engine);
    __atomic_store_n(&engine->shut_down, true, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&engine->changed);
    /* Waits for the operations in flight, the registration thread's
     * current call included; nothing new starts after shut_down. */
    uintptr_t start = 0, end = PAGE_INDEX_LIMIT;
    claim_locked(&op, &start, &end, 1, false, false);
    record_exit_counts_locked(engine);
    struct release_request request = {0, PAGE_INDEX_LIMIT, RELEASE_EXIT, NULL, false, 0, 0};
    release_locked(&op, &request);
    op_end(&op);
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
        bool busy = engine->worker_busy;
        for (int slot = 0; slot < ENGINE_CLAIMS && !busy; slot++)
            busy = engine->claims[slot].count != 0;
        if (!busy || pthread_cond_timedwait(&engine->changed, &engine->mutex, &deadline) != 0)
            break;
    }
    record_exit_counts_locked(engine);
    pthread_mutex_unlock(&engine->mutex);
    return true;
}

bool engine_is_registered(struct engine *engine, uintptr_t addr)
{
    return state_at(engine, addr) == RANGE_REGISTERED;
}

void engine_get_counters(struct engine *engine, struct pinshim_counters *out)
{
    pthread_mutex_lock(&engine->mutex);
    *out = engine->counters;
    out->program_registrations = engine->program_registrations;
    out->pending_ranges = engine->pending_ranges;
    out->pending_bytes = engine->pending_bytes;
    out->queued_ranges = engine->queued_ranges;
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

size_t engine_get_devices(struct engine *engine, struct engine_device_counts *out, size_t max)
{
    size_t used = 0;
    pthread_mutex_lock(&engine->mutex);
    for (size_t i = 0; i < ENGINE_MAX_DEVICES && i < max; i++) {
        out[i] = engine->devices[i];
        if (out[i].registrations != 0)
            used = i + 1;
    }
    pthread_mutex_unlock(&engine->mutex);
    return used;
}

uint64_t engine_live_bytes(struct engine *engine)
{
    pthread_mutex_lock(&engine->mutex);
    uint64_t bytes = engine->counters.live_bytes;
    pthread_mutex_unlock(&engine->mutex);
    return bytes;
}
