/* Makes lock calls that a small RLIMIT_MEMLOCK refuses (and one it allows)
 * and prints each result with the errno it left, for comparison with and
 * without the shim. Run it through run_limited. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

static const char *errno_name(int error)
{
    switch (error) {
    case 0:
        return "0";
    case ENOMEM:
        return "ENOMEM";
    case EPERM:
        return "EPERM";
    case EAGAIN:
        return "EAGAIN";
    case EINVAL:
        return "EINVAL";
    default:
        return "other";
    }
}

static void report(const char *call, int result)
{
    int error = result == 0 ? 0 : errno;
    printf("%-28s %d %s (%d)\n", call, result, errno_name(error), error);
}

int main(void)
{
    struct rlimit limit;
    getrlimit(RLIMIT_MEMLOCK, &limit);
    printf("RLIMIT_MEMLOCK %llu\n", (unsigned long long)limit.rlim_cur);

    size_t big = (size_t)1 << 20, small = (size_t)32 << 10;
    void *buffer = NULL;
    if (posix_memalign(&buffer, 4096, big) != 0)
        return 1;
    memset(buffer, 1, big);

    errno = 0;
    report("mlock 1 MiB", mlock(buffer, big));
    errno = 0;
    report("mlock2 1 MiB", mlock2(buffer, big, 0));
    errno = 0;
    report("mlock2 ONFAULT 1 MiB", mlock2(buffer, big, MLOCK_ONFAULT));
    errno = 0;
    void *mapped =
        mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    report("mmap MAP_LOCKED 1 MiB", mapped == MAP_FAILED ? -1 : 0);
    if (mapped != MAP_FAILED)
        munmap(mapped, big);
    errno = 0;
    report("mlockall MCL_CURRENT", mlockall(MCL_CURRENT));
    errno = 0;
    report("mlock 32 KiB", mlock(buffer, small));
    errno = 0;
    report("munlock 32 KiB", munlock(buffer, small));
    errno = 0;
    report("munlock 1 MiB never locked", munlock(buffer, big));
    free(buffer);
    return 0;
}
