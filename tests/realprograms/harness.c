/* harness: see harness.h. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_lite.h"

/* Settings a developer's shell may hold that would change what a run does. */
static const char *const cleared_settings[] = {
    "PINSHIM_REGISTER=",
    "PINSHIM_MIN_BYTES=",
    "PINSHIM_FLAGS=",
    "PINSHIM_LOG=",
    "FAKE_CUDART_NO_DRIVER=",
    "FAKE_CUDART_DEVICES=",
    "FAKE_CUDART_FAIL_REGISTER_EVERY=",
    "FAKE_CUDART_FAIL_UNREGISTER_EVERY=",
    "FAKE_CUDART_FAIL_ERROR=",
    "FAKE_CUDART_UNLOAD_AT_EXIT=",
    "PINSHIM_VENDOR=",
    "FAKE_GPU_FAIL_REGISTER_EVERY=",
    "FAKE_GPU_FAIL_UNREGISTER_EVERY=",
    "FAKE_GPU_FAIL_ERROR=",
};

const char *harness_env(const char *name)
{
    const char *value = getenv(name);
    cr_assert(value != NULL && value[0] != '\0', "%s is not set (run through meson test)", name);
    return value;
}

const char *harness_optional_env(const char *name)
{
    const char *value = getenv(name);
    return value != NULL && value[0] != '\0' ? value : NULL;
}

const char *harness_sanitizer(void)
{
    const char *sanitize = harness_optional_env("SANITIZE");
    return sanitize != NULL && strcmp(sanitize, "none") != 0 ? sanitize : NULL;
}

unsigned long long harness_lock_budget(void)
{
    struct rlimit limit;
    if (geteuid() == 0 || getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
        return ULLONG_MAX;
    return (unsigned long long)limit.rlim_cur;
}

void harness_require_lock_budget(unsigned long long bytes)
{
    unsigned long long budget = harness_lock_budget();
    if (budget < bytes)
        cr_skip_test("the programs lock up to %llu KiB at once; RLIMIT_MEMLOCK (ulimit -l) allows "
                     "%llu KiB: run as root or raise the limit",
                     bytes >> 10, budget >> 10);
}

static bool is_stats_file(const char *name)
{
    size_t length = strlen(name);
    if (strncmp(name, "stats.", 6) != 0 || length < 12 || strcmp(name + length - 5, ".json") != 0)
        return false;
    for (size_t i = 6; i < length - 5; i++)
        if (name[i] < '0' || name[i] > '9')
            return false; /* stats.<pid>.json.tmp.<pid> and the like */
    return true;
}

/* Reads the stats files; keeps the one with the smallest name, counts all. */
static void collect_stats(struct harness_run *run)
{
    DIR *directory = opendir(run->directory);
    cr_assert_not_null(directory);
    char first[256] = "";
    struct dirent *entry;
    while ((entry = readdir(directory)) != NULL) {
        if (!is_stats_file(entry->d_name))
            continue;
        run->stats_files++;
        if (first[0] == '\0' || strcmp(entry->d_name, first) < 0)
            snprintf(first, sizeof(first), "%s", entry->d_name);
    }
    closedir(directory);
    if (first[0] != '\0') {
        char path[HARNESS_PATH_MAX + 256];
        snprintf(path, sizeof(path), "%s/%s", run->directory, first);
        run->stats = read_file_text(path);
    }
}

#define MAX_SETTINGS 63

/* Adds "K=V" (or "K=", unset) to settings, replacing an earlier entry for K. */
static void add_setting(const char **settings, size_t *count, const char *setting)
{
    size_t name_length = strcspn(setting, "=");
    for (size_t i = 0; i < *count; i++) {
        if (strncmp(settings[i], setting, name_length + 1) == 0) {
            settings[i] = setting;
            return;
        }
    }
    cr_assert_lt(*count, MAX_SETTINGS, "too many settings");
    settings[(*count)++] = setting;
}

void harness_run(struct harness_run *run, const char *const argv[],
                 const struct harness_options *options)
{
    static const struct harness_options no_options = {0};
    if (options == NULL)
        options = &no_options;
    memset(run, 0, sizeof(*run));
    if (options->shared_directory) {
        char why[2 * HARNESS_PATH_MAX];
        run->directory = make_shared_temp_dir(why, sizeof(why));
        if (run->directory == NULL)
            cr_skip_test("%s", why);
        cr_assert_eq(chmod(run->directory, 0777), 0);
    } else {
        run->directory = make_temp_dir();
        cr_assert_not_null(run->directory, "cannot make a temporary directory");
    }
    snprintf(run->log_path, sizeof(run->log_path), "%s/fake.log", run->directory);

    char preload[HARNESS_PATH_MAX + 16], cudart[HARNESS_PATH_MAX + 16];
    char stats[HARNESS_PATH_MAX + 32], log[HARNESS_PATH_MAX + 32];
    char vendor[64] = "PINSHIM_VENDOR=", library_path[HARNESS_PATH_MAX + 32] = "LD_LIBRARY_PATH=";
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", options->preload ? options->preload : "");
    snprintf(stats, sizeof(stats), "PINSHIM_STATS=%s/stats.%%p.json", run->directory);
    /* HARNESS_VENDOR=hip or ze: the fake HIP runtime or Level Zero loader,
     * found by its soname in the directory HARNESS_VENDOR_DIR names (create
     * mode searches it so), logging in the CUDA double's format to
     * FAKE_GPU_LOG (tests/fake_gpu/fake_pins.h). */
    const char *vendor_name = harness_optional_env("HARNESS_VENDOR");
    if (vendor_name != NULL) {
        snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=");
        snprintf(vendor, sizeof(vendor), "PINSHIM_VENDOR=%s", vendor_name);
        snprintf(library_path, sizeof(library_path), "LD_LIBRARY_PATH=%s",
                 harness_env("HARNESS_VENDOR_DIR"));
        snprintf(log, sizeof(log), "FAKE_GPU_LOG=%s", run->log_path);
    } else {
        snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", harness_env("FAKE_CUDART"));
        snprintf(log, sizeof(log), "FAKE_CUDART_LOG=%s", run->log_path);
    }

    /* child_run appends every entry, and getenv takes the first of a name:
     * each entry replaces an earlier one of the same name. */
    const char *environment[64];
    size_t count = 0;
    const char *defaults[] = {preload, cudart, stats, log, vendor, library_path};
    for (size_t i = 0; i < sizeof(cleared_settings) / sizeof(*cleared_settings); i++)
        add_setting(environment, &count, cleared_settings[i]);
    for (size_t i = 0; i < sizeof(defaults) / sizeof(*defaults); i++)
        add_setting(environment, &count, defaults[i]);
    for (size_t i = 0; options->env && options->env[i]; i++)
        add_setting(environment, &count, options->env[i]);
    environment[count] = NULL;

    child_run(argv, environment, options->stdin_text, &run->result);
    cr_assert_geq(run->result.status, 0, "%s could not be started", argv[0]);
    collect_stats(run);
    run->have_log = access(run->log_path, R_OK) == 0 && fake_log_load(run->log_path, -1, &run->log);
}

void harness_free(struct harness_run *run)
{
    child_result_free(&run->result);
    free(run->stats);
    if (run->have_log)
        fake_log_free(&run->log);
    if (run->directory != NULL)
        remove_tree(run->directory);
    free(run->directory);
    memset(run, 0, sizeof(*run));
}

double harness_stat(const struct harness_run *run, const char *key)
{
    double value = -1;
    cr_assert_not_null(run->stats, "no stats were written; stderr:\n%s", run->result.err);
    cr_assert(json_lite_get_number(run->stats, key, &value), "the stats lack %s:\n%s", key,
              run->stats);
    return value;
}

const char *harness_stat_string(const struct harness_run *run, const char *key, char *out,
                                size_t out_size)
{
    if (run->stats == NULL || !json_lite_get_string(run->stats, key, out, out_size))
        return NULL;
    return out;
}

size_t harness_count(const char *text, const char *needle)
{
    size_t count = 0;
    for (const char *at = text; at && (at = strstr(at, needle)) != NULL; at += strlen(needle))
        count++;
    return count;
}

size_t harness_count_lines(const char *text, const char *needle)
{
    size_t count = 0;
    const char *line = text;
    while (line != NULL && *line != '\0') {
        const char *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        const char *found = strstr(line, needle);
        if (found != NULL && (size_t)(found - line) < length)
            count++;
        line = end ? end + 1 : NULL;
    }
    return count;
}

void harness_expect_same_result(const struct harness_run *without_shim,
                                const struct harness_run *with_shim)
{
    cr_assert_eq(with_shim->result.status, without_shim->result.status,
                 "exit status %d with the shim, %d without\nstderr with the shim:\n%s",
                 with_shim->result.status, without_shim->result.status, with_shim->result.err);
    cr_assert(with_shim->result.out_len == without_shim->result.out_len &&
                  memcmp(with_shim->result.out, without_shim->result.out,
                         without_shim->result.out_len) == 0,
              "stdout differs\n--- without the shim:\n%s\n--- with the shim:\n%s",
              without_shim->result.out, with_shim->result.out);
}

void harness_expect_clean_runtime(const struct harness_run *run)
{
    cr_assert(run->have_log, "the fake runtime wrote no log; stderr:\n%s", run->result.err);
    cr_assert_eq(run->log.total.violations, 0, "%llu violations recorded, first: %s",
                 (unsigned long long)run->log.total.violations,
                 run->log.total.violations ? run->log.total.violation_lines[0] : "");
    cr_assert_eq(run->log.total.live_count, 0, "%zu registrations left in the runtime",
                 run->log.total.live_count);
    cr_assert_eq(run->log.malformed_lines, 0);
}

void harness_expect_consistent_stats(const struct harness_run *run)
{
    double ok = harness_stat(run, "unregister.ok");
    double failed = harness_stat(run, "unregister.failed");
    double unloading = harness_stat(run, "unregister.exit_unloading");
    double gone = harness_stat(run, "unregister.gone");
    double by_reason =
        harness_stat(run, "unregister.munlock") + harness_stat(run, "unregister.free") +
        harness_stat(run, "unregister.realloc") + harness_stat(run, "unregister.munmap") +
        harness_stat(run, "unregister.mremap") + harness_stat(run, "unregister.mmap_fixed") +
        harness_stat(run, "unregister.exit") + harness_stat(run, "unregister.program") +
        harness_stat(run, "unregister.mprotect") + harness_stat(run, "unregister.join");
    cr_assert_eq(ok + failed + unloading + gone, by_reason, "unregistrations do not add up:\n%s",
                 run->stats);
    cr_assert_eq(harness_stat(run, "unregister.exit"), harness_stat(run, "live.ranges"), "%s",
                 run->stats);
    if (!run->have_log) {
        cr_assert_eq(harness_stat(run, "register.ok"), 0, "registered without a runtime log");
        return;
    }
    cr_assert_eq(harness_stat(run, "register.ok"), (double)run->log.total.register_ok, "%s",
                 run->stats);
    cr_assert_eq(ok, (double)run->log.total.unregister_ok, "%s", run->stats);
}

bool harness_copy_file(const char *source, const char *directory, const char *name, unsigned mode)
{
    char target[HARNESS_PATH_MAX + 256];
    snprintf(target, sizeof(target), "%s/%s", directory, name);
    int in = open(source, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return false;
    int out = open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = out >= 0;
    char buffer[65536];
    ssize_t got;
    while (ok && (got = read(in, buffer, sizeof(buffer))) > 0)
        ok = write(out, buffer, (size_t)got) == got;
    close(in);
    if (out >= 0)
        ok = close(out) == 0 && ok;
    return ok && chmod(target, (mode_t)mode) == 0;
}
