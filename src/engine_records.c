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

/* ---- the free window's map (see struct engine_free_view) ----
 *
 * A block is in danger when its free would release registered pages. By the
 * free rule (engine_release_block) a record loses pages to a freed block
 * when the block holds bytes its lock asked for (then every page the block
 * touches), or holds one of its pages whole. Every page of a record holds
 * bytes of its lock (records are made for the uncovered pages of the lock's
 * own pages), so a block that holds a whole page holds lock bytes too: a
 * block is in danger exactly when it overlaps some record's lock bytes
 * within that record's pages (record_danger). The map gives, for each 4 KiB
 * granule g, the distance D in bytes from g's start to the first byte in
 * danger at or after it (capped at ENGINE_WINDOW_LIMIT), as
 * ENGINE_WINDOW_LIMIT - D; free adds it to the block's offset in g and its
 * length and compares with the limit. Where danger covers g's start and
 * ends inside g (a lock's last, partial page, whose other bytes hold the
 * next blocks), the entry keeps that end b and the distance to the next
 * danger after it instead (engine_window_after_entry): the one-add check
 * fails there, and a second look clears a block that starts at or after b
 * and ends before that next danger.
 *
 * Only a thread holding the engine's mutex writes the map, with relaxed
 * atomic stores of whole entries, each computed from the registry as it is
 * now; readers load entries without synchronisation. A reader may see a mix
 * of entries from before and after a change, each of which held at some
 * moment: the danger a change adds is that of memory being locked (a free
 * of it races the program's own lock), and what a change removes was being
 * released by the operation making it. */

struct danger {
    uintptr_t start, end; /* end 0: none */
};

/* The bytes of a record's lock inside its own pages. */
static struct danger record_danger(const struct range_record *record)
{
    uintptr_t start = engine_max_address(record->lock_start, record->base);
    uintptr_t end = engine_min_address(record->lock_end, record->end);
    return start < end ? (struct danger){start, end} : (struct danger){0, 0};
}

/* The first danger that ends after from (it may start before), among the
 * records below limit; end 0 when there is none. */
static struct danger next_danger(struct engine *engine, uintptr_t from, uintptr_t limit)
{
    uintptr_t cursor = from;
    while (cursor < limit) {
        struct range_record *record =
            range_registry_first_overlap(&engine->registry, cursor, limit);
        if (record == NULL)
            break;
        struct danger danger = record_danger(record);
        if (danger.end > from)
            return danger;
        cursor = record->end;
    }
    return (struct danger){0, 0};
}

/* The entry of the granule at granule, given danger, the first danger that
 * ends after it (end 0: none before limit). */
static uint64_t window_entry(struct engine *engine, uintptr_t granule, struct danger danger,
                             uintptr_t limit)
{
    uintptr_t reach = ENGINE_WINDOW_LIMIT;
    if (danger.end == 0 || danger.start >= granule + reach)
        return 0; /* nothing within reach */
    if (danger.start > granule)
        return reach - (danger.start - granule);
    if (danger.end >= granule + PAGE_INDEX_GRANULE)
        return reach; /* in danger from its first byte to its last */
    /* Danger ends at b inside the granule: blocks from b on are clear up to
     * the next danger. */
    struct danger after = next_danger(engine, danger.end, limit);
    uintptr_t next =
        after.end == 0 || after.start >= granule + reach ? reach : after.start - granule;
    uintptr_t b = danger.end - granule;
    return next > b ? engine_window_after_entry(b, next) : reach;
}

/* The entry at granule before from, which saw nothing before from: the
 * first danger it sees is ahead, or its own when the old entry shows one
 * nearer than from (then it and the ones below are unchanged: false). */
static bool refresh_one_below(uint64_t *slot, uintptr_t granule, uintptr_t from,
                              struct danger ahead)
{
    uintptr_t reach = ENGINE_WINDOW_LIMIT;
    uint64_t entry = __atomic_load_n(slot, __ATOMIC_RELAXED);
    uintptr_t next =
        ahead.end == 0 || ahead.start >= granule + reach ? reach : ahead.start - granule;
    if (entry >> ENGINE_WINDOW_AFTER_SHIFT != 0) {
        /* A danger covers this granule's start and ends inside it: what it
         * sees next may be in [from, ...); the ones below see the danger
         * here first. */
        uintptr_t after = (uintptr_t)(uint32_t)entry;
        uintptr_t seen = (uintptr_t)(entry >> ENGINE_WINDOW_AFTER_SHIFT);
        if (granule + seen >= from)
            __atomic_store_n(slot, next > after ? engine_window_after_entry(after, next) : reach,
                             __ATOMIC_RELAXED);
        return false;
    }
    uintptr_t seen = reach - (uintptr_t)entry; /* distance to what it sees first */
    if (seen < reach && granule + seen < from)
        return false; /* a danger of its own, before from */
    if (reach - next == entry)
        return false; /* it sees what it saw: so do the ones below, which see it first too */
    __atomic_store_n(slot, reach - next, __ATOMIC_RELAXED);
    return true;
}

/* The entries below map[first] (granule from) that look ahead past from,
 * after the first danger ending after from became ahead. A record alone in
 * its megabyte has all 254 below it to rewrite at each lock and unlock, so
 * the common case, ahead at or after from, runs in a loop of a few
 * instructions an entry; refresh_one_below takes the entries it cannot
 * decide, and every entry when ahead starts before from. */
static void refresh_below_locked(uint64_t *map, uintptr_t first, uintptr_t from,
                                 struct danger ahead)
{
    uintptr_t reach = ENGINE_WINDOW_LIMIT;
    uintptr_t steps = (reach - 1) >> PAGE_INDEX_GRANULE_SHIFT; /* below from, within reach */
    if (steps > first)
        steps = first;
    if (ahead.end != 0 && ahead.start < from) {
        for (uintptr_t k = 1; k <= steps; k++)
            if (!refresh_one_below(&map[first - k], from - (k << PAGE_INDEX_GRANULE_SHIFT), from,
                                   ahead))
                return;
        return;
    }
    /* At k granules below from: the danger ahead is at distance t + k G
     * (none: beyond reach), so the entry becomes reach - t - k G, or 0 once
     * that reaches 0; an old entry above reach - k G sees a danger of its own
     * before from (or is an "after" entry, above every plain one). */
    uintptr_t t = ahead.end == 0 || ahead.start - from >= reach ? reach : ahead.start - from;
    uint64_t updated = reach - t, own_above = reach;
    for (uintptr_t k = 1; k <= steps; k++) {
        updated = updated > PAGE_INDEX_GRANULE ? updated - PAGE_INDEX_GRANULE : 0;
        own_above -= PAGE_INDEX_GRANULE;
        uint64_t *slot = &map[first - k];
        uint64_t entry = __atomic_load_n(slot, __ATOMIC_RELAXED);
        if (entry > own_above) {
            refresh_one_below(slot, from - (k << PAGE_INDEX_GRANULE_SHIFT), from, ahead);
            return;
        }
        if (entry == updated)
            return; /* it sees what it saw: so do the ones below, which see it first too */
        __atomic_store_n(slot, updated, __ATOMIC_RELAXED);
    }
}

/* Recomputes the entries that a change of danger in [start, end) (a record
 * inserted or removed there, or its lock bytes changed) can change: those of
 * [start, end) from the registry, then those before start that looked ahead
 * into it, from the nearest down, until one that sees a danger of its own
 * first (the entries further down see it too: unchanged). */
void engine_window_refresh_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    uint64_t *map = engine->window_entries;
    uintptr_t base = engine->free_view.window_before + 1;
    uintptr_t granules = ENGINE_WINDOW_ENTRIES;
    uintptr_t reach = ENGINE_WINDOW_LIMIT;
    if (map == NULL || end <= base)
        return;
    uintptr_t first = start > base ? (start - base) >> PAGE_INDEX_GRANULE_SHIFT : 0;
    uintptr_t last = (end - base + PAGE_INDEX_GRANULE - 1) >> PAGE_INDEX_GRANULE_SHIFT;
    if (first >= granules)
        return;
    if (last > granules)
        last = granules;
    uintptr_t limit = base + (last << PAGE_INDEX_GRANULE_SHIFT) + reach;
    struct danger danger = {0, 0};
    bool none_left = false; /* no danger from here to limit */
    for (uintptr_t at = first; at < last; at++) {
        uintptr_t granule = base + (at << PAGE_INDEX_GRANULE_SHIFT);
        if (!none_left && danger.end <= granule) {
            danger = next_danger(engine, granule, limit);
            none_left = danger.end == 0;
        }
        __atomic_store_n(&map[at], window_entry(engine, granule, danger, limit), __ATOMIC_RELAXED);
    }
    /* Before start: each entry that saw nothing nearer than [start, end)
     * now sees the first danger at or after start. */
    uintptr_t from = base + (first << PAGE_INDEX_GRANULE_SHIFT);
    struct danger ahead = next_danger(engine, from, from + reach);
    refresh_below_locked(map, first, from, ahead);
}

void engine_prefetch_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    range_registry_prefetch(&engine->registry, start);
    range_registry_prefetch(&engine->registry, end);
    uint64_t *map = engine->window_entries;
    uintptr_t base = engine->free_view.window_before + 1;
    if (map != NULL && start >= base &&
        (start - base) >> PAGE_INDEX_GRANULE_SHIFT < ENGINE_WINDOW_ENTRIES)
        __builtin_prefetch(&map[(start - base) >> PAGE_INDEX_GRANULE_SHIFT]);
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
    } else {
        return;
    }
    /* The counters' copies, for a watcher of the live record. */
    struct pinshim_counters *counters = &engine_stats(engine)->counters;
    counters->queued_ranges = engine->queued_ranges;
    counters->pending_ranges = engine->pending_ranges;
    counters->pending_bytes = engine->pending_bytes;
    engine_note_change_locked(engine);
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
    engine_window_refresh_locked(engine, record->base, record->end);
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
    uintptr_t end = record->end;
    range_registry_remove(&engine->registry, base);
    engine_window_refresh_locked(engine, base, end);
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
