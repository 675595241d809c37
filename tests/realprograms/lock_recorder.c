/* lock_recorder: a preload library that writes down every memory-locking call
 * a program makes, with its result, so a test can compute what the shim should
 * have registered from what the program really did. It is listed before
 * libpinshim.so in LD_PRELOAD (or alone, for the run without the shim) and
 * passes each call on unchanged.
 *
 * LOCK_RECORDER_LOG=path: one line per call, appended with one write(2):
 *   <call> <pid> 0x<addr> <length> <result> <errno>
 * for mlock, mlock2, munlock and munmap, "<call> <pid> 0 0 <result> <errno>"
 * for mlockall and munlockall, and "mmap <pid> 0x<mapping> <length> 0 0" for
 * every mapping mmap made (the shim cuts runs of locked pages where mappings
 * begin and end). It defines no allocator function, so the shim's check that
 * nothing precedes its free stays quiet. */
/* mmap and mmap64 are two symbols here: no off_t redirection. */
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define RECORDER_EXPORT __attribute__((visibility("default")))

static void record(const char *call, const void *addr, size_t length, long result, int error)
{
    const char *path = getenv("LOCK_RECORDER_LOG");
    if (path == NULL || path[0] == '\0')
        return;
    char line[160];
    int n = snprintf(line, sizeof(line), "%s %ld %#lx %zu %ld %d\n", call, (long)getpid(),
                     (unsigned long)(uintptr_t)addr, length, result, error);
    /* Raw open/write: the libc wrappers are fine, but no stdio (it allocates). */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return;
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
        /* nothing to do: a lost line makes the test fail visibly */
    }
    close(fd);
}

static void *next_function(const char *name)
{
    void *function = dlsym(RTLD_NEXT, name);
    if (function == NULL)
        abort(); /* no libc below us: nothing sensible to do */
    return function;
}

RECORDER_EXPORT int mlock(const void *addr, size_t len)
{
    static int (*next)(const void *, size_t);
    if (next == NULL)
        next = (int (*)(const void *, size_t))next_function("mlock");
    int result = next(addr, len);
    int saved_errno = errno;
    record("mlock", addr, len, result, result == 0 ? 0 : saved_errno);
    errno = saved_errno;
    return result;
}

RECORDER_EXPORT int mlock2(const void *addr, size_t len, unsigned int flags)
{
    static int (*next)(const void *, size_t, unsigned int);
    if (next == NULL)
        next = (int (*)(const void *, size_t, unsigned int))next_function("mlock2");
    int result = next(addr, len, flags);
    int saved_errno = errno;
    record("mlock2", addr, len, result, result == 0 ? 0 : saved_errno);
    errno = saved_errno;
    return result;
}

RECORDER_EXPORT int munlock(const void *addr, size_t len)
{
    static int (*next)(const void *, size_t);
    if (next == NULL)
        next = (int (*)(const void *, size_t))next_function("munlock");
    int result = next(addr, len);
    int saved_errno = errno;
    record("munlock", addr, len, result, result == 0 ? 0 : saved_errno);
    errno = saved_errno;
    return result;
}

RECORDER_EXPORT int mlockall(int flags)
{
    static int (*next)(int);
    if (next == NULL)
        next = (int (*)(int))next_function("mlockall");
    int result = next(flags);
    int saved_errno = errno;
    record("mlockall", NULL, 0, result, result == 0 ? 0 : saved_errno);
    errno = saved_errno;
    return result;
}

RECORDER_EXPORT int munlockall(void)
{
    static int (*next)(void);
    if (next == NULL)
        next = (int (*)(void))next_function("munlockall");
    int result = next();
    int saved_errno = errno;
    record("munlockall", NULL, 0, result, result == 0 ? 0 : saved_errno);
    errno = saved_errno;
    return result;
}

RECORDER_EXPORT int munmap(void *addr, size_t len)
{
    static int (*next)(void *, size_t);
    if (next == NULL)
        next = (int (*)(void *, size_t))next_function("munmap");
    int result = next(addr, len);
    int saved_errno = errno;
    record("munmap", addr, len, result, result == 0 ? 0 : saved_errno);
    errno = saved_errno;
    return result;
}

static void *record_mapping(void *result, size_t length)
{
    int saved_errno = errno;
    if (result != MAP_FAILED)
        record("mmap", result, length, 0, 0);
    errno = saved_errno;
    return result;
}

RECORDER_EXPORT void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    static void *(*next)(void *, size_t, int, int, int, off_t);
    if (next == NULL)
        next = (void *(*)(void *, size_t, int, int, int, off_t))next_function("mmap");
    return record_mapping(next(addr, length, prot, flags, fd, offset), length);
}

RECORDER_EXPORT void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    static void *(*next)(void *, size_t, int, int, int, off_t);
    if (next == NULL)
        next = (void *(*)(void *, size_t, int, int, int, off_t))next_function("mmap64");
    return record_mapping(next(addr, length, prot, flags, fd, offset), length);
}
