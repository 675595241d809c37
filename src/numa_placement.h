/* NUMA placement (issue 29): which node a registration's pages are on, and
 * which node a device sits nearest, so that the statistics can say how much
 * registered memory is remote from the GPU it is copied to.
 *
 * Pages are located without being touched or moved: move_pages(2) with no
 * target nodes answers each page's node. Where a seccomp profile refuses it
 * (Docker's default refuses it always, moby's profiles/seccomp/default.json)
 * get_mempolicy(2) with MPOL_F_NODE | MPOL_F_ADDR is asked for fewer pages:
 * Docker allows it with CAP_SYS_NICE (older profiles to all); where both
 * are refused the bytes are unknown. Large ranges are
 * sampled: at most NUMA_PLACEMENT_SAMPLES pages, evenly spread, each standing
 * for its share of the range (locked pages cannot migrate, so one look at
 * registration holds while the registration does). No allocation. */
#ifndef PINSHIM_NUMA_PLACEMENT_H
#define PINSHIM_NUMA_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NUMA_PLACEMENT_MAX_NODES 64
#define NUMA_PLACEMENT_SAMPLES 256
/* Pages asked one system call each when move_pages is refused. */
#define NUMA_PLACEMENT_FALLBACK_SAMPLES 16

struct numa_placement {
    uint64_t bytes[NUMA_PLACEMENT_MAX_NODES];
    uint64_t unknown_bytes; /* pages whose node could not be learned (or >= MAX_NODES) */
};

/* Adds the bytes of [start, end) (page-aligned) to out by node. False when
 * the kernel answered nothing (every byte then counts as unknown). */
bool numa_placement_locate(uintptr_t start, uintptr_t end, size_t page_size,
                           struct numa_placement *out);

/* The kernel's answer for a list of pages, as move_pages(2) gives it
 * (status[i]: a node, or a negative errno): the seam tests replace. */
typedef long (*numa_placement_query_fn)(unsigned long count, void **pages, int *status);
void numa_placement_set_query(numa_placement_query_fn replacement); /* NULL: the kernel's */

/* The NUMA node of a PCI device ("0000:17:00.0") from
 * /sys/bus/pci/devices/<id>/numa_node under sysfs_root ("/sys" when NULL);
 * -1 when unknown (no NUMA, no such file, a malformed id). */
int numa_placement_pci_node(const char *sysfs_root, const char *bus_id);

#endif
