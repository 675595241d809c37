/* fake_log: reads the event log the fake CUDA runtime writes
 * (FAKE_CUDART_LOG, see fake_cudart.h) and sums it up per process, replaying
 * successful register/unregister calls to find what was left registered.
 */
#ifndef FAKE_LOG_H
#define FAKE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FAKE_LOG_MAX_ERROR_CODES 32 /* distinct codes counted per call kind */
#define FAKE_LOG_KEPT_VIOLATIONS 4  /* violation lines kept as text */
#define FAKE_LOG_LINE_MAX 256

struct fake_log_error_count {
    int code;
    uint64_t count;
};

struct fake_log_range {
    uintptr_t base;
    size_t size;
};

struct fake_log_process {
    int pid; /* -1 in fake_log_summary.total */
    uint64_t register_calls;
    uint64_t register_ok;
    size_t register_error_codes; /* entries used in register_errors */
    struct fake_log_error_count register_errors[FAKE_LOG_MAX_ERROR_CODES];
    uint64_t unregister_calls;
    uint64_t unregister_ok;
    size_t unregister_error_codes;
    struct fake_log_error_count unregister_errors[FAKE_LOG_MAX_ERROR_CODES];
    uint64_t get_last_error_calls;
    uint64_t violations;
    size_t kept_violations; /* min(violations, FAKE_LOG_KEPT_VIOLATIONS) */
    char violation_lines[FAKE_LOG_KEPT_VIOLATIONS][FAKE_LOG_LINE_MAX];
    /* Successful unregisters of a base this process never registered (e.g.
     * one it inherited across fork). */
    uint64_t unmatched_unregisters;
    /* Registrations still live at the end of the log: malloc'd, sorted by base. */
    size_t live_count;
    uint64_t live_bytes;
    struct fake_log_range *live;
};

struct fake_log_summary {
    size_t process_count;
    struct fake_log_process *processes; /* malloc'd, in order of first appearance */
    struct fake_log_process total;      /* sums over all processes, all their live ranges */
    uint64_t lines;
    uint64_t malformed_lines; /* non-empty lines that are not log events */
};

/* Summarises the log at path: every process, or only pid when pid_or_minus1
 * is not -1. A missing file is an error (false); an empty one is not. Free
 * the result with fake_log_free, also after a failure. */
bool fake_log_load(const char *path, int pid_or_minus1, struct fake_log_summary *out);

/* The same over log text already in memory. */
bool fake_log_parse(const char *text, int pid_or_minus1, struct fake_log_summary *out);

void fake_log_free(struct fake_log_summary *summary);

/* The entry for pid, or NULL if it logged nothing. */
const struct fake_log_process *fake_log_find(const struct fake_log_summary *summary, int pid);

/* How many register / unregister calls failed with code. */
uint64_t fake_log_register_errors(const struct fake_log_process *process, int code);
uint64_t fake_log_unregister_errors(const struct fake_log_process *process, int code);

/* A human-readable dump, for test failure messages. */
void fake_log_print(const struct fake_log_summary *summary, FILE *stream);

#endif /* FAKE_LOG_H */
