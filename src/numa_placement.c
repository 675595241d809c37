#include "numa_placement.h"

#include "io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_F_NODE (1 << 0)
#define MPOL_F_ADDR (1 << 1)

static long kernel_move_pages(unsigned long count, void **pages, int *status)
{
    /* No target nodes: nothing moves, status gets each page's node. */
    return syscall(SYS_move_pages, 0, count, pages, NULL, status, 0);
}

static numa_placement_query_fn query = kernel_move_pages;

void numa_placement_set_query(numa_placement_query_fn replacement)
{
    query = replacement != NULL ? replacement : kernel_move_pages;
}

/* The byte share of sample i of count over total bytes (the shares add up
 * to total exactly). */
static uint64_t share(uint64_t total, unsigned long i, unsigned long count)
{
    return (uint64_t)((unsigned __int128)total * (i + 1) / count -
                      (unsigned __int128)total * i / count);
}

/* The first page of the i-th of count equal slices of pages pages. */
static uintptr_t sample_address(uintptr_t start, size_t page_size, unsigned long pages,
                                unsigned long i, unsigned long count)
{
    unsigned long page = (unsigned long)((unsigned __int128)pages * i / count);
    return start + (uintptr_t)page * page_size;
}

/* get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR) for each of count samples. */
static long ask_page_by_page(uintptr_t start, size_t page_size, unsigned long pages,
                             unsigned long count, int *status)
{
    for (unsigned long i = 0; i < count; i++) {
        int node = -1;
        if (syscall(SYS_get_mempolicy, &node, NULL, 0UL,
                    (void *)sample_address(start, page_size, pages, i, count),
                    (unsigned long)(MPOL_F_NODE | MPOL_F_ADDR)) != 0)
            return -1;
        status[i] = node;
    }
    return 0;
}

static void add(struct numa_placement *out, int node, uint64_t bytes)
{
    if (node >= 0 && node < NUMA_PLACEMENT_MAX_NODES)
        out->bytes[node] += bytes;
    else
        out->unknown_bytes += bytes;
}

bool numa_placement_locate(uintptr_t start, uintptr_t end, size_t page_size,
                           struct numa_placement *out)
{
    if (end <= start || page_size == 0)
        return false;
    uint64_t total = end - start;
    unsigned long pages = (unsigned long)((total + page_size - 1) / page_size);
    unsigned long count = pages;
    if (count > NUMA_PLACEMENT_SAMPLES)
        count = NUMA_PLACEMENT_SAMPLES;
    void *addresses[NUMA_PLACEMENT_SAMPLES];
    int status[NUMA_PLACEMENT_SAMPLES];
    for (unsigned long i = 0; i < count; i++) {
        addresses[i] = (void *)sample_address(start, page_size, pages, i, count);
        status[i] = -ENOENT;
    }
    int saved_errno = errno;
    long answer = query(count, addresses, status);
    if (answer != 0 && query == kernel_move_pages) {
        /* Refused (seccomp, a kernel without NUMA): ask page by page, fewer. */
        if (count > NUMA_PLACEMENT_FALLBACK_SAMPLES)
            count = NUMA_PLACEMENT_FALLBACK_SAMPLES;
        answer = ask_page_by_page(start, page_size, pages, count, status);
    }
    errno = saved_errno;
    if (answer != 0) {
        out->unknown_bytes += total;
        return false;
    }
    for (unsigned long i = 0; i < count; i++)
        add(out, status[i], share(total, i, count));
    return true;
}

int numa_placement_pci_node(const char *sysfs_root, const char *bus_id)
{
    if (bus_id == NULL || bus_id[0] == '\0' || strchr(bus_id, '/') != NULL ||
        strstr(bus_id, "..") != NULL)
        return -1;
    char path[512];
    int length = snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/numa_node",
                          sysfs_root != NULL ? sysfs_root : "/sys", bus_id);
    if (length < 0 || (size_t)length >= sizeof(path))
        return -1;
    /* The driver may write the id in capitals (cuDeviceGetPCIBusId does);
     * sysfs names are in lower case. */
    for (char *at = path + length - (int)strlen(bus_id) - (int)strlen("/numa_node");
         *at != '/' && *at != '\0'; at++)
        if (*at >= 'A' && *at <= 'F')
            *at = (char)(*at - 'A' + 'a');
    int saved_errno = errno;
    char text[16];
    bool found = read_small_file(path, text, sizeof(text));
    errno = saved_errno;
    if (!found)
        return -1;
    char *after = NULL;
    long node = strtol(text, &after, 10);
    if (after == text || *after != '\0' || node < -1 || node > 1 << 20)
        return -1;
    return (int)node;
}
