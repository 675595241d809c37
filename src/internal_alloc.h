/* The shim's own memory: anonymous mappings made with the raw system call, so
 * nothing here goes through the interposed (or any) allocator or mmap wrapper. */
#ifndef PINSHIM_INTERNAL_ALLOC_H
#define PINSHIM_INTERNAL_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* Zero-filled, page-aligned; NULL on failure. errno is preserved. */
void *internal_map(size_t bytes);
void internal_unmap(void *memory, size_t bytes);

/* Fixed-size nodes carved from 1 MiB chunks; not thread-safe (callers hold the
 * engine lock). Nodes come back zeroed. */
struct node_pool {
    size_t node_size;
    void *free_list;
    size_t free_count; /* nodes on free_list */
    char *bump;
    size_t bump_left;
    void *chunks; /* singly linked through the first word of each chunk */
};

void node_pool_init(struct node_pool *pool, size_t node_size);
void *node_pool_get(struct node_pool *pool);
void node_pool_put(struct node_pool *pool, void *node);
/* Makes sure the next count gets map nothing (count at most a chunk's worth):
 * called where mapping is harmless, so that calls where it is not (inside a
 * release, before the real munlock) find their nodes ready. */
bool node_pool_reserve(struct node_pool *pool, size_t count);
/* Returns every chunk to the kernel (used after fork and by tests). */
void node_pool_destroy(struct node_pool *pool);

#endif
