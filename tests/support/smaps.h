/* What /proc/self/smaps says of a range's pages: the tests' own reading,
 * apart from the shim's (which asks PAGEMAP_SCAN). */
#ifndef SMAPS_H
#define SMAPS_H

#include <stdbool.h>
#include <stdint.h>

/* The AnonHugePages, in bytes, of the mappings that overlap [start, end),
 * and whether one of them carries VmFlags "hg" (MADV_HUGEPAGE's flag).
 * False when /proc/self/smaps cannot be read. */
bool smaps_huge_pages(uintptr_t start, uintptr_t end, unsigned long long *huge_bytes,
                      bool *flagged);

#endif
