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

void mapping_bounds_note_mapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end)
{
    if (bounds == NULL || !in_index(start, end))
        return;
    bounds_lock(bounds);
    if (bounds_ready(bounds)) {
        page_index_clear_map(&bounds->marks, STARTS, start + PAGE_INDEX_GRANULE, end);
        page_index_clear_map(&bounds->marks, ENDS, start + PAGE_INDEX_GRANULE, end);
        page_index_set_bit(&bounds->marks, STARTS, start);
        if (end < PAGE_INDEX_LIMIT)
            page_index_set_bit(&bounds->marks, ENDS, end);
    }
    bounds_unlock(bounds);
}

void mapping_bounds_note_unmapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end)
{
    if (bounds == NULL || !in_index(start, end) ||
        __atomic_load_n(&bounds->ready, __ATOMIC_ACQUIRE) <= 0)
        return;
    bounds_lock(bounds);
    /* The starts inside [start, end) and the ends inside (start, end]: a
     * neighbour that ends at start or starts at end keeps its mark. */
    page_index_clear_map(&bounds->marks, STARTS, start, end);
    page_index_clear_map(&bounds->marks, ENDS, start + PAGE_INDEX_GRANULE,
                         end < PAGE_INDEX_LIMIT ? end + PAGE_INDEX_GRANULE : end);
    bounds_unlock(bounds);
}

void mapping_bounds_note_resized(struct mapping_bounds *bounds, uintptr_t old_end,
                                 uintptr_t new_end)
{
    if (bounds == NULL || old_end == new_end || old_end > PAGE_INDEX_LIMIT ||
        new_end > PAGE_INDEX_LIMIT)
        return;
    bounds_lock(bounds);
    if (bounds_ready(bounds)) {
        uintptr_t low = old_end < new_end ? old_end : new_end;
        uintptr_t high = old_end < new_end ? new_end : old_end;
        /* The old end goes; grown, the pages gained are inside the mapping. */
        page_index_clear_map(&bounds->marks, ENDS, low,
                             high < PAGE_INDEX_LIMIT ? high + PAGE_INDEX_GRANULE : high);
        if (new_end > old_end)
            page_index_clear_map(&bounds->marks, STARTS, old_end, new_end);
        if (new_end < PAGE_INDEX_LIMIT)
            page_index_set_bit(&bounds->marks, ENDS, new_end);
    }
    bounds_unlock(bounds);
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

void mapping_bounds_note_remapped(struct mapping_bounds *bounds, uintptr_t old_start,
                                  size_t old_size, size_t new_size, int flags, uintptr_t new_start,
                                  uintptr_t page_size)
{
    uintptr_t mask = page_size - 1;
    uintptr_t old_end = old_start + ((old_size + mask) & ~mask);
    uintptr_t new_end = new_start + ((new_size + mask) & ~mask);
    if (old_end < old_start || new_end < new_start)
        return;
    if (new_start == old_start && old_size != 0) {
        mapping_bounds_note_resized(bounds, old_end, new_end);
        return;
    }
    if (old_size != 0 && !(flags & MREMAP_DONTUNMAP))
        mapping_bounds_note_unmapped(bounds, old_start, old_end);
    mapping_bounds_note_mapped(bounds, new_start, new_end);
}

bool mapping_bounds_split_at(const struct mapping_bounds *bounds, uintptr_t address)
{
    if (bounds == NULL || __atomic_load_n(&bounds->ready, __ATOMIC_ACQUIRE) <= 0 ||
        address >= PAGE_INDEX_LIMIT)
        return false;
    return page_index_test_bit(&bounds->marks, STARTS, address) ||
           page_index_test_bit(&bounds->marks, ENDS, address);
}

void mapping_bounds_destroy(struct mapping_bounds *bounds)
{
    if (bounds->ready > 0)
        page_index_destroy(&bounds->marks);
    bounds->ready = 0;
    bounds->lock = 0;
}
