/* Range registry: the shim's registrations, disjoint page ranges, in a hash
 * table keyed by base address (expected O(1) lookup for munlock/free/munmap of
 * a whole registration) with the page index as companion for overlap and
 * containment queries. Not thread-safe: the engine holds its lock around every
 * call. Record pointers are valid only until the next insert or remove. */
#ifndef PINSHIM_RANGE_REGISTRY_H
#define PINSHIM_RANGE_REGISTRY_H

#include "page_index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum range_state {
    RANGE_REGISTERING = 1, /* reserved; cudaHostRegister in flight */
    RANGE_REGISTERED,
    RANGE_UNREGISTERING, /* cudaHostUnregister in flight */
};

struct range_record {
    uintptr_t base; /* 0 marks an empty slot */
    uintptr_t end;
    uint32_t state;
};

struct range_registry {
    struct range_record *slots;
    size_t capacity; /* power of two */
    size_t count;
    struct page_index index;
};

bool range_registry_init(struct range_registry *registry);
void range_registry_destroy(struct range_registry *registry);

struct range_record *range_registry_find(struct range_registry *registry, uintptr_t base);
/* Adds [base, end), which must not overlap a record. False when out of memory. */
bool range_registry_insert(struct range_registry *registry, uintptr_t base, uintptr_t end,
                           enum range_state state);
void range_registry_remove(struct range_registry *registry, uintptr_t base);

/* The record containing addr, or NULL. */
struct range_record *range_registry_containing(struct range_registry *registry, uintptr_t addr);
/* The lowest record overlapping [start, end), or NULL. */
struct range_record *range_registry_first_overlap(struct range_registry *registry, uintptr_t start,
                                                  uintptr_t end);

#endif
