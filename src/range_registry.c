#include "range_registry.h"

#include <string.h>

#define INITIAL_CAPACITY 1024

_Static_assert(sizeof(struct range_record) == 64, "a slot is one cache line");

static inline size_t slot_of(const struct range_registry *registry, uintptr_t base)
{
    /* Fibonacci hashing of the page number spreads sequential bases. */
    uint64_t h = (uint64_t)(base >> PAGE_INDEX_GRANULE_SHIFT) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (registry->capacity - 1);
}

bool range_registry_init(struct range_registry *registry)
{
    memset(registry, 0, sizeof(*registry));
    registry->slots = internal_map(INITIAL_CAPACITY * sizeof(struct range_record));
    if (registry->slots == NULL)
        return false;
    registry->capacity = INITIAL_CAPACITY;
    if (!page_index_init(&registry->index)) {
        internal_unmap(registry->slots, INITIAL_CAPACITY * sizeof(struct range_record));
        registry->slots = NULL;
        return false;
    }
    return true;
}

void range_registry_destroy(struct range_registry *registry)
{
    internal_unmap(registry->slots, registry->capacity * sizeof(struct range_record));
    page_index_destroy(&registry->index);
    memset(registry, 0, sizeof(*registry));
}

struct range_record *range_registry_find(struct range_registry *registry, uintptr_t base)
{
    if (registry->slots == NULL || base == 0)
        return NULL;
    size_t mask = registry->capacity - 1;
    for (size_t i = slot_of(registry, base);; i = (i + 1) & mask) {
        struct range_record *slot = &registry->slots[i];
        if (slot->base == base)
            return slot;
        if (slot->base == 0)
            return NULL;
    }
}

static void place(struct range_record *slots, size_t capacity, const struct range_record *record,
                  const struct range_registry *hasher)
{
    size_t mask = capacity - 1;
    size_t i = slot_of(hasher, record->base);
    while (slots[i].base != 0)
        i = (i + 1) & mask;
    slots[i] = *record;
}

static bool grow(struct range_registry *registry)
{
    size_t new_capacity = registry->capacity * 2;
    struct range_record *new_slots = internal_map(new_capacity * sizeof(struct range_record));
    if (new_slots == NULL)
        return false;
    struct range_registry hasher = *registry;
    hasher.capacity = new_capacity;
    for (size_t i = 0; i < registry->capacity; i++)
        if (registry->slots[i].base != 0)
            place(new_slots, new_capacity, &registry->slots[i], &hasher);
    internal_unmap(registry->slots, registry->capacity * sizeof(struct range_record));
    registry->slots = new_slots;
    registry->capacity = new_capacity;
    return true;
}

bool range_registry_reserve(struct range_registry *registry, size_t extra)
{
    /* Keep the load factor at or below 1/2 so probes stay short. */
    while ((registry->count + extra) * 2 > registry->capacity)
        if (!grow(registry))
            return false;
    return true;
}

struct range_record *range_registry_insert(struct range_registry *registry,
                                           const struct range_record *record)
{
    if (!range_registry_reserve(registry, 1))
        return NULL;
    if (!page_index_mark(&registry->index, record->base, record->end))
        return NULL;
    place(registry->slots, registry->capacity, record, registry);
    registry->count++;
    return range_registry_find(registry, record->base);
}

struct range_record *range_registry_split(struct range_registry *registry, uintptr_t base,
                                          uintptr_t at)
{
    if (!range_registry_reserve(registry, 1))
        return NULL;
    struct range_record *left = range_registry_find(registry, base);
    if (left == NULL || at <= left->base || at >= left->end)
        return NULL;
    struct range_record right = *left;
    right.base = at;
    left->end = at;
    page_index_mark_base(&registry->index, at);
    place(registry->slots, registry->capacity, &right, registry);
    registry->count++;
    return range_registry_find(registry, at);
}

/* Takes slot out of the table (its bits in the index are the caller's). */
static void remove_slot(struct range_registry *registry, const struct range_record *slot)
{
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    size_t mask = registry->capacity - 1;
    size_t hole = (size_t)(slot - registry->slots);
    for (size_t i = (hole + 1) & mask;; i = (i + 1) & mask) {
        struct range_record *candidate = &registry->slots[i];
        if (candidate->base == 0)
            break;
        size_t home = slot_of(registry, candidate->base);
        /* Move candidate into the hole unless its home lies cyclically in (hole, i]. */
        bool home_between = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
        if (!home_between) {
            registry->slots[hole] = *candidate;
            hole = i;
        }
    }
    memset(&registry->slots[hole], 0, sizeof(struct range_record));
    registry->count--;
}

void range_registry_remove(struct range_registry *registry, uintptr_t base)
{
    struct range_record *slot = range_registry_find(registry, base);
    if (slot == NULL)
        return;
    page_index_clear(&registry->index, slot->base, slot->end);
    remove_slot(registry, slot);
}

struct range_record *range_registry_join(struct range_registry *registry, uintptr_t base)
{
    struct range_record *left = range_registry_find(registry, base);
    if (left == NULL)
        return NULL;
    uintptr_t at = left->end;
    struct range_record *right = range_registry_find(registry, at);
    if (right == NULL)
        return NULL;
    uintptr_t end = right->end;
    /* The used bits stay set throughout; only the right part's base goes. */
    page_index_clear_map(&registry->index, PAGE_INDEX_BASE, at, at + PAGE_INDEX_GRANULE);
    remove_slot(registry, right);
    left = range_registry_find(registry, base);
    left->end = end;
    return left;
}

void range_registry_prefetch(const struct range_registry *registry, uintptr_t base)
{
    if (registry->slots == NULL)
        return;
    __builtin_prefetch(&registry->slots[slot_of(registry, base)]);
    page_index_prefetch(&registry->index, base);
}

struct range_record *range_registry_containing(struct range_registry *registry, uintptr_t addr)
{
    uintptr_t base;
    if (!page_index_find_base_at_or_before(&registry->index, addr, &base))
        return NULL;
    struct range_record *record = range_registry_find(registry, base);
    if (record == NULL || addr >= record->end)
        return NULL;
    return record;
}

struct range_record *range_registry_first_overlap(struct range_registry *registry, uintptr_t start,
                                                  uintptr_t end)
{
    if (start >= end)
        return NULL;
    struct range_record *record = range_registry_containing(registry, start);
    if (record != NULL)
        return record;
    uintptr_t aligned = start & ~(PAGE_INDEX_GRANULE - 1);
    uintptr_t base;
    if (!page_index_find_next(&registry->index, PAGE_INDEX_BASE, true, aligned, end, &base))
        return NULL;
    return range_registry_find(registry, base);
}
