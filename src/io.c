#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

bool write_fully(int fd, const void *data, size_t length)
{
    const char *cursor = data;
    while (length > 0) {
        ssize_t written = write(fd, cursor, length);
        if (written < 0 && errno == EINTR)
            continue;
        if (written <= 0)
            return false;
        cursor += written;
        length -= (size_t)written;
    }
    return true;
}

bool read_small_file(const char *path, char *out, size_t out_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    size_t used = 0;
    while (used + 1 < out_size) {
        ssize_t n = read(fd, out + used, out_size - 1 - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        used += (size_t)n;
    }
    close(fd);
    out[used] = '\0';
    if (used > 0 && out[used - 1] == '\n')
        out[used - 1] = '\0';
    return used > 0;
}

const char *proc_stat_field(const char *stat, int field)
{
    /* After ") " comes field 3; each later field is one space further. */
    const char *cursor = strrchr(stat, ')');
    for (int at = 2; at < field && cursor != NULL; at++)
        cursor = strchr(cursor + 1, ' ');
    return cursor != NULL ? cursor + 1 : NULL;
}
