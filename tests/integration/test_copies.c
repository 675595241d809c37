/* Issue 34: a program that locks a buffer in pieces and copies it whole
 * works with the shim as without it, and the copy is pinned with it; what no
 * copy may cross (two mappings) stays apart. tests/programs/copies.c (a GPU
 * program on the fake runtime and driver, which refuse a copy whose host
 * range is not inside one registration or outside all, as NVIDIA's do)
 * runs each scenario under the shim's defaults and without the shim. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "emulation.h"
#include "shim_run.h"

static void run_copies(struct shim_run *run, const char *scenario, bool with_shim)
{
    static const char *const defaults[] = {"PINSHIM_LOG=",
                                           "PINSHIM_MIN_BYTES=",
                                           "PINSHIM_CONTEXT=",
                                           "PINSHIM_ASYNC=",
                                           "FAKE_CUDART_LOG=",
                                           "FAKE_CUDART_CHECK=1",
                                           NULL};
    const char *argv[] = {shim_run_required_env("COPIES"), scenario, NULL};
    shim_run(run, argv, with_shim, defaults, NULL);
    cr_assert_eq(run->result.status, 0, "copies %s exited %d:\n%s%s", scenario, run->result.status,
                 run->result.out, run->result.err);
}

/* Every copy of the scenario succeeds and keeps its bytes, both ways; with
 * the shim the buffer is one registration and every copy pinned. */
static void expect_whole_copies(const char *scenario, const char *name, long copies)
{
    struct shim_run without, with;
    run_copies(&without, scenario, false);
    run_copies(&with, scenario, true);
    const char *keys[] = {"to_device", "to_host", "async", "intact"};
    for (size_t i = 0; i < 4; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s_%s", name, keys[i]);
        long expected = i == 3 ? 1 : 0;
        cr_assert_eq(shim_run_printed_number(&without, key), expected, "%s without the shim: %s",
                     scenario, without.result.out);
        cr_assert_eq(shim_run_printed_number(&with, key), expected, "%s with the shim: %s",
                     scenario, with.result.out);
    }
    cr_assert_eq(shim_run_printed_number(&without, "registrations"), 0);
    cr_assert_eq(shim_run_printed_number(&with, "registrations"), 1, "%s", with.result.out);
    cr_assert_eq(shim_run_printed_number(&without, "pinned_copies"), 0);
    cr_assert_eq(shim_run_printed_number(&with, "pinned_copies"), copies, "%s", with.result.out);
    shim_run_expect_no_warning(&with);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* The program: 16 MiB mapped once, locked in two 8 MiB calls, copied
 * whole (it failed on the H200 with the shim of round 4). */
Test(copies, two_locks_of_one_mapping_copy_whole)
{
    expect_whole_copies("two-halves", "whole", 4);
}

Test(copies, a_lock_grown_over_its_neighbour_copies_whole)
{
    expect_whole_copies("grown", "whole", 4);
}

Test(copies, sixty_four_pieces_locked_in_reverse_copy_whole)
{
    expect_whole_copies("reversed", "whole", 4);
}

/* Two heap buffers on one page are one run: each copies whole, pinned. */
Test(copies, buffers_sharing_a_page_copy_whole)
{
    struct shim_run probe;
    run_copies(&probe, "shared-page", true);
    bool shared = shim_run_printed_number(&probe, "share_a_page") == 1;
    shim_run_free(&probe);
    if (!shared)
        cr_skip_test("malloc did not place the two buffers on one page here");
    expect_whole_copies("shared-page", "first", 8);
}

/* Eight mappings side by side, each locked: eight registrations; unmapping
 * one registers none of the others again, and they copy as before. */
Test(copies, side_by_side_mappings_stay_apart)
{
    struct shim_run run;
    run_copies(&run, "side-by-side", true);
    cr_assert_eq(shim_run_printed_number(&run, "registrations"), 8, "%s", run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "registered_again"), 0, "%s", run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "neighbour_to_device"), 0);
    cr_assert_eq(shim_run_printed_number(&run, "neighbour_intact"), 1);
    cr_assert_eq(shim_run_printed_number(&run, "pinned_copies"), 4);
    shim_run_expect_no_warning(&run);
    shim_run_free(&run);
}

/* The limit that stays (README, "Limits that bite"): a copy that spans locked
 * and unlocked memory mixes registered and unregistered pages under the shim
 * and is refused (cudaErrorInvalidValue, 1), where without the shim it runs
 * at pageable speed. The locked half alone copies, pinned. */
Test(copies, a_copy_beyond_the_locked_pages_is_the_documented_limit)
{
    struct shim_run without, with;
    run_copies(&without, "half-locked", false);
    run_copies(&with, "half-locked", true);
    cr_assert_eq(shim_run_printed_number(&without, "whole_to_device"), 0);
    cr_assert_eq(shim_run_printed_number(&with, "whole_to_device"), 1, "%s", with.result.out);
    cr_assert_eq(shim_run_printed_number(&with, "locked_half_to_device"), 0);
    cr_assert_eq(shim_run_printed_number(&with, "locked_half_intact"), 1);
    shim_run_free(&without);
    shim_run_free(&with);
}
