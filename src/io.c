#include "io.h"

#include <errno.h>
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
