#include "memory_map.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static bool parse_hex(const char **cursor, const char *limit, uintptr_t *value)
{
    uintptr_t result = 0;
    const char *at = *cursor;
    int digits = 0;
    for (; at < limit; at++, digits++) {
        char c = *at;
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else
            break;
        result = result * 16 + digit;
    }
    *cursor = at;
    *value = result;
    return digits > 0;
}

bool memory_map_find(uintptr_t addr, uintptr_t *start, uintptr_t *end)
{
    int saved_errno = errno;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved_errno;
        return false;
    }
    char buffer[4096];
    size_t held = 0;
    bool found = false, done = false;
    while (!found && !done) {
        ssize_t n = read(fd, buffer + held, sizeof(buffer) - held);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            done = true;
        else
            held += (size_t)n;
        /* Whole lines only; a partial last line waits for the next read. */
        const char *line = buffer;
        const char *limit = buffer + held;
        for (;;) {
            const char *newline = memchr(line, '\n', (size_t)(limit - line));
            if (newline == NULL)
                break;
            const char *cursor = line;
            uintptr_t low, high;
            if (parse_hex(&cursor, newline, &low) && cursor < newline && *cursor == '-' &&
                (cursor++, parse_hex(&cursor, newline, &high)) && low <= addr && addr < high) {
                *start = low;
                *end = high;
                found = true;
                break;
            }
            line = newline + 1;
        }
        size_t consumed = (size_t)(line - buffer);
        memmove(buffer, line, held - consumed);
        held -= consumed;
        if (held == sizeof(buffer)) /* a line longer than the buffer: skip it */
            held = 0;
    }
    close(fd);
    errno = saved_errno;
    return found;
}
