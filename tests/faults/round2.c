/* Reproductions of the failures issue 9 (correctness, round 2) reported, one
 * mode each, run under LD_PRELOAD=libpinshim.so with the fake CUDA runtime
 * (PINSHIM_CONTEXT=create, PINSHIM_ASYNC=off) by test_round2.c. Each mode
 * prints "ok ..." when the shim behaves and "BUG: ..." when the failure
 * shows; exit status 0 either way unless the reproduction itself went wrong.
 *
 *   release_halves N [munmap]  mlock 4 MiB, then two threads released by a
 *                              barrier munlock (or munmap) one half each, N
 *                              times: no registration may stay on the
 *                              unlocked (unmapped) memory
 *   neighbour_free             b = malloc(200); a = malloc(100 KiB) on the
 *                              same page; mlock(a); free(b): a stays
 *                              registered (cudaPointerGetAttributes)
 *   onfault_reservation        an 8 GiB MAP_NORESERVE reservation, one page
 *                              touched, mlock2(MLOCK_ONFAULT) of all of it:
 *                              only the resident page is registered
 *   cancelled_waiter           a thread waiting inside munlock for another
 *                              thread's registration is cancelled; the next
 *                              unrelated munlock must not hang (alarm: 10 s)
 *   exit_summary_fd FILE       closes every descriptor from 3 up, opens FILE
 *                              (it gets 3), writes "data\n", and closes
 *                              stderr at exit as coreutils do: the exit
 *                              summary must not land in FILE
 *   fork_child                 mlock 4 MiB, fork; the child reports whether
 *                              it has the buffer's pages (mincore)
 *   exit_now [_Exit]           mlock 4 MiB and end with _exit(3) (or _Exit(3))
 *                              holding it: the statistics are still written
 *                              (issue 10) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAKE_CUDART_NO_CUDA_PROTOTYPES
#include "fake_cudart.h"

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

static size_t (*fake_snapshot)(struct fake_cudart_range *, size_t);
static int (*pointer_attributes)(void *, const void *);
static size_t page;

/* The fake runtime the shim loaded (PINSHIM_CUDART), or the one it forwards
 * to (the slow runtime's dependency). */
static bool find_fake(void)
{
    const char *path = getenv("PINSHIM_CUDART");
    void *handle = path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (handle == NULL)
        handle = dlopen("libfake_cudart.so", RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        return false;
    fake_snapshot =
        (size_t(*)(struct fake_cudart_range *, size_t))dlsym(handle, "fake_cudart_snapshot");
    pointer_attributes = (int (*)(void *, const void *))dlsym(handle, "cudaPointerGetAttributes");
    return fake_snapshot != NULL && pointer_attributes != NULL;
}

/* Bytes of [start, end) covered by live registrations. */
static size_t registered_bytes(uintptr_t start, uintptr_t end)
{
    static struct fake_cudart_range ranges[4096];
    size_t count = fake_snapshot(ranges, 4096), covered = 0;
    for (size_t i = 0; i < count; i++) {
        uintptr_t from = ranges[i].base > start ? ranges[i].base : start;
        uintptr_t to =
            ranges[i].base + ranges[i].size < end ? ranges[i].base + ranges[i].size : end;
        if (from < to)
            covered += to - from;
    }
    return covered;
}

/* ---- release_halves ---- */

static char *halves_region;
static size_t halves_length;
static bool halves_unmap;
static pthread_barrier_t halves_barrier;

static void *release_half(void *argument)
{
    uintptr_t which = (uintptr_t)argument;
    char *half = halves_region + which * (halves_length / 2);
    pthread_barrier_wait(&halves_barrier);
    if (which == 1 && halves_unmap)
        munmap(half, halves_length / 2);
    else
        munlock(half, halves_length / 2);
    return NULL;
}

static int release_halves(long rounds, bool unmap)
{
    halves_length = 4 << 20;
    halves_unmap = unmap;
    long stale = 0;
    for (long round = 0; round < rounds; round++) {
        halves_region =
            mmap(NULL, halves_length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (halves_region == MAP_FAILED || mlock(halves_region, halves_length) != 0) {
            perror("mmap/mlock");
            return 2;
        }
        if (round == 0 && !find_fake()) {
            printf("the fake runtime is not loaded\n");
            return 2;
        }
        if (registered_bytes((uintptr_t)halves_region, (uintptr_t)halves_region + halves_length) !=
            halves_length) {
            printf("the lock was not registered\n");
            return 2;
        }
        pthread_barrier_init(&halves_barrier, NULL, 2);
        pthread_t threads[2];
        for (uintptr_t i = 0; i < 2; i++)
            pthread_create(&threads[i], NULL, release_half, (void *)i);
        for (int i = 0; i < 2; i++)
            pthread_join(threads[i], NULL);
        pthread_barrier_destroy(&halves_barrier);
        if (registered_bytes((uintptr_t)halves_region, (uintptr_t)halves_region + halves_length) !=
            0)
            stale++;
        munmap(halves_region, halves_length);
    }
    if (stale != 0)
        printf("BUG: in %ld of %ld rounds a half stayed registered after it was %s\n", stale,
               rounds, unmap ? "unmapped" : "unlocked");
    else
        printf("ok: %ld rounds, nothing stayed registered\n", rounds);
    return 0;
}

/* ---- neighbour_free ---- */

static int neighbour_free(void)
{
    /* Small blocks first, so a and b come from the same stretch of heap. */
    char *b = NULL, *a = NULL;
    for (int attempt = 0; attempt < 64; attempt++) {
        b = malloc(200);
        a = malloc(100 * 1024);
        if (((uintptr_t)b & ~(page - 1)) == ((uintptr_t)a & ~(page - 1)))
            break;
    }
    if (((uintptr_t)b & ~(page - 1)) != ((uintptr_t)a & ~(page - 1))) {
        printf("could not place a and b on one page\n");
        return 2;
    }
    memset(a, 1, 100 * 1024);
    if (mlock(a, 100 * 1024) != 0 || !find_fake()) {
        printf("mlock failed or the fake runtime is not loaded\n");
        return 2;
    }
    int type = -1;
    if (pointer_attributes(&type, a) != 0 || type != 1) {
        printf("a was not registered after mlock\n");
        return 2;
    }
    free(b);
    type = -1;
    pointer_attributes(&type, a);
    if (type != 1)
        printf("BUG: freeing the neighbour b un-registered the locked block a\n");
    else
        printf("ok: a is still registered after free(b)\n");
    munlock(a, 100 * 1024);
    free(a);
    return 0;
}

/* ---- onfault_reservation ---- */

static long resident_kib(void)
{
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (status != NULL && fgets(line, sizeof(line), status))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (status != NULL)
        fclose(status);
    return kib;
}

static int onfault_reservation(void)
{
    size_t size = (size_t)8 << 30;
    char *reservation = mmap(NULL, size, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reservation == MAP_FAILED) {
        perror("mmap 8 GiB");
        return 2;
    }
    reservation[5 * page] = 1; /* one resident page */
    long before = resident_kib();
    if (mlock2(reservation, size, MLOCK_ONFAULT) != 0) {
        perror("mlock2");
        return 2;
    }
    long after = resident_kib();
    size_t registered =
        find_fake() ? registered_bytes((uintptr_t)reservation, (uintptr_t)reservation + size) : 0;
    if (registered > 64 * page)
        printf("BUG: %zu MiB of the ONFAULT reservation were registered (resident %ld -> %ld "
               "KiB)\n",
               registered >> 20, before, after);
    else if (after - before > 64 * 1024)
        printf("BUG: the lock made %ld KiB resident\n", after - before);
    else
        printf("ok: %zu bytes registered, resident %ld -> %ld KiB\n", registered, before, after);
    munlock(reservation, size);
    munmap(reservation, size);
    return 0;
}

/* ---- cancelled_waiter ---- */

static char *waiter_buffer;
static const size_t waiter_length = 1 << 20;

static void sleep_ms(long milliseconds)
{
    struct timespec delay = {milliseconds / 1000, (milliseconds % 1000) * 1000000};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
    }
}

static void *slow_locker(void *argument)
{
    (void)argument;
    if (mlock(waiter_buffer, waiter_length) != 0) /* registration takes 300 ms */
        perror("mlock");
    return NULL;
}

static void *waiting_unlocker(void *argument)
{
    (void)argument;
    sleep_ms(50);
    munlock(waiter_buffer, waiter_length); /* waits for the registration */
    return NULL;
}

/* A watchdog rather than alarm(): the signal may be blocked where this runs. */
static void *watchdog(void *argument)
{
    (void)argument;
    sleep_ms(10000);
    static const char message[] =
        "BUG: an munlock after a cancelled waiter hung (the shim's lock was left held)\n";
    if (write(STDOUT_FILENO, message, sizeof(message) - 1) < 0)
        _exit(2);
    _exit(0);
    return NULL;
}

static int cancelled_waiter(void)
{
    waiter_buffer =
        mmap(NULL, 2 * waiter_length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (waiter_buffer == MAP_FAILED)
        return 2;
    pthread_t locker, unlocker;
    pthread_create(&locker, NULL, slow_locker, NULL);
    pthread_create(&unlocker, NULL, waiting_unlocker, NULL);
    sleep_ms(150); /* the unlocker waits inside munlock now */
    pthread_cancel(unlocker);
    pthread_join(locker, NULL);
    void *outcome = NULL;
    pthread_t dog;
    pthread_create(&dog, NULL, watchdog, NULL);
    pthread_join(unlocker, &outcome);
    /* An unrelated lock and unlock after it. */
    char *other = waiter_buffer + waiter_length;
    if (mlock(other, waiter_length) != 0 || munlock(other, waiter_length) != 0)
        perror("mlock/munlock");
    printf("ok: the cancelled waiter %s; later calls went through\n",
           outcome == PTHREAD_CANCELED ? "was cancelled" : "finished");
    return 0;
}

/* ---- exit_summary_fd ---- */

static void close_stderr_at_exit(void)
{
    fclose(stderr); /* as coreutils' close_stdout does */
}

static int exit_summary_fd(const char *path)
{
    char *buffer = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED || mlock(buffer, 1 << 20) != 0)
        return 2;
    /* Daemon-style: close every descriptor from 3 up. */
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
        for (int fd = 3; fd < 65536; fd++)
            close(fd);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd != 3) {
        printf("the data file got descriptor %d, not 3\n", fd);
        return 2;
    }
    if (write(fd, "data\n", 5) != 5)
        return 2;
    atexit(close_stderr_at_exit);
    printf("ok: wrote the data file\n");
    fflush(stdout);
    return 0; /* the file stays open, as a program's output would */
}

/* ---- fork_child ---- */

static int fork_child(void)
{
    size_t length = 4 << 20;
    char *buffer = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED || mlock(buffer, length) != 0)
        return 2;
    memset(buffer, 7, length);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        unsigned char vector[1];
        bool present = mincore(buffer, page, vector) == 0;
        printf("child: the buffer is %s\n", present ? "there" : "absent");
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    munlock(buffer, length);
    munmap(buffer, length);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 2;
}

/* ---- exit_now ---- */

static int exit_now(bool upper)
{
    size_t length = 4 << 20;
    char *buffer = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED || mlock(buffer, length) != 0)
        return 2;
    if (getenv("ROUND2_EXIT_IN_FLIGHT") != NULL) {
        /* Ends while the shim's thread is inside the registration (the fake
         * driver sleeps in it, FAKE_CUDA_REGISTER_SECONDS_PER_GIB). */
        size_t (*in_flight)(void) = NULL;
        for (int i = 0; i < 3000 && (in_flight == NULL || in_flight() == 0); i++) {
            void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
            if (driver != NULL) {
                in_flight = (size_t(*)(void))dlsym(driver, "fake_cuda_registrations_in_flight");
                dlclose(driver);
            }
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        if (in_flight == NULL || in_flight() == 0)
            return 2;
        printf("ok: a registration is in flight\n");
    }
    printf("ok: locked, ending with %s\n", upper ? "_Exit" : "_exit");
    fflush(stdout);
    if (upper)
        _Exit(3);
    _exit(3);
}

int main(int argc, char **argv)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "release_halves") == 0)
        return release_halves(argc >= 3 ? atol(argv[2]) : 1000,
                              argc >= 4 && strcmp(argv[3], "munmap") == 0);
    if (argc >= 2 && strcmp(argv[1], "neighbour_free") == 0)
        return neighbour_free();
    if (argc >= 2 && strcmp(argv[1], "onfault_reservation") == 0)
        return onfault_reservation();
    if (argc >= 2 && strcmp(argv[1], "cancelled_waiter") == 0)
        return cancelled_waiter();
    if (argc >= 3 && strcmp(argv[1], "exit_summary_fd") == 0)
        return exit_summary_fd(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "fork_child") == 0)
        return fork_child();
    if (argc >= 2 && strcmp(argv[1], "exit_now") == 0)
        return exit_now(argc >= 3 && strcmp(argv[2], "_Exit") == 0);
    fprintf(stderr, "usage: round2 MODE [ARGS] (see the source)\n");
    return 2;
}
