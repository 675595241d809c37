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

#endif
