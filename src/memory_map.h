/* The process's own memory map, read from /proc/self/maps without allocating.
 * Only for rare calls whose effect depends on VMA boundaries. */
#ifndef PINSHIM_MEMORY_MAP_H
#define PINSHIM_MEMORY_MAP_H

#include <stdbool.h>
#include <stdint.h>

/* The [start, end) of the mapping (VMA) that holds addr; false if none does or
 * the map cannot be read. */
bool memory_map_find(uintptr_t addr, uintptr_t *start, uintptr_t *end);

#endif
