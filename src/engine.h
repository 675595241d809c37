/* The engine: keeps CUDA registrations equal to the program's locked pages.
 * It takes its CUDA calls through a narrow backend so tests can drive it
 * without LD_PRELOAD.
 *
 * The protocol. Every entry point (lock, unlock, unmap, remap, free, the
 * program's own registrations) is one engine call that owns the whole
 * sequence: it claims the pages it will touch, releases what must go before
 * the real call, runs the real call (passed in), registers or restores what
 * the outcome asks for, and drops its claim. Claims on overlapping pages wait
 * for each other, so no two operations ever interleave on a page (a lock and
 * an unlock of two buffers that share a page included); claims on disjoint
 * pages run in parallel. One mutex guards the registry and the claims; it is
 * never held across a backend call or a real call.
 *
 * Lock-free readers (free's check, pinshim_is_registered) see a page covered
 * from the moment a record for it is inserted until it is removed: a release
 * that splits a registration keeps the remainder's pages marked throughout. */
#ifndef PINSHIM_ENGINE_H
#define PINSHIM_ENGINE_H

#include "internal_alloc.h"
#include "lock_bytes.h"
#include "mapping_bounds.h"
#include "numa_placement.h"
#include "range_registry.h"

#include "pinshim.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a backend's register or unregister call came to, in the engine's own
 * words: each vendor's backend translates its codes into these and keeps
 * the code itself for messages and counts. */
enum engine_outcome {
    ENGINE_OK = 0,
    ENGINE_ALREADY_REGISTERED, /* the memory is registered already: the program's */
    ENGINE_NOT_REGISTERED,     /* nothing registered there now: gone with its context,
                                  or undone by the program where the shim cannot see */
    ENGINE_NO_CONTEXT,         /* the place chosen has no live context now: wait for one */
    ENGINE_UNLOADING,          /* the runtime is being torn down (at exit) */
    ENGINE_FAILED,             /* any other refusal: the range stays locked only */
};

struct engine_result {
    enum engine_outcome outcome;
    int code; /* the vendor's own code (0 with ENGINE_OK, or none: ENGINE_NO_CONTEXT) */
};

static inline struct engine_result engine_result_of(enum engine_outcome outcome, int code)
{
    return (struct engine_result){outcome, code};
}

/* Registration flags, the engine's: each backend turns them into its
 * vendor's (CUDA's CU_MEMHOSTREGISTER_* and HIP's hipHostRegister* have
 * these values; Level Zero's import takes none). */
#define ENGINE_REGISTER_PORTABLE 0x01u
#define ENGINE_REGISTER_DEVICEMAP 0x02u
#define ENGINE_REGISTER_IOMEMORY 0x04u
#define ENGINE_REGISTER_READ_ONLY 0x08u

/* The default (0) means "mapped and portable" for CUDA on every 64-bit (UVA)
 * system and for HIP: two flag sets that normalise alike mean the same thing. */
static inline unsigned engine_normalized_flags(unsigned flags)
{
    return flags != 0 ? flags : ENGINE_REGISTER_PORTABLE | ENGINE_REGISTER_DEVICEMAP;
}

/* What pinning meets in a mapping (the runtime's backend reads it from
 * /proc/self/smaps; memory_map.h). */
enum engine_mapping_kind {
    ENGINE_MAPPING_WRITABLE,    /* registered with the flags chosen */
    ENGINE_MAPPING_READ_ONLY,   /* needs READ_ONLY, where the device supports it */
    ENGINE_MAPPING_NO_ACCESS,   /* PROT_NONE: no driver pins it */
    ENGINE_MAPPING_IO,          /* VM_IO or VM_PFNMAP: no driver pins it */
    ENGINE_MAPPING_SHARED_FILE, /* a writable shared file mapping that needs dirty
                                   tracking: not long-term pinnable for writing */
    ENGINE_MAPPING_UNMAPPED,
    ENGINE_MAPPING_KIND_COUNT
};

/* Where a registration made now would go. */
enum engine_choice {
    ENGINE_PLACE_READY,    /* *place filled in */
    ENGINE_PLACE_DEFER,    /* no CUDA context (or no driver) in the process yet: look again soon */
    ENGINE_PLACE_DISABLED, /* registration is off for good in this process */
};

struct engine_backend {
    void *context;
    /* Where a registration of memory locked by the calling thread would go.
     * from_worker: called on the engine's own registration thread (which has
     * no context of its own); hint is the place the locking thread pointed
     * at, or NULL. */
    enum engine_choice (*choose_place)(void *context, bool from_worker,
                                       const struct range_place *hint, struct range_place *place);
    /* Registers with place->register_flags; may fill in place->device when
     * the backend chose it (the runtime's). */
    struct engine_result (*register_range)(void *context, struct range_place *place, void *base,
                                           size_t length);
    /* length: the registration's, as registered (a backend may check that
     * what it is about to release is still the registration it made). */
    struct engine_result (*unregister_range)(void *context, const struct range_place *place,
                                             void *base, size_t length);
    /* Optional: the context current on the calling thread, as a place (its
     * device, and the context unless it is that device's primary one); false
     * when the thread has none or it cannot be told. A program's
     * cudaHostRegister on this thread registers there. */
    bool (*thread_place)(void *context, struct range_place *place);
    /* Name of a vendor's code, for messages; may return NULL. */
    const char *(*error_name)(void *context, int code);
    /* Optional: the call register_range (or unregister_range) makes, for
     * messages ("cuMemHostRegister", "hipHostRegister", ...). */
    const char *(*call_name)(void *context, bool unregister);
    /* Optional: calls found for each part of [start, end) the kernel holds
     * locked now (after MREMAP_DONTUNMAP, whose effect on locks depends on
     * how the kernel merges mappings). */
    bool (*locked_parts)(void *context, uintptr_t start, uintptr_t end,
                         void (*found)(void *found_context, uintptr_t part_start,
                                       uintptr_t part_end),
                         void *found_context);
    /* Optional: calls found for each run of resident pages in [start, end)
     * (mlock2 MLOCK_ONFAULT registers what is resident). */
    bool (*resident_parts)(void *context, uintptr_t start, uintptr_t end,
                           void (*found)(void *found_context, uintptr_t part_start,
                                         uintptr_t part_end),
                           void *found_context);
    /* Optional: calls found for each run of [start, end) of one mapping kind
     * (asked only after a registration failed: a range that spans mappings
     * of other kinds is then registered piece by piece). */
    bool (*mapping_kinds)(void *context, uintptr_t start, uintptr_t end,
                          void (*found)(void *found_context, uintptr_t part_start,
                                        uintptr_t part_end, enum engine_mapping_kind kind),
                          void *found_context);
    /* Optional: whether place's device takes READ_ONLY registrations
     * (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED). */
    bool (*read_only_supported)(void *context, const struct range_place *place);
    /* Optional: whether every page of [start, end) is mapped. */
    bool (*is_mapped)(void *context, uintptr_t start, uintptr_t end);
    /* Optional: the [start, end) of the mapping (VMA) that holds addr. */
    bool (*mapping_bounds)(void *context, uintptr_t addr, uintptr_t *start, uintptr_t *end);
    /* Optional: the engine started or stopped wanting its registration
     * thread (the runtime runs engine_worker_run on a thread of its own). */
    void (*wake_worker)(void *context);
    /* Optional: a registration succeeded or is about to be undone (madvise
     * MADV_DONTFORK / MADV_DOFORK when asked for). */
    void (*registered)(void *context, uintptr_t start, uintptr_t end, bool added);
    /* Optional (with options.numa): adds the bytes of the registered
     * [start, end) to out by the NUMA node its pages are on. */
    bool (*page_nodes)(void *context, uintptr_t start, uintptr_t end, struct numa_placement *out);
    /* Optional: the NUMA node nearest place's device; -1 when unknown, or
     * when the registration serves every device (no one device to be near). */
    int (*device_node)(void *context, const struct range_place *place);
};

enum release_reason {
    RELEASE_MUNLOCK,
    RELEASE_FREE,
    RELEASE_REALLOC,
    RELEASE_MUNMAP,
    RELEASE_MREMAP,
    RELEASE_MMAP_FIXED,
    RELEASE_EXIT,
    RELEASE_PROGRAM,  /* the program registered the pages itself */
    RELEASE_MPROTECT, /* read-only pages became writable: registered again writable */
    RELEASE_JOIN,     /* its run grew, joined another or is held: registered again whole */
    RELEASE_REASON_COUNT
};

/* mlock2(MLOCK_ONFAULT): what is registered. */
enum engine_onfault {
    ENGINE_ONFAULT_RESIDENT = 0, /* the pages resident when the lock returns */
    ENGINE_ONFAULT_SKIP,         /* nothing */
    ENGINE_ONFAULT_ALL,          /* all of it (registration faults the rest in) */
};

struct engine_options {
    uint64_t min_bytes; /* smallest run of locked pages that is registered */
    /* The chunks a run is cut into when the driver refuses it in one call
     * and it is larger than this (never before). */
    uint64_t max_registration_bytes;
    uintptr_t page_size;
    /* CU_MEMHOSTREGISTER_* bits every registration is made with (0: the
     * default, PORTABLE|DEVICEMAP). */
    unsigned register_flags;
    enum engine_onfault onfault;
    bool asynchronous; /* lock calls return before registration */
    bool numa;         /* locate registered pages on NUMA nodes (backend page_nodes) */
};

/* The real call of an entry point, run by the engine inside its protocol.
 * run returns the call's result (an int, or a pointer, as a long). */
struct engine_call {
    long (*run)(void *arguments);
    void *arguments;
    const char *name; /* "mlock", "free", ...: said in NVTX ranges (trace.h) */
};

/* What a failed unlock-type call left locked, to register again. */
enum engine_failure_rule {
    ENGINE_FAILED_CHANGED_NOTHING,   /* munmap, munlockall, realloc */
    ENGINE_FAILED_UNLOCKED_TO_HOLE,  /* munlock: ENOMEM after unlocking up to a hole */
    ENGINE_FAILED_MAY_HAVE_UNMAPPED, /* mmap(MAP_FIXED): put back what is still mapped */
};

/* free's lock-free view, read on every free while records exist, written
 * under the engine's mutex. gate: 0 while no record exists, else the end of
 * the span that holds every record, so that one compare, "ptr >= gate",
 * clears every block when nothing is registered and every block above all
 * records (a NULL pointer passes on, and is cleared after the window). Then,
 * for blocks that start inside the window (the aligned 64 GiB region of the
 * first record, from its second granule on when that region starts at 0, so
 * that NULL is never in it), one entry per 4 KiB granule tells how far, in
 * bytes from the granule's start,
 * the first byte in danger is (a byte a record's lock asked for, within the
 * record's pages: a block that holds one makes its free release pages), as
 * LIMIT - min(LIMIT, distance) with LIMIT = ENGINE_WINDOW_LIMIT: LIMIT is
 * "in danger at the granule's first byte" and 0 (the kernel's zero pages:
 * untouched) "none within LIMIT bytes". A block that starts at offset o in
 * the window, its granule's entry e, and whose last byte is at o + n holds
 * no byte in danger when (o mod 4096) + n + e < LIMIT: one add from memory,
 * whatever the block's size (the entries are in bytes, and 64 bits wide, so
 * that the sum needs no shift and no widening). A granule where danger
 * covers the first byte and ends inside it (a lock's last, partial page)
 * keeps that end and the next danger in the entry (ENGINE_WINDOW_AFTER_SHIFT),
 * which fails the add; a second look (in engine_block_clear_fast too) then clears
 * the blocks that start after it. The map runs 256 granules past the window's end, so a
 * block starting near the end sees the records just after it. window_size
 * is 0 until block sizes may be read from glibc's chunk headers
 * (engine_enable_window), or when the map could not be mapped.
 * window_start, window_size and window are written once, before a reader
 * can see a record.
 *
 * In C11's memory model. Writers hold the engine's mutex and store the gate,
 * the entries and below with __atomic_store_n (relaxed); window_size is
 * stored with release after window and window_start. free reads them with
 * no lock: the gate and the entries with plain loads (so that the compiler
 * folds the gate's load into the compare), below with a relaxed load. Two
 * cases:
 *  - The free is ordered after the lock that made a record it must see (the
 *    same thread locked then freed, or the program synchronised the two, as
 *    it must to free memory another thread locked). The stores were made
 *    inside that lock call, before it returned, so they happen before the
 *    free, and by write-read coherence the free reads them or later values;
 *    a later value only narrows the window (fewer records) or widens it
 *    after another lock, which sends the block on to the locked path, where
 *    the mutex orders everything.
 *  - The free races the lock (not ordered either way). Then the block
 *    cannot be what that lock asked for, or the program races on its own
 *    memory; a stale "clear" frees a block whose bytes no finished lock
 *    needs, and the allocator can only give back pages the block covers
 *    whole, which a concurrent lock of other bytes does not register.
 * The plain loads of the gate and entries are, to the letter of C11, racy
 * reads of words written atomically; GCC and Clang compile an aligned
 * machine-word load to one load instruction, which reads the old or the new
 * value, as a relaxed atomic load would: the shim relies on that, as the
 * glibc chunk header it also reads there is read without synchronisation by
 * any allocator. The window's map and the page index's nodes are never
 * unmapped while the engine lives, so no read touches unmapped memory.
 * x86-64 is strongly ordered and hides missed orderings; the tests ran on
 * x86-64 natively and on aarch64 under qemu-user (also on x86-64 hardware),
 * so weak ordering on real aarch64 is argued here, not tested. */
struct engine_free_view {
    uintptr_t gate;
    uintptr_t window_start;
    uintptr_t window_size;
    const uint64_t *window;
    /* The span's start while block sizes may be read from headers (else 0):
     * a block that starts below it and ends below it holds no record. */
    uintptr_t below;
} __attribute__((aligned(64)));

#define ENGINE_WINDOW_BYTES ((uintptr_t)64 << 30)
#define ENGINE_WINDOW_REACH 255 /* granules an entry of the map looks ahead */
#define ENGINE_WINDOW_LIMIT ((uintptr_t)ENGINE_WINDOW_REACH << PAGE_INDEX_GRANULE_SHIFT)
/* An entry for a granule where danger covers the first byte and ends at b
 * inside it: (next << ENGINE_WINDOW_AFTER_SHIFT) | b, next the distance from
 * the granule's start to the next danger after b. It is above every plain
 * entry, so the one-add check fails; the second look reads b from the low
 * half and next from the high half, and a plain entry (high half 0) fails
 * it. */
#define ENGINE_WINDOW_AFTER_SHIFT 32
static inline uint64_t engine_window_after_entry(uintptr_t b, uintptr_t next)
{
    return ((uint64_t)next << ENGINE_WINDOW_AFTER_SHIFT) | b;
}
#define ENGINE_WINDOW_ENTRIES                                                                      \
    ((ENGINE_WINDOW_BYTES >> PAGE_INDEX_GRANULE_SHIFT) + ENGINE_WINDOW_REACH + 1)
#define ENGINE_WINDOW_MAP_BYTES (ENGINE_WINDOW_ENTRIES * sizeof(uint64_t))

/* How long, at least and at most, the registration thread waits after the
 * last change of the queue before it registers: a loop locking a buffer
 * piece by piece (a lock of a few MiB takes a millisecond or so to fault its
 * pages in) joins its pieces while they are queued. bench/run_joins
 * measures the effect. */
#define ENGINE_QUEUE_QUIET_NANOSECONDS (2ull * 1000 * 1000)
#define ENGINE_QUEUE_QUIET_MAX_NANOSECONDS (1000ull * 1000 * 1000)

#define ENGINE_ERROR_SLOTS 32
#define ENGINE_CLAIMS 64 /* at most 64: claims_taken is their bitmask */
#define ENGINE_MAX_DEVICES 64

#define ENGINE_ERROR_NAME_BYTES 40

struct engine_error_count {
    int code;
    uint64_t count;
    char name[ENGINE_ERROR_NAME_BYTES]; /* the backend's name for code, cut to fit */
};

/* Pages claimed by one running operation: up to two ranges. */
struct engine_claim {
    uintptr_t start[2], end[2];
    unsigned count; /* 0: free slot */
};

struct engine_device_counts {
    uint64_t registrations, bytes;
};

/* Everything the engine counts, in one block so that it can live in a file
 * mapped shared (live_record.h) as well as in the engine: the counters move
 * there at a process's first lock and a killed process leaves them behind.
 * Fields are updated in place, under the engine's mutex unless said; the
 * live record's field table (live_record.c) names each for readers. */
struct engine_statistics {
    struct pinshim_counters counters; /* guarded by mutex; pending/queued mirror the engine's */
    /* Bumped with relaxed atomics outside the lock, merged by engine_get_counters. */
    uint64_t skipped_small, lock_calls, unlock_calls, mlockall_calls;
    uint64_t skipped_disabled;        /* locks not registered: registration off in this process */
    uint64_t skipped_runtime_library; /* locks made by the CUDA driver or a runtime itself */
    uint64_t skipped_address;         /* locks above the indexed address space */
    uint64_t skipped_onfault_pages;   /* MLOCK_ONFAULT pages not resident, not registered */
    /* Registrations split by mapping: pieces registered READ_ONLY, pieces
     * left unregistered by kind (and read-only pieces on a device that takes
     * no READ_ONLY), ranges registered piece by piece. */
    uint64_t read_only_registrations;
    uint64_t skipped_pieces[ENGINE_MAPPING_KIND_COUNT];
    uint64_t skipped_read_only_unsupported;
    uint64_t registered_by_pieces;
    uint64_t exit_unloading; /* exit unregistrations answered "runtime/driver unloading" */
    /* Runs (engine_runs.c): runs registered whole after parts of them
     * were undone (counters.unregister_join); joined runs the driver refused,
     * registered in their old pieces instead; runs cut into chunks because
     * the driver refused them whole; locked ranges tracked but not
     * registered now (enum range_held), and their bytes. */
    uint64_t runs_joined, join_failed, runs_chunked;
    uint64_t held_ranges, held_bytes;
    uint64_t deferred_total, deferred_registered; /* ranges that waited for a context */
    uint64_t cancelled_queued, dropped_pending;   /* released before they were registered */
    uint64_t gone_with_context; /* unregistrations that found the registration gone (713) */
    uint64_t program_registrations, program_unregistrations, program_took_back;
    /* The program's cudaHostRegister of pages the shim held registered just
     * so: the registration became the program's, without a CUDA call; its
     * cudaHostUnregister of pages still locked: the shim kept the
     * registration, without a call. */
    uint64_t program_handed_over, program_kept;
    uint64_t wait_nanoseconds;       /* time program threads spent in backend calls */
    uint64_t background_nanoseconds; /* time the registration thread spent in them */
    uint64_t last_change_ns;         /* CLOCK_REALTIME(_COARSE) of the last change of state */
    struct engine_device_counts devices[ENGINE_MAX_DEVICES];
    struct engine_error_count errors[ENGINE_ERROR_SLOTS];
    /* The vendor (PINSHIM_VENDOR's name) and the call registrations go
     * through, once one is chosen; written once, by the process's runtime
     * module, for the live record's readers. */
    char vendor[16];
    char register_call[40];
    /* NUMA placement (options.numa): bytes registered by the node their
     * pages were on, and the part on their device's node; bytes on another
     * node than their device's, and bytes whose node was not learned; each
     * device's node (-1: unknown; set at engine_init). Under the mutex. */
    struct engine_numa_counts {
        uint64_t bytes, local_bytes;
    } numa_nodes[NUMA_PLACEMENT_MAX_NODES];
    uint64_t numa_remote_bytes, numa_unknown_bytes;
    int32_t device_nodes[ENGINE_MAX_DEVICES];
    /* Huge pages (huge_pages.h), bumped with relaxed atomics: bytes of plain
     * locks on huge pages, on small ones, and on pages of a size not
     * learned when the lock returned; bytes of PMD-aligned chunks the shim
     * made huge before a lock, left alone because they had pages, left small
     * for want of free huge blocks, refused by the kernel, left small after
     * a slow batch; allocations aligned to the PMD size; 1 once a slow batch
     * stopped the shim's huge pages. The kernel's THP mode, written once. */
    uint64_t huge_bytes, small_bytes, page_size_unknown_bytes;
    uint64_t huge_made_bytes, huge_had_pages_bytes, huge_no_block_bytes;
    uint64_t huge_refused_bytes, huge_stopped_bytes;
    uint64_t huge_aligned_allocations, huge_backed_off;
    char huge_pages_kernel[32];
};

struct engine {
    struct engine_free_view free_view;
    /* Where the gate is kept: free_view.gate, or (engine_keep_gate_at) a
     * variable of its own that free reads with a RIP-relative compare. */
    uintptr_t *gate;
    uint64_t *window_entries; /* ENGINE_WINDOW_MAP_BYTES, or NULL */
    pthread_mutex_t mutex;
    pthread_cond_t changed; /* claims dropped, worker work */
    struct range_registry registry;
    const struct engine_backend *backend;
    struct engine_options options;
    size_t record_count; /* read without the lock by the fast paths */
    /* [span_start, span_end) holds every record (and may hold more: it only
     * grows while records exist and starts afresh with the first record after
     * none); written under the mutex, read without it by the fast paths. */
    uintptr_t span_start, span_end;
    bool window_allowed; /* engine_enable_window was called */
    bool window_placed;  /* the window's place chosen (at the first record) */
    bool registry_ok;
    bool shut_down;
    bool worker_active;      /* a registration thread runs (or is being started) */
    bool worker_busy;        /* it is registering a range now */
    bool warned_remote_numa; /* remote memory is warned about once per process */
    struct engine_claim claims[ENGINE_CLAIMS];
    /* Bit i set: claims[i] is taken. An operation finds a free slot and
     * checks the taken ones for conflicts without reading the free ones (a
     * scan of all 64 was a thousand instructions and 40 cache lines a
     * lock+unlock pair: issue 22). */
    uint64_t claims_taken;
    /* Records waiting for the registration thread (QUEUED) or for a context
     * (PENDING), by base; stale entries are skipped. */
    struct engine_waiting *queue_head, *queue_tail, *pending_head, *pending_tail;
    size_t queued_ranges, pending_ranges; /* written under the mutex, read without it */
    /* When a record last became QUEUED (CLOCK_MONOTONIC, ns): the
     * registration thread lets a burst of locks settle first
     * (ENGINE_QUEUE_QUIET_NANOSECONDS), so that pieces locked one after
     * another join while queued, at no call, and the run is registered
     * once; engine_drain waits for no quiet (drains_waiting). */
    uint64_t queue_changed_ns;
    unsigned drains_waiting;
    /* How long the registration thread's last registration took: the quiet
     * it waits for is twice that (at least ENGINE_QUEUE_QUIET_NANOSECONDS,
     * at most ENGINE_QUEUE_QUIET_MAX_NANOSECONDS), so that locks that come
     * faster than a registration of their run join while queued and the run
     * is registered a few times, not once per lock. */
    uint64_t last_background_ns;
    /* When the queue last went from empty to not empty: nothing waits
     * longer than ENGINE_QUEUE_QUIET_MAX_NANOSECONDS for quiet, so that a
     * steady stream of locks cannot keep the queue from being registered. */
    uint64_t queue_filled_ns;
    uint64_t pending_bytes;
    uint64_t pending_passes; /* looks finished (engine_drain waits for one) */
    /* What the engine counts: its own block until a live record takes the
     * counters (engine_statistics_move_to), then the record's. */
    struct engine_statistics *statistics;
    struct engine_statistics own_statistics;
    uint64_t logged_skips; /* bit per kind (and bit 31: no READ_ONLY support): logged once */
    /* Taken at shutdown, before the exit unregistrations. */
    uint64_t live_ranges_at_exit, live_bytes_at_exit;
    uint64_t pending_ranges_at_exit, pending_bytes_at_exit;
    uint64_t queued_ranges_at_exit, queued_bytes_at_exit;
    uint32_t warned_register[ENGINE_ERROR_SLOTS], warned_unregister[ENGINE_ERROR_SLOTS];
    struct node_pool piece_pool;
    struct node_pool waiting_pool;
    /* The bytes the program's locks (and its own registrations) asked for:
     * what free releases and the free window's map are decided by. */
    struct lock_bytes lock_bytes;
    /* Where the program's mappings begin and end (NULL: nowhere known):
     * runs of locked pages are cut there. */
    struct mapping_bounds *bounds;
    uint32_t warned_runs; /* bit per kind of run message: warned once */
};

/* The engine's counters, wherever they live now: acquire pairs with the
 * release in engine_statistics_move_to, so a thread that sees the new place
 * sees what was copied there. */
static inline struct engine_statistics *engine_stats(struct engine *engine)
{
    return __atomic_load_n(&engine->statistics, __ATOMIC_ACQUIRE);
}

/* Moves the counters to place (data_bytes >= sizeof(struct engine_statistics),
 * zeroed, 8-byte aligned: a live record's mapping) and counts there from now
 * on. Counts that other threads add to the old place while it moves are
 * carried over once more after the switch; one still in flight after that
 * is lost (issue 19: "at most the operation in flight"). */
void engine_statistics_move_to(struct engine *engine, struct engine_statistics *place);

bool engine_init(struct engine *engine, const struct engine_backend *backend,
                 const struct engine_options *options);
void engine_destroy(struct engine *engine);
/* In a fork child: forget every registration (they are the parent's), claim,
 * queued work and counter. Only the forking thread exists there. */
void engine_reset_after_fork(struct engine *engine);

/* Lock-free: whether any record may overlap [start, end). The first load is
 * all a process with no record pays. */
static inline bool engine_may_overlap(const struct engine *engine, uintptr_t start, uintptr_t end)
{
    if (__atomic_load_n(&engine->record_count, __ATOMIC_RELAXED) == 0)
        return false;
    if (end <= __atomic_load_n(&engine->span_start, __ATOMIC_RELAXED) ||
        start >= __atomic_load_n(&engine->span_end, __ATOMIC_RELAXED))
        return false;
    return page_index_any_used_inline(&engine->registry.index, start, end);
}

/* The word before the block: glibc's chunk size with its flag bits. Read
 * through an address computed as a number, for callers the compiler sees
 * pass NULL (the window's bounds keep NULL from this read). */
static inline size_t engine_header_word(const void *ptr)
{
    return *(const size_t *)((uintptr_t)ptr - sizeof(size_t));
}

/* free's lock-free check for the block at ptr, whose glibc chunk header is
 * the word before it (read only when the view says headers may be read):
 * engine_block_clear_fast is true when the block cannot hold a page any
 * record covers. gate is the engine's gate (*engine->gate). False means
 * "look further" (the page index, the allocator's size), never "it holds
 * one". The header word is the chunk size plus three flag bits: as a size it
 * may reach up to 7 bytes too far, which at worst sends a block on to the
 * full check. See struct engine_free_view.
 *
 * Its steps, for free to inline only the first: engine_block_window_check
 * (1: clear, by the gate or the window's one add: three instructions idle,
 * fifteen in the window on x86-64; -1: in the window, not cleared by the one
 * add; 0: outside the window), then engine_block_clear_second_look or
 * engine_block_clear_outside. */
static inline int engine_block_window_check(const struct engine *engine, uintptr_t gate,
                                            const void *ptr, uintptr_t *sum, uintptr_t *granule)
{
    uintptr_t address = (uintptr_t)ptr;
    if (__builtin_expect(address >= gate, 1))
        return 1;
    /* The window's fields are written once (window_size last, when headers
     * may be read): plain loads, which the compiler folds into the
     * arithmetic. NULL is never inside the window. */
    const struct engine_free_view *view = &engine->free_view;
    uintptr_t offset = address - view->window_start;
    if (offset >= view->window_size)
        return 0;
    /* The block's last byte is 9 bytes before the header's size ends it (one
     * word of header, one lent): the 9 moves to the limit's side. */
    *granule = offset >> PAGE_INDEX_GRANULE_SHIFT;
    *sum = (offset & (PAGE_INDEX_GRANULE - 1)) + engine_header_word(ptr) + view->window[*granule];
    return *sum < ENGINE_WINDOW_LIMIT + 9 ? 1 : -1;
}

/* For a block in the window the one add did not clear (sum and granule as
 * engine_block_window_check gave them: the block's offset in its granule
 * plus its header word plus the entry, and the entry's index): in a lock's
 * last, partial granule, clear from the lock's end on, up to the next
 * danger (see ENGINE_WINDOW_AFTER_SHIFT). The window starts on a granule, so
 * the block's offset in its granule is its address's. */
static inline bool engine_block_clear_second_look(const struct engine *engine, const void *ptr,
                                                  uintptr_t sum, uintptr_t granule)
{
    uint64_t entry = engine->free_view.window[granule];
    uintptr_t reach = sum - entry;
    return reach - 9 < (uintptr_t)(entry >> ENGINE_WINDOW_AFTER_SHIFT) &&
           (uint32_t)((uintptr_t)ptr & (PAGE_INDEX_GRANULE - 1)) >= (uint32_t)entry;
}

/* For a block outside the window: NULL, and blocks below every record. */
static inline bool engine_block_clear_outside(const struct engine *engine, const void *ptr)
{
    uintptr_t address = (uintptr_t)ptr;
    if (address == 0)
        return true;
    /* Below every record (below is 0 unless headers may be read). */
    uintptr_t below = __atomic_load_n(&engine->free_view.below, __ATOMIC_RELAXED);
    return address < below && address + engine_header_word(ptr) - 9 < below;
}

static inline bool engine_block_clear_fast(const struct engine *engine, uintptr_t gate,
                                           const void *ptr)
{
    uintptr_t sum = 0, granule = 0;
    int verdict = engine_block_window_check(engine, gate, ptr, &sum, &granule);
    if (verdict > 0)
        return true;
    return verdict < 0 ? engine_block_clear_second_look(engine, ptr, sum, granule)
                       : engine_block_clear_outside(engine, ptr);
}

/* Runs of locked pages are cut where bounds says a mapping begins or ends
 * (set once, before the first lock; NULL: nowhere). */
void engine_set_mapping_bounds(struct engine *engine, struct mapping_bounds *bounds);

/* Keeps free_view.gate at *gate instead (zeroed now). */
void engine_keep_gate_at(struct engine *engine, uintptr_t *gate);

/* Lets free read the window once block sizes may come from glibc's chunk
 * headers (the checks at the first lock said so). */
void engine_enable_window(struct engine *engine);

static inline bool engine_has_registrations(const struct engine *engine)
{
    return __atomic_load_n(&engine->record_count, __ATOMIC_RELAXED) != 0;
}

#define ENGINE_LOCK_ONFAULT 1u

/* mlock, mlock2: runs call (the real lock); when it succeeds, the pages of
 * [addr, addr + length) join the run of locked pages they touch, and each
 * run is one registration (engine_runs.c): registered now, by the
 * registration thread, or once the process has a CUDA context; or held,
 * unregistered, while the run is smaller than min_bytes or holds pages that
 * no registration may cover. Returns what call returned, with its errno. */
long engine_lock(struct engine *engine, uintptr_t addr, size_t length, unsigned flags,
                 const struct engine_call *call);

/* mmap, mmap64 with MAP_FIXED (replace, when the fixed range is to be
 * released first) and/or MAP_LOCKED (locks: register the new mapping). The
 * new mapping's bounds go to the engine's mapping bounds. */
long engine_map(struct engine *engine, uintptr_t fixed_start, size_t length, bool replaces,
                bool locks, const struct engine_call *call);

/* munlock, munmap, munlockall: releases the registrations overlapping the
 * pages [start, end) (registering the parts outside it again, each part of
 * a run one registration), runs call, and after a failure registers again
 * what the call left locked. munmap's range leaves the mapping bounds:
 * before the call where no page of it is tracked, else with the call, once
 * the op holds the pages (mapping_bounds_unmap_begin). */
long engine_unlock(struct engine *engine, uintptr_t start, uintptr_t end,
                   enum release_reason reason, enum engine_failure_rule failure,
                   const struct engine_call *call);

/* mprotect, pkey_mprotect of [start, end) (pages) that gives access
 * (writable: write access): what is registered there READ_ONLY is
 * registered again without it once the call succeeds (so the device may
 * write it, as it may any writable locked buffer), and pages held because
 * their protection allowed no registration are looked at again. Protection
 * taken away keeps the registrations as they are: they stay valid. */
long engine_protect(struct engine *engine, uintptr_t start, uintptr_t end, bool writable,
                    const struct engine_call *call);

/* mremap. flags are mremap's; new_address is read with MREMAP_FIXED. */
long engine_remap(struct engine *engine, uintptr_t old_start, size_t old_size, size_t new_size,
                  int flags, uintptr_t new_address, const struct engine_call *call);

/* free, realloc: the block [start, end) (its usable bytes) goes back to the
 * allocator. Every page the block touches is released, but for a first or
 * last page that still holds lock bytes of other memory (a neighbouring
 * buffer locked on the same page): that one stays registered. call failing
 * (realloc returning NULL for a nonzero size) restores what was released. */
long engine_release_block(struct engine *engine, uintptr_t start, uintptr_t end,
                          enum release_reason reason, bool can_fail,
                          const struct engine_call *call);

/* The program's own registrations and unregistrations (cudaHostRegister,
 * hipHostRegister, a Level Zero import; call: the real one; flags: the
 * program's, in the engine's words). When the shim holds exactly that range
 * registered, with flags that mean the same and in the context the
 * program's call would use, the registration becomes the program's and no
 * call is made (a hand-over). Otherwise the shim gives up every page of the
 * range before the program's call (its own registrations go, queued and
 * pending ones are dropped); when the call succeeds the pages are the
 * program's until it unregisters them. Then the shim holds the locked pages
 * again: the program's registration itself, without a call, when it is one
 * the shim would have made; else registered anew. */
/* A program's own registration call: the real one, and the value it returns
 * when it succeeds (cudaSuccess, hipSuccess, ZE_RESULT_SUCCESS: 0 for every
 * vendor so far), which the engine also returns when it makes no call. */
struct engine_program_call {
    struct engine_call call;
    long success;
};

long engine_program_register(struct engine *engine, uintptr_t start, size_t length, unsigned flags,
                             const struct engine_program_call *call);
long engine_program_unregister(struct engine *engine, uintptr_t start,
                               const struct engine_program_call *call);
/* Whether addr lies in a registration of the shim's own (not the program's):
 * the program's cudaHostUnregister of such an address must not undo it. */
bool engine_is_shim_registration(struct engine *engine, uintptr_t addr);

/* The registration thread's body: registers queued ranges and, while ranges
 * wait for a context, asks the backend every poll_nanoseconds. Returns when
 * nothing is left to do (or at shut-down); the caller's thread then ends.
 * queued_only: register what is queued and return without waiting for a
 * context (when no thread could be started, the caller runs it itself). */
void engine_worker_run(struct engine *engine, uint64_t poll_nanoseconds, bool queued_only);
/* Whether the engine has work for the registration thread. Lock-free. */
static inline bool engine_worker_has_work(const struct engine *engine)
{
    return __atomic_load_n(&engine->queued_ranges, __ATOMIC_RELAXED) != 0 ||
           __atomic_load_n(&engine->pending_ranges, __ATOMIC_RELAXED) != 0;
}
static inline bool engine_has_pending(const struct engine *engine)
{
    return __atomic_load_n(&engine->pending_ranges, __ATOMIC_RELAXED) != 0;
}
/* Waits until nothing is queued for or being registered by the registration
 * thread; returns the number of ranges still pending (waiting for a context).
 * With look_for_context (the caller knows a CUDA driver is loaded), pending
 * ranges are looked at once more first: the thread is woken (started if need
 * be) and the call waits for that pass, so a context the program made just
 * before is used. */
size_t engine_drain(struct engine *engine, bool look_for_context);
/* Wakes the registration thread (a context may have appeared). */
void engine_worker_poke(struct engine *engine);

/* At exit: waits for the operations in flight, records what is live, pending
 * and queued, unregisters what is registered and stops registering. Once:
 * later calls do nothing. */
void engine_shutdown(struct engine *engine);

/* At _exit: stops registering, waits (at most 5 s) for the operations in
 * flight, and records what is live, pending and queued as at exit, without
 * unregistering (the kernel drops every pin with the process). False when the
 * engine's lock could not be had within about 100 ms (_exit called from a
 * signal handler that interrupted the shim, say): then nothing was recorded. */
bool engine_note_immediate_exit(struct engine *engine);

bool engine_is_registered(struct engine *engine, uintptr_t addr);
/* The state (enum range_state) of the record holding addr, or -1 when none
 * does. */
int engine_state_at(struct engine *engine, uintptr_t addr);
void engine_get_counters(struct engine *engine, struct pinshim_counters *out);
/* Copies the error histogram; returns the number of entries. */
size_t engine_get_errors(struct engine *engine, struct engine_error_count *out, size_t max);
/* Copies per-device registrations (index = device); returns the highest
 * device with any, plus one. */
size_t engine_get_devices(struct engine *engine, struct engine_device_counts *out, size_t max);
/* Total bytes the shim holds registered now (for the fork warning). */
uint64_t engine_live_bytes(struct engine *engine);

static inline void engine_count(uint64_t *counter)
{
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

#endif
