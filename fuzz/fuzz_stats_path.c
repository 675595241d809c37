/* libFuzzer target: stats_expand_path, the PINSHIM_STATS template expansion.
 * Input: 8 bytes of pid, 1 byte of output size, 1 byte of host-name length,
 * that many bytes of host name, then the template (each string ends at its
 * first NUL, as a C string would).
 *
 * Properties beyond "no crash, no sanitizer report": the result is what a
 * straightforward reference expansion gives (%p the pid, %h the host, %% a
 * percent sign, anything else as it is), the call fails exactly when that does
 * not fit in the output buffer, and nothing is written past the buffer. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "stats.h"

/* Each %h of the template can stand for 255 bytes of host name. */
#define REFERENCE_MAX (CONFIG_PATH_MAX * 256)

static void check(bool condition, const char *what)
{
    if (!condition) {
        fprintf(stderr, "fuzz_stats_path: %s\n", what);
        abort();
    }
}

static size_t reference_expand(const char *template_path, long pid, const char *host, char *out)
{
    size_t used = 0;
    for (const char *c = template_path; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            used += (size_t)sprintf(out + used, "%ld", pid);
            c++;
        } else if (c[0] == '%' && c[1] == 'h') {
            strcpy(out + used, host);
            used += strlen(host);
            c++;
        } else if (c[0] == '%' && c[1] == '%') {
            out[used++] = '%';
            c++;
        } else {
            out[used++] = *c;
        }
    }
    out[used] = '\0';
    return used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 10)
        return 0;
    long pid;
    memcpy(&pid, data, sizeof(pid));
    size_t out_size = data[8];
    size_t host_length = data[9];
    data += 10;
    size -= 10;
    if (host_length > size)
        host_length = size;
    char host[256];
    memcpy(host, data, host_length);
    host[host_length] = '\0';
    data += host_length;
    size -= host_length;
    char template_path[CONFIG_PATH_MAX];
    size_t template_length = size < sizeof(template_path) - 1 ? size : sizeof(template_path) - 1;
    memcpy(template_path, data, template_length);
    template_path[template_length] = '\0';

    /* The output in a heap block of exactly out_size bytes: ASan catches a
     * write past it. */
    char *out = malloc(out_size ? out_size : 1);
    check(out != NULL, "out of memory");
    static char expected[REFERENCE_MAX];
    size_t expected_length = reference_expand(template_path, pid, host, expected);
    bool fits = expected_length + 1 <= out_size;
    bool expanded = stats_expand_path(template_path, pid, host, out, out_size);
    check(expanded == fits, "stats_expand_path disagrees about what fits");
    if (expanded)
        check(strcmp(out, expected) == 0, "stats_expand_path expands differently");
    free(out);
    return 0;
}
