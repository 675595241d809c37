#include "smaps.h"

#include <stdio.h>
#include <string.h>

bool smaps_huge_pages(uintptr_t start, uintptr_t end, unsigned long long *huge_bytes, bool *flagged)
{
    *huge_bytes = 0;
    *flagged = false;
    FILE *smaps = fopen("/proc/self/smaps", "r");
    if (smaps == NULL)
        return false;
    char line[1024];
    unsigned long low = 0, high = 0;
    while (fgets(line, sizeof(line), smaps) != NULL) {
        unsigned long a, b, kib;
        const char *space = strchr(line, ' '), *dash = strchr(line, '-');
        if (dash != NULL && space != NULL && dash < space &&
            sscanf(line, "%lx-%lx ", &a, &b) == 2) {
            low = a; /* a mapping's first line; its fields follow */
            high = b;
        } else if (low < end && start < high) {
            if (sscanf(line, "AnonHugePages: %lu kB", &kib) == 1)
                *huge_bytes += (unsigned long long)kib * 1024;
            else if (strncmp(line, "VmFlags:", 8) == 0 && strstr(line, " hg") != NULL)
                *flagged = true;
        }
    }
    fclose(smaps);
    return true;
}
