/* Issue 12: a program that registers memory itself (tests/programs/ownership.c)
 * gets from every one of its CUDA calls exactly what it gets without the
 * shim (return values and cudaGetLastError), and the shim gives the pages up
 * while the program owns them and takes them back after. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child.h"

static const char *required(const char *name)
{
    const char *value = getenv(name);
    cr_assert(value != NULL && value[0] != '\0', "%s is not set (run through meson test)", name);
    return value;
}

/* The lines the program printed of its calls (not "state:" and "shim:"). */
static char *program_lines(const char *out)
{
    char *lines = calloc(1, strlen(out) + 1);
    for (const char *line = out; *line;) {
        const char *newline = strchr(line, '\n');
        size_t length = newline ? (size_t)(newline - line + 1) : strlen(line);
        if (strncmp(line, "shim: ", 6) != 0 && strncmp(line, "state: ", 7) != 0)
            strncat(lines, line, length);
        line += length;
    }
    return lines;
}

static void run(struct child_result *result, bool with_shim, const char *const *settings)
{
    static char preload[1200], cudart[1200];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", with_shim ? required("PINSHIM_LIB") : "");
    /* The runtime the program is linked against: the shim shares it. */
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", required("FAKE_CUDART"));
    const char *env[16] = {
        preload,           cudart, "PINSHIM_STATS=", "PINSHIM_LOG=", "PINSHIM_MIN_BYTES=",
        "FAKE_CUDART_LOG="};
    size_t count = 6;
    for (size_t i = 0; settings != NULL && settings[i] != NULL && count < 15; i++)
        env[count++] = settings[i];
    env[count] = NULL;
    const char *argv[] = {required("OWNERSHIP"), NULL};
    child_run(argv, env, NULL, result);
    cr_assert_eq(result->status, 0, "ownership exited %d\n%s%s", result->status, result->out,
                 result->err);
}

/* first_lock_waits: PINSHIM_CONTEXT=program, where the first lock comes
 * before the program has initialised CUDA, so the shim holds it as pending
 * (not registered) until the program's own registration takes it over. */
static void expect_same_as_without_the_shim(const char *const *settings, bool first_lock_waits)
{
    struct child_result without, with;
    run(&without, false, settings);
    run(&with, true, settings);
    char *expected = program_lines(without.out), *got = program_lines(with.out);
    cr_assert_str_eq(got, expected,
                     "the program saw other results under the shim\nwithout:\n%s\nwith:\n%s",
                     expected, got);
    cr_assert(strstr(with.err, "pinshim:") == NULL, "the shim warned:\n%s", with.err);
    /* What the shim held at each step. */
    const char *shim_says[] = {
        first_lock_waits ? "shim: after lock: the shim holds it: 0"
                         : "shim: after lock: the shim holds it: 1",
        "shim: after the program's register: the shim holds it: 0",
        "shim: after unlock: the shim holds it: 0",
        "shim: after the program's unregister: the shim holds it: 0",
        "shim: after the second lock: the shim holds it: 1",
        "shim: after that: the shim holds it: 1",
        "shim: after the program's unregister while locked: the shim holds it: 1",
        "shim: at the end: the shim holds it: 0",
    };
    for (size_t i = 0; i < sizeof(shim_says) / sizeof(*shim_says); i++)
        cr_assert(strstr(with.out, shim_says[i]) != NULL, "missing \"%s\" in:\n%s", shim_says[i],
                  with.out);
    /* Registered (by the shim or the program) at each step, as the program's
     * cudaPointerGetAttributes sees it: with the shim, locked memory is. */
    const char *with_states[] = {
        first_lock_waits ? "state: after lock: pointer type 0"
                         : "state: after lock: pointer type 1",
        "state: after the program's register: pointer type 1",
        "state: after unlock: pointer type 1", /* the program's registration */
        "state: after the program's unregister: pointer type 0",
        "state: after the second lock: pointer type 1",
        "state: after that: pointer type 1",
        "state: after the program's unregister while locked: pointer type 1", /* taken back */
        "state: at the end: pointer type 0",
    };
    for (size_t i = 0; i < sizeof(with_states) / sizeof(*with_states); i++)
        cr_assert(strstr(with.out, with_states[i]) != NULL, "missing \"%s\" in:\n%s",
                  with_states[i], with.out);
    /* Without the shim, nothing is registered while only locked. */
    cr_assert(strstr(without.out, "state: after lock: pointer type 0") != NULL, "%s", without.out);
    cr_assert(strstr(expected, "program unregisters what it never registered: returned 713, "
                               "last error 713") != NULL,
              "%s", expected);
    cr_assert(strstr(expected, "program registers twice: returned 712, last error 712") != NULL,
              "%s", expected);
    free(expected);
    free(got);
    child_result_free(&without);
    child_result_free(&with);
}

/* PINSHIM_CONTEXT=create: the shim loads the runtime and registers at the
 * first lock (in the locking thread, or its own). */
Test(ownership, create_mode_synchronous)
{
    const char *settings[] = {"PINSHIM_CONTEXT=create", "PINSHIM_ASYNC=off", NULL};
    expect_same_as_without_the_shim(settings, false);
}

Test(ownership, create_mode_with_the_registration_thread)
{
    const char *settings[] = {"PINSHIM_CONTEXT=create", "PINSHIM_ASYNC=on", NULL};
    expect_same_as_without_the_shim(settings, false);
}

/* The defaults (PINSHIM_CONTEXT=program, PINSHIM_ASYNC=on) with the fake
 * runtime on the fake driver: the shim registers into the context the
 * program's first CUDA call made. */
Test(ownership, program_mode_by_default)
{
    const char *settings[] = {"PINSHIM_CONTEXT=", "PINSHIM_ASYNC=", NULL};
    expect_same_as_without_the_shim(settings, true);
}

Test(ownership, program_mode_synchronous)
{
    const char *settings[] = {"PINSHIM_CONTEXT=program", "PINSHIM_ASYNC=off", NULL};
    expect_same_as_without_the_shim(settings, true);
}
