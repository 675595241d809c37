/* One rank of the 4-process job run by test_mpi.py, with libpinshim.so preloaded
 * and the fake CUDA runtime. Each rank locks buffers the way a communication
 * library would, moves data through them with MPI, then releases them by every
 * route the shim watches (munlock, free while locked, munmap of a MAP_LOCKED
 * mapping) and leaves one buffer locked at exit.
 *
 *   mpi_lock_ranks BUFFER_KIB MAPPED_KIB
 *
 * Per rank, the shim should count: register.ok 4 (three posix_memalign buffers
 * of BUFFER_KIB, one MAP_LOCKED mapping of MAPPED_KIB), one unregistration each
 * by munlock, free, munmap and exit, and one range of BUFFER_KIB live at exit.
 * The program checks the data and the shim's view after each step through the
 * public API, found with dlsym so the program does not link the shim, and exits
 * non-zero (after MPI_Abort) on the first mismatch. */
#include <mpi.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*is_registered_fn)(const void *ptr);

static int world_rank;

_Noreturn static void fail(const char *what)
{
    fprintf(stderr, "mpi_lock_ranks: rank %d: %s\n", world_rank, what);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

static void expect_registered(is_registered_fn is_registered, const void *buffer, int expected,
                              const char *what)
{
    if (is_registered(buffer) != expected) {
        char message[160];
        snprintf(message, sizeof(message), "%s: pinshim_is_registered is %d, expected %d", what,
                 is_registered(buffer), expected);
        fail(message);
    }
}

static size_t parse_kib(const char *text)
{
    char *end;
    unsigned long value = strtoul(text, &end, 10);
    if (*text == '\0' || *end != '\0' || value == 0 || value > 1024 * 1024)
        return 0;
    return (size_t)value * 1024;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    size_t buffer_bytes = argc == 3 ? parse_kib(argv[1]) : 0;
    size_t mapped_bytes = argc == 3 ? parse_kib(argv[2]) : 0;
    if (buffer_bytes == 0 || mapped_bytes == 0)
        fail("usage: mpi_lock_ranks BUFFER_KIB MAPPED_KIB");

    /* The shim must be in this rank: a job where the launcher dropped
     * LD_PRELOAD would otherwise pass with empty stats. */
    is_registered_fn is_registered =
        (is_registered_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    if (is_registered == NULL)
        fail("libpinshim.so is not loaded (LD_PRELOAD did not reach this rank)");

    /* Cache-line alignment on purpose: the shim gives requests this large whole
     * pages, so locking one buffer never locks a neighbour's page. */
    void *send_buffer, *receive_buffer, *ring_buffer;
    if (posix_memalign(&send_buffer, 64, buffer_bytes) != 0 ||
        posix_memalign(&receive_buffer, 64, buffer_bytes) != 0 ||
        posix_memalign(&ring_buffer, 64, buffer_bytes) != 0)
        fail("posix_memalign failed");
    if (mlock(send_buffer, buffer_bytes) != 0 || mlock(receive_buffer, buffer_bytes) != 0 ||
        mlock(ring_buffer, buffer_bytes) != 0)
        fail("mlock failed (RLIMIT_MEMLOCK too small?)");
    void *mapped = mmap(NULL, mapped_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (mapped == MAP_FAILED)
        fail("mmap(MAP_LOCKED) failed");
    expect_registered(is_registered, send_buffer, 1, "locked send buffer");
    expect_registered(is_registered, receive_buffer, 1, "locked receive buffer");
    expect_registered(is_registered, ring_buffer, 1, "locked ring buffer");
    expect_registered(is_registered, mapped, 1, "MAP_LOCKED mapping");

    /* Collective over the locked buffers: the sum over ranks of (rank + 1) * i. */
    size_t count = buffer_bytes / sizeof(int32_t);
    int32_t *send_values = send_buffer, *sums = receive_buffer;
    for (size_t i = 0; i < count; i++)
        send_values[i] = (int32_t)((size_t)(world_rank + 1) * (i % 1000));
    MPI_Allreduce(send_values, sums, (int)count, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
    int32_t rank_factor = world_size * (world_size + 1) / 2;
    for (size_t i = 0; i < count; i++)
        if (sums[i] != rank_factor * (int32_t)(i % 1000))
            fail("MPI_Allreduce result is wrong");

    /* Point to point around a ring: the first half goes to the next rank, the
     * second half comes from the previous one. */
    size_t half = count / 2;
    int32_t *ring_values = ring_buffer;
    for (size_t i = 0; i < half; i++)
        ring_values[i] = world_rank * 100000 + (int32_t)(i % 1000);
    int next = (world_rank + 1) % world_size;
    int previous = (world_rank + world_size - 1) % world_size;
    MPI_Sendrecv(ring_values, (int)half, MPI_INT32_T, next, 7, ring_values + half, (int)half,
                 MPI_INT32_T, previous, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (size_t i = 0; i < half; i++)
        if (ring_values[half + i] != previous * 100000 + (int32_t)(i % 1000))
            fail("MPI_Sendrecv result is wrong");

    /* Release by each route the shim watches; the ring buffer stays locked. */
    if (munlock(send_buffer, buffer_bytes) != 0)
        fail("munlock failed");
    expect_registered(is_registered, send_buffer, 0, "send buffer after munlock");
    free(send_buffer);
    free(receive_buffer); /* still locked: free must release the registration */
    if (munmap(mapped, mapped_bytes) != 0)
        fail("munmap failed");
    expect_registered(is_registered, mapped, 0, "mapping after munmap");
    expect_registered(is_registered, ring_buffer, 1, "ring buffer kept locked");

    MPI_Barrier(MPI_COMM_WORLD);
    printf("mpi_lock_ranks: rank %d of %d: ok\n", world_rank, world_size);
    MPI_Finalize();
    return 0; /* ring_buffer is left locked on purpose: live at exit */
}
