/* Page index: two bitmaps over the address space in granules of 4 KiB, the
 * smallest page Linux has, one marking the granules covered by a registration
 * and one marking the first granule of each registration. A page of the
 * process (4, 16 or 64 KiB: sysconf's, as the engine is given) is a whole
 * number of granules, and registrations are whole pages, so the granules of a
 * page are all marked or none. It is the registry's companion index: overlap and
 * containment queries walk bitmap words, so their cost follows the size of the
 * queried range, never the number of live ranges.
 *
 * Writers hold the engine lock. Readers may run without it (free's check):
 * nodes are published with release stores and never freed while the index
 * lives, so a reader sees either old or new bits, never unmapped memory.
 * In C11's terms: a node is zeroed (fresh anonymous memory) and then its
 * pointer stored with release; readers load the pointer with acquire, so the
 * node's initial contents happen before their reads of it (on aarch64 the
 * dependent load orders this anyway, but the acquire says it). Bitmap words
 * are written with relaxed atomic stores and read with relaxed loads: a
 * reader ordered after the lock that set a bit (see engine_free_view) reads
 * it by write-read coherence; one racing the lock may read either value. */
#ifndef PINSHIM_PAGE_INDEX_H
#define PINSHIM_PAGE_INDEX_H

#include "internal_alloc.h"

#include <stdbool.h>
#include <stdint.h>

#define PAGE_INDEX_GRANULE_SHIFT 12
#define PAGE_INDEX_GRANULE ((uintptr_t)1 << PAGE_INDEX_GRANULE_SHIFT)
#define PAGE_INDEX_ADDRESS_BITS 48
#define PAGE_INDEX_LIMIT ((uintptr_t)1 << PAGE_INDEX_ADDRESS_BITS)

#define PAGE_INDEX_LEAF_BITS 11 /* granules per leaf: 2048 (8 MiB) */
#define PAGE_INDEX_MID_BITS 12  /* leaves per mid node: 4096 (32 GiB) */
#define PAGE_INDEX_ROOT_BITS                                                                       \
    (PAGE_INDEX_ADDRESS_BITS - PAGE_INDEX_GRANULE_SHIFT - PAGE_INDEX_LEAF_BITS -                   \
     PAGE_INDEX_MID_BITS)

enum page_index_map { PAGE_INDEX_USED = 0, PAGE_INDEX_BASE = 1 };

struct page_index_leaf {
    /* [...][used|base]: a granule's two words share a cache line, so a lock or
     * unlock touches one line of the leaf where it touched two. */
    uint64_t words[(1u << PAGE_INDEX_LEAF_BITS) / 64][2];
};

struct page_index_mid {
    struct page_index_leaf *leaves[1u << PAGE_INDEX_MID_BITS];
};

struct page_index {
    struct page_index_mid **root; /* 1 << PAGE_INDEX_ROOT_BITS entries */
    struct node_pool leaf_pool;
    struct node_pool mid_pool;
};

bool page_index_init(struct page_index *index);
void page_index_destroy(struct page_index *index);

/* Marks [start, end) used and start as a base. Addresses are granule-aligned and
 * below PAGE_INDEX_LIMIT. Returns false, changing nothing, when out of memory. */
bool page_index_mark(struct page_index *index, uintptr_t start, uintptr_t end);
/* Clears both maps over [start, end). */
void page_index_clear(struct page_index *index, uintptr_t start, uintptr_t end);
/* Marks addr, a granule already marked used, as a base (splitting a range
 * leaves its used bits untouched, so lock-free readers never see a gap). */
void page_index_mark_base(struct page_index *index, uintptr_t addr);

/* One map alone, for users that keep their own marks in the two maps
 * (mapping_bounds.h): sets addr's bit (false, changing nothing, when out of
 * memory), clears the bits of [start, end), tests addr's bit (lock-free). */
bool page_index_set_bit(struct page_index *index, enum page_index_map map, uintptr_t addr);
void page_index_clear_map(struct page_index *index, enum page_index_map map, uintptr_t start,
                          uintptr_t end);
bool page_index_test_bit(const struct page_index *index, enum page_index_map map, uintptr_t addr);

/* Lock-free: the first granule in [start, end) whose bit in map equals want_set. */
bool page_index_find_next(const struct page_index *index, enum page_index_map map, bool want_set,
                          uintptr_t start, uintptr_t end, uintptr_t *found);
/* Lock-free: whether any granule of [start, end) is used. start/end need not be aligned. */
bool page_index_any_used(const struct page_index *index, uintptr_t start, uintptr_t end);
/* Lock-free, inline, without a call: for a range inside one bitmap word (64
 * granules, 256 KiB: the case of nearly every free), 1 if a granule of [start, end) is
 * used, 0 if none is; -1 when the range is empty, spans two words or passes
 * the index's limit, for page_index_any_used to answer. Three dependent loads
 * and a mask. */
static inline int page_index_one_word_used(const struct page_index *index, uintptr_t start,
                                           uintptr_t end)
{
    uintptr_t first = start >> PAGE_INDEX_GRANULE_SHIFT;
    uintptr_t last = (end - 1) >> PAGE_INDEX_GRANULE_SHIFT;
    if (start >= end ||
        (((first ^ last) >> 6) | (last >> (PAGE_INDEX_ADDRESS_BITS - PAGE_INDEX_GRANULE_SHIFT))))
        return -1;
    struct page_index_mid *mid = __atomic_load_n(
        &index->root[first >> (PAGE_INDEX_LEAF_BITS + PAGE_INDEX_MID_BITS)], __ATOMIC_ACQUIRE);
    if (mid == NULL)
        return 0;
    struct page_index_leaf *leaf = __atomic_load_n(
        &mid->leaves[(first >> PAGE_INDEX_LEAF_BITS) & ((1u << PAGE_INDEX_MID_BITS) - 1)],
        __ATOMIC_ACQUIRE);
    if (leaf == NULL)
        return 0;
    uint64_t word = __atomic_load_n(
        &leaf->words[(first & ((1u << PAGE_INDEX_LEAF_BITS) - 1)) / 64][PAGE_INDEX_USED],
        __ATOMIC_RELAXED);
    uint64_t mask = (~(uint64_t)0 >> (63 - (last & 63))) & (~(uint64_t)0 << (first & 63));
    return (word & mask) != 0;
}

/* Lock-free, inline where it can be: page_index_any_used. */
static inline bool page_index_any_used_inline(const struct page_index *index, uintptr_t start,
                                              uintptr_t end)
{
    int used = page_index_one_word_used(index, start, end);
    return used >= 0 ? used != 0 : page_index_any_used(index, start, end);
}

/* Starts loading the line of the bitmaps that holds addr's granule, so that
 * the queries about it that follow find it in cache (issue 22: at many live
 * ranges every map is out of cache). */
void page_index_prefetch(const struct page_index *index, uintptr_t addr);

/* The last base at or before addr; false if none is found before a gap. */
bool page_index_find_base_at_or_before(const struct page_index *index, uintptr_t addr,
                                       uintptr_t *found);

#endif
