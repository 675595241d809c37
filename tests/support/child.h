/* child: run a program the way the shim's integration tests need to (with
 * LD_PRELOAD and FAKE_CUDART_* set for it alone) and capture what it prints. */
#ifndef CHILD_H
#define CHILD_H

#include <stdbool.h>
#include <stddef.h>

struct child_result {
    int status;    /* exit code, 128 + signal number, or -1 if it never ran */
    bool signaled; /* killed by a signal (status is then 128 + signal) */
    char *out;     /* malloc'd, NUL-terminated: everything written to stdout */
    size_t out_len;
    char *err; /* ... and to stderr */
    size_t err_len;
};

/* Runs argv[0] (searched in PATH if it has no '/') with argv, in this
 * process's environment changed by extra_env: NULL or a NULL-terminated list
 * of "K=V" (set K) and "K=" (unset K). stdin_text (or nothing, when NULL) is
 * its standard input. Waits for it, fills *out (free with child_result_free)
 * and returns out->status; -1 if it could not be started. */
int child_run(const char *const argv[], const char *const extra_env[],
              const char *stdin_text_or_null, struct child_result *out);

void child_result_free(struct child_result *result);

/* The whole file as a malloc'd NUL-terminated string, or NULL. */
char *read_file_text(const char *path);

/* A new empty directory $TMPDIR/pinshim-test-XXXXXX (or under /tmp); the
 * malloc'd path, or NULL. */
char *make_temp_dir(void);

/* A new empty directory of mode 0755 for the files a test hands to another
 * user (nobody): $TMPDIR/pinshim-shared-XXXXXX when that user can reach and
 * run programs from $TMPDIR, else the same under /tmp. The build tree and
 * TMPDIR may sit in a directory other users cannot enter (a 0700 home,
 * mktemp -d). The malloc'd path, or NULL with the reason in why (one line). */
char *make_shared_temp_dir(char *why, size_t why_size);

/* Removes path and everything under it (not following symlinks). */
bool remove_tree(const char *path);

#endif /* CHILD_H */
