/* criterion_skip_status: the main of the Criterion programs that meson also
 * runs one test at a time (test(args : ['--filter=SUITE/TEST'])), for tests
 * that may have to be skipped (those that run as another user). Criterion
 * exits 0 when tests are skipped and prints nothing about them unless
 * --verbose: here each skipped test prints one line with its reason, and the
 * exit status is 77, which meson reports as SKIP, when none of the selected
 * tests ran to a result. Link it by adding criterion_skip_status_dep. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <stdio.h>

static size_t tests_with_a_result;
static size_t tests_skipped;

ReportHook(POST_TEST)(struct criterion_test_stats *stats)
{
    if (stats->test_status != CR_STATUS_SKIPPED) {
        tests_with_a_result++;
        return;
    }
    /* Tests left out by --filter are reported as skipped too, without a reason. */
    if (stats->message == NULL || stats->message[0] == '\0')
        return;
    tests_skipped++;
    fprintf(stderr, "SKIP %s/%s: %s\n", stats->test->category, stats->test->name, stats->message);
}

int main(int argc, char *argv[])
{
    struct criterion_test_set *tests = criterion_initialize();
    int status = 0;
    if (criterion_handle_args(argc, argv, true))
        status = criterion_run_all_tests(tests) ? 0 : 1;
    criterion_finalize(tests);
    if (status == 0 && tests_with_a_result == 0 && tests_skipped > 0)
        status = 77;
    return status;
}
