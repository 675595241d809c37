/* The engine's records: inserting, splitting and removing them, with the
 * lock-free views the fast paths read kept in step (the free window, the
 * span, the record count) and the counts of queued and pending records. */
#include "engine_internal.h"

#include "internal_alloc.h"
#include "log.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

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

struct engine_waiting *engine_waiting_pop_locked(struct engine_waiting **head,
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
void engine_account_state_locked(struct engine *engine, const struct range_record *record, int sign)
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

void engine_set_state_locked(struct engine *engine, struct range_record *record,
                             enum range_state state)
{
    engine_account_state_locked(engine, record, -1);
    record->state = (uint8_t)state;
    engine_account_state_locked(engine, record, 1);
}

struct range_record *engine_insert_record_locked(struct engine *engine,
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
    engine_account_state_locked(engine, stored, 1);
    return stored;
}

void engine_remove_record_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    if (record == NULL)
        return;
    engine_account_state_locked(engine, record, -1);
    window_update(engine, record->base, record->end, false);
    range_registry_remove(&engine->registry, base);
    publish_record_count(engine);
}

/* Splits the record at base so that one record covers exactly [start, end)
 * (inside it) and returns that record, or NULL when out of memory (nothing
 * changed). The pieces outside keep the record's fields; their pages stay
 * marked throughout, so a lock-free reader never sees them uncovered. */
struct range_record *engine_isolate_locked(struct engine *engine, uintptr_t base, uintptr_t start,
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
        engine_account_state_locked(engine, record, 1);
    }
    if (end < record->end) {
        struct range_record *right = range_registry_split(registry, record->base, end);
        engine_account_state_locked(engine, right, 1);
        record = range_registry_find(registry, start);
    }
    publish_record_count(engine);
    return record;
}
