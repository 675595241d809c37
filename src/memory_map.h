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
