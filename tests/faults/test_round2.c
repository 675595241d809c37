/* Issue 9 (correctness, round 2): each failure the issue reported, run as a
 * real program under the shim (round2.c), plus the runtime search past an
 * unusable runtime. Every test here failed on the shim before the fixes. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "child.h"
#include "emulation.h"

static const char *required(const char *name)
{
    const char *value = getenv(name);
    cr_assert(value != NULL && value[0] != '\0', "%s is not set (run through meson test)", name);
    return value;
}

/* Runs round2 with args under the shim, the fake runtime (or the runtime
 * the settings name: "PINSHIM_CUDART=" alone leaves it unset) and the extra
 * settings. */
static void run_round2(struct child_result *result, const char *const *args,
                       const char *const *settings)
{
    static char preload[1200], cudart[1200];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", required("PINSHIM_LIB"));
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", required("FAKE_CUDART"));
    bool own_runtime = false;
    for (size_t i = 0; settings != NULL && settings[i] != NULL; i++)
        own_runtime |= strncmp(settings[i], "PINSHIM_CUDART=", 15) == 0;
    const char *env[24] = {preload,
                           "PINSHIM_CONTEXT=create",
                           "PINSHIM_ASYNC=off",
                           "PINSHIM_MIN_BYTES=",
                           "PINSHIM_LOG=",
                           "PINSHIM_STATS=",
                           "FAKE_CUDART_LOG=",
                           own_runtime ? "PINSHIM_CUDART=" : cudart};
    size_t count = 8;
    for (size_t i = 0; settings != NULL && settings[i] != NULL && count < 23; i++)
        env[count++] = settings[i];
    env[count] = NULL;
    const char *argv[8] = {required("ROUND2")};
    for (size_t i = 0; args[i] != NULL && i < 6; i++)
        argv[i + 1] = args[i];
    child_run(argv, env, NULL, result);
}

static void expect_ok(const char *const *args, const char *const *settings)
{
    struct child_result result;
    run_round2(&result, args, settings);
    cr_assert_eq(result.status, 0, "round2 %s exited %d\n%s%s", args[0], result.status, result.out,
                 result.err);
    cr_assert(strstr(result.out, "BUG") == NULL, "%s%s", result.out, result.err);
    cr_assert(strncmp(result.out, "ok", 2) == 0, "%s%s", result.out, result.err);
    child_result_free(&result);
}

/* Item 1: releases of two halves of one registration at once, from two
 * threads, many times; with checks off so the rounds are fast. */
Test(round2, two_threads_unlocking_halves_leave_nothing_registered, .timeout = 300)
{
    const char *args[] = {"release_halves", "3000", NULL};
    const char *settings[] = {"FAKE_CUDART_CHECK=0", NULL};
    expect_ok(args, settings);
}

Test(round2, unlock_and_unmap_of_halves_leave_nothing_registered, .timeout = 300)
{
    const char *args[] = {"release_halves", "3000", "munmap", NULL};
    const char *settings[] = {"FAKE_CUDART_CHECK=0", NULL};
    expect_ok(args, settings);
}

/* The same with a slow unregistration: the second release comes while the
 * first one is inside cudaHostUnregister. */
Test(round2, halves_with_a_slow_runtime, .timeout = 300)
{
    static char slow[1200];
    snprintf(slow, sizeof(slow), "PINSHIM_CUDART=%s", required("SLOW_RUNTIME"));
    const char *args[] = {"release_halves", "200", NULL};
    const char *settings[] = {slow, "SLOW_RUNTIME_UNREGISTER_MS=1", "FAKE_CUDART_CHECK=0", NULL};
    expect_ok(args, settings);
}

/* Item 2. */
Test(round2, freeing_a_neighbour_keeps_a_locked_block_registered)
{
    const char *args[] = {"neighbour_free", NULL};
    expect_ok(args, NULL);
}

/* Item 3: the default rule registers what is resident. */
Test(round2, onfault_lock_of_a_reservation_registers_only_what_is_resident, .timeout = 60)
{
    if (!test_kernel_has_mlock2())
        cr_skip_test("the kernel has no mlock2 system call (ENOSYS): no MLOCK_ONFAULT lock");
    const char *args[] = {"onfault_reservation", NULL};
    expect_ok(args, NULL);
}

/* Item 4. */
Test(round2, a_cancelled_waiter_does_not_deadlock_the_process, .timeout = 60)
{
    static char slow[1200];
    snprintf(slow, sizeof(slow), "PINSHIM_CUDART=%s", required("SLOW_RUNTIME"));
    const char *args[] = {"cancelled_waiter", NULL};
    const char *settings[] = {slow, "SLOW_RUNTIME_REGISTER_MS=300", NULL};
    expect_ok(args, settings);
}

/* Item 5: libcudart.so.13 answers 35, libcudart.so.12 works: the search goes
 * on to .12 and the stats say why .13 was passed over. */
Test(round2, runtime_search_passes_over_an_unusable_runtime)
{
    char *directory = make_temp_dir();
    char path[1200], target[1200], stats_path[1200];
    snprintf(path, sizeof(path), "%s/libcudart.so.13", directory);
    cr_assert_eq(symlink(required("CUDART_WITHOUT_DRIVER"), path), 0);
    snprintf(target, sizeof(target), "%s/libcudart.so.12", directory);
    cr_assert_eq(symlink(required("FAKE_CUDART"), target), 0);
    static char library_path[1300], stats[1300];
    snprintf(library_path, sizeof(library_path), "LD_LIBRARY_PATH=%s", directory);
    snprintf(stats_path, sizeof(stats_path), "%s/stats.json", directory);
    snprintf(stats, sizeof(stats), "PINSHIM_STATS=%s", stats_path);
    /* PINSHIM_CUDART unset: the shim searches. */
    const char *args[] = {"neighbour_free", NULL};
    const char *settings[] = {"PINSHIM_CUDART=", library_path, stats, "PINSHIM_LOG=info", NULL};
    struct child_result result;
    run_round2(&result, args, settings);
    cr_assert_eq(result.status, 0, "%s%s", result.out, result.err);
    char *json = read_file_text(stats_path);
    cr_assert_not_null(json, "no stats:\n%s", result.err);
    cr_assert(strstr(json, "\"usable\": true") != NULL, "%s", json);
    cr_assert(strstr(json, "libcudart.so.12") != NULL, "%s", json);
    cr_assert(strstr(json, "\"passed_over\": [{\"runtime\": ") != NULL, "%s", json);
    cr_assert(strstr(json, "cudaErrorInsufficientDriver (35)") != NULL, "%s", json);
    cr_assert(strstr(result.err, "passed over") != NULL, "%s", result.err);
    free(json);
    child_result_free(&result);
    remove_tree(directory);
    free(directory);
}

/* Item 6: the summary must not land in the program's data file. */
Test(round2, exit_summary_never_lands_in_a_reused_descriptor)
{
    char *directory = make_temp_dir();
    char data[1200];
    snprintf(data, sizeof(data), "%s/data.txt", directory);
    const char *args[] = {"exit_summary_fd", data, NULL};
    const char *settings[] = {"PINSHIM_STATS=1", NULL};
    struct child_result result;
    run_round2(&result, args, settings);
    cr_assert_eq(result.status, 0, "%s%s", result.out, result.err);
    char *text = read_file_text(data);
    cr_assert_not_null(text);
    cr_assert_str_eq(text, "data\n", "the program's data file was written to:\n%s", text);
    free(text);
    child_result_free(&result);
    remove_tree(directory);
    free(directory);
}

/* Item 7: a fork with much registered memory warns once (the kernel copies
 * DMA-pinned pages into the child)... */
Test(round2, fork_with_registered_memory_warns)
{
    const char *args[] = {"fork_child", NULL};
    const char *warn[] = {"PINSHIM_FORK_WARN=1M", NULL};
    struct child_result result;
    run_round2(&result, args, warn);
    cr_assert_eq(result.status, 0, "%s%s", result.out, result.err);
    cr_assert(strstr(result.out, "child: the buffer is there") != NULL, "%s", result.out);
    cr_assert(strstr(result.err, "pinshim: fork() with 4 MiB registered") != NULL, "%s",
              result.err);
    child_result_free(&result);

    const char *quiet[] = {"PINSHIM_FORK_WARN=0", NULL};
    run_round2(&result, args, quiet);
    cr_assert(strstr(result.err, "fork()") == NULL, "%s", result.err);
    child_result_free(&result);
}

/* ...and PINSHIM_FORK=dontfork keeps registered pages out of children. */
Test(round2, fork_with_dontfork_keeps_registered_memory_out)
{
    if (!test_kernel_honours_dontfork())
        cr_skip_test("madvise(MADV_DONTFORK) has no effect here (qemu-user answers 0 to madvise "
                     "and does nothing)");
    const char *args[] = {"fork_child", NULL};
    struct child_result result;
    const char *dontfork[] = {"PINSHIM_FORK=dontfork", "PINSHIM_FORK_WARN=1M", NULL};
    run_round2(&result, args, dontfork);
    cr_assert_eq(result.status, 0, "%s%s", result.out, result.err);
    cr_assert(strstr(result.out, "child: the buffer is absent") != NULL, "%s", result.out);
    cr_assert(strstr(result.err, "fork()") == NULL, "no warning with dontfork:\n%s", result.err);
    child_result_free(&result);
}
