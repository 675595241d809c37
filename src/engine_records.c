/* The engine's records: inserting, splitting, joining and removing them,
 * with the lock-free views the fast paths read kept in step (the free
 * window, the span, the record count), the counts of queued, pending and
 * held records, and the lock bytes the free window is computed from. */
#include "engine_internal.h"

#include "internal_alloc.h"
#include "log.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
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
 * free rule (engine_release_block) a freed block releases the pages it
 * touches but those that keep lock bytes of other memory, and every page a
 * record covers holds lock bytes (lock_bytes.h: the bytes of the locks that
 * made the records, and of the program's own registrations), so a block is
 * in danger exactly when it holds lock bytes. The map gives, for each 4 KiB
 * granule g, the distance D in bytes from g's start to the first lock byte
 * at or after it (capped at ENGINE_WINDOW_LIMIT), as ENGINE_WINDOW_LIMIT - D;
 * free adds it to the block's offset in g and its length and compares with
 * the limit. Where lock bytes cover g's start and end inside g (a lock's
 * last, partial page, whose other bytes hold the next blocks), the entry
 * keeps that end b and the distance to the next lock byte after it instead
 * (engine_window_after_entry): the one-add check fails there, and a second
 * look clears a block that starts at or after b and ends before that next
 * lock byte.
 *
 * Only a thread holding the engine's mutex writes the map, with relaxed
 * atomic stores of whole entries, each computed from the lock bytes as they
 * are now; readers load entries without synchronisation. A reader may see a
 * mix of entries from before and after a change, each of which held at some
 * moment: the danger a change adds is that of memory being locked (a free
 * of it races the program's own lock), and what a change removes was being
 * released by the operation making it. Lock bytes are taken away only once
 * the call that released their pages succeeded, so the map may keep a
 * danger a little longer than its records: such a block is sent on to the
 * full check, which finds no record. */

struct danger {
    uintptr_t start, end; /* end 0: none */
};

/* The first lock bytes that end after from (they may start before), among
 * those starting below limit; end 0 when there are none. */
static struct danger next_danger(struct engine *engine, uintptr_t from, uintptr_t limit)
{
    uintptr_t start, end;
    if (lock_bytes_next(&engine->lock_bytes, from, &start, &end) && start < limit)
        return (struct danger){start, end};
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
    uintptr_t base = engine->free_view.window_start;
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
    uintptr_t base = engine->free_view.window_start;
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
    /* A region that starts at 0 is entered one granule up, so NULL lies
     * below the window (engine_block_window_check). */
    uintptr_t start = address & ~(ENGINE_WINDOW_BYTES - 1);
    engine->free_view.window_start = start != 0 ? start : PAGE_INDEX_GRANULE;
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

/* Keeps the counts and lists of queued, pending and held records in step:
 * ranges records enter (sign 1) or leave (-1) the record's state, with
 * bytes of them; a split or a join moves no bytes. */
static void account_locked(struct engine *engine, const struct range_record *record, int sign,
                           uint64_t bytes, bool listed)
{
    size_t ranges = (size_t)(long)sign;
    uint64_t signed_bytes = sign > 0 ? bytes : (uint64_t)0 - bytes;
    if (record->state == RANGE_QUEUED) {
        __atomic_store_n(&engine->queued_ranges, engine->queued_ranges + ranges, __ATOMIC_RELAXED);
        if (sign > 0 && listed) {
            bool was_empty = engine->queue_head == NULL;
            waiting_push_locked(engine, &engine->queue_head, &engine->queue_tail, record->base);
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            engine->queue_changed_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
            if (was_empty)
                engine->queue_filled_ns = engine->queue_changed_ns;
        }
    } else if (record->state == RANGE_PENDING) {
        __atomic_store_n(&engine->pending_ranges, engine->pending_ranges + ranges,
                         __ATOMIC_RELAXED);
        engine->pending_bytes += signed_bytes;
        if (sign > 0 && listed)
            waiting_push_locked(engine, &engine->pending_head, &engine->pending_tail, record->base);
    } else if (record->state == RANGE_HELD) {
        engine_stats(engine)->held_ranges += ranges;
        engine_stats(engine)->held_bytes += signed_bytes;
        return;
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

void engine_account_state_locked(struct engine *engine, const struct range_record *record, int sign)
{
    account_locked(engine, record, sign, record->end - record->base, true);
}

void engine_set_state_locked(struct engine *engine, struct range_record *record,
                             enum range_state state)
{
    engine_account_state_locked(engine, record, -1);
    record->state = (uint8_t)state;
    engine_account_state_locked(engine, record, 1);
}

void engine_set_held_locked(struct engine *engine, struct range_record *record,
                            enum range_held reason)
{
    if (record->state != RANGE_HELD)
        engine_set_state_locked(engine, record, RANGE_HELD);
    record->held = (uint8_t)reason;
}

struct range_record *engine_insert_record_locked(struct engine *engine,
                                                 const struct range_record *record)
{
    widen_span_locked(engine, record->base, record->end);
    struct range_record *stored = range_registry_insert(&engine->registry, record);
    if (stored == NULL)
        return NULL;
    window_place(engine, record->base);
    publish_record_count(engine);
    __atomic_store_n(engine->gate, engine->span_end, __ATOMIC_RELAXED);
    engine_account_state_locked(engine, stored, 1);
    return stored;
}

void engine_remove_record_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    if (record == NULL)
        return;
    engine_account_state_locked(engine, record, -1);
    range_registry_remove(&engine->registry, base);
    publish_record_count(engine);
}

void engine_forget_record_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *record = range_registry_find(&engine->registry, base);
    if (record == NULL)
        return;
    uintptr_t end = record->end;
    engine_remove_record_locked(engine, base);
    engine_lock_bytes_remove_locked(engine, base, end);
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
        account_locked(engine, record, 1, 0, true);
    }
    if (end < record->end) {
        struct range_record *right = range_registry_split(registry, record->base, end);
        account_locked(engine, right, 1, 0, true);
        record = range_registry_find(registry, start);
    }
    publish_record_count(engine);
    return record;
}

struct range_record *engine_join_locked(struct engine *engine, uintptr_t base)
{
    struct range_record *left = range_registry_find(&engine->registry, base);
    struct range_record *right =
        left != NULL ? range_registry_find(&engine->registry, left->end) : NULL;
    if (right == NULL)
        return NULL;
    account_locked(engine, right, -1, 0, false);
    left = range_registry_join(&engine->registry, base);
    publish_record_count(engine);
    return left;
}

/* ---- lock bytes ---- */

static void refresh_bytes_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    uintptr_t mask = PAGE_INDEX_GRANULE - 1;
    uintptr_t last = (end + mask) & ~mask;
    engine_window_refresh_locked(engine, start & ~mask, last < end ? UINTPTR_MAX & ~mask : last);
}

void engine_lock_bytes_add_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return;
    if (!lock_bytes_add(&engine->lock_bytes, start, end)) {
        static int warned;
        if (__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED) == 0)
            log_warn("out of memory recording the bytes of a lock at %#lx; a free of memory "
                     "beside it may release its pages early (warned once)",
                     (unsigned long)start);
        return;
    }
    refresh_bytes_locked(engine, start, end);
}

void engine_lock_bytes_remove_locked(struct engine *engine, uintptr_t start, uintptr_t end)
{
    if (start >= end || !lock_bytes_any(&engine->lock_bytes, start, end))
        return;
    lock_bytes_remove(&engine->lock_bytes, start, end);
    refresh_bytes_locked(engine, start, end);
}

void engine_lock_bytes_move_locked(struct engine *engine, uintptr_t old_start, uintptr_t old_end,
                                   uintptr_t new_start)
{
    /* Moves never overlap their source (mremap refuses that), so each
     * range can be taken away and added at its new place in turn. */
    uintptr_t cursor = old_start, start, end;
    while (cursor < old_end && lock_bytes_next(&engine->lock_bytes, cursor, &start, &end) &&
           start < old_end) {
        uintptr_t from = engine_max_address(start, old_start);
        uintptr_t to = engine_min_address(end, old_end);
        engine_lock_bytes_remove_locked(engine, from, to);
        engine_lock_bytes_add_locked(engine, new_start + (from - old_start),
                                     new_start + (to - old_start));
        cursor = to;
    }
}
