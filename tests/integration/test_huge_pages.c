/* Integration: huge pages for the memory programs lock (issue 36), on this
 * machine's kernel, as a user gets them (LD_PRELOAD, create mode with the
 * fake runtime). What the statistics say is checked against what the
 * program itself reads in /proc/self/smaps, and the program's answers
 * against a run without the shim. Where the kernel makes no huge pages on
 * request (THP always, never, no THP, before Linux 6.1), nothing may change
 * and the statistics must say why. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "shim_run.h"

#define MIB (1024LL * 1024)

/* MALLOC_PERTURB_ (meson test sets it) would write every new block: unset,
 * as in a program's own environment, so that buffers start untouched. */
static const char *const defaults[] = {
    "PINSHIM_CONTEXT=create", "PINSHIM_HUGEPAGES=", "MALLOC_PERTURB_=", "PINSHIM_LOG=", NULL};

/* The kernel's THP mode as the shim names it. */
static void this_kernel(char *out, size_t size)
{
    FILE *file = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char text[128] = "";
    if (file == NULL || fgets(text, sizeof(text), file) == NULL) {
        snprintf(out, size, "absent");
    } else if (strstr(text, "[always]") != NULL) {
        snprintf(out, size, "always");
    } else if (strstr(text, "[never]") != NULL) {
        snprintf(out, size, "never");
    } else {
        struct utsname name;
        unsigned major = 0, minor = 0;
        uname(&name);
        sscanf(name.release, "%u.%u", &major, &minor);
        snprintf(out, size, "%s",
                 major > 6 || (major == 6 && minor >= 1) ? "madvise" : "madvise-without-collapse");
    }
    if (file != NULL)
        fclose(file);
}

static const char *stats_text(const struct shim_run *run, const char *key)
{
    static char value[64];
    char needle[128];
    snprintf(needle, sizeof(needle), "\"%s\": \"", key);
    const char *at = run->stats != NULL ? strstr(run->stats, needle) : NULL;
    cr_assert_not_null(at, "no %s in the stats:\n%s", key, run->stats);
    at += strlen(needle);
    size_t length = strcspn(at, "\"");
    snprintf(value, sizeof(value), "%.*s", (int)length, at);
    return value;
}

static long long huge(const struct shim_run *run, const char *key)
{
    return shim_run_stats_number(run, "huge_pages", key);
}

Test(huge_pages, deepspeeds_pattern_is_locked_on_huge_pages)
{
    char kernel[64];
    this_kernel(kernel, sizeof(kernel));
    const char *argv[] = {shim_run_required_env("HUGE_LOCK"), "deepspeed", "64", NULL};
    struct shim_run without, with;
    shim_run(&without, argv, false, defaults, NULL);
    shim_run(&with, argv, true, defaults, NULL);
    cr_assert_str_eq(shim_run_printed(&with, "lock"), "0", "%s", with.result.err);
    cr_assert_str_eq(shim_run_printed(&without, "lock"), "0");
    /* Zero as without the shim (ASan's allocator writes a new block's first
     * 4 KiB). */
    cr_assert_eq(shim_run_printed_number(&with, "zero"), shim_run_printed_number(&without, "zero"),
                 "the buffer's bytes changed");
    cr_assert_eq(shim_run_printed_number(&with, "flagged"), 0,
                 "the shim left MADV_HUGEPAGE's flag on the buffer");
    cr_assert_str_eq(stats_text(&with, "kernel"), kernel);
    cr_assert_str_eq(stats_text(&with, "option"), "auto");
    long long locked = huge(&with, "huge_bytes") + huge(&with, "small_bytes");
    long long program_saw = shim_run_printed_number(&with, "huge_bytes");
    if (huge(&with, "unknown_bytes") == 0) {
        /* The record is what the kernel says: the page-rounded lock, 64 MiB. */
        cr_assert_eq(locked, 64 * MIB, "%s", with.stats);
        cr_assert_eq(huge(&with, "huge_bytes"), program_saw, "stats %lld, smaps %lld",
                     huge(&with, "huge_bytes"), program_saw);
    }
    if (strcmp(kernel, "madvise") == 0) {
        /* Aligned to 2 MiB: all 32 chunks lie in the buffer, each made huge
         * or said why not. */
        cr_assert_eq(shim_run_printed_number(&with, "pmd_aligned"), 1);
        cr_assert_eq(huge(&with, "aligned_allocations"), 1);
        cr_assert_eq(huge(&with, "made_bytes") + huge(&with, "no_block_bytes") +
                         huge(&with, "refused_bytes") + huge(&with, "stopped_bytes") +
                         huge(&with, "had_pages_bytes"),
                     64 * MIB, "%s", with.stats);
        /* Untouched but for an allocator's fill of the first page (ASan's). */
        cr_assert_leq(huge(&with, "had_pages_bytes"), 2 * MIB, "%s", with.stats);
        /* What was made is what the program finds, where the kernel can say
         * (qemu-user answers madvise with success and does nothing, and
         * knows no PAGEMAP_SCAN: the bytes are unknown there). */
        if (huge(&with, "unknown_bytes") == 0)
            cr_assert_eq(program_saw, huge(&with, "made_bytes"), "%s", with.stats);
        /* Without the shim, THP madvise gives this buffer no huge page. */
        cr_assert_eq(shim_run_printed_number(&without, "huge_bytes"), 0);
    } else {
        cr_assert_eq(huge(&with, "made_bytes"), 0);
        cr_assert_eq(huge(&with, "aligned_allocations"), 0);
        cr_assert_eq(program_saw,
                     shim_run_printed_number(&without, "huge_bytes") > 0 ? program_saw : 0);
    }
    shim_run_free(&without);
    shim_run_free(&with);
}

Test(huge_pages, off_changes_nothing)
{
    char kernel[64];
    this_kernel(kernel, sizeof(kernel));
    const char *argv[] = {shim_run_required_env("HUGE_LOCK"), "deepspeed", "64", NULL};
    const char *settings[] = {"PINSHIM_HUGEPAGES=off", NULL};
    struct shim_run with;
    shim_run(&with, argv, true, defaults, settings);
    cr_assert_str_eq(shim_run_printed(&with, "lock"), "0");
    cr_assert_str_eq(stats_text(&with, "option"), "off");
    cr_assert_eq(huge(&with, "made_bytes"), 0);
    cr_assert_eq(huge(&with, "aligned_allocations"), 0);
    cr_assert_eq(shim_run_printed_number(&with, "pmd_aligned"), 0,
                 "page-aligned by the rounding only (glibc's header page before it)");
    if (strcmp(kernel, "madvise") == 0)
        cr_assert_eq(shim_run_printed_number(&with, "huge_bytes"), 0);
    if (huge(&with, "unknown_bytes") == 0)
        cr_assert_eq(huge(&with, "huge_bytes"), shim_run_printed_number(&with, "huge_bytes"));
    shim_run_free(&with);
}

/* Memory with pages, MLOCK_ONFAULT locks and memory never locked keep the
 * pages they get without the shim. */
Test(huge_pages, memory_it_should_not_touch_is_left_as_it_is)
{
    const char *modes[] = {"prefilled", "onfault", "unlocked"};
    for (size_t i = 0; i < sizeof(modes) / sizeof(*modes); i++) {
        const char *argv[] = {shim_run_required_env("HUGE_LOCK"), modes[i], "16", NULL};
        const char *settings[] = {"PINSHIM_STATS_ALL=1", NULL};
        struct shim_run without, with;
        shim_run(&without, argv, false, defaults, settings);
        shim_run(&with, argv, true, defaults, settings);
        cr_assert_str_eq(shim_run_printed(&with, "lock"), shim_run_printed(&without, "lock"));
        cr_assert_eq(shim_run_printed_number(&with, "huge_bytes"),
                     shim_run_printed_number(&without, "huge_bytes"), "%s", modes[i]);
        cr_assert_eq(shim_run_printed_number(&with, "flagged"), 0, "%s", modes[i]);
        cr_assert_eq(huge(&with, "made_bytes"), 0, "%s: %s", modes[i], with.stats);
        shim_run_free(&without);
        shim_run_free(&with);
    }
}

/* The reason the shim makes chunks huge itself rather than with
 * MADV_HUGEPAGE: the flag would outlive the lock and split the mapping, and
 * mremap of the whole mapping would then fail with EFAULT. */
Test(huge_pages, a_mapping_locked_in_part_still_moves_whole)
{
    const char *argv[] = {shim_run_required_env("HUGE_LOCK"), "mremap", NULL};
    struct shim_run without, with;
    shim_run(&without, argv, false, defaults, NULL);
    shim_run(&with, argv, true, defaults, NULL);
    cr_assert_str_eq(shim_run_printed(&without, "mremap"), "0");
    cr_assert_str_eq(shim_run_printed(&with, "mlock"), "0");
    cr_assert_str_eq(shim_run_printed(&with, "mremap"), "0", "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* aligned_alloc, memalign and valloc get posix_memalign's alignment: PMD-aligned
 * where the shim makes huge pages, as they are elsewhere. */
Test(huge_pages, the_other_aligned_allocations_are_aligned_too)
{
    char kernel[64];
    this_kernel(kernel, sizeof(kernel));
    const char *argv[] = {shim_run_required_env("HUGE_LOCK"), "aligned", "8", NULL};
    const char *settings[] = {"PINSHIM_STATS_ALL=1", NULL};
    struct shim_run with;
    shim_run(&with, argv, true, defaults, settings);
    const char *names[] = {"aligned_alloc_pmd_aligned", "memalign_pmd_aligned",
                           "valloc_pmd_aligned"};
    bool making = strcmp(kernel, "madvise") == 0;
    for (int i = 0; i < 3; i++)
        if (making)
            cr_assert_eq(shim_run_printed_number(&with, names[i]), 1, "%s", names[i]);
    cr_assert_eq(huge(&with, "aligned_allocations"), making ? 3 : 0, "%s", with.stats);
    shim_run_free(&with);
}
