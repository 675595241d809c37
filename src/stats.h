/* Stats: the report written at exit, as JSON to a file or as a text summary.
 * Writes with write(2) from a stack buffer: no allocation. */
#ifndef PINSHIM_STATS_H
#define PINSHIM_STATS_H

#include "options.h"

#include "pinshim.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STATS_MAX_ERRORS 32

struct stats_report {
    long pid;
    char host[256];
    char exe[1024];
    const struct pinshim_config *config;
    bool cudart_loaded;
    bool cudart_usable;
    bool cudart_shared;
    const char *cudart_path;  /* NULL when nothing was loaded */
    const char *cudart_error; /* NULL when it loaded fine or was never needed */
    struct pinshim_counters counters;
    uint64_t skipped_disabled;
    uint64_t skipped_address;
    uint64_t skipped_race_pages;
    uint64_t exit_unloading;
    uint64_t live_ranges_at_exit;
    uint64_t live_bytes_at_exit;
    bool fork_child;
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

/* Writes the JSON report to path through a temporary file and rename, so readers
 * never see half a file. On failure writes why and returns false. */
bool stats_write_file(const char *path, const struct stats_report *report, char *why,
                      size_t why_size);

#endif
