#include "shim_run.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETTINGS 64

const char *shim_run_required_env(const char *name)
{
    const char *value = getenv(name);
    cr_assert(value != NULL && value[0] != '\0', "%s is not set (run through meson test)", name);
    return value;
}

/* Sets entry in env (count entries), replacing one of the same name. */
static void put(const char **env, size_t *count, const char *entry)
{
    const char *equals = strchr(entry, '=');
    cr_assert_not_null(equals, "a setting without '=': %s", entry);
    size_t name = (size_t)(equals - entry) + 1;
    for (size_t i = 0; i < *count; i++)
        if (strncmp(env[i], entry, name) == 0) {
            env[i] = entry;
            return;
        }
    cr_assert_lt(*count, MAX_SETTINGS, "too many settings");
    env[(*count)++] = entry;
}

void shim_run(struct shim_run *run, const char *const *argv, bool with_shim,
              const char *const *defaults, const char *const *settings)
{
    memset(run, 0, sizeof *run);
    run->directory = make_temp_dir();
    cr_assert_not_null(run->directory);
    snprintf(run->stats_path, sizeof run->stats_path, "%s/stats.json", run->directory);
    static char preload[1200], cudart[1200], stats[1200];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s",
             with_shim ? shim_run_required_env("PINSHIM_LIB") : "");
    snprintf(cudart, sizeof cudart, "PINSHIM_CUDART=%s", shim_run_required_env("FAKE_CUDART"));
    snprintf(stats, sizeof stats, "PINSHIM_STATS=%s", run->stats_path);
    const char *env[MAX_SETTINGS + 1];
    size_t count = 0;
    put(env, &count, preload);
    put(env, &count, cudart);
    put(env, &count, stats);
    for (size_t i = 0; defaults != NULL && defaults[i] != NULL; i++)
        put(env, &count, defaults[i]);
    for (size_t i = 0; settings != NULL && settings[i] != NULL; i++)
        put(env, &count, settings[i]);
    env[count] = NULL;
    child_run(argv, env, NULL, &run->result);
    char command[512] = "";
    for (size_t i = 0; argv[i] != NULL; i++) {
        size_t used = strlen(command);
        snprintf(command + used, sizeof command - used, "%s%s", i ? " " : "",
                 i == 0 && strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[i]);
    }
    cr_assert_eq(run->result.status, 0, "%s exited %d\nstdout:\n%s\nstderr:\n%s", command,
                 run->result.status, run->result.out, run->result.err);
    run->stats = read_file_text(run->stats_path);
}

void shim_run_free(struct shim_run *run)
{
    child_result_free(&run->result);
    free(run->stats);
    remove_tree(run->directory);
    free(run->directory);
}

/* The number after "\"key\": " in the JSON inside the object named section
 * ("" for the top level). */
long long shim_run_stats_number(const struct shim_run *run, const char *section, const char *key)
{
    cr_assert_not_null(run->stats, "no stats file at %s\nstderr:\n%s", run->stats_path,
                       run->result.err);
    const char *from = run->stats;
    if (section[0] != '\0') {
        char name[128];
        snprintf(name, sizeof name, "\"%s\": {", section);
        from = strstr(run->stats, name);
        cr_assert_not_null(from, "no \"%s\" in the stats:\n%s", section, run->stats);
    }
    char name[128];
    snprintf(name, sizeof name, "\"%s\": ", key);
    const char *at = strstr(from, name);
    cr_assert_not_null(at, "no \"%s\" in \"%s\" of the stats:\n%s", key, section, run->stats);
    return strtoll(at + strlen(name), NULL, 10);
}

const char *shim_run_printed(const struct shim_run *run, const char *key)
{
    static char value[256];
    char needle[128];
    snprintf(needle, sizeof needle, "%s=", key);
    for (const char *line = run->result.out; line != NULL && *line;) {
        if (strncmp(line, needle, strlen(needle)) == 0) {
            size_t length = strcspn(line + strlen(needle), "\n");
            if (length >= sizeof value)
                length = sizeof value - 1;
            memcpy(value, line + strlen(needle), length);
            value[length] = '\0';
            return value;
        }
        const char *newline = strchr(line, '\n');
        line = newline ? newline + 1 : NULL;
    }
    cr_assert_fail("\"%s\" not printed:\n%s\nstderr:\n%s", key, run->result.out, run->result.err);
    return NULL;
}

long long shim_run_printed_number(const struct shim_run *run, const char *key)
{
    return strtoll(shim_run_printed(run, key), NULL, 10);
}

void shim_run_expect_no_warning(const struct shim_run *run)
{
    cr_assert(strstr(run->result.err, "pinshim:") == NULL, "the shim warned:\n%s", run->result.err);
}
