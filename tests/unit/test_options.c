/* The option table: every accepted spelling, every kind of bad value, and the
 * README's table generated from it. */
#include "options.h"

#include "log.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"

struct fake_environment {
    const char *names[8];
    const char *values[8];
};

static const char *lookup(const char *name, void *context)
{
    struct fake_environment *environment = context;
    for (int i = 0; i < 8 && environment->names[i]; i++)
        if (strcmp(environment->names[i], name) == 0)
            return environment->values[i];
    return NULL;
}

/* Loads a configuration from one variable and returns what was logged. */
static char logged[4096];
static int load_one(struct pinshim_config *cfg, const char *name, const char *value)
{
    struct fake_environment environment = {{name}, {value}};
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    log_set_fd(pipe_fds[1]);
    int bad = config_load(cfg, lookup, &environment);
    log_set_fd(-1);
    close(pipe_fds[1]);
    ssize_t n = read(pipe_fds[0], logged, sizeof(logged) - 1);
    logged[n > 0 ? n : 0] = '\0';
    close(pipe_fds[0]);
    return bad;
}

Test(options, defaults)
{
    struct pinshim_config cfg;
    struct fake_environment empty = {{NULL}, {NULL}};
    cr_assert_eq(config_load(&cfg, lookup, &empty), 0);
    cr_assert(cfg.register_enabled);
    cr_assert_eq(cfg.min_bytes, 65536);
    cr_assert_eq(cfg.register_flags, 0);
    cr_assert_str_empty(cfg.cudart);
    cr_assert_eq(cfg.stats_mode, STATS_NONE);
    cr_assert_eq(cfg.log_level, LOG_WARN);
}

Test(options, every_boolean_spelling)
{
    const char *on[] = {"1", "true", "yes", "on", "TRUE", "Yes", "oN"};
    const char *off[] = {"0", "false", "no", "off", "FALSE", "No", "OFF"};
    struct pinshim_config cfg;
    for (size_t i = 0; i < sizeof(on) / sizeof(*on); i++) {
        cr_assert_eq(load_one(&cfg, "PINSHIM_REGISTER", on[i]), 0, "%s", on[i]);
        cr_assert(cfg.register_enabled, "%s", on[i]);
        cr_assert_eq(load_one(&cfg, "PINSHIM_REGISTER", off[i]), 0, "%s", off[i]);
        cr_assert_not(cfg.register_enabled, "%s", off[i]);
        cr_assert_str_empty(logged);
    }
}

Test(options, byte_sizes)
{
    struct {
        const char *text;
        uint64_t bytes;
    } good[] = {{"0", 0},
                {"4096", 4096},
                {"64K", 65536},
                {"64k", 65536},
                {"1M", 1 << 20},
                {"2m", 2 << 20},
                {"1G", 1u << 30},
                {"3g", 3ull << 30},
                {"18446744073709551615", UINT64_MAX},
                {"17179869183G", 17179869183ull << 30}};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        uint64_t bytes;
        cr_assert(parse_byte_size(good[i].text, &bytes), "%s", good[i].text);
        cr_assert_eq(bytes, good[i].bytes, "%s", good[i].text);
    }
    const char *bad[] = {"",
                         "K",
                         "-1",
                         "1.5M",
                         "12Q",
                         "1KB",
                         " 1",
                         "1 ",
                         "1T",
                         "18446744073709551616",
                         "17179869184G",
                         "0x10"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        uint64_t bytes = 7;
        cr_assert_not(parse_byte_size(bad[i], &bytes), "'%s' accepted", bad[i]);
        cr_assert_eq(bytes, 7);
    }
}

Test(options, bad_value_warns_once_and_uses_default)
{
    struct pinshim_config cfg;
    cr_assert_eq(load_one(&cfg, "PINSHIM_MIN_BYTES", "12Q"), 1);
    cr_assert_eq(cfg.min_bytes, 65536);
    cr_assert_str_eq(logged, "pinshim: PINSHIM_MIN_BYTES=\"12Q\" is not valid (not a byte count); "
                             "accepted: bytes, or with a K/M/G suffix (powers of 1024); using "
                             "64K\n");
    cr_assert_eq(load_one(&cfg, "PINSHIM_REGISTER", "maybe"), 1);
    cr_assert(cfg.register_enabled);
    cr_assert(strstr(logged, "PINSHIM_REGISTER=\"maybe\"") != NULL);
    cr_assert(strstr(logged, "using on") != NULL);
    cr_assert_eq(load_one(&cfg, "PINSHIM_LOG", "verbose"), 1);
    cr_assert_eq(cfg.log_level, LOG_WARN);
    cr_assert_eq(load_one(&cfg, "PINSHIM_FLAGS", "portable,bogus"), 1);
    cr_assert_eq(cfg.register_flags, 0);
    cr_assert(strstr(logged, "unknown flag 'bogus'") != NULL);
    cr_assert_eq(load_one(&cfg, "PINSHIM_FLAGS", ""), 1);
    cr_assert_eq(load_one(&cfg, "PINSHIM_STATS", "/tmp/x.%q"), 1);
    cr_assert_eq(cfg.stats_mode, STATS_NONE);
    /* One line per bad value. */
    cr_assert_eq(strchr(logged, '\n'), strrchr(logged, '\n'));
}

Test(options, quiet_silences_warnings_about_other_values)
{
    struct fake_environment environment = {{"PINSHIM_LOG", "PINSHIM_MIN_BYTES"}, {"QUIET", "x"}};
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    log_set_fd(pipe_fds[1]);
    struct pinshim_config cfg;
    cr_assert_eq(config_load(&cfg, lookup, &environment), 1);
    log_set_fd(-1);
    close(pipe_fds[1]);
    char buffer[64];
    cr_assert_eq(read(pipe_fds[0], buffer, sizeof(buffer)), 0, "quiet still logged");
    close(pipe_fds[0]);
    cr_assert_eq(cfg.min_bytes, 65536);
    log_set_level(LOG_WARN);
}

Test(options, flags)
{
    struct {
        const char *text;
        unsigned flags;
    } cases[] = {{"default", 0},       {"portable", 1},        {"mapped", 2},
                 {"readonly", 8},      {"portable,mapped", 3}, {"PORTABLE,ReadOnly", 9},
                 {"default,mapped", 2}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        struct pinshim_config cfg;
        cr_assert_eq(load_one(&cfg, "PINSHIM_FLAGS", cases[i].text), 0, "%s", cases[i].text);
        cr_assert_eq(cfg.register_flags, cases[i].flags, "%s", cases[i].text);
    }
    const char *bad[] = {"portable,", ",mapped", "portable mapped", "iomemory", "3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        struct pinshim_config cfg;
        cr_assert_eq(load_one(&cfg, "PINSHIM_FLAGS", bad[i]), 1, "'%s' accepted", bad[i]);
    }
}

Test(options, stats_and_log_and_cudart)
{
    struct pinshim_config cfg;
    const char *none[] = {"", "0"};
    for (int i = 0; i < 2; i++) {
        load_one(&cfg, "PINSHIM_STATS", none[i]);
        cr_assert_eq(cfg.stats_mode, STATS_NONE);
    }
    const char *text[] = {"1", "stderr", "STDERR"};
    for (int i = 0; i < 3; i++) {
        load_one(&cfg, "PINSHIM_STATS", text[i]);
        cr_assert_eq(cfg.stats_mode, STATS_TEXT);
    }
    cr_assert_eq(load_one(&cfg, "PINSHIM_STATS", "/tmp/s.%h.%p.%%.json"), 0);
    cr_assert_eq(cfg.stats_mode, STATS_JSON);
    cr_assert_str_eq(cfg.stats_path, "/tmp/s.%h.%p.%%.json");
    const char *levels[] = {"quiet", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        load_one(&cfg, "PINSHIM_LOG", levels[i]);
        cr_assert_eq((int)cfg.log_level, i);
    }
    load_one(&cfg, "PINSHIM_LOG", "DEBUG");
    cr_assert_eq(cfg.log_level, LOG_DEBUG);
    load_one(&cfg, "PINSHIM_CUDART", "/opt/cuda/libcudart.so.12");
    cr_assert_str_eq(cfg.cudart, "/opt/cuda/libcudart.so.12");
    char too_long[CONFIG_PATH_MAX + 10];
    memset(too_long, 'a', sizeof(too_long) - 1);
    too_long[sizeof(too_long) - 1] = '\0';
    cr_assert_eq(load_one(&cfg, "PINSHIM_CUDART", too_long), 1);
    cr_assert_str_empty(cfg.cudart);
}

Test(options, format_value_round_trips)
{
    struct pinshim_config cfg;
    config_set_defaults(&cfg);
    cfg.register_flags = 0x0B;
    char text[64];
    config_format_value(&cfg, OPT_FLAGS, text, sizeof(text));
    cr_assert_str_eq(text, "portable,mapped,readonly");
    config_format_value(&cfg, OPT_MIN_BYTES, text, sizeof(text));
    cr_assert_str_eq(text, "65536");
    config_format_value(&cfg, OPT_REGISTER, text, sizeof(text));
    cr_assert_str_eq(text, "on");
}

Test(options, every_option_has_a_cli_name_and_env_name)
{
    for (int i = 0; i < OPT_COUNT; i++) {
        cr_assert_eq((int)option_table[i].id, i);
        cr_assert_eq(option_find_by_env(option_table[i].env_name), &option_table[i]);
        cr_assert_eq(option_find_by_cli(option_table[i].cli_name), &option_table[i]);
    }
}

/* The README's option table is the generated one, byte for byte. */
Test(options, readme_table_matches_the_code)
{
    const char *root = getenv("PINSHIM_SOURCE_ROOT");
    cr_assert_not_null(root, "PINSHIM_SOURCE_ROOT not set by meson");
    char path[4096];
    snprintf(path, sizeof(path), "%s/README.md", root);
    char *readme = read_file_text(path);
    cr_assert_not_null(readme, "cannot read %s", path);
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    options_write_markdown(pipe_fds[1]);
    close(pipe_fds[1]);
    static char table[16384];
    ssize_t n = read(pipe_fds[0], table, sizeof(table) - 1);
    close(pipe_fds[0]);
    cr_assert_gt(n, 0);
    table[n] = '\0';
    cr_assert(strstr(readme, table) != NULL,
              "README.md lacks the generated option table; regenerate it with "
              "build/src/pinshim --help-options-markdown:\n%s",
              table);
    free(readme);
}
