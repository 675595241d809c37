/* libFuzzer target: the option parser. The input is up to six lines, the
 * values of PINSHIM_REGISTER, _MIN_BYTES, _FLAGS, _CUDART, _STATS and _LOG in
 * that order (a missing line leaves the variable unset); the whole input is
 * also given to parse_byte_size.
 *
 * Properties beyond "no crash, no sanitizer report":
 *  - every accepted option, formatted back with config_format_value, parses
 *    to the same setting (PINSHIM_CUDART aside: empty formats as "search");
 *  - parse_byte_size agrees with a straightforward reference. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <unistd.h>

#include "log.h"
#include "options.h"

#define MAX_VALUE 2048

struct fuzz_values {
    char text[OPT_COUNT][MAX_VALUE];
    bool present[OPT_COUNT];
};

static const char *lookup(const char *name, void *context)
{
    const struct fuzz_values *values = context;
    for (int i = 0; i < OPT_COUNT; i++)
        if (strcmp(option_table[i].env_name, name) == 0)
            return values->present[i] ? values->text[i] : NULL;
    return NULL;
}

/* Digits, then at most one of k/K/m/M/g/G; no overflow. */
static bool reference_byte_size(const char *text, uint64_t *out)
{
    if (*text < '0' || *text > '9')
        return false;
    unsigned __int128 value = 0;
    const char *cursor = text;
    while (*cursor >= '0' && *cursor <= '9') {
        value = value * 10 + (unsigned)(*cursor - '0');
        if (value > UINT64_MAX)
            return false;
        cursor++;
    }
    const char *suffixes = "kKmMgG";
    const char *suffix = *cursor != '\0' ? strchr(suffixes, *cursor) : NULL;
    if (*cursor != '\0' && (suffix == NULL || cursor[1] != '\0'))
        return false;
    if (suffix != NULL)
        value <<= 10 * (1 + (suffix - suffixes) / 2);
    if (value > UINT64_MAX)
        return false;
    *out = (uint64_t)value;
    return true;
}

static void check(bool condition, const char *what)
{
    if (!condition) {
        fprintf(stderr, "fuzz_options: %s\n", what);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* Bad values are warned about on the log: keep them off the fuzzer's output. */
    int quiet = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (quiet >= 0)
        log_set_fd(quiet);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fuzz_values values;
    memset(&values, 0, sizeof(values));
    size_t start = 0;
    for (int option = 0; option < OPT_COUNT; option++) {
        size_t end = start;
        while (end < size && data[end] != '\n')
            end++;
        size_t length = end - start < MAX_VALUE - 1 ? end - start : MAX_VALUE - 1;
        memcpy(values.text[option], data + start, length);
        values.text[option][length] = '\0'; /* a NUL inside ends the value, as in environ */
        values.present[option] = true;
        if (end >= size)
            break;
        start = end + 1;
    }

    struct pinshim_config cfg;
    config_load(&cfg, lookup, &values, false);

    static const enum option_id round_trip[] = {OPT_REGISTER, OPT_MIN_BYTES, OPT_FLAGS, OPT_STATS,
                                                OPT_LOG};
    for (size_t i = 0; i < sizeof(round_trip) / sizeof(*round_trip); i++) {
        enum option_id id = round_trip[i];
        char text[CONFIG_PATH_MAX + 64], why[96];
        config_format_value(&cfg, id, text, sizeof(text));
        struct pinshim_config again = cfg;
        check(option_table[id].parse(text, &again, why, sizeof(why)),
              "a formatted value does not parse");
        check(again.register_enabled == cfg.register_enabled && again.min_bytes == cfg.min_bytes &&
                  again.register_flags == cfg.register_flags &&
                  again.stats_mode == cfg.stats_mode && again.log_level == cfg.log_level &&
                  strcmp(again.stats_path, cfg.stats_path) == 0,
              "a formatted value parses to another setting");
    }

    char whole[MAX_VALUE];
    size_t length = size < sizeof(whole) - 1 ? size : sizeof(whole) - 1;
    memcpy(whole, data, length);
    whole[length] = '\0';
    uint64_t parsed = 0, expected = 0;
    bool accepted = parse_byte_size(whole, &parsed);
    check(accepted == reference_byte_size(whole, &expected), "parse_byte_size accepts wrongly");
    check(!accepted || parsed == expected, "parse_byte_size gives the wrong value");
    return 0;
}
