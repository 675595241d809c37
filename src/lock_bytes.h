/* Lock bytes: the bytes the program's lock calls asked for (and the bytes of
 * its own registrations), as disjoint, coalesced byte ranges in a balanced
 * tree. The engine registers whole pages, in runs that may hold many
 * buffers; what a free gives back is decided by these bytes: a page the
 * freed block touches stays registered while it holds lock bytes of
 * another buffer, and goes once it holds none (engine_release_block). The
 * free window's map (engine_free_view) is computed from them too.
 *
 * Not thread-safe: the engine holds its mutex around every call. Nodes come
 * from a node pool (internal_alloc.h), never from the program's allocator. */
#ifndef PINSHIM_LOCK_BYTES_H
#define PINSHIM_LOCK_BYTES_H

#include "internal_alloc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lock_bytes_node {
    uintptr_t start, end;
    struct lock_bytes_node *left, *right;
    int height;
};

struct lock_bytes {
    struct lock_bytes_node *root;
    size_t count; /* disjoint ranges held */
    struct node_pool pool;
};

void lock_bytes_init(struct lock_bytes *set);
void lock_bytes_destroy(struct lock_bytes *set);

/* Adds [start, end), joining the ranges it overlaps or touches. False, with
 * nothing changed, when out of memory. */
bool lock_bytes_add(struct lock_bytes *set, uintptr_t start, uintptr_t end);
/* Removes [start, end) (a range it cuts in two keeps both ends). False when
 * out of memory for the second end: then the whole range it cut is gone. */
bool lock_bytes_remove(struct lock_bytes *set, uintptr_t start, uintptr_t end);
/* Whether any byte of [start, end) is held. */
bool lock_bytes_any(const struct lock_bytes *set, uintptr_t start, uintptr_t end);
/* The first held range that ends after from (it may start before from);
 * false when there is none. */
bool lock_bytes_next(const struct lock_bytes *set, uintptr_t from, uintptr_t *start,
                     uintptr_t *end);
/* How many bytes of [start, end) are held, counting at most up to limit
 * (the count stops there: callers compare with a threshold). */
uint64_t lock_bytes_count(const struct lock_bytes *set, uintptr_t start, uintptr_t end,
                          uint64_t limit);
/* Makes the next count removals and additions safe from running out of
 * nodes (count at most a pool chunk's worth). */
bool lock_bytes_reserve(struct lock_bytes *set, size_t count);

#endif
