#include "page_index.h"

#include <string.h>

#define LEAF_GRANULES ((uintptr_t)1 << PAGE_INDEX_LEAF_BITS)
#define MID_GRANULES ((uintptr_t)1 << (PAGE_INDEX_LEAF_BITS + PAGE_INDEX_MID_BITS))
#define ROOT_ENTRIES ((size_t)1 << PAGE_INDEX_ROOT_BITS)

static inline uintptr_t granule_of(uintptr_t addr)
{
    return addr >> PAGE_INDEX_GRANULE_SHIFT;
}

static inline size_t root_slot(uintptr_t granule)
{
    return (size_t)(granule >> (PAGE_INDEX_LEAF_BITS + PAGE_INDEX_MID_BITS));
}

static inline size_t mid_slot(uintptr_t granule)
{
    return (size_t)((granule >> PAGE_INDEX_LEAF_BITS) & ((1u << PAGE_INDEX_MID_BITS) - 1));
}

bool page_index_init(struct page_index *index)
{
    memset(index, 0, sizeof(*index));
    index->root = internal_map(ROOT_ENTRIES * sizeof(*index->root));
    if (index->root == NULL)
        return false;
    node_pool_init(&index->leaf_pool, sizeof(struct page_index_leaf));
    node_pool_init(&index->mid_pool, sizeof(struct page_index_mid));
    return true;
}

void page_index_destroy(struct page_index *index)
{
    internal_unmap(index->root, ROOT_ENTRIES * sizeof(*index->root));
    node_pool_destroy(&index->leaf_pool);
    node_pool_destroy(&index->mid_pool);
    memset(index, 0, sizeof(*index));
}

/* The leaf holding granule, or NULL. *skip_to is set to the first granule past
 * the missing node so scans can jump over empty address space. */
static inline struct page_index_leaf *leaf_lookup(const struct page_index *index, uintptr_t granule,
                                                  uintptr_t *skip_to)
{
    struct page_index_mid *mid =
        __atomic_load_n(&index->root[root_slot(granule)], __ATOMIC_ACQUIRE);
    if (mid == NULL) {
        *skip_to = (granule | (MID_GRANULES - 1)) + 1;
        return NULL;
    }
    struct page_index_leaf *leaf =
        __atomic_load_n(&mid->leaves[mid_slot(granule)], __ATOMIC_ACQUIRE);
    if (leaf == NULL)
        *skip_to = (granule | (LEAF_GRANULES - 1)) + 1;
    return leaf;
}

static struct page_index_leaf *leaf_ensure(struct page_index *index, uintptr_t granule)
{
    struct page_index_mid **mid_slot_ptr = &index->root[root_slot(granule)];
    struct page_index_mid *mid = *mid_slot_ptr;
    if (mid == NULL) {
        mid = node_pool_get(&index->mid_pool);
        if (mid == NULL)
            return NULL;
        __atomic_store_n(mid_slot_ptr, mid, __ATOMIC_RELEASE);
    }
    struct page_index_leaf **leaf_slot_ptr = &mid->leaves[mid_slot(granule)];
    struct page_index_leaf *leaf = *leaf_slot_ptr;
    if (leaf == NULL) {
        leaf = node_pool_get(&index->leaf_pool);
        if (leaf == NULL)
            return NULL;
        __atomic_store_n(leaf_slot_ptr, leaf, __ATOMIC_RELEASE);
    }
    return leaf;
}

/* Sets or clears the bits of one map over granules [first, last_exclusive) of a leaf. */
static void leaf_update(struct page_index_leaf *leaf, int map, uintptr_t first,
                        uintptr_t last_exclusive, bool set)
{
    uintptr_t offset = first & (LEAF_GRANULES - 1);
    uintptr_t count = last_exclusive - first;
    while (count > 0) {
        size_t word = offset / 64;
        unsigned bit = (unsigned)(offset % 64);
        unsigned width = 64 - bit < count ? 64 - bit : (unsigned)count;
        uint64_t mask = (width == 64 ? ~(uint64_t)0 : (((uint64_t)1 << width) - 1)) << bit;
        uint64_t old = __atomic_load_n(&leaf->words[word][map], __ATOMIC_RELAXED);
        __atomic_store_n(&leaf->words[word][map], set ? (old | mask) : (old & ~mask),
                         __ATOMIC_RELAXED);
        offset += width;
        count -= width;
    }
}

bool page_index_mark(struct page_index *index, uintptr_t start, uintptr_t end)
{
    uintptr_t first = granule_of(start), last = granule_of(end);
    /* Allocate every node first so a failure leaves the maps untouched. */
    for (uintptr_t g = first; g < last; g = (g | (LEAF_GRANULES - 1)) + 1)
        if (leaf_ensure(index, g) == NULL)
            return false;
    for (uintptr_t g = first; g < last;) {
        uintptr_t leaf_end = (g | (LEAF_GRANULES - 1)) + 1;
        uintptr_t stop = leaf_end < last ? leaf_end : last;
        leaf_update(leaf_ensure(index, g), PAGE_INDEX_USED, g, stop, true);
        g = stop;
    }
    leaf_update(leaf_ensure(index, first), PAGE_INDEX_BASE, first, first + 1, true);
    return true;
}

void page_index_mark_base(struct page_index *index, uintptr_t addr)
{
    uintptr_t granule = granule_of(addr);
    struct page_index_leaf *leaf = leaf_ensure(index, granule);
    if (leaf != NULL) /* exists: its used bit is set */
        leaf_update(leaf, PAGE_INDEX_BASE, granule, granule + 1, true);
}

/* Clears the maps first_map..last_map over [start, end), skipping the
 * address space no leaf covers. */
static void clear_maps(struct page_index *index, int first_map, int last_map, uintptr_t start,
                       uintptr_t end)
{
    uintptr_t last = granule_of(end);
    for (uintptr_t g = granule_of(start); g < last;) {
        uintptr_t skip_to;
        struct page_index_leaf *leaf = leaf_lookup(index, g, &skip_to);
        if (leaf == NULL) {
            g = skip_to;
            continue;
        }
        uintptr_t leaf_end = (g | (LEAF_GRANULES - 1)) + 1;
        uintptr_t stop = leaf_end < last ? leaf_end : last;
        for (int map = first_map; map <= last_map; map++)
            leaf_update(leaf, map, g, stop, false);
        g = stop;
    }
}

void page_index_clear(struct page_index *index, uintptr_t start, uintptr_t end)
{
    clear_maps(index, PAGE_INDEX_USED, PAGE_INDEX_BASE, start, end);
}

bool page_index_set_bit(struct page_index *index, enum page_index_map map, uintptr_t addr)
{
    uintptr_t granule = granule_of(addr);
    struct page_index_leaf *leaf = leaf_ensure(index, granule);
    if (leaf == NULL)
        return false;
    leaf_update(leaf, map, granule, granule + 1, true);
    return true;
}

void page_index_clear_map(struct page_index *index, enum page_index_map map, uintptr_t start,
                          uintptr_t end)
{
    clear_maps(index, (int)map, (int)map, start, end);
}

bool page_index_test_bit(const struct page_index *index, enum page_index_map map, uintptr_t addr)
{
    uintptr_t granule = granule_of(addr), skip_to;
    if (addr >= PAGE_INDEX_LIMIT)
        return false;
    struct page_index_leaf *leaf = leaf_lookup(index, granule, &skip_to);
    if (leaf == NULL)
        return false;
    uintptr_t offset = granule & (LEAF_GRANULES - 1);
    uint64_t word = __atomic_load_n(&leaf->words[offset / 64][map], __ATOMIC_RELAXED);
    return (word >> (offset % 64)) & 1;
}

bool page_index_find_next(const struct page_index *index, enum page_index_map map, bool want_set,
                          uintptr_t start, uintptr_t end, uintptr_t *found)
{
    if (end > PAGE_INDEX_LIMIT)
        end = PAGE_INDEX_LIMIT;
    uintptr_t g = granule_of(start), last = granule_of(end);
    while (g < last) {
        uintptr_t skip_to;
        struct page_index_leaf *leaf = leaf_lookup(index, g, &skip_to);
        if (leaf == NULL) {
            if (!want_set) {
                *found = g << PAGE_INDEX_GRANULE_SHIFT;
                return true;
            }
            g = skip_to;
            continue;
        }
        uintptr_t offset = g & (LEAF_GRANULES - 1);
        uint64_t word = __atomic_load_n(&leaf->words[offset / 64][map], __ATOMIC_RELAXED);
        if (!want_set)
            word = ~word;
        word &= ~(uint64_t)0 << (offset % 64);
        if (word != 0) {
            uintptr_t hit = g - (offset % 64) + (uintptr_t)__builtin_ctzll(word);
            if (hit >= last)
                return false;
            *found = hit << PAGE_INDEX_GRANULE_SHIFT;
            return true;
        }
        g = (g | 63) + 1;
    }
    return false;
}

bool page_index_any_used(const struct page_index *index, uintptr_t start, uintptr_t end)
{
    if (start >= PAGE_INDEX_LIMIT || end <= start)
        return false;
    uintptr_t aligned_start = start & ~(PAGE_INDEX_GRANULE - 1);
    uintptr_t aligned_end = (end + PAGE_INDEX_GRANULE - 1) & ~(PAGE_INDEX_GRANULE - 1);
    if (aligned_end < end) /* wrapped */
        aligned_end = PAGE_INDEX_LIMIT;
    uintptr_t unused;
    return page_index_find_next(index, PAGE_INDEX_USED, true, aligned_start, aligned_end, &unused);
}

void page_index_prefetch(const struct page_index *index, uintptr_t addr)
{
    uintptr_t granule = granule_of(addr), skip_to;
    if (addr >= PAGE_INDEX_LIMIT)
        return;
    struct page_index_leaf *leaf = leaf_lookup(index, granule, &skip_to);
    if (leaf != NULL)
        __builtin_prefetch(&leaf->words[(granule & (LEAF_GRANULES - 1)) / 64]);
}

bool page_index_find_base_at_or_before(const struct page_index *index, uintptr_t addr,
                                       uintptr_t *found)
{
    if (addr >= PAGE_INDEX_LIMIT)
        return false;
    uintptr_t g = granule_of(addr);
    for (;;) {
        uintptr_t skip_to;
        struct page_index_leaf *leaf = leaf_lookup(index, g, &skip_to);
        if (leaf == NULL)
            return false; /* a registration never spans a missing leaf */
        uintptr_t offset = g & (LEAF_GRANULES - 1);
        unsigned bit = (unsigned)(offset % 64);
        uint64_t keep = bit == 63 ? ~(uint64_t)0 : (((uint64_t)1 << (bit + 1)) - 1);
        uint64_t bases =
            __atomic_load_n(&leaf->words[offset / 64][PAGE_INDEX_BASE], __ATOMIC_RELAXED) & keep;
        uint64_t used =
            __atomic_load_n(&leaf->words[offset / 64][PAGE_INDEX_USED], __ATOMIC_RELAXED) & keep;
        /* Every page from the base up to addr must be covered: a gap means addr
         * lies outside any registration. */
        if (bases != 0) {
            unsigned base_bit = 63 - (unsigned)__builtin_clzll(bases);
            uint64_t span = keep & ~(((uint64_t)1 << base_bit) - 1);
            if ((used & span) != span)
                return false;
            *found = (g - bit + base_bit) << PAGE_INDEX_GRANULE_SHIFT;
            return true;
        }
        if (used != keep || g == bit)
            return false;
        g = g - bit - 1;
    }
}
