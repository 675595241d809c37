/* Block extent: where a heap block handed to free or realloc ends, so the
 * shim can tell whether the block holds a registered page.
 *
 * The portable answer asks the allocator (malloc_usable_size): a call, and
 * glibc's version also reads the next chunk's header. When the allocator is
 * glibc's own, the size word glibc keeps just before every block gives the
 * same answer in one load. That source is used only after checks, made at
 * the first lock that may register, showed the allocator is glibc's and the
 * size word agrees with malloc_usable_size on blocks of many sizes; anything
 * else keeps the call. */
#ifndef PINSHIM_BLOCK_EXTENT_H
#define PINSHIM_BLOCK_EXTENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum block_extent_source {
    BLOCK_EXTENT_ALLOCATOR_CALL = 0, /* malloc_usable_size */
    BLOCK_EXTENT_GLIBC_HEADER = 1,   /* glibc's chunk size word */
    BLOCK_EXTENT_NOT_CHOSEN = 2,     /* no lock that may register yet: free asks the allocator */
};

/* The allocator functions the checks use; the shim passes the real ones. */
struct block_extent_allocator {
    void *(*malloc)(size_t);
    int (*posix_memalign)(void **, size_t, size_t);
    void (*free)(void *);
    size_t (*usable_size)(void *);
};

/* glibc's chunk layout (malloc/malloc.c): the word before the block holds the
 * chunk size with three flag bits; bit 1 marks an mmapped chunk. The block
 * ends one word (the next chunk's prev_size, lent to this block) or, when
 * mmapped, two words before the chunk's end. Valid for live glibc blocks only. */
static inline uintptr_t block_extent_glibc_end(const void *ptr)
{
    size_t header = ((const size_t *)ptr)[-1];
    size_t chunk = header & ~(size_t)7;
    size_t lent = sizeof(size_t) + (header & 2) * (sizeof(size_t) / 2);
    return (uintptr_t)ptr + chunk - lent;
}

/* Whether the allocation functions the program sees (first in the global
 * scope) and the free, realloc, posix_memalign and malloc_usable_size the
 * shim forwards to (the next after it) are all glibc's, and no loaded tool
 * (valgrind) redirects them. */
bool block_extent_allocator_is_glibc(void);

/* Whether block_extent_glibc_end agrees with usable_size on blocks of sizes
 * from 1 byte to 100,000 bytes, plain and page-aligned, and on one mmapped
 * 40 MiB block, allocated and freed through allocator. Call only when the
 * allocator is glibc's. */
bool block_extent_glibc_header_agrees(const struct block_extent_allocator *allocator);

/* Whether glibc's malloc runs in its single-threaded mode, taking no arena
 * lock: glibc 2.32 and later say so in __libc_single_threaded (false for good
 * once a thread has been started); older ones are asked through the
 * process's thread count (/proc/self/stat). Unknown counts as threaded. */
bool block_extent_glibc_single_threaded(void);

/* The source that both checks allow: the header when they pass, else the call. */
enum block_extent_source block_extent_choose(const struct block_extent_allocator *allocator);

const char *block_extent_source_name(enum block_extent_source source);

/* The process's choice, made once by the interposition layer at the first
 * lock that may register and read on free's hot path: the source
 * (enum block_extent_source) and the state of the choice (0 not made, 1
 * being made, 2 made). */
extern int block_extent_chosen_source __attribute__((visibility("hidden")));
extern int block_extent_choice_state __attribute__((visibility("hidden")));

/* In a fork child: a choice the parent's thread was making starts again. */
void block_extent_after_fork_child(void);

/* posix_memalign's rounding of a buffer that may be locked (size at least
 * threshold): the size up to whole pages of page_size bytes and the alignment
 * up to a page, so that a lock of the buffer shares no page with a neighbour.
 * False, changing nothing, below threshold, for an alignment posix_memalign
 * rejects (the real call must see it), or when the size cannot be rounded. */
bool block_extent_round_to_pages(size_t page_size, size_t threshold, size_t *alignment,
                                 size_t *size);

#endif
