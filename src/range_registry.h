/* Range registry: the shim's registrations, disjoint page ranges, in a hash
 * table keyed by base address (expected O(1) lookup for munlock/free/munmap of
 * a whole registration) with the page index as companion for overlap and
 * containment queries. Not thread-safe: the engine holds its lock around every
 * call. Record pointers are valid only until the next insert or remove.
 *
 * A slot is a record, one cache line (64 bytes, aligned): a lookup reads the
 * line of its home slot and, when displaced, the next ones (linear probing),
 * and the address of that line is known before the table is read, so that
 * range_registry_prefetch can start the load early (issue 22: with a million
 * live ranges each line is a miss; 56-byte slots straddled two lines). */
#ifndef PINSHIM_RANGE_REGISTRY_H
#define PINSHIM_RANGE_REGISTRY_H

#include "page_index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum range_state {
    RANGE_PENDING = 1,   /* locked; waits for the program to start its GPU runtime (deferred) */
    RANGE_QUEUED,        /* locked; waits for the registration thread */
    RANGE_REGISTERING,   /* the backend's register call in flight */
    RANGE_REGISTERED,    /* registered by the shim */
    RANGE_UNREGISTERING, /* the backend's unregister call in flight */
    RANGE_PROGRAM,       /* registered by the program itself: never the shim's to undo */
};

/* Where and how a registration is made: the device, the context (CUDA: 0 is
 * the device's primary context, or the runtime's choice; Level Zero: the
 * driver), and the engine's register flags it is made with. */
struct range_place {
    uintptr_t context;
    int32_t device; /* -1: not known (the runtime chose) */
    uint16_t flags; /* RANGE_PLACE_* */
    /* ENGINE_REGISTER_* bits (never 0 once chosen: the default is
     * PORTABLE|DEVICEMAP); 0 until the engine picks them. */
    uint8_t register_flags;
    uint8_t reserved;
};
/* Made in the locking thread's own (non-primary) context: only that context
 * can be used for it. */
#define RANGE_PLACE_THREAD_CONTEXT 1u
/* Holds in every context and on every device of the process (HIP's host
 * registrations; Level Zero's imports, per driver: context names the driver):
 * any thread may make or undo it. */
#define RANGE_PLACE_ANY_CONTEXT 2u

struct range_record {
    uintptr_t base; /* 0 marks an empty slot */
    uintptr_t end;
    /* The bytes the lock call that made this record asked for; free keeps a
     * page it shares with another block only while such bytes lie outside
     * the freed block. Pages for records not made by a lock call. */
    uintptr_t lock_start, lock_end;
    struct range_place place;
    uint8_t state;
    /* RANGE_PROGRAM: the program holds these pages locked (a lock the shim
     * would have registered), so the shim takes them back when the program
     * unregisters. */
    uint8_t program_locked;
} __attribute__((aligned(64)));

struct range_registry {
    struct range_record *slots;
    size_t capacity; /* power of two */
    size_t count;
    struct page_index index;
};

bool range_registry_init(struct range_registry *registry);
void range_registry_destroy(struct range_registry *registry);

struct range_record *range_registry_find(struct range_registry *registry, uintptr_t base);
/* Adds a copy of record (base, end, state, ...), which must not overlap a
 * record. Returns the stored record, or NULL when out of memory. */
struct range_record *range_registry_insert(struct range_registry *registry,
                                           const struct range_record *record);
void range_registry_remove(struct range_registry *registry, uintptr_t base);
/* Makes room for extra more records without growing later; false when out of
 * memory. After it, that many inserts and splits cannot fail for the table. */
bool range_registry_reserve(struct range_registry *registry, size_t extra);
/* Splits the record based at base in two at at (base < at < end): the right
 * part becomes its own record with the same fields. The used bits are not
 * touched, so a lock-free reader sees the pages covered throughout. Returns
 * the right part, or NULL when out of memory (nothing changed). */
struct range_record *range_registry_split(struct range_registry *registry, uintptr_t base,
                                          uintptr_t at);

/* Starts loading what a call about a record based at base reads first: its
 * home slot's line in the hash table and the page index's line for base.
 * Misses that would come one after another then overlap. */
void range_registry_prefetch(const struct range_registry *registry, uintptr_t base);

/* The record containing addr, or NULL. */
struct range_record *range_registry_containing(struct range_registry *registry, uintptr_t addr);
/* The lowest record overlapping [start, end), or NULL. */
struct range_record *range_registry_first_overlap(struct range_registry *registry, uintptr_t start,
                                                  uintptr_t end);

#endif
