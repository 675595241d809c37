/* numa_cost: what locating a registration's pages on NUMA nodes costs
 * (PINSHIM_NUMA, issue 29), per registration and per GiB, as a ratio to the
 * kernel's own mlock of the same range, measured in one run.
 *
 * For each size a private anonymous mapping is touched, then per repetition
 * mlock'ed (timed), located with numa_placement_locate (timed: move_pages(2)
 * for at most NUMA_PLACEMENT_SAMPLES pages, or get_mempolicy page by page
 * where move_pages is refused) and munlock'ed. The shim adds the locate to
 * every registration; the ratio says how it compares with the lock the
 * program pays anyway. Medians of the repetitions. */
#include "bench_util.h"
#include "numa_placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void usage(void)
{
    fprintf(stderr, "usage: numa_cost [--sizes-kib 64,1024,16384,262144,1048576] [--reps N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *sizes_text = "64,1024,16384,262144,1048576";
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes-kib") == 0 && i + 1 < argc)
            sizes_text = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            usage();
    }
    if (reps < 1 || reps > 1000)
        usage();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    double *lock_seconds = calloc((size_t)reps, sizeof(double));
    double *locate_seconds = calloc((size_t)reps, sizeof(double));
    if (lock_seconds == NULL || locate_seconds == NULL)
        return 1;
    printf("%10s %12s %12s %14s %10s %s\n", "size", "mlock us", "locate us", "locate us/GiB",
           "locate/mlock", "nodes");
    char *copy = strdup(sizes_text);
    for (char *item = strtok(copy, ","); item != NULL; item = strtok(NULL, ",")) {
        size_t bytes = (size_t)strtoull(item, NULL, 10) * 1024;
        bytes = (bytes + page - 1) / page * page;
        char *memory =
            mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        for (size_t offset = 0; offset < bytes; offset += page)
            memory[offset] = 1;
        struct numa_placement placement;
        bool located = true;
        for (int r = 0; r < reps; r++) {
            double began = bench_now_seconds();
            if (mlock(memory, bytes) != 0) {
                perror("mlock (RLIMIT_MEMLOCK?)");
                return 1;
            }
            double locked = bench_now_seconds();
            memset(&placement, 0, sizeof(placement));
            located = numa_placement_locate((uintptr_t)memory, (uintptr_t)memory + bytes, page,
                                            &placement) &&
                      located;
            double done = bench_now_seconds();
            munlock(memory, bytes);
            lock_seconds[r] = locked - began;
            locate_seconds[r] = done - locked;
        }
        double lock = bench_median(lock_seconds, (size_t)reps);
        double locate = bench_median(locate_seconds, (size_t)reps);
        char nodes[256] = "";
        for (int node = 0; node < NUMA_PLACEMENT_MAX_NODES; node++)
            if (placement.bytes[node] != 0)
                snprintf(nodes + strlen(nodes), sizeof(nodes) - strlen(nodes), "%s%d:%zu MiB",
                         nodes[0] ? " " : "", node, (size_t)(placement.bytes[node] >> 20));
        if (!located)
            snprintf(nodes, sizeof(nodes), "unknown (the kernel answered nothing)");
        printf("%7zu KiB %12.1f %12.1f %14.1f %10.3f %s\n", bytes / 1024, lock * 1e6, locate * 1e6,
               locate * 1e6 / ((double)bytes / (1 << 30)), locate / lock, nodes);
        munmap(memory, bytes);
    }
    free(copy);
    free(lock_seconds);
    free(locate_seconds);
    return 0;
}
