/* Writing whole buffers to a descriptor with write(2): no stdio, no allocation. */
#ifndef PINSHIM_IO_H
#define PINSHIM_IO_H

#include <stdbool.h>
#include <stddef.h>

/* Writes all of data, retrying on EINTR and short writes. False on error. */
bool write_fully(int fd, const void *data, size_t length);

#endif
