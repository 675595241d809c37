/* Issue 35: the vendors' real libraries, as Debian ships them, on a machine
 * without their GPUs: a program that starts the runtime, sees it find no
 * device (or only the Level Zero loader's null driver), goes on and locks
 * memory runs the same with the shim as without it, in program mode and in
 * create mode with each PINSHIM_VENDOR: the same exit status, the same
 * results of its calls, and nothing registered. tests/programs/ze_program.c
 * and hip_program.c (linked against the fakes) run with the real libraries
 * put first on LD_LIBRARY_PATH. A library that is not installed skips its
 * tests, saying which (scripts/deps installs them; tests/README.md lists the
 * versions and what they returned). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "emulation.h"
#include "shim_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The build machine's library directories, where Debian installs them. */
static const char *const library_dirs[] = {
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", NULL};

/* The directory holding soname, or skips the test saying what is missing. */
static const char *real_library_dir(const char *soname, const char *package)
{
    SKIP_UNDER_EMULATOR("the vendors' libraries installed here are the build machine's");
    for (size_t i = 0; library_dirs[i] != NULL; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", library_dirs[i], soname);
        if (access(path, R_OK) == 0)
            return library_dirs[i];
    }
    cr_skip_test("%s is not installed (Debian's %s; scripts/deps installs it)", soname, package);
    return NULL;
}

static const char *const modes[][2] = {
    {"PINSHIM_CONTEXT=", "PINSHIM_VENDOR="},
    {"PINSHIM_CONTEXT=create", "PINSHIM_VENDOR=auto"},
    {"PINSHIM_CONTEXT=create", "PINSHIM_VENDOR=cuda"},
    {"PINSHIM_CONTEXT=create", "PINSHIM_VENDOR=hip"},
    {"PINSHIM_CONTEXT=create", "PINSHIM_VENDOR=ze"},
};
#define MODE_COUNT (sizeof(modes) / sizeof(*modes))

/* Runs program scenario with the real libraries of dir first, without and
 * with the shim in mode, and compares what its calls returned. */
static void run_both(const char *program, const char *scenario, const char *dir, size_t mode,
                     const char *extra, const char *const *keys, struct shim_run *without,
                     struct shim_run *with)
{
    char library_path[600];
    snprintf(library_path, sizeof(library_path), "LD_LIBRARY_PATH=%s", dir);
    /* The real CUDA runtime, if any, is found as a user's would be. */
    const char *defaults[] = {"PINSHIM_CUDART=", "PINSHIM_LOG=", "FAKE_GPU_LOG=", NULL};
    const char *settings[] = {library_path, modes[mode][0], modes[mode][1], extra, NULL};
    const char *argv[] = {shim_run_required_env(program), scenario, NULL};
    shim_run(without, argv, false, defaults, settings);
    shim_run(with, argv, true, defaults, settings);
    cr_assert_eq(with->result.status, without->result.status,
                 "%s %s (%s %s): exit status %d with the shim, %d without\n%s%s", program, scenario,
                 modes[mode][0], modes[mode][1], with->result.status, without->result.status,
                 with->result.out, with->result.err);
    for (size_t i = 0; keys[i] != NULL; i++) {
        char expected[256];
        snprintf(expected, sizeof(expected), "%s", shim_run_printed(without, keys[i]));
        cr_assert_str_eq(shim_run_printed(with, keys[i]), expected,
                         "%s %s (%s %s): %s differs with the shim\nwithout:\n%s\nwith:\n%s%s",
                         program, scenario, modes[mode][0], modes[mode][1], keys[i],
                         without->result.out, with->result.out, with->result.err);
    }
    cr_assert_eq(shim_run_printed_number(with, "registered"), 0, "%s%s", with->result.out,
                 with->result.err);
    /* No registration was even tried: no runtime had started. */
    cr_assert_eq(shim_run_stats_number(with, "register", "ok") +
                     shim_run_stats_number(with, "register", "failed"),
                 0, "%s", with->stats);
}

static const int mode_indexes[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

/* Level Zero's loader over Intel's driver (intel-opencl-icd's
 * libze_intel_gpu), which finds no device: zeInit answers
 * ZE_RESULT_ERROR_UNINITIALIZED, and the loader has unloaded the driver. The
 * program's zeInit is seen by the shim's definition (even) or not (odd: the
 * loader's own, through dlsym, as SYCL's loader front end calls it). */
ParameterizedTestParameters(realvendors, ze_with_intels_driver_and_no_device)
{
    return cr_make_param_array(int, mode_indexes, 2 * MODE_COUNT);
}

ParameterizedTest(const int *index, realvendors, ze_with_intels_driver_and_no_device)
{
    const char *dir = real_library_dir("libze_loader.so.1", "libze1");
    real_library_dir("libze_intel_gpu.so.1", "intel-opencl-icd");
    const char *scenario = *index % 2 ? "start_then_lock_unseen" : "start_then_lock";
    const char *keys[] = {"start", "mlock", "munlock", NULL};
    struct shim_run without, with;
    run_both("ZE_PROGRAM", scenario, dir, (size_t)*index / 2, NULL, keys, &without, &with);
    if (strcmp(shim_run_printed(&without, "start"), "0x78000001") != 0)
        cr_skip_test("zeInit answered %s here (a device?): this test is for a machine without "
                     "one",
                     shim_run_printed(&without, "start"));
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Level Zero's loader with no driver to load (ZE_ENABLE_ALT_DRIVERS names
 * one that is not there): zeInit answers ZE_RESULT_ERROR_UNINITIALIZED. */
ParameterizedTestParameters(realvendors, ze_loader_with_no_driver)
{
    return cr_make_param_array(int, mode_indexes, 2 * MODE_COUNT);
}

ParameterizedTest(const int *index, realvendors, ze_loader_with_no_driver)
{
    const char *dir = real_library_dir("libze_loader.so.1", "libze1");
    const char *scenario = *index % 2 ? "start_then_lock_unseen" : "start_then_lock";
    const char *keys[] = {"start", "mlock", "munlock", NULL};
    struct shim_run without, with;
    run_both("ZE_PROGRAM", scenario, dir, (size_t)*index / 2,
             "ZE_ENABLE_ALT_DRIVERS=/nonexistent/libze_no_driver.so.1", keys, &without, &with);
    cr_assert_str_eq(shim_run_printed(&without, "start"), "0x78000001");
    shim_run_free(&without);
    shim_run_free(&with);
}

/* The loader's null driver (scripts/build-ze-null-driver) alone: zeInit
 * succeeds, and the driver answers success to every extension function's
 * name without giving one. The shim finds no import and says so once.
 * (zeInit succeeds: the null driver offers no import, so nothing can be
 * registered; SYCL's adapter over it crashed in zeDeviceGet with and
 * without the shim: tests/README.md.) */
ParameterizedTestParameters(realvendors, ze_with_the_null_driver)
{
    return cr_make_param_array(int, mode_indexes, 2 * MODE_COUNT);
}

ParameterizedTest(const int *index, realvendors, ze_with_the_null_driver)
{
    const char *dir = real_library_dir("libze_loader.so.1", "libze1");
    const char *null_driver = shim_run_required_env("ZE_NULL_DRIVER");
    if (access(null_driver, R_OK) != 0)
        cr_skip_test("no %s (scripts/build-ze-null-driver builds it from Debian's level-zero "
                     "source, scripts/test runs it)",
                     null_driver);
    char alternative[600];
    snprintf(alternative, sizeof(alternative), "ZE_ENABLE_ALT_DRIVERS=%s", null_driver);
    const char *scenario = *index % 2 ? "start_then_lock_unseen" : "start_then_lock";
    const char *keys[] = {"start", "mlock", "munlock", NULL};
    struct shim_run without, with;
    size_t mode = (size_t)*index / 2;
    run_both("ZE_PROGRAM", scenario, dir, mode, alternative, keys, &without, &with);
    cr_assert_str_eq(shim_run_printed(&with, "start"), "0");
    const char *vendor = modes[mode][1];
    /* Program mode asks the driver only after a start it saw (a start
     * through the loader's handle is left alone); create mode starts its own. */
    bool level_zero_asked = (strcmp(vendor, "PINSHIM_VENDOR=") == 0 && *index % 2 == 0) ||
                            strcmp(vendor, "PINSHIM_VENDOR=ze") == 0 ||
                            strcmp(vendor, "PINSHIM_VENDOR=auto") == 0;
    if (level_zero_asked)
        cr_assert(strstr(with.result.err, "no Level Zero driver offers "
                                          "zexDriverImportExternalPointer") != NULL,
                  "%s", with.result.err);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* ROCm's HIP with no AMD GPU (ROCm 5.2.3: hipInit 101, hipGetDeviceCount 100,
 * hipHostRegister 101): the program's own calls answer the same with the
 * shim, hipGetLastError included. */
ParameterizedTestParameters(realvendors, hip_without_a_gpu)
{
    return cr_make_param_array(int, mode_indexes, MODE_COUNT);
}

ParameterizedTest(const int *index, realvendors, hip_without_a_gpu)
{
    const char *dir = real_library_dir("libamdhip64.so.5", "libamdhip64-5");
    real_library_dir("libhsa-runtime64.so.1", "libhsa-runtime64-1");
    const char *keys[] = {"init",  "device_count", "count",      "own_register",
                          "mlock", "munlock",      "last_error", NULL};
    struct shim_run without, with;
    run_both("HIP_PROGRAM", "no_device", dir, (size_t)*index, NULL, keys, &without, &with);
    shim_run_free(&without);
    shim_run_free(&with);
}
