/* The engine: keeps CUDA registrations equal to the program's locked pages.
 * It takes its CUDA calls through a narrow backend so tests can drive it
 * without LD_PRELOAD. Callers pass page-aligned [start, end) ranges.
 *
 * Locking: one mutex guards the registry; it is never held across a backend
 * call. A range whose backend call is in flight stays in the registry as
 * pending, and operations that touch it wait on a condition variable. */
#ifndef PINSHIM_ENGINE_H
#define PINSHIM_ENGINE_H

#include "internal_alloc.h"
#include "range_registry.h"

#include "pinshim.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* cudaError_t values the engine interprets. */
enum {
    ENGINE_CUDA_SUCCESS = 0,
    ENGINE_CUDA_UNLOADING = 4,
    ENGINE_CUDA_ALREADY_REGISTERED = 712,
    ENGINE_CUDA_NOT_REGISTERED = 713,
};

struct engine_backend {
    void *context;
    /* Loads the runtime on first use; false means registration is off for good. */
    bool (*ready)(void *context);
    int (*register_range)(void *context, void *base, size_t length);
    int (*unregister_range)(void *context, void *base);
    /* Name of an error code, for messages; may return NULL. */
    const char *(*error_name)(void *context, int error);
    /* Optional: calls found for each part of [start, end) the kernel holds
     * locked now. Used when too many unlocks raced a lock to tell which pages
     * they touched. */
    bool (*locked_parts)(void *context, uintptr_t start, uintptr_t end,
                         void (*found)(void *found_context, uintptr_t part_start,
                                       uintptr_t part_end),
                         void *found_context);
};

enum release_reason {
    RELEASE_MUNLOCK,
    RELEASE_FREE,
    RELEASE_REALLOC,
    RELEASE_MUNMAP,
    RELEASE_MREMAP,
    RELEASE_MMAP_FIXED,
    RELEASE_EXIT,
    RELEASE_REASON_COUNT
};

/* Pieces of registrations a release removed, so a failed munlock/munmap/...
 * can put them back. */
struct engine_ticket_piece {
    uintptr_t start, end;
    struct engine_ticket_piece *next;
};
struct engine_ticket {
    struct engine_ticket_piece *head;
};

#define ENGINE_ERROR_SLOTS 32
/* Recent and running munlock ranges, to tell a lock racing an unlock of a shared page. */
#define ENGINE_RECENT_UNLOCKS 1024
#define ENGINE_UNLOCKS_IN_FLIGHT 32
/* engine_register_pages callers that need no race check pass this. */
#define ENGINE_NO_UNLOCK_CHECK UINT64_MAX

struct engine_unlock_note {
    uintptr_t start, end;
    uint64_t sequence;
};

struct engine_error_count {
    int code;
    uint64_t count;
};

struct engine {
    pthread_mutex_t mutex;
    pthread_cond_t changed;
    struct range_registry registry;
    const struct engine_backend *backend;
    uint64_t min_bytes;
    uintptr_t page_size;
    size_t record_count; /* read without the lock by the fast paths */
    /* [span_start, span_end) holds every registration (and may hold more: it
     * only grows while records exist and starts afresh with the first record
     * after none); written under the mutex, read without it by the fast paths. */
    uintptr_t span_start, span_end;
    uint64_t insert_generation; /* bumped on every insert, under the mutex */
    bool registry_ok;
    bool shut_down;
    struct pinshim_counters counters; /* guarded by mutex; the fields below are not */
    /* Bumped with relaxed atomics outside the lock, merged by engine_get_counters. */
    uint64_t skipped_small, lock_calls, unlock_calls, mlockall_calls;
    uint64_t skipped_disabled; /* locks not registered: no usable runtime */
    uint64_t skipped_address;  /* locks above the indexed address space */
    uint64_t exit_unloading;   /* exit unregistrations answered cudaErrorCudartUnloading */
    uint64_t live_ranges_at_exit, live_bytes_at_exit;
    uint64_t skipped_race;    /* pages left unregistered: an unlock raced the lock */
    uint64_t unlock_sequence; /* munlock calls noted; read without the lock */
    struct engine_unlock_note recent_unlocks[ENGINE_RECENT_UNLOCKS];
    struct engine_unlock_note unlocks_in_flight[ENGINE_UNLOCKS_IN_FLIGHT]; /* sequence 0: free */
    unsigned unlocks_in_flight_overflow; /* running unlocks with no slot: all pages conflict */
    struct engine_error_count errors[ENGINE_ERROR_SLOTS];
    uint32_t warned_register[ENGINE_ERROR_SLOTS], warned_unregister[ENGINE_ERROR_SLOTS];
    struct node_pool piece_pool;
};

bool engine_init(struct engine *engine, const struct engine_backend *backend, uint64_t min_bytes,
                 uintptr_t page_size);
void engine_destroy(struct engine *engine);
/* In a fork child: forget every registration (they are the parent's) and counters. */
void engine_reset_after_fork(struct engine *engine);

/* Lock-free: whether any registration may overlap [start, end). The first load
 * is all a process with no registration pays. */
static inline bool engine_may_overlap(const struct engine *engine, uintptr_t start, uintptr_t end)
{
    if (__atomic_load_n(&engine->record_count, __ATOMIC_RELAXED) == 0)
        return false;
    if (end <= __atomic_load_n(&engine->span_start, __ATOMIC_RELAXED) ||
        start >= __atomic_load_n(&engine->span_end, __ATOMIC_RELAXED))
        return false;
    return page_index_any_used_inline(&engine->registry.index, start, end);
}

static inline bool engine_has_registrations(const struct engine *engine)
{
    return __atomic_load_n(&engine->record_count, __ATOMIC_RELAXED) != 0;
}

/* Lock and unlock race on a page two buffers share: the kernel may unlock it
 * after the lock returned and before the engine registers it. The lock path
 * reads the unlock sequence before the real lock. Every munlock is marked as
 * running (engine_begin_unlock) before its release and real call, and noted
 * with a new sequence number when it ends (engine_end_unlock). Pages that a
 * running unlock, or one that ended after the lock read the sequence, touches
 * are left unregistered: at worst a page DMA-copied at pageable speed, never a
 * registration of unlocked memory. */
static inline uint64_t engine_unlock_sequence(const struct engine *engine)
{
    return __atomic_load_n(&engine->unlock_sequence, __ATOMIC_ACQUIRE);
}
int engine_begin_unlock(struct engine *engine, uintptr_t start, uintptr_t end);
void engine_end_unlock(struct engine *engine, int token, uintptr_t start, uintptr_t end);
/* An unlock that is already over: begin and end at once. */
void engine_note_unlock(struct engine *engine, uintptr_t start, uintptr_t end);

/* After a successful lock of [addr, addr + length) (byte range as the caller gave
 * it): registers the pages not yet registered, when length >= min_bytes, except
 * those an unlock noted after unlocks_before touches. */
void engine_after_lock(struct engine *engine, uintptr_t addr, size_t length,
                       uint64_t unlocks_before);
/* Registers every unregistered page of [start, end) regardless of min_bytes. */
void engine_register_pages(struct engine *engine, uintptr_t start, uintptr_t end);
/* Before [start, end) is unlocked or released: unregisters every registration
 * overlapping it and re-registers their parts outside it. With a ticket,
 * the removed pieces are recorded for engine_restore. */
void engine_release(struct engine *engine, uintptr_t start, uintptr_t end,
                    enum release_reason reason, struct engine_ticket *ticket);
/* Re-registers the ticket's pieces clipped to [clip_start, clip_end), then drops it. */
void engine_restore(struct engine *engine, struct engine_ticket *ticket, uintptr_t clip_start,
                    uintptr_t clip_end);
void engine_ticket_discard(struct engine *engine, struct engine_ticket *ticket);

/* At exit: records what is live, unregisters it and stops registering. */
void engine_shutdown(struct engine *engine);

bool engine_is_registered(struct engine *engine, uintptr_t addr);
void engine_get_counters(struct engine *engine, struct pinshim_counters *out);
/* Copies the error histogram; returns the number of entries. */
size_t engine_get_errors(struct engine *engine, struct engine_error_count *out, size_t max);

static inline void engine_count(uint64_t *counter)
{
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

#endif
