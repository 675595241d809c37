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

/* An environment with room for every variable of the table. */
struct big_environment {
    const char *names[OPT_COUNT];
    const char *values[OPT_COUNT];
};

static const char *big_lookup(const char *name, void *context)
{
    struct big_environment *environment = context;
    for (int i = 0; i < OPT_COUNT && environment->names[i]; i++)
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
    int bad = config_load(cfg, lookup, &environment, false);
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
    cr_assert_eq(config_load(&cfg, lookup, &empty, false), 0);
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
    cr_assert_eq(config_load(&cfg, lookup, &environment, false), 1);
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

Test(options, stats_all_is_a_boolean_flag)
{
    struct pinshim_config cfg;
    struct fake_environment empty = {{NULL}, {NULL}};
    config_load(&cfg, lookup, &empty, false);
    cr_assert_not(cfg.stats_all);
    const char *on[] = {"1", "true", "YES", "on"};
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(load_one(&cfg, "PINSHIM_STATS_ALL", on[i]), 0);
        cr_assert(cfg.stats_all, "%s", on[i]);
    }
    cr_assert_eq(load_one(&cfg, "PINSHIM_STATS_ALL", "off"), 0);
    cr_assert_not(cfg.stats_all);
    cr_assert_eq(load_one(&cfg, "PINSHIM_STATS_ALL", "everything"), 1);
    cr_assert_not(cfg.stats_all);
    cr_assert(strstr(logged, "PINSHIM_STATS_ALL=\"everything\" is not valid (not a boolean)") !=
              NULL);
    char text[16];
    cfg.stats_all = true;
    config_format_value(&cfg, OPT_STATS_ALL, text, sizeof(text));
    cr_assert_str_eq(text, "on");
    /* The command's flag sets the variable to a value the parser takes. */
    const struct option_spec *spec = option_find_by_cli("stats-all");
    cr_assert_not_null(spec);
    cr_assert_null(spec->cli_argument);
    cr_assert_str_eq(spec->flag_value, "1");
}

/* Every flag (an option without an argument) sets a value its parser accepts;
 * every option with an argument has none. */
Test(options, flags_set_values_their_parser_takes)
{
    for (int i = 0; i < OPT_COUNT; i++) {
        const struct option_spec *spec = &option_table[i];
        if (spec->cli_argument != NULL) {
            cr_assert_null(spec->flag_value, "%s", spec->env_name);
            continue;
        }
        cr_assert_not_null(spec->flag_value, "%s", spec->env_name);
        struct pinshim_config cfg;
        config_set_defaults(&cfg);
        char why[96];
        cr_assert(spec->parse(spec->flag_value, &cfg, why, sizeof(why)), "%s", spec->env_name);
    }
}

/* Loads with every variable of the table set to a value other than its default
 * (one that names a file where the option names one), in secure-execution
 * mode or not; what was logged is in logged. */
static struct pinshim_config load_all_set(bool secure_execution)
{
    static const char *const values[OPT_COUNT] = {
        [OPT_REGISTER] = "off",
        [OPT_MIN_BYTES] = "1M",
        [OPT_FLAGS] = "portable",
        [OPT_CUDART] = "/tmp/evil/libcudart.so",
        [OPT_STATS] = "/tmp/x.json",
        [OPT_STATS_ALL] = "1",
        [OPT_LOG] = "warn",
        [OPT_BLOCK_SIZE] = "allocator",
        [OPT_CONTEXT] = "create",
        [OPT_VENDOR] = "hip",
        [OPT_DEVICE] = "2",
        [OPT_ASYNC] = "on",
        [OPT_MAX_REGISTRATION] = "1G",
        [OPT_ONFAULT] = "skip",
        [OPT_FORK] = "dontfork",
        [OPT_FORK_WARN] = "0",
        [OPT_LIVE] = "/tmp/live-records",
        [OPT_NUMA] = "off",
        [OPT_NVTX] = "off",
        [OPT_HUGE_PAGES] = "off",
    };
    struct big_environment environment = {{0}, {0}};
    for (int i = 0; i < OPT_COUNT; i++) {
        cr_assert_not_null(values[i], "the test lacks a value for %s", option_table[i].env_name);
        environment.names[i] = option_table[i].env_name;
        environment.values[i] = values[i];
    }
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    log_set_fd(pipe_fds[1]);
    struct pinshim_config cfg;
    cr_assert_eq(config_load(&cfg, big_lookup, &environment, secure_execution), 0);
    log_set_fd(-1);
    close(pipe_fds[1]);
    ssize_t n = read(pipe_fds[0], logged, sizeof(logged) - 1);
    logged[n > 0 ? n : 0] = '\0';
    close(pipe_fds[0]);
    return cfg;
}

Test(options, secure_execution_ignores_options_that_name_files)
{
    cr_assert(option_table[OPT_STATS].names_file);
    cr_assert(option_table[OPT_CUDART].names_file);

    struct pinshim_config cfg = load_all_set(false);
    cr_assert_str_empty(logged);
    cr_assert_eq(cfg.stats_mode, STATS_JSON);
    cr_assert_str_eq(cfg.cudart, "/tmp/evil/libcudart.so");

    cfg = load_all_set(true);
    /* The options that name files keep their defaults... */
    struct pinshim_config defaults;
    config_set_defaults(&defaults);
    for (int i = 0; i < OPT_COUNT; i++) {
        char got[CONFIG_PATH_MAX], wanted[CONFIG_PATH_MAX];
        config_format_value(&cfg, (enum option_id)i, got, sizeof(got));
        config_format_value(&defaults, (enum option_id)i, wanted, sizeof(wanted));
        if (option_table[i].names_file)
            cr_assert_str_eq(got, wanted, "%s was read in secure-execution mode",
                             option_table[i].env_name);
        /* ...the others are read as usual. */
        else if (i != OPT_LOG)
            cr_assert_str_neq(got, wanted, "%s was not read", option_table[i].env_name);
    }
    cr_assert_eq(cfg.stats_mode, STATS_NONE);
    cr_assert_str_empty(cfg.cudart);
    cr_assert(cfg.stats_all);
    cr_assert_eq(cfg.min_bytes, 1 << 20);
    /* One warning naming every variable ignored and what is used instead. */
    cr_assert_str_eq(logged, "pinshim: secure-execution mode (setuid, setgid or file "
                             "capabilities): ignoring PINSHIM_CUDART, PINSHIM_STATS, "
                             "PINSHIM_LIVE, which name files or libraries; using "
                             "PINSHIM_CUDART=search, PINSHIM_STATS=0, PINSHIM_LIVE=auto\n");
}

Test(options, secure_execution_warns_only_about_what_was_set)
{
    struct pinshim_config cfg;
    struct fake_environment environment = {{"PINSHIM_STATS", "PINSHIM_CUDART"}, {"1", ""}};
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    log_set_fd(pipe_fds[1]);
    cr_assert_eq(config_load(&cfg, lookup, &environment, true), 0);
    log_set_fd(-1);
    close(pipe_fds[1]);
    ssize_t n = read(pipe_fds[0], logged, sizeof(logged) - 1);
    logged[n > 0 ? n : 0] = '\0';
    close(pipe_fds[0]);
    /* PINSHIM_STATS=1 names no file but the variable is ignored as a whole, as
     * secure_getenv would; an empty PINSHIM_CUDART means the default anyway. */
    cr_assert_eq(cfg.stats_mode, STATS_NONE);
    cr_assert_str_eq(logged, "pinshim: secure-execution mode (setuid, setgid or file "
                             "capabilities): ignoring PINSHIM_STATS, which name files or "
                             "libraries; using PINSHIM_STATS=0\n");
    /* Nothing set: nothing said. */
    struct fake_environment empty = {{NULL}, {NULL}};
    cr_assert_eq(pipe(pipe_fds), 0);
    log_set_fd(pipe_fds[1]);
    config_load(&cfg, lookup, &empty, true);
    log_set_fd(-1);
    close(pipe_fds[1]);
    char buffer[64];
    cr_assert_eq(read(pipe_fds[0], buffer, sizeof(buffer)), 0);
    close(pipe_fds[0]);
}

Test(options, secure_execution_of_this_test_is_off)
{
    /* The test runs as itself, not setuid: getauxval(AT_SECURE) is 0. */
    cr_assert_not(config_secure_execution());
}
