/* Mapping bounds (see mapping_bounds.h). */
#include "mapping_bounds.h"

#include <errno.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STARTS PAGE_INDEX_USED
#define ENDS PAGE_INDEX_BASE

/* The lock word holds the holder's pid: a fork child finds its parent's pid
 * there when another thread of the parent held it at fork, and takes it. */
static void bounds_lock(struct mapping_bounds *bounds)
{
    int saved_errno = errno;
    int self = (int)syscall(SYS_getpid);
    for (;;) {
        int holder = 0;
        if (__atomic_compare_exchange_n(&bounds->lock, &holder, self, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            break;
        if (holder != self && __atomic_compare_exchange_n(&bounds->lock, &holder, self, false,
                                                          __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break; /* held by a thread of the parent, which does not exist here */
        sched_yield();
    }
    errno = saved_errno;
}

static void bounds_unlock(struct mapping_bounds *bounds)
{
    __atomic_store_n(&bounds->lock, 0, __ATOMIC_RELEASE);
}

/* Sets the marks up at first use (with the lock held); false when there is
 * no memory for them (then nothing is marked, ever: runs are cut nowhere). */
static bool bounds_ready(struct mapping_bounds *bounds)
{
    if (bounds->ready == 0)
        __atomic_store_n(&bounds->ready, page_index_init(&bounds->marks) ? 1 : -1,
                         __ATOMIC_RELEASE);
    return bounds->ready > 0;
}

static bool in_index(uintptr_t start, uintptr_t end)
{
    return start < end && end <= PAGE_INDEX_LIMIT;
}

/* [start, end) is one mapping, with the lock held: it starts and ends
 * there (no end mark at the index's limit). */
static void mark_mapping(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end)
{
    page_index_set_bit(&bounds->marks, STARTS, start);
    if (end < PAGE_INDEX_LIMIT)
        page_index_set_bit(&bounds->marks, ENDS, end);
}

void mapping_bounds_note_mapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end)
{
    if (bounds == NULL || !in_index(start, end))
        return;
    bounds_lock(bounds);
    if (bounds_ready(bounds)) {
        /* Both maps (page_index_clear): no bound inside it. */
        page_index_clear(&bounds->marks, start + PAGE_INDEX_GRANULE, end);
        mark_mapping(bounds, start, end);
    }
    bounds_unlock(bounds);
}

/* The marks [start, end) owned go, with the lock held: the starts inside
 * [start, end) and the ends inside (start, end]; a neighbour that ends at
 * start or starts at end keeps its mark. */
static void clear_unmapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end)
{
    page_index_clear_map(&bounds->marks, STARTS, start, end);
    page_index_clear_map(&bounds->marks, ENDS, start + PAGE_INDEX_GRANULE,
                         end < PAGE_INDEX_LIMIT ? end + PAGE_INDEX_GRANULE : end);
}

void mapping_bounds_note_unmapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end)
{
    if (bounds == NULL || !in_index(start, end) ||
        __atomic_load_n(&bounds->ready, __ATOMIC_ACQUIRE) <= 0)
        return;
    bounds_lock(bounds);
    clear_unmapped(bounds, start, end);
    bounds_unlock(bounds);
}

void mapping_bounds_unmap_begin(struct mapping_bounds *bounds, struct mapping_bounds_unmap *unmap,
                                uintptr_t start, uintptr_t end)
{
    *unmap = (struct mapping_bounds_unmap){start, end, bounds != NULL && in_index(start, end)};
    if (unmap->locked)
        bounds_lock(bounds);
}

void mapping_bounds_unmap_end(struct mapping_bounds *bounds,
                              const struct mapping_bounds_unmap *unmap, bool unmapped)
{
    if (!unmap->locked)
        return;
    if (unmapped && __atomic_load_n(&bounds->ready, __ATOMIC_ACQUIRE) > 0)
        clear_unmapped(bounds, unmap->start, unmap->end);
    bounds_unlock(bounds);
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

static uintptr_t round_up(uintptr_t value, uintptr_t page_size)
{
    uintptr_t mask = page_size - 1;
    uintptr_t rounded = (value + mask) & ~mask;
    return rounded < value ? UINTPTR_MAX & ~mask : rounded;
}

/* Copies the marks of map strictly inside (from, to) to the same offsets
 * from new_start, with the lock held. */
static void copy_inside(struct mapping_bounds *bounds, enum page_index_map map, uintptr_t from,
                        uintptr_t to, uintptr_t new_start)
{
    uintptr_t cursor = from + PAGE_INDEX_GRANULE, found;
    while (cursor < to && page_index_find_next(&bounds->marks, map, true, cursor, to, &found)) {
        if (new_start + (found - from) < PAGE_INDEX_LIMIT)
            page_index_set_bit(&bounds->marks, map, new_start + (found - from));
        cursor = found + PAGE_INDEX_GRANULE;
    }
}

void mapping_bounds_remap_begin(struct mapping_bounds *bounds, struct mapping_bounds_remap *remap,
                                uintptr_t old_start, size_t old_size, uintptr_t page_size)
{
    *remap = (struct mapping_bounds_remap){old_start, round_up(old_start + old_size, page_size),
                                           bounds != NULL};
    if (remap->locked)
        bounds_lock(bounds);
}

void mapping_bounds_remap_end(struct mapping_bounds *bounds,
                              const struct mapping_bounds_remap *remap, long result,
                              size_t new_size, int flags, uintptr_t page_size)
{
    if (!remap->locked)
        return;
    uintptr_t old_start = remap->old_start, old_end = remap->old_end;
    uintptr_t new_start = (uintptr_t)result;
    uintptr_t new_end = round_up(new_start + new_size, page_size);
    bool moved_or_new = result != -1 && (new_start != old_start || old_end <= old_start);
    if (result == -1 || !bounds_ready(bounds) || new_end > PAGE_INDEX_LIMIT ||
        old_end > PAGE_INDEX_LIMIT) {
        bounds_unlock(bounds);
        return;
    }
    if (moved_or_new) {
        /* A mapping of its own at the new place, with the bounds inside the
         * old range (a move of several mappings) at the same offsets. */
        page_index_clear(&bounds->marks, new_start + PAGE_INDEX_GRANULE, new_end);
        if (old_end > old_start) {
            uintptr_t copied_end = old_start + (new_end - new_start) < old_end
                                       ? old_start + (new_end - new_start)
                                       : old_end;
            copy_inside(bounds, STARTS, old_start, copied_end, new_start);
            copy_inside(bounds, ENDS, old_start, copied_end, new_start);
        }
        mark_mapping(bounds, new_start, new_end);
        if (old_end > old_start && !(flags & MREMAP_DONTUNMAP)) {
            /* The old range is unmapped: the marks it owned go, but for the
             * new place's own, where the two overlap. */
            clear_unmapped(bounds, old_start, old_end);
            if (new_start < old_end && old_start < new_end)
                mark_mapping(bounds, new_start, new_end);
        }
    } else {
        /* In place. Shrunk: the pages given back are unmapped (the marks
         * they owned go), and the mapping ends at its new end. Grown (only
         * a mapping's last part grows): the pages gained are its own (no
         * bound from the old end on), and it ends at its new end. The same
         * size changes nothing; the bounds before the old end stay. */
        if (new_end < old_end) {
            clear_unmapped(bounds, new_end, old_end);
            page_index_set_bit(&bounds->marks, ENDS, new_end);
        } else if (new_end > old_end) {
            page_index_clear(&bounds->marks, old_end, new_end);
            if (new_end < PAGE_INDEX_LIMIT)
                page_index_set_bit(&bounds->marks, ENDS, new_end);
        }
    }
    bounds_unlock(bounds);
}

bool mapping_bounds_split_at(const struct mapping_bounds *bounds, uintptr_t address)
{
    if (bounds == NULL || __atomic_load_n(&bounds->ready, __ATOMIC_ACQUIRE) <= 0 ||
        address >= PAGE_INDEX_LIMIT)
        return false;
    return page_index_test_bit(&bounds->marks, STARTS, address) ||
           page_index_test_bit(&bounds->marks, ENDS, address);
}

uintptr_t mapping_bounds_next_split(const struct mapping_bounds *bounds, uintptr_t from,
                                    uintptr_t to)
{
    if (bounds == NULL || __atomic_load_n(&bounds->ready, __ATOMIC_ACQUIRE) <= 0 ||
        from >= PAGE_INDEX_LIMIT)
        return to;
    /* The granules after from's, up to to: a bound at from itself is not
     * inside the range. */
    uintptr_t first = (from & ~(PAGE_INDEX_GRANULE - 1)) + PAGE_INDEX_GRANULE;
    if (first >= to || first >= PAGE_INDEX_LIMIT)
        return to;
    uintptr_t limit = to < PAGE_INDEX_LIMIT ? to : PAGE_INDEX_LIMIT;
    uintptr_t next = to, found;
    if (page_index_find_next(&bounds->marks, STARTS, true, first, limit, &found))
        next = found;
    if (page_index_find_next(&bounds->marks, ENDS, true, first, limit, &found) && found < next)
        next = found;
    return next;
}

void mapping_bounds_destroy(struct mapping_bounds *bounds)
{
    if (bounds->ready > 0)
        page_index_destroy(&bounds->marks);
    bounds->ready = 0;
    bounds->lock = 0;
}
