/* The process's own memory map, read from /proc/self/maps without allocating.
 * Only for rare calls whose effect depends on VMA boundaries. */
#ifndef PINSHIM_MEMORY_MAP_H
#define PINSHIM_MEMORY_MAP_H

#include <stdbool.h>
#include <stdint.h>

/* The [start, end) of the mapping (VMA) that holds addr; false if none does or
 * the map cannot be read. */
bool memory_map_find(uintptr_t addr, uintptr_t *start, uintptr_t *end);

/* Calls found(context, part_start, part_end) for each part of [start, end) that
 * lies in a locked mapping (VmFlags "lo" in /proc/self/smaps). False if the
 * map cannot be read. */
bool memory_map_locked_parts(uintptr_t start, uintptr_t end,
                             void (*found)(void *context, uintptr_t part_start, uintptr_t part_end),
                             void *context);

/* What pinning the pages of a mapping for CUDA meets (the kernel's gup
 * rules, mm/gup.c check_vma_flags, as the open kernel modules' pins meet
 * them); see memory_map_kinds. */
enum memory_map_kind {
    MEMORY_MAP_WRITABLE,    /* readable and writable: pinned with the default flags */
    MEMORY_MAP_READ_ONLY,   /* readable, not writable: only a READ_ONLY registration */
    MEMORY_MAP_NO_ACCESS,   /* not readable (PROT_NONE): never */
    MEMORY_MAP_IO,          /* VM_IO or VM_PFNMAP (VmFlags io, pf): never */
    MEMORY_MAP_SHARED_FILE, /* writable MAP_SHARED on a file system that writes back:
                               never long-term pinned for writing (Linux 6.5+) */
    MEMORY_MAP_UNMAPPED,    /* a hole */
    MEMORY_MAP_KIND_COUNT
};

/* Calls found for each run of [start, end) of one kind, in address order,
 * from /proc/self/smaps (and statfs for shared files). False if it cannot
 * be read. Rare: only after a registration failed. */
bool memory_map_kinds(uintptr_t start, uintptr_t end,
                      void (*found)(void *context, uintptr_t part_start, uintptr_t part_end,
                                    enum memory_map_kind kind),
                      void *context);

/* Calls found for each part of [start, end) that lies in a private,
 * readable and writable, anonymous mapping ("rw-p", inode 0 in
 * /proc/self/maps), in address order. False if the map cannot be read. */
bool memory_map_private_anonymous_parts(uintptr_t start, uintptr_t end,
                                        void (*found)(void *context, uintptr_t part_start,
                                                      uintptr_t part_end),
                                        void *context);

/* Whether every page of [start, end) is mapped: msync(MS_ASYNC) checks the
 * mapping and, since Linux 2.6.19, does nothing else. errno is kept. */
bool memory_map_is_mapped(uintptr_t start, uintptr_t end);

/* Calls found for each run of pages of [start, end) that are resident
 * (mincore), in address order. Pages are page_size long. False if mincore
 * failed (a hole in the range). */
bool memory_map_resident_parts(uintptr_t start, uintptr_t end, uintptr_t page_size,
                               void (*found)(void *context, uintptr_t part_start,
                                             uintptr_t part_end),
                               void *context);

#endif
