/* harness: what the safety tests (realprograms, coexist, faults) share. It runs
 * a program the same way with and without libpinshim.so preloaded and gathers
 * what they compare: exit status, stdout, stderr, the shim's JSON stats and the
 * fake CUDA runtime's log. The checks use Criterion's assertions. */
#ifndef SAFETY_HARNESS_H
#define SAFETY_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

#include "child.h"
#include "emulation.h"
#include "fake_log.h"

#define HARNESS_PATH_MAX 1024

struct harness_run {
    struct child_result result;
    char *directory; /* temporary: stats.<pid>.json and fake.log */
    char log_path[HARNESS_PATH_MAX];
    size_t stats_files; /* stats.*.json files written (one per process that exited) */
    char *stats;        /* the text of the first one, NULL if none */
    struct fake_log_summary log;
    bool have_log; /* the fake runtime was loaded and logged something */
};

struct harness_options {
    /* LD_PRELOAD value; NULL runs the program without any preload. */
    const char *preload;
    /* Extra "K=V" (set) and "K=" (unset) entries, applied last; NULL-terminated. */
    const char *const *env;
    const char *stdin_text;
    /* Make the run's directory writable by every user and where every user
     * can reach it (make_shared_temp_dir; the test is skipped when there is no
     * such place), for programs that drop their privileges before they write
     * stats or the fake log. */
    bool shared_directory;
};

/* The value of a variable meson sets for the test; fails the test if unset. */
const char *harness_env(const char *name);
/* The value, or NULL when unset or empty (for optional tools). */
const char *harness_optional_env(const char *name);

/* The sanitizers the build uses (b_sanitize, e.g. "address,undefined"), or
 * NULL in a plain build. In an ASan-built program mlock and munlock are
 * ASan's, which answer 0 without calling the kernel. */
const char *harness_sanitizer(void);

/* Skips the test unless this process may lock at least bytes: root (which
 * has CAP_IPC_LOCK here) or an RLIMIT_MEMLOCK that large (ulimit -l). */
void harness_require_lock_budget(unsigned long long bytes);
/* What this process may lock: ULLONG_MAX when unlimited. */
unsigned long long harness_lock_budget(void);

/* Runs argv with the shim's and the fake runtime's settings (PINSHIM_CUDART =
 * $FAKE_CUDART, PINSHIM_STATS and FAKE_CUDART_LOG into a new directory, every
 * other PINSHIM_ and FAKE_CUDART_ variable unset), then options->env. The same
 * environment is used with and without the preload, so the two runs differ
 * only by LD_PRELOAD. */
void harness_run(struct harness_run *run, const char *const argv[],
                 const struct harness_options *options);
void harness_free(struct harness_run *run);

/* A number from the stats; fails the test when the stats or the key are missing. */
double harness_stat(const struct harness_run *run, const char *key);
/* The string at key (cudart.error, ...) or NULL when it is null or missing. */
const char *harness_stat_string(const struct harness_run *run, const char *key, char *out,
                                size_t out_size);

/* Occurrences of needle in text. */
size_t harness_count(const char *text, const char *needle);
/* Lines of text that contain needle. */
size_t harness_count_lines(const char *text, const char *needle);

/* Both runs ended the same way and printed the same on stdout. */
void harness_expect_same_result(const struct harness_run *without_shim,
                                const struct harness_run *with_shim);

/* The fake runtime recorded no violation, holds nothing at the end and its log
 * is well formed. */
void harness_expect_clean_runtime(const struct harness_run *run);

/* The stats agree with themselves and with the fake runtime's log: every
 * unregistration has one reason (ok + failed + exit_unloading), and every
 * successful call the runtime saw is one the stats counted. */
void harness_expect_consistent_stats(const struct harness_run *run);

/* Copies a file to directory/name with the given mode; false on failure. */
bool harness_copy_file(const char *source, const char *directory, const char *name, unsigned mode);

#endif
