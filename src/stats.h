/* Stats: the report written at exit, as JSON to a file or as a text summary.
 * Writes with write(2) from a stack buffer: no allocation. */
#ifndef PINSHIM_STATS_H
#define PINSHIM_STATS_H

#include "numa_placement.h"
#include "options.h"

#include "pinshim.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STATS_MAX_ERRORS 32
#define STATS_MAX_DEVICES 64
#define STATS_MAX_TRIES 8

struct stats_report {
    long pid;
    char host[256];
    char exe[1024];
    const struct pinshim_config *config;
    /* The GPU vendor used, and the calls it registered and unregistered
     * with; NULL when none was. */
    const char *vendor, *vendor_title, *register_call, *unregister_call;
    /* Create mode: the runtime the shim loaded (the JSON's "cudart" object,
     * named when CUDA was the only vendor). */
    bool runtime_loaded;
    bool runtime_usable;
    bool runtime_shared;
    const char *runtime_path;  /* NULL when nothing was loaded */
    const char *runtime_error; /* why none is used; NULL when fine or never needed */
    char runtime_error_text[512];
    size_t runtime_try_count; /* runtimes passed over before the one used, and why */
    struct {
        const char *name;
        const char *result;
    } runtime_tries[STATS_MAX_TRIES];
    const char *driver_path;   /* program mode: the runtime or driver the shim used */
    uint64_t contexts_created; /* by the shim (PINSHIM_CONTEXT=create only) */
    struct pinshim_counters counters;
    uint64_t skipped_disabled;
    uint64_t skipped_runtime_library;
    /* Ranges registered piece by piece for their mappings: pieces registered
     * READ_ONLY, pieces left out by reason. */
    uint64_t registered_by_pieces, read_only_registrations;
    uint64_t skipped_read_only_unsupported, skipped_io, skipped_no_access, skipped_shared_file,
        skipped_unmapped;
    uint64_t skipped_address;
    uint64_t skipped_onfault_pages;
    uint64_t exit_unloading;
    uint64_t live_ranges_at_exit;
    uint64_t live_bytes_at_exit;
    /* Ranges that waited for the program to start its GPU runtime. */
    uint64_t deferred_total, deferred_registered, deferred_dropped;
    uint64_t pending_ranges_at_exit, pending_bytes_at_exit;
    /* The registration thread. */
    uint64_t queued_ranges_at_exit, cancelled_queued;
    uint64_t wait_nanoseconds, background_nanoseconds;
    /* The program's own registrations. */
    uint64_t program_unregistrations, program_took_back, gone_with_context;
    uint64_t program_handed_over, program_kept;
    /* Runs of locked pages (engine_runs.c): registered whole after parts of
     * them were undone, joined runs the driver refused (registered in their
     * old pieces), runs it refused whole (in chunks); held at exit. */
    uint64_t runs_joined, join_failed, runs_chunked;
    uint64_t held_ranges_at_exit, held_bytes_at_exit;
    size_t device_count; /* devices[0..device_count) */
    struct {
        uint64_t registrations, bytes;
    } devices[STATS_MAX_DEVICES];
    /* NUMA placement (PINSHIM_NUMA): numa false when off. Bytes registered
     * by node (and local to their device), remote and unknown bytes, each
     * used device's node (-1: unknown). */
    bool numa;
    struct {
        uint64_t bytes, local_bytes;
    } numa_nodes[NUMA_PLACEMENT_MAX_NODES];
    uint64_t numa_remote_bytes, numa_unknown_bytes;
    int device_nodes[STATS_MAX_DEVICES];
    /* Huge pages (PINSHIM_HUGEPAGES, huge_pages.h): the option, the kernel's
     * THP mode for the process and its PMD size (0: none); bytes of plain
     * locks on huge, small and unknown pages; bytes of PMD-aligned chunks
     * made huge, left alone with pages, left small for want of free blocks,
     * refused by the kernel, left small after a slow batch; allocations
     * aligned; whether a slow batch stopped the shim's huge pages. */
    const char *huge_pages_option, *huge_pages_kernel;
    uint64_t huge_pmd_size;
    uint64_t huge_bytes, small_bytes, page_size_unknown_bytes;
    uint64_t huge_made_bytes, huge_had_pages_bytes, huge_no_block_bytes;
    uint64_t huge_refused_bytes, huge_stopped_bytes;
    uint64_t huge_aligned_allocations;
    bool huge_backed_off;
    bool fork_child;
    const char *ended_by;          /* "exit", or "_exit" (no exit handlers ran); NULL: not said */
    uint64_t warnings;             /* warnings the shim raised in this process (log.h) */
    const char *block_size_source; /* how free learned block sizes; NULL: not reported */
    size_t error_count;
    struct {
        const char *name;
        int code;
        uint64_t count;
    } errors[STATS_MAX_ERRORS];
};

/* Both return false when a write failed. */
bool stats_write_json(int fd, const struct stats_report *report);
bool stats_write_text(int fd, const struct stats_report *report);

/* Expands %p (pid), %h (host) and %% in template. False if the result does not fit. */
bool stats_expand_path(const char *template_path, long pid, const char *host, char *out,
                       size_t out_size);

/* Whether the process has something to say: stats are written (to a file or
 * as the summary on stderr) only when it saw a lock call (mlock, mlock2,
 * MAP_LOCKED or mlockall) or the shim raised a warning, or when
 * PINSHIM_STATS_ALL asks for every process. Never when PINSHIM_STATS is off. */
bool stats_worth_writing(const struct stats_report *report, const struct pinshim_config *config);

/* Where the temporary file's unpredictable name comes from. */
#define STATS_RANDOM_BYTES 12
#define STATS_TEMPORARY_ATTEMPTS 16
struct stats_random {
    /* Fills out with length unpredictable bytes; never fails. */
    void (*fill)(void *context, unsigned char *out, size_t length);
    void *context;
};

/* getrandom(2), or, where it fails (no entropy yet at boot, kernels before
 * 3.17), a mix of clocks, pid and addresses. */
extern const struct stats_random stats_system_random;

/* The temporary name, in path's directory, that random bytes stand for:
 * ".<final name>.<16 characters>.tmp" (the final name cut to 200 bytes).
 * False if it does not fit. */
bool stats_temporary_name(const char *path, const unsigned char random[STATS_RANDOM_BYTES],
                          char *out, size_t out_size);

/* Writes the JSON report to path, safely in a directory others can write to:
 * a new file with an unpredictable name is created in path's directory with
 * O_CREAT|O_EXCL|O_NOFOLLOW (a file or symlink already there is never opened:
 * another name is tried, up to STATS_TEMPORARY_ATTEMPTS), written, and renamed
 * to path (rename replaces a symlink at path, never follows it), so readers
 * never see half a file. Its mode is 0666 less the umask, as for any file the
 * user's programs create. On failure the temporary file is removed, why says
 * what failed, and it returns false. No allocation. */
bool stats_write_file(const char *path, const struct stats_report *report, char *why,
                      size_t why_size);

/* The same with the random source given (tests plant files at the next name). */
bool stats_write_file_using(const char *path, const struct stats_report *report,
                            const struct stats_random *random, char *why, size_t why_size);

#endif
