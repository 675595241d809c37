/* Issue 18: every kind of locked mapping, registered with the flags the real
 * driver needs. A GPU program linked against the (fake) CUDA runtime: it
 * initialises CUDA, locks one kind of mapping, and prints what the driver
 * double holds for it ("key=value" lines test_mappings checks). The double
 * refuses what the real driver refuses (fake_cuda.h).
 *
 *   mappings read-only-file     a file mapped PROT_READ, MAP_SHARED (llama.cpp's
 *                               --mlock on its weights, vmtouch -l)
 *   mappings read-only-private  anonymous memory made PROT_READ, then locked
 *   mappings shared-file        a file mapped PROT_READ|PROT_WRITE, MAP_SHARED,
 *                               on the file system of DIRECTORY (argument)
 *   mappings shmem              a memfd and shared anonymous memory
 *   mappings two-protections    one lock over a writable and a read-only half
 *   mappings mprotect           locked read-only, then made writable; locked
 *                               writable, then made read-only
 *   mappings vvar               the vDSO's data pages (VM_IO, VM_PFNMAP)
 *   mappings no-access          PROT_NONE memory locked on fault (registered whole
 *                               with PINSHIM_ONFAULT=all)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FAKE_CUDA_NO_CUDA_PROTOTYPES
#include "fake_cuda.h"
#include "fake_cudart.h"

#define MIB ((size_t)1 << 20)

static size_t page;

static void die(const char *what)
{
    printf("harness: %s\n", what);
    fflush(stdout);
    _exit(2);
}

/* The driver double's registration holding address: its flags, or -1. */
static int registered_flags(const void *address)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*lookup)(const void *, struct fake_cuda_registration *) =
        driver ? (int (*)(const void *, struct fake_cuda_registration *))dlsym(driver,
                                                                               "fake_cuda_lookup")
               : NULL;
    if (lookup == NULL)
        die("the driver double is not loaded");
    struct fake_cuda_registration registration;
    return lookup(address, &registration) == 1 ? (int)registration.flags : -1;
}

static void report(const char *name, const void *address)
{
    printf("%s=%d\n", name, registered_flags(address));
}

static void *map_file(const char *directory, int prot, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/pinshim-mappings-XXXXXX", directory);
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
        die("a file to map");
    /* Written through write(2), so that a read-only mapping has content. */
    char block[4096];
    memset(block, 7, sizeof block);
    for (size_t done = 0; done < size; done += sizeof block)
        if (pwrite(fd, block, sizeof block, (off_t)done) != (ssize_t)sizeof block)
            die("write");
    void *memory = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    close(fd);
    unlink(path);
    if (memory == MAP_FAILED)
        die("mmap of the file");
    return memory;
}

static void *map_anonymous(size_t size, int flags)
{
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
        die("mmap");
    memset(memory, 1, size);
    return memory;
}

static void lock(void *memory, size_t size)
{
    if (mlock(memory, size) != 0)
        die("mlock");
}

static void unlock_and_report(const char *name, void *memory, size_t size)
{
    if (munlock(memory, size) != 0)
        die("munlock");
    report(name, memory);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    page = (size_t)sysconf(_SC_PAGESIZE);
    if (cudaFree(NULL) != 0)
        die("cudaFree(NULL)");
    const char *scenario = argc > 1 ? argv[1] : "";
    const size_t size = 8 * MIB;
    if (strcmp(scenario, "read-only-file") == 0) {
        char *memory = map_file(argc > 2 ? argv[2] : "/tmp", PROT_READ, size);
        lock(memory, size);
        report("flags", memory);
        report("flags_at_end", memory + size - 1);
        unlock_and_report("after_unlock", memory, size);
    } else if (strcmp(scenario, "read-only-private") == 0) {
        char *memory = map_anonymous(size, MAP_PRIVATE);
        if (mprotect(memory, size, PROT_READ) != 0)
            die("mprotect");
        lock(memory, size);
        report("flags", memory);
        unlock_and_report("after_unlock", memory, size);
    } else if (strcmp(scenario, "shared-file") == 0) {
        char *memory = map_file(argc > 2 ? argv[2] : ".", PROT_READ | PROT_WRITE, size);
        lock(memory, size);
        report("flags", memory);
        memory[0] = 1; /* the program goes on using it */
        unlock_and_report("after_unlock", memory, size);
    } else if (strcmp(scenario, "shmem") == 0) {
        int fd = (int)syscall(SYS_memfd_create, "mappings", 0);
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
            die("memfd");
        char *memfd = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (memfd == MAP_FAILED)
            die("mmap of the memfd");
        memset(memfd, 1, size);
        lock(memfd, size);
        report("memfd_flags", memfd);
        char *shared = map_anonymous(size, MAP_SHARED);
        lock(shared, size);
        report("shared_anonymous_flags", shared);
        unlock_and_report("memfd_after_unlock", memfd, size);
        unlock_and_report("shared_anonymous_after_unlock", shared, size);
    } else if (strcmp(scenario, "two-protections") == 0) {
        char *memory = map_anonymous(size, MAP_PRIVATE);
        if (mprotect(memory + size / 2, size / 2, PROT_READ) != 0)
            die("mprotect");
        lock(memory, size);
        report("writable_half", memory);
        report("read_only_half", memory + size / 2);
        report("read_only_end", memory + size - 1);
        unlock_and_report("writable_after_unlock", memory, size);
        report("read_only_after_unlock", memory + size / 2);
    } else if (strcmp(scenario, "mprotect") == 0) {
        char *read_only = map_anonymous(size, MAP_PRIVATE);
        if (mprotect(read_only, size, PROT_READ) != 0)
            die("mprotect");
        lock(read_only, size);
        report("read_only", read_only);
        if (mprotect(read_only, size, PROT_READ | PROT_WRITE) != 0)
            die("mprotect writable");
        report("made_writable", read_only);
        read_only[0] = 2;
        char *writable = map_anonymous(size, MAP_PRIVATE);
        lock(writable, size);
        report("writable", writable);
        if (mprotect(writable, size, PROT_READ) != 0)
            die("mprotect read-only");
        report("made_read_only", writable);
        if (mprotect(read_only + page, page, PROT_READ) != 0 ||
            mprotect(read_only + page, page, PROT_READ | PROT_WRITE) != 0)
            die("mprotect of one page");
        report("one_page_back_and_forth", read_only + page);
        unlock_and_report("made_writable_after_unlock", read_only, size);
        unlock_and_report("made_read_only_after_unlock", writable, size);
    } else if (strcmp(scenario, "vvar") == 0) {
        FILE *maps = fopen("/proc/self/maps", "r");
        char line[512];
        uintptr_t start = 0, end = 0;
        while (maps != NULL && fgets(line, sizeof line, maps) != NULL)
            if (strstr(line, "[vvar]") != NULL && sscanf(line, "%lx-%lx", &start, &end) == 2)
                break;
        if (maps != NULL)
            fclose(maps);
        if (start == 0) {
            printf("skipped=no [vvar] mapping\n");
            return 0;
        }
        printf("vvar_lock=%d\n", mlock((void *)start, end - start));
        report("flags", (void *)start);
        munlock((void *)start, end - start);
    } else if (strcmp(scenario, "no-access") == 0) {
        char *memory = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED)
            die("mmap");
        /* mlock faults pages in and fails here; a lock on fault does not. */
        printf("lock=%d\n", mlock2(memory, size, MLOCK_ONFAULT));
        report("flags", memory);
        munlock(memory, size);
    } else {
        die("unknown scenario");
    }
    return 0;
}
