/* Reproductions of bugs the safety tests found in the shim, one per argument.
 * Exit status: 0 the shim behaves, 1 the bug shows, 2 the reproduction itself
 * went wrong, 77 it cannot run here. With --open (a bug not fixed yet, marked
 * should_fail in meson), 2 becomes 0 so that only the bug itself counts as
 * the expected failure and a broken reproduction shows as an unexpected pass.
 *
 *   race_during_load    a lock racing an munlock of a buffer that shares a
 *                       page with it, the unlock coming while the shim loads
 *                       its runtime after the mlock: the shim registered a
 *                       page the kernel had just unlocked (fixed)
 *   race_during_unlock  the same race, the lock coming while the shim
 *                       unregisters before the munlock system call (open)
 *   long_stats          a long PINSHIM_STATS template that expands too long:
 *                       the warning was cut before it said why (fixed) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child.h"
#include "fake_log.h"

#define BEHAVES 0
#define BUG_SEEN 1
#define BROKEN 2
#define SKIPPED 77

static const char *setting(const char *name)
{
    const char *value = getenv(name);
    if (value == NULL || value[0] == '\0') {
        printf("%s is not set (run through meson test)\n", name);
        return NULL;
    }
    return value;
}

/* Runs program under the shim with the extra settings; the fake runtime logs
 * to log_path when log_path is not NULL. */
static void run_under_shim(const char *program, const char *argument, const char *const *settings,
                           const char *log_path, struct child_result *result)
{
    static char preload[1200], log[1200];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", getenv("PINSHIM_LIB"));
    snprintf(log, sizeof(log), "FAKE_CUDART_LOG=%s", log_path ? log_path : "");
    const char *env[16] = {preload, log, "PINSHIM_MIN_BYTES=", "PINSHIM_REGISTER=", "PINSHIM_LOG="};
    size_t count = 5;
    for (size_t i = 0; settings[i] != NULL && count < 15; i++)
        env[count++] = settings[i];
    env[count] = NULL;
    const char *argv[] = {program, argument, NULL};
    child_run(argv, env, NULL, result);
}

/* Runs shared_page_race in mode with the slow runtime's delay, and looks for
 * the fake runtime's record of a registered page that was not locked. */
static int race(const char *mode, const char *delay)
{
    const char *check = getenv("FAKE_CUDART_CHECK");
    if (check != NULL && strcmp(check, "0") == 0) {
        printf("SKIP: FAKE_CUDART_CHECK=0, the fake runtime cannot see the violation\n");
        return SKIPPED;
    }
    const char *slow = setting("SLOW_RUNTIME"), *program = setting("SHARED_PAGE_RACE");
    if (slow == NULL || program == NULL || setting("PINSHIM_LIB") == NULL)
        return BROKEN;
    char *directory = make_temp_dir();
    if (directory == NULL)
        return BROKEN;
    char log_path[1100], cudart[1200];
    snprintf(log_path, sizeof(log_path), "%s/fake.log", directory);
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", slow);
    const char *settings[] = {cudart, delay, "PINSHIM_STATS=", NULL};
    struct child_result result;
    run_under_shim(program, mode, settings, log_path, &result);
    int verdict = BROKEN;
    struct fake_log_summary summary;
    if (result.status != 0 || strstr(result.out, "done") == NULL) {
        printf("the program failed (%d):\n%s%s", result.status, result.out, result.err);
    } else if (!fake_log_load(log_path, -1, &summary)) {
        printf("the fake runtime wrote no log; stderr:\n%s", result.err);
    } else {
        fake_log_print(&summary, stdout);
        if (summary.total.violations != 0) {
            printf("BUG: a registered page was not locked (%s)\n",
                   summary.total.violation_lines[0]);
            verdict = BUG_SEEN;
        } else {
            printf("the invariant held\n");
            verdict = BEHAVES;
        }
        fake_log_free(&summary);
    }
    child_result_free(&result);
    remove_tree(directory);
    free(directory);
    return verdict;
}

static int long_stats(void)
{
    const char *program = setting("EXIT_WITH_LOCKS");
    if (program == NULL || setting("PINSHIM_LIB") == NULL || setting("FAKE_CUDART") == NULL)
        return BROKEN;
    /* 509 times %p: 1023 characters, which PINSHIM_STATS accepts. */
    static char stats[32 + 2 * 509] = "PINSHIM_STATS=/tmp/";
    for (int i = 0; i < 509; i++)
        strcat(stats, "%p");
    char cudart[1200];
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", getenv("FAKE_CUDART"));
    const char *settings[] = {stats, cudart, NULL};
    struct child_result result;
    run_under_shim(program, NULL, settings, NULL, &result);
    int verdict = BROKEN;
    const char *pid = strstr(result.err, "pinshim: pid ");
    if (pid == NULL) {
        printf("no summary on stderr:\n%s", result.err);
    } else if (atol(pid + strlen("pinshim: pid ")) < 100) {
        printf("SKIP: the pid has fewer than three digits, the path fits\n");
        verdict = SKIPPED;
    } else if (strstr(result.err, "expands to a path that is too long") != NULL) {
        printf("the warning says why\n");
        verdict = BEHAVES;
    } else if (strstr(result.err, "pinshim: PINSHIM_STATS=\"/tmp/%p%p") != NULL) {
        printf("BUG: the warning is cut before its reason:\n%.120s...\n", result.err);
        verdict = BUG_SEEN;
    } else {
        printf("no warning at all:\n%s", result.err);
    }
    child_result_free(&result);
    return verdict;
}

int main(int argc, char **argv)
{
    bool open_bug = argc == 3 && strcmp(argv[2], "--open") == 0;
    int verdict = BROKEN;
    if (argc >= 2 && strcmp(argv[1], "race_during_load") == 0)
        verdict = race("lock_during_load", "SLOW_RUNTIME_LOAD_MS=300");
    else if (argc >= 2 && strcmp(argv[1], "race_during_unlock") == 0)
        verdict = race("lock_during_unlock", "SLOW_RUNTIME_UNREGISTER_MS=300");
    else if (argc >= 2 && strcmp(argv[1], "long_stats") == 0)
        verdict = long_stats();
    else
        printf("usage: regressions race_during_load|race_during_unlock|long_stats [--open]\n");
    return open_bug && verdict == BROKEN ? BEHAVES : verdict;
}
