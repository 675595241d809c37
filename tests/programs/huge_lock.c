/* Locks memory as the programs pinshim is for do, and says what pages it got
 * (test huge_pages). It prints "key=value" lines:
 *   deepspeed MIB   posix_memalign(4096, MIB) untouched, mlock: DeepSpeed's
 *                   native pinning; the buffer's PMD alignment, its huge bytes
 *                   (AnonHugePages of its mappings in /proc/self/smaps), whether
 *                   a mapping of it carries MADV_HUGEPAGE's flag, and its bytes
 *                   still zero.
 *   unlocked MIB    the same buffer touched and never locked.
 *   prefilled MIB   written before the lock.
 *   onfault MIB     mlock2(MLOCK_ONFAULT), then touched.
 *   mremap          16 MiB mapped, the middle 8 MiB locked and unlocked, then
 *                   the whole mapping moved and grown by mremap.
 *   aligned MIB     aligned_alloc(64, MIB), memalign(64, MIB), valloc(MIB):
 *                   whether each is PMD-aligned.
 * The program has no GPU: it links neither the shim nor a runtime. */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "smaps.h"

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

#define MIB ((size_t)1 << 20)

static long pmd_size(void)
{
    FILE *file = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
    long size = 0;
    if (file != NULL) {
        if (fscanf(file, "%ld", &size) != 1)
            size = 0;
        fclose(file);
    }
    return size;
}

static void report(const char *buffer, size_t length)
{
    unsigned long long huge_bytes;
    bool flagged;
    long pmd = pmd_size();
    printf("pmd_aligned=%d\n", pmd > 0 && (uintptr_t)buffer % (uintptr_t)pmd == 0);
    smaps_huge_pages((uintptr_t)buffer, (uintptr_t)buffer + length, &huge_bytes, &flagged);
    printf("huge_bytes=%llu\n", huge_bytes);
    printf("flagged=%d\n", flagged);
    int zero = 1;
    for (size_t at = 0; at < length; at += 4096)
        zero &= buffer[at] == 0;
    printf("zero=%d\n", zero);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    size_t length = (argc > 2 ? strtoull(argv[2], NULL, 10) : 64) * MIB;
    if (strcmp(mode, "mremap") == 0) {
        length = 16 * MIB;
        char *mapping =
            mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapping == MAP_FAILED)
            return 1;
        char *middle = (char *)(((uintptr_t)mapping + 4 * MIB) & ~(uintptr_t)(2 * MIB - 1));
        printf("mlock=%d\n", mlock(middle, 8 * MIB));
        printf("munlock=%d\n", munlock(middle, 8 * MIB));
        void *moved = mremap(mapping, length, 2 * length, MREMAP_MAYMOVE);
        printf("mremap=%d\n", moved == MAP_FAILED ? errno : 0);
        return 0;
    }
    if (strcmp(mode, "aligned") == 0) {
        long pmd = pmd_size();
        void *blocks[] = {aligned_alloc(64, length), memalign(64, length), valloc(length)};
        const char *names[] = {"aligned_alloc", "memalign", "valloc"};
        for (int i = 0; i < 3; i++) {
            printf("%s_pmd_aligned=%d\n", names[i],
                   blocks[i] != NULL && pmd > 0 && (uintptr_t)blocks[i] % (uintptr_t)pmd == 0);
            free(blocks[i]);
        }
        return 0;
    }
    void *memory = NULL;
    if (posix_memalign(&memory, 4096, length) != 0)
        return 1;
    char *buffer = memory;
    int result = 0;
    if (strcmp(mode, "deepspeed") == 0) {
        result = mlock(buffer, length);
    } else if (strcmp(mode, "prefilled") == 0) {
        memset(buffer, 0, length);
        result = mlock(buffer, length);
    } else if (strcmp(mode, "onfault") == 0) {
        result = mlock2(buffer, length, MLOCK_ONFAULT);
        for (size_t at = 0; at < length; at += 4096)
            ((volatile char *)buffer)[at] = 0;
    } else if (strcmp(mode, "unlocked") == 0) {
        for (size_t at = 0; at < length; at += 4096)
            ((volatile char *)buffer)[at] = 0;
    } else {
        return 2;
    }
    printf("lock=%d\n", result == 0 ? 0 : errno);
    report(buffer, length);
    if (strcmp(mode, "unlocked") != 0)
        munlock(buffer, length);
    free(buffer);
    return 0;
}
