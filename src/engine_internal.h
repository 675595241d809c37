/* The engine's rooms share these: the types of a running operation and of a
 * release, and the steps each room takes from the others. Only the engine's
 * own files include this header; everyone else uses engine.h.
 *
 *   engine_records.c   records, the free path's window and span, state counts
 *   engine_claims.c    claims on pages and the begin/run/end of an operation
 *   engine_calls.c     the backend's register and unregister calls, counted,
 *                      and a refused range cut by mapping kind
 *   engine_protocol.c  tracking and releasing, and the entry points that
 *                      lock, map, unlock and free: the protocol in one place
 *   engine_runs.c      runs of locked pages: each run one registration, or
 *                      held whole; joined, cut and registered again
 *   engine_remap.c     mremap
 *   engine_program.c   the program's own cudaHostRegister/cudaHostUnregister
 *   engine_worker.c    the registration thread and the watcher
 *   engine.c           set-up, fork, exit and the queries
 *
 * Every function here named ..._locked runs with the engine's mutex held. */
#ifndef PINSHIM_ENGINE_INTERNAL_H
#define PINSHIM_ENGINE_INTERNAL_H

#include "engine.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Bits of engine->warned_runs: messages about runs said once per process. */
#define ENGINE_WARNED_JOIN_FAILED 1u
#define ENGINE_WARNED_CHUNKED 2u
#define ENGINE_WARNED_HELD_ONFAULT 4u
#define ENGINE_WARNED_HELD_REFUSED 8u

/* Stamps the counters with the time of a change a watcher cares about
 * (registered, released, failed, waiting): a coarse clock, read in the vDSO. */
static inline void engine_note_change_locked(struct engine *engine)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME_COARSE, &now) == 0)
        __atomic_store_n(&engine_stats(engine)->last_change_ns,
                         (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec,
                         __ATOMIC_RELAXED);
}

/* An entry of the lists of records waiting for the registration thread. */
struct engine_waiting {
    uintptr_t base;
    struct engine_waiting *next;
};

/* A piece of a record that a release removed, so a failed call can put it
 * back, or mremap can move it. */
struct engine_piece {
    uintptr_t start, end;
    uintptr_t program_start, program_end; /* RANGE_PROGRAM: the program's bytes */
    struct range_place place;
    uint8_t state; /* RANGE_REGISTERED, QUEUED, PENDING, HELD or PROGRAM before the release */
    uint8_t program_locked;
    uint8_t held; /* RANGE_HELD: why */
    struct engine_piece *next;
};

struct engine_ticket {
    struct engine_piece *head;
};

/* How a piece put back or moved is tracked again: as it was. Its place was
 * chosen or not; what held its run keeps holding it, the rest is new and
 * its run says what it becomes. */
static inline enum engine_choice engine_piece_choice(const struct engine_piece *piece)
{
    return piece->state == RANGE_PENDING || (piece->place.flags & RANGE_PLACE_DEFERRED)
               ? ENGINE_PLACE_DEFER
               : ENGINE_PLACE_READY;
}

static inline enum range_held engine_piece_hold(const struct engine_piece *piece)
{
    if (piece->state == RANGE_HELD &&
        (piece->held == RANGE_HELD_ONFAULT || piece->held == RANGE_HELD_REFUSED ||
         piece->held == RANGE_HELD_NO_ACCESS))
        return (enum range_held)piece->held;
    return RANGE_HELD_NEW;
}

/* One running entry point: its claim, its cancellation state, the errno the
 * program had, and whether it must start the registration thread. */
struct engine_op {
    struct engine *engine;
    int slot;
    int cancel_state;
    int program_errno;
    bool start_worker;
};

/* What a release asks for. */
struct release_request {
    uintptr_t start, end; /* pages */
    enum release_reason reason;
    struct engine_ticket *ticket; /* NULL: nothing will be put back */
    /* free/realloc: the block's bytes, for the rule on shared pages */
    bool block;
    uintptr_t block_start, block_end;
};

/* ---- small helpers ---- */

static inline uintptr_t engine_max_address(uintptr_t a, uintptr_t b)
{
    return a > b ? a : b;
}

static inline uintptr_t engine_min_address(uintptr_t a, uintptr_t b)
{
    return a < b ? a : b;
}

static inline uintptr_t engine_page_floor(const struct engine *engine, uintptr_t addr)
{
    return addr & ~(engine->options.page_size - 1);
}

/* Rounds up; an address in the last page rounds to the highest page boundary
 * below the index's limit (such pages are refused earlier). */
static inline uintptr_t engine_page_ceil(const struct engine *engine, uintptr_t addr)
{
    uintptr_t mask = engine->options.page_size - 1;
    uintptr_t rounded = (addr + mask) & ~mask;
    return rounded < addr ? UINTPTR_MAX & ~mask : rounded;
}

/* The pages [*start, *end) of the byte range [addr, addr + length); false when
 * they reach above the indexed address space. */
static inline bool engine_byte_range_pages(const struct engine *engine, uintptr_t addr,
                                           size_t length, uintptr_t *start, uintptr_t *end)
{
    uintptr_t last = addr + length;
    if (last < addr)
        last = UINTPTR_MAX;
    *start = engine_page_floor(engine, addr);
    *end = engine_page_ceil(engine, last);
    return *end <= PAGE_INDEX_LIMIT && *start < *end;
}

/* Whether the engine keeps registrations (set up, not shut down). */
static inline bool engine_active(struct engine *engine)
{
    return engine->registry_ok && !__atomic_load_n(&engine->shut_down, __ATOMIC_RELAXED);
}

/* The real call alone, outside the protocol. */
static inline long engine_run_plain(const struct engine_call *call)
{
    return call->run(call->arguments);
}

/* ---- records (engine_records.c) ---- */

/* Keeps the queued and pending counts and lists in step with a record
 * entering (sign 1) or leaving (-1) its state. */
void engine_account_state_locked(struct engine *engine, const struct range_record *record,
                                 int sign);
void engine_set_state_locked(struct engine *engine, struct range_record *record,
                             enum range_state state);
/* Inserts a copy of record (which overlaps none); NULL when out of memory. */
struct range_record *engine_insert_record_locked(struct engine *engine,
                                                 const struct range_record *record);
void engine_remove_record_locked(struct engine *engine, uintptr_t base);
/* Removes the record at base and the lock bytes of its pages: untracked
 * now, so no free reads them. */
void engine_forget_record_locked(struct engine *engine, uintptr_t base);
/* Splits the record at base so that one record covers exactly [start, end)
 * and returns it; NULL when out of memory (nothing changed). */
struct range_record *engine_isolate_locked(struct engine *engine, uintptr_t base, uintptr_t start,
                                           uintptr_t end);
/* Joins the record at base with the record that starts at its end (both of
 * one state); returns the joined record, or NULL when there is none. */
struct range_record *engine_join_locked(struct engine *engine, uintptr_t base);
struct engine_waiting *engine_waiting_pop_locked(struct engine_waiting **head,
                                                 struct engine_waiting **tail);

/* Starts loading, all at once, the lines a call about the pages [start, end)
 * reads one after another: the registry's (the slot of a record at start and
 * of one at end, the next record the free window's refresh looks at, and the
 * page index's line) and the free window's entry. With a million live ranges
 * each is a miss of its own (issue 22); overlapped they cost about one. */
void engine_prefetch_locked(struct engine *engine, uintptr_t start, uintptr_t end);
/* Recomputes the free window's map over [start, end) and what looks ahead
 * into it: after the lock bytes there changed. */
void engine_window_refresh_locked(struct engine *engine, uintptr_t start, uintptr_t end);
/* Lock bytes (lock_bytes.h) added or taken away, with the free window kept
 * in step. Out of memory for an addition: warned once; the bytes are
 * missing (free then releases what it touches there). */
void engine_lock_bytes_add_locked(struct engine *engine, uintptr_t start, uintptr_t end);
void engine_lock_bytes_remove_locked(struct engine *engine, uintptr_t start, uintptr_t end);
/* Moves the lock bytes of [old_start, old_end) to new_start on (mremap). */
void engine_lock_bytes_move_locked(struct engine *engine, uintptr_t old_start, uintptr_t old_end,
                                   uintptr_t new_start);
/* A HELD record's reason, with the held counts kept in step. */
void engine_set_held_locked(struct engine *engine, struct range_record *record,
                            enum range_held reason);

/* ---- claims and operations (engine_claims.c) ---- */

bool engine_ranges_overlap(uintptr_t a_start, uintptr_t a_end, uintptr_t b_start, uintptr_t b_end);
/* Waits until no other operation claims any page of the ranges (count: 1 or
 * 2), then claims them, widened to the whole runs around their ends when
 * extend is set (engine_extend_to_runs_locked). False,
 * with nothing claimed, at shut-down when give_up_at_shutdown is set. */
bool engine_claim_locked(struct engine_op *op, const uintptr_t *starts, const uintptr_t *ends,
                         unsigned count, bool extend, bool give_up_at_shutdown);
/* Adds [start, end) to the op's claim when no other operation claims any of
 * it; never waits. */
bool engine_claim_more_locked(struct engine_op *op, uintptr_t start, uintptr_t end);
bool engine_op_claims(const struct engine_op *op, uintptr_t start, uintptr_t end);
/* Gives the op's claim up (its slot is free again) and wakes the waiters. */
void engine_drop_claim_locked(struct engine_op *op);
/* An operation: begin takes the mutex (cancellation off), run drops it around
 * the real call, end drops the claim and the mutex and starts the
 * registration thread when the op asked for it. */
void engine_op_begin(struct engine_op *op, struct engine *engine, const char *cause);
/* The cause engine_op_begin recorded for the calling thread (NULL outside
 * an operation). */
const char *engine_thread_cause(void);
void engine_op_end(struct engine_op *op);
long engine_op_run(struct engine_op *op, const struct engine_call *call, int *call_errno);
/* Work for the registration thread was added. */
void engine_want_worker_locked(struct engine_op *op);

/* ---- the backend's calls (engine_calls.c) and the protocol (engine_protocol.c) ---- */

/* The record at base is REGISTERING: makes the backend call (the mutex
 * dropped; the caller's claim covers the record) and records a success, or
 * the wait for a context. Returns the backend's answer; a failure leaves
 * the record REGISTERING, for engine_registration_failed_locked. */
struct engine_result engine_try_register_locked(struct engine *engine, uintptr_t base,
                                                bool on_worker);
/* Whether the result is a refusal (not a success, not "no context"). */
bool engine_registration_failed(struct engine_result result);
/* Unregisters the REGISTERED record at base (the mutex dropped around the
 * call), counted under reason; the record stays, UNREGISTERING, for the
 * caller. Returns the backend's answer. */
struct engine_result engine_unregister_record_locked(struct engine *engine, uintptr_t base,
                                                     enum release_reason reason, bool on_worker);
/* Counts a refused registration of the record at base (warned the first
 * time per code); the record stays as it is. */
void engine_count_register_failure_locked(struct engine *engine, uintptr_t base,
                                          struct engine_result result);
/* After a failed registration of the record at base: reads the kinds of
 * mapping it spans; where they are mixed, cuts it into pieces of one kind
 * (HELD: NEW with the flags their mapping needs, REFUSED, NO_ACCESS) and
 * returns true (its run must be settled again). False, changing nothing,
 * when every piece is plainly writable (the failure was the range's own). */
bool engine_cut_by_mapping_kinds_locked(struct engine *engine, uintptr_t base);
/* Tracks the pages of [start, end) that no record covers as HELD records
 * (reason hold; place chosen unless choice defers), and with a plain lock
 * (hold NEW) the ONFAULT records there become NEW. The op's claim covers
 * [start, end). Runs are not settled here. False when out of memory. */
bool engine_track_range_locked(struct engine_op *op, uintptr_t start, uintptr_t end,
                               enum engine_choice choice, const struct range_place *place,
                               enum range_held hold);
/* A lock's pages: its bytes become lock bytes, its pages are tracked and
 * the runs they touch settled (engine_settle_locked). */
void engine_add_range_locked(struct engine_op *op, uintptr_t start, uintptr_t end,
                             uintptr_t lock_start, uintptr_t lock_end, enum engine_choice choice,
                             const struct range_place *place, enum range_held hold);
/* Releases every record overlapping request's pages. */
void engine_release_locked(struct engine_op *op, const struct release_request *request);
/* Registers again the ticket's pieces clipped to [clip_start, clip_end) (only
 * those still mapped when only_mapped), then empties the ticket. */
void engine_restore_locked(struct engine_op *op, struct engine_ticket *ticket, uintptr_t clip_start,
                           uintptr_t clip_end, bool only_mapped);
void engine_ticket_discard_locked(struct engine *engine, struct engine_ticket *ticket);

/* ---- runs (engine_runs.c) ---- */

/* Widens [*start, *end) to the whole runs that hold or touch its first and
 * last pages (a claim must cover every record an operation may join, cut or
 * register again). */
void engine_extend_to_runs_locked(struct engine *engine, uintptr_t *start, uintptr_t *end);
/* Whether the record right after left (starting at its end) continues its
 * run: both may be registered with others, and no mapping begins there. */
bool engine_run_continues(struct engine *engine, const struct range_record *left,
                          const struct range_record *right);
/* Brings every run that holds or touches a page of [start, end) to what it
 * should be: registered whole, in as few registrations as its pages allow,
 * or held whole. The op's claim covers those runs. */
void engine_settle_locked(struct engine_op *op, uintptr_t start, uintptr_t end);
/* The registration of the record at base failed (result): it is cut by
 * mapping kind, or in its old pieces, or in chunks, or held; true when its
 * run must be settled again. */
bool engine_registration_failed_locked(struct engine_op *op, uintptr_t base,
                                       struct engine_result result, bool on_worker);

/* ---- the program's own registrations (engine_program.c) ---- */

/* [start, end) is locked now: the program's registrations there are marked
 * to be taken back when the program unregisters them. */
void engine_mark_program_locked_locked(struct engine *engine, uintptr_t start, uintptr_t end);

#endif
