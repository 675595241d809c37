/* shim_run: what the integration suites that run one test program under the
 * shim share: the program runs with LD_PRELOAD=$PINSHIM_LIB, the fake
 * runtime ($FAKE_CUDART) and its JSON statistics in a fresh directory, in
 * this process's environment changed by the suite's defaults and the test's
 * settings. Criterion assertions: link shim_run_dep. */
#ifndef SHIM_RUN_H
#define SHIM_RUN_H

#include "child.h"

#include <stdbool.h>

struct shim_run {
    struct child_result result;
    char *directory;
    char stats_path[1024];
    char *stats; /* the JSON statistics, or NULL when none were written */
};

/* The value of a variable meson sets for the test; fails the test if unset. */
const char *shim_run_required_env(const char *name);

/* Runs argv (with the shim when with_shim) and waits for it; fails the test
 * unless it exits 0. defaults and settings are NULL or NULL-terminated lists
 * of "K=V" (set) and "K=" (unset); a setting replaces a default of the same
 * name. */
void shim_run(struct shim_run *run, const char *const *argv, bool with_shim,
              const char *const *defaults, const char *const *settings);

void shim_run_free(struct shim_run *run);

/* The number after "\"key\": " in the JSON statistics inside the object named
 * section ("" for the top level); fails the test when it is not there. */
long long shim_run_stats_number(const struct shim_run *run, const char *section, const char *key);

/* The value the program printed as a line "key=value", as a string (kept
 * until the next call) or a number; fails the test when it is not there. */
const char *shim_run_printed(const struct shim_run *run, const char *key);
long long shim_run_printed_number(const struct shim_run *run, const char *key);

/* Fails the test when the shim wrote anything ("pinshim:") on stderr. */
void shim_run_expect_no_warning(const struct shim_run *run);

#endif
