/* Mapping bounds: where the mappings the program made with mmap (and moved
 * or resized with mremap) begin and end, as far as the shim saw them. The
 * engine joins neighbouring locked pages into one registration, since a copy
 * may not cross from one registration into the next; but two mappings made
 * by two mmap calls are two objects, even where the kernel placed them side
 * by side (it does so for consecutive calls), and no valid copy spans two
 * objects. A run of locked pages is therefore cut where a mapping the shim
 * saw begins or ends, and nowhere else: releasing one of several
 * side-by-side buffers then registers none of the others again.
 *
 * Heap blocks are not told apart here: glibc puts a chunk header between
 * two blocks, so blocks that own whole pages never sit on adjacent pages,
 * and blocks that share a page must share its registration anyway. An
 * allocator that packs whole-page blocks back to back joins them; releasing
 * one then registers the other again (time, never a failed copy). A mapping
 * the shim does not see (glibc's own, a raw system call, shmat) has no
 * bounds here, with the same effect.
 *
 * Marks: a bit per 4 KiB granule in two maps of a page index: "a mapping
 * starts here" and "a mapping ends right before here". A new mapping sets
 * its two and clears those inside it; an unmapping clears the marks its
 * range owned. Writers take a small lock of its own (the holder's pid in the
 * lock word, so that a fork child never waits for a thread it does not
 * have); readers (the engine, under its own mutex) read single bits without
 * it: a mark between two pages the engine tracks changes only in calls the
 * engine itself runs on those pages. */
#ifndef PINSHIM_MAPPING_BOUNDS_H
#define PINSHIM_MAPPING_BOUNDS_H

#include "page_index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mapping_bounds {
    struct page_index marks; /* USED map: starts here; BASE map: ends before here */
    int lock;                /* 0, or the pid of the process whose thread holds it */
    int ready;               /* 0: not set up yet; 1: marks usable; -1: no memory for them */
};

/* A new mapping covers [start, end) (page-aligned): it starts and ends
 * there, and marks inside it are gone. */
void mapping_bounds_note_mapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end);
/* [start, end) is about to be unmapped: the marks it owned go. Called
 * before the call, so that a mapping placed there once it returns keeps
 * the marks it makes; only where no page of the range is tracked (a mark
 * beside a tracked page changes only inside the engine's operation on it). */
void mapping_bounds_note_unmapped(struct mapping_bounds *bounds, uintptr_t start, uintptr_t end);
/* munmap of tracked pages, in two steps around the call, which the engine
 * makes once its operation holds the pages (the pages on both sides of a
 * bound it clears are then its own, or outside every run it may join): the
 * marks' lock is held from before the call to after it, so that a mapping
 * another thread places in the freed range notes its marks after these go;
 * and they go only when the call unmapped the range (a failed munmap keeps
 * every mapping, with its bounds). */
struct mapping_bounds_unmap {
    uintptr_t start, end;
    bool locked;
};
void mapping_bounds_unmap_begin(struct mapping_bounds *bounds, struct mapping_bounds_unmap *unmap,
                                uintptr_t start, uintptr_t end);
void mapping_bounds_unmap_end(struct mapping_bounds *bounds,
                              const struct mapping_bounds_unmap *unmap, bool unmapped);
/* mremap in two steps, the marks' lock held from before the call to after
 * it: a mapping another thread makes in the range a move freed notes its
 * marks after the move's (the range was the mover's until the call).
 * After the call, with what it returned (-1: it failed): moved, the new
 * range is a mapping of its own, with the bounds inside the old range at
 * the same offsets (Linux 6.17 moves several mappings at once), and the old
 * range's marks go (but with MREMAP_DONTUNMAP); in place, the mapping ends
 * at its new end. Sizes are rounded to page_size. */
struct mapping_bounds_remap {
    uintptr_t old_start, old_end;
    bool locked;
};
void mapping_bounds_remap_begin(struct mapping_bounds *bounds, struct mapping_bounds_remap *remap,
                                uintptr_t old_start, size_t old_size, uintptr_t page_size);
void mapping_bounds_remap_end(struct mapping_bounds *bounds,
                              const struct mapping_bounds_remap *remap, long result,
                              size_t new_size, int flags, uintptr_t page_size);
/* Whether a mapping the shim saw begins or ends at address (page-aligned):
 * the pages on either side belong to two objects. NULL bounds: none. */
bool mapping_bounds_split_at(const struct mapping_bounds *bounds, uintptr_t address);
/* The first address in (from, to) at which a mapping the shim saw begins
 * or ends, or to when there is none. NULL bounds: to. */
uintptr_t mapping_bounds_next_split(const struct mapping_bounds *bounds, uintptr_t from,
                                    uintptr_t to);
/* Frees the marks (tests). */
void mapping_bounds_destroy(struct mapping_bounds *bounds);

#endif
