/* Issue 34: a GPU program that locks its buffers in pieces and copies them
 * whole, through the (fake) CUDA runtime it is linked against; the driver
 * double refuses a copy whose host range is not inside one registration or
 * outside all (NVIDIA's copy rule, fake_cuda.h). It prints "key=value"
 * lines: each copy's result (0, or the CUDA error), and, read from the
 * driver double, how many registrations hold the buffer and whether the
 * copies were pinned. test_copies runs it with and without the shim.
 *
 *   copies two-halves     16 MiB mapped once, locked in two 8 MiB calls
 *   copies grown          a lock, then one over it and its neighbour
 *   copies reversed       64 pieces of one mapping locked in reverse order
 *   copies shared-page    two heap buffers sharing a page, each locked
 *   copies side-by-side   eight mappings made one after another (the kernel
 *                         places them side by side), each locked; one unmapped
 *   copies half-locked    a buffer half locked, copied whole (a limit: the
 *                         copy mixes registered and unregistered memory)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_CUDA_NO_CUDA_PROTOTYPES
#include "fake_cuda.h"
#include "fake_cudart.h"

#define MIB ((size_t)1 << 20)

int cudaMalloc(void **device_pointer, size_t size);
int cudaMemcpy(void *destination, const void *source, size_t count, int kind);
int cudaMemcpyAsync(void *destination, const void *source, size_t count, int kind, void *stream);
int cudaStreamSynchronize(void *stream);

static size_t page;
static void *device;
static size_t device_size;

static void die(const char *what)
{
    printf("harness: %s\n", what);
    fflush(stdout);
    _exit(2);
}

static void *driver_symbol(const char *name)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *symbol = driver != NULL ? dlsym(driver, name) : NULL;
    if (symbol == NULL)
        die("the driver double is not loaded");
    return symbol;
}

/* How many live registrations of the driver double overlap [start, end). */
static size_t registrations_in(const void *start, size_t length)
{
    size_t (*snapshot)(struct fake_cuda_registration *, size_t) =
        (size_t(*)(struct fake_cuda_registration *, size_t))driver_symbol("fake_cuda_snapshot");
    static struct fake_cuda_registration ranges[256];
    size_t count = snapshot(ranges, 256), overlapping = 0;
    uintptr_t low = (uintptr_t)start, high = low + length;
    for (size_t i = 0; i < count && i < 256; i++)
        overlapping += ranges[i].state == FAKE_CUDA_REGISTRATION_LIVE && ranges[i].base < high &&
                       low < ranges[i].base + ranges[i].size;
    return overlapping;
}

static uint64_t copies_of(int kind)
{
    uint64_t (*count)(int) = (uint64_t(*)(int))driver_symbol("fake_cuda_copy_count");
    return count(kind);
}

/* Copies [host, host + length) to the device and back, synchronously and
 * asynchronously, and checks the bytes; prints each call's result. */
static void copy_whole(const char *name, unsigned char *host, size_t length)
{
    if (length > device_size)
        die("the device buffer is too small");
    for (size_t i = 0; i < length; i += 509)
        host[i] = (unsigned char)(i / 509 + 3);
    int to_device = cudaMemcpy(device, host, length, 1);
    memset(host, 0, length);
    int to_host = cudaMemcpy(host, device, length, 2);
    int async_to_device = cudaMemcpyAsync(device, host, length, 1, NULL);
    int async_to_host = cudaMemcpyAsync(host, device, length, 2, NULL);
    int synchronised = cudaStreamSynchronize(NULL);
    bool intact = to_device == 0 && to_host == 0;
    for (size_t i = 0; i < length && intact; i += 509)
        intact = host[i] == (unsigned char)(i / 509 + 3);
    printf("%s_to_device=%d\n%s_to_host=%d\n%s_async=%d\n%s_intact=%d\n", name, to_device, name,
           to_host, name, async_to_device != 0 ? async_to_device : async_to_host, name,
           intact && synchronised == 0);
}

static void *map(size_t size)
{
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
        die("mmap");
    return memory;
}

static void lock(const void *address, size_t length)
{
    if (mlock(address, length) != 0)
        die("mlock (RLIMIT_MEMLOCK?)");
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: copies SCENARIO");
    page = (size_t)sysconf(_SC_PAGESIZE);
    const char *scenario = argv[1];
    device_size = 16 * MIB;
    /* A GPU program: it starts CUDA and takes device memory first. */
    if (cudaMalloc(&device, device_size) != 0)
        die("cudaMalloc");
    uint64_t pinned_before = copies_of(FAKE_CUDA_COPY_PINNED);
    if (strcmp(scenario, "two-halves") == 0) {
        unsigned char *buffer = map(16 * MIB);
        lock(buffer, 8 * MIB);
        lock(buffer + 8 * MIB, 8 * MIB);
        printf("registrations=%zu\n", registrations_in(buffer, 16 * MIB));
        copy_whole("whole", buffer, 16 * MIB);
    } else if (strcmp(scenario, "grown") == 0) {
        unsigned char *buffer = map(8 * MIB);
        lock(buffer, 2 * MIB);
        lock(buffer, 8 * MIB);
        printf("registrations=%zu\n", registrations_in(buffer, 8 * MIB));
        copy_whole("whole", buffer, 8 * MIB);
    } else if (strcmp(scenario, "reversed") == 0) {
        unsigned char *buffer = map(4 * MIB);
        size_t piece = 4 * MIB / 64;
        for (size_t i = 64; i-- > 0;)
            lock(buffer + i * piece, piece);
        printf("registrations=%zu\n", registrations_in(buffer, 4 * MIB));
        copy_whole("whole", buffer, 4 * MIB);
    } else if (strcmp(scenario, "shared-page") == 0) {
        /* Two heap buffers, the second right after the first, sharing the
         * first one's last page (malloc, not page-rounded). */
        size_t first_length = 100 * 1024 + 200, second_length = 100 * 1024;
        unsigned char *first = malloc(first_length);
        unsigned char *second = malloc(second_length);
        if (first == NULL || second == NULL)
            die("malloc");
        uintptr_t first_last = ((uintptr_t)first + first_length - 1) & ~(page - 1);
        printf("share_a_page=%d\n", ((uintptr_t)second & ~(page - 1)) == first_last);
        lock(first, first_length);
        lock(second, second_length);
        printf("registrations=%zu\n",
               registrations_in(first, (size_t)(second + second_length - first)));
        copy_whole("first", first, first_length);
        copy_whole("second", second, second_length);
        munlock(first, first_length);
        munlock(second, second_length);
        free(first);
        free(second);
    } else if (strcmp(scenario, "side-by-side") == 0) {
        /* Eight mmap calls, placed side by side on purpose (the kernel does
         * so for consecutive calls; here each replaces a piece of a
         * reservation of the program's own, which makes it certain). */
        unsigned char *range =
            mmap(NULL, 8 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (range == MAP_FAILED)
            die("mmap a reservation");
        unsigned char *buffers[8];
        for (int i = 0; i < 8; i++) {
            buffers[i] = mmap(range + (size_t)i * MIB, MIB, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (buffers[i] != range + (size_t)i * MIB)
                die("mmap side by side");
            lock(buffers[i], MIB);
        }
        size_t registered = 0;
        for (int i = 0; i < 8; i++)
            registered += registrations_in(buffers[i], MIB);
        printf("registrations=%zu\n", registered);
        uint64_t (*calls)(int) = (uint64_t(*)(int))driver_symbol("fake_cuda_call_count");
        uint64_t registers = calls(FAKE_CU_CALL_MEM_HOST_REGISTER_V2);
        munmap(buffers[3], MIB);
        printf("registered_again=%llu\n",
               (unsigned long long)(calls(FAKE_CU_CALL_MEM_HOST_REGISTER_V2) - registers));
        copy_whole("neighbour", buffers[4], MIB);
    } else if (strcmp(scenario, "half-locked") == 0) {
        unsigned char *buffer = map(4 * MIB);
        lock(buffer, 2 * MIB);
        copy_whole("whole", buffer, 4 * MIB);
        copy_whole("locked_half", buffer, 2 * MIB);
    } else {
        die("unknown scenario");
    }
    printf("pinned_copies=%llu\n",
           (unsigned long long)(copies_of(FAKE_CUDA_COPY_PINNED) - pinned_before));
    return 0;
}
