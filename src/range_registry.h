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
    RANGE_HELD,          /* locked and tracked, not registered: see enum range_held */
};

/* Why a HELD record is not registered. A run (engine_runs.c) is registered
 * whole or not at all, so that every copy inside it works: the reasons that
 * hold a whole run are ONFAULT and REFUSED. */
enum range_held {
    RANGE_HELD_NEW = 0,   /* just added or changed: the run it is in decides (transient) */
    RANGE_HELD_SMALL,     /* its run is smaller than PINSHIM_MIN_BYTES */
    RANGE_HELD_ONFAULT,   /* locked with MLOCK_ONFAULT and not all resident: holds its run */
    RANGE_HELD_REFUSED,   /* a mapping no registration covers (VM_IO, a shared file, read-only
                             memory on a device without READ_ONLY): holds its run */
    RANGE_HELD_NO_ACCESS, /* PROT_NONE or unmapped: no copy crosses it, so it cuts runs */
    RANGE_HELD_FAILED,    /* the driver refused it: tried again when its run changes */
    RANGE_HELD_BESIDE,    /* could be registered, but its run is held for another part's sake */
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
/* No place chosen yet: the process had no context when the pages were
 * locked (the pending ones wait for it; a held one takes its run's place). */
#define RANGE_PLACE_DEFERRED 4u

struct range_record {
    uintptr_t base; /* 0 marks an empty slot */
    uintptr_t end;
    union {
        /* RANGE_PROGRAM: the bytes the program's own registration asked
         * for (the pointer its unregistration will pass is program_start). */
        struct {
            uintptr_t program_start, program_end;
        };
        /* Otherwise, in a run registered whole after it grew: the largest
         * part that was registered before, to register again as it was
         * should the driver refuse the whole (0, 0: none). */
        struct {
            uintptr_t kept_start, kept_end;
        };
    };
    struct range_place place;
    uint8_t state;
    /* RANGE_PROGRAM: the program holds these pages locked (a lock the shim
     * would have registered), so the shim takes them back when the program
     * unregisters. */
    uint8_t program_locked;
    uint8_t held; /* RANGE_HELD: enum range_held */
    /* One of the chunks of a run the driver refused in one call: joined
     * with nothing (engine_runs.c). */
    uint8_t chunk;
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

/* Joins the record based at base with the record that starts at its end:
 * the left one grows over the right one (its other fields stay), whose slot
 * goes. The used bits are not touched, so a lock-free reader sees the pages
 * covered throughout. Returns the joined record, or NULL (nothing changed)
 * when either is missing. */
struct range_record *range_registry_join(struct range_registry *registry, uintptr_t base);

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
