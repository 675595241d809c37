/* numa_placement: where a range's pages lie, through the query seam (this
 * machine has one node), and the node of a PCI device from a sysfs tree the
 * test makes. */
#include "numa_placement.h"

#include "child.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096ul
#define BASE ((uintptr_t)0x7e0000000000)

static unsigned long asked;
static uintptr_t highest_asked;

/* Page i lies on node i % 2 (interleaved); pages from BASE + 1 GiB on node 70
 * (beyond the nodes counted). */
static long interleaved(unsigned long count, void **pages, int *status)
{
    asked += count;
    for (unsigned long i = 0; i < count; i++) {
        uintptr_t address = (uintptr_t)pages[i];
        highest_asked = address > highest_asked ? address : highest_asked;
        status[i] = address >= BASE + (1ul << 30) ? 70 : (int)((address - BASE) / PAGE % 2);
    }
    return 0;
}

static long refused(unsigned long count, void **pages, int *status)
{
    (void)count;
    (void)pages;
    (void)status;
    errno = EPERM;
    return -1;
}

static void reset(void)
{
    asked = 0;
    highest_asked = 0;
    numa_placement_set_query(interleaved);
}

static void restore(void)
{
    numa_placement_set_query(NULL);
}

TestSuite(numa_placement, .init = reset, .fini = restore);

Test(numa_placement, every_page_of_a_small_range)
{
    struct numa_placement placement = {0};
    cr_assert(numa_placement_locate(BASE, BASE + 10 * PAGE, PAGE, &placement));
    cr_assert_eq(asked, 10);
    cr_assert_eq(placement.bytes[0], 5 * PAGE);
    cr_assert_eq(placement.bytes[1], 5 * PAGE);
    cr_assert_eq(placement.unknown_bytes, 0);
}

/* 256 MiB: NUMA_PLACEMENT_SAMPLES pages spread over the whole range, whose
 * shares add up to the range exactly. */
Test(numa_placement, a_large_range_is_sampled)
{
    struct numa_placement placement = {0};
    uintptr_t end = BASE + (256ul << 20) + PAGE; /* 65537 pages: shares are uneven */
    cr_assert(numa_placement_locate(BASE, end, PAGE, &placement));
    cr_assert_eq(asked, NUMA_PLACEMENT_SAMPLES);
    cr_assert_geq(highest_asked, end - (end - BASE) / NUMA_PLACEMENT_SAMPLES - PAGE,
                  "the last slice is asked too");
    cr_assert_eq(placement.bytes[0] + placement.bytes[1], end - BASE);
    cr_assert_gt(placement.bytes[0], 0);
}

Test(numa_placement, nodes_beyond_the_counted_are_unknown)
{
    struct numa_placement placement = {0};
    uintptr_t start = BASE + (1ul << 30) - 2 * PAGE;
    cr_assert(numa_placement_locate(start, start + 4 * PAGE, PAGE, &placement));
    cr_assert_eq(placement.bytes[0] + placement.bytes[1], 2 * PAGE);
    cr_assert_eq(placement.unknown_bytes, 2 * PAGE);
}

Test(numa_placement, a_refusal_leaves_every_byte_unknown)
{
    numa_placement_set_query(refused);
    struct numa_placement placement = {0};
    errno = 1234;
    cr_assert_not(numa_placement_locate(BASE, BASE + 8 * PAGE, PAGE, &placement));
    cr_assert_eq(placement.unknown_bytes, 8 * PAGE);
    cr_assert_eq(errno, 1234, "errno is the caller's");
}

/* The kernel's own answer for memory of this process: a node it has. */
Test(numa_placement, the_kernel_answers_for_real_pages)
{
    numa_placement_set_query(NULL);
    size_t bytes = 64 * PAGE;
    char *memory = aligned_alloc(PAGE, bytes);
    cr_assert_not_null(memory);
    for (size_t i = 0; i < bytes; i += PAGE)
        memory[i] = 1;
    struct numa_placement placement = {0};
    bool located =
        numa_placement_locate((uintptr_t)memory, (uintptr_t)memory + bytes, PAGE, &placement);
    uint64_t known = 0;
    for (int node = 0; node < NUMA_PLACEMENT_MAX_NODES; node++)
        known += placement.bytes[node];
    cr_assert_eq(known + placement.unknown_bytes, bytes);
    if (located) /* a kernel without NUMA (or a sandbox) answers nothing */
        cr_assert_eq(known, bytes, "every touched page is on a node");
    free(memory);
}

static void write_text(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    cr_assert_not_null(file);
    fputs(text, file);
    fclose(file);
}

Test(numa_placement, pci_device_node_from_sysfs)
{
    char *root = make_temp_dir();
    cr_assert_not_null(root);
    char path[1024];
    const char *parts[] = {"bus", "bus/pci", "bus/pci/devices", "bus/pci/devices/0000:ab:00.0",
                           "bus/pci/devices/0000:17:00.0"};
    for (size_t i = 0; i < sizeof(parts) / sizeof(*parts); i++) {
        snprintf(path, sizeof(path), "%s/%s", root, parts[i]);
        cr_assert_eq(mkdir(path, 0755), 0);
    }
    snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:ab:00.0/numa_node", root);
    write_text(path, "1\n");
    snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:17:00.0/numa_node", root);
    write_text(path, "-1\n");
    cr_assert_eq(numa_placement_pci_node(root, "0000:AB:00.0"), 1, "the driver's capitals");
    cr_assert_eq(numa_placement_pci_node(root, "0000:ab:00.0"), 1);
    cr_assert_eq(numa_placement_pci_node(root, "0000:17:00.0"), -1, "no NUMA");
    cr_assert_eq(numa_placement_pci_node(root, "0000:18:00.0"), -1, "no such device");
    cr_assert_eq(numa_placement_pci_node(root, "../../etc"), -1);
    cr_assert_eq(numa_placement_pci_node(root, ""), -1);
    cr_assert_eq(numa_placement_pci_node(root, NULL), -1);
    free(root);
}
