/* Frees locked memory without unlocking it, the way programs that rely on the
 * kernel to drop the lock do: a posix_memalign'ed buffer locked whole, and a
 * malloc'ed one locked at a page-aligned offset inside (as memtester does),
 * both freed while still locked. Prints the lengths it locked, so the test
 * knows what the shim should have registered, and a checksum of the data. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static unsigned long checksum(const unsigned char *data, size_t length)
{
    unsigned long sum = 0;
    for (size_t i = 0; i < length; i += 4096)
        sum = sum * 31 + data[i];
    return sum;
}

int main(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    size_t whole_length = (size_t)4 << 20;
    void *whole = NULL;
    if (posix_memalign(&whole, 64, whole_length) != 0) {
        fprintf(stderr, "posix_memalign failed\n");
        return 1;
    }
    memset(whole, 0x5a, whole_length);
    if (mlock(whole, whole_length) != 0) {
        fprintf(stderr, "mlock: %s\n", strerror(errno));
        return 1;
    }
    printf("locked %zu\n", whole_length);

    size_t inside_size = ((size_t)3 << 20) + 100;
    unsigned char *inside = malloc(inside_size);
    if (inside == NULL) {
        fprintf(stderr, "malloc failed\n");
        return 1;
    }
    memset(inside, 0xa5, inside_size);
    uintptr_t aligned = ((uintptr_t)inside + page - 1) & ~(uintptr_t)(page - 1);
    size_t inside_length = (inside_size - (aligned - (uintptr_t)inside)) & ~(page - 1);
    if (mlock((void *)aligned, inside_length) != 0) {
        fprintf(stderr, "mlock inside: %s\n", strerror(errno));
        return 1;
    }
    printf("locked %zu\n", inside_length);

    printf("checksum %lu %lu\n", checksum(whole, whole_length), checksum(inside, inside_size));
    free(whole); /* still locked */
    free(inside);
    printf("freed 2 locked buffers\n");
    return 0;
}
