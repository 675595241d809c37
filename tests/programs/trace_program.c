/* trace_program: locks, unlocks and frees a buffer under the shim in create
 * mode (the fake runtime), for the NVTX test (tests/integration/test_nvtx.c).
 * Scenario argv[1]:
 *
 *   basic   posix_memalign 8 MiB; mlock, munlock, mlock, free
 *   wait    thread "locker" mlocks 64 MiB while the fake driver's
 *           registration sleeps (FAKE_CUDA_REGISTER_SECONDS_PER_GIB); once it
 *           is in flight, thread "unlocker" munlocks the buffer and waits for
 *           it; once that thread sleeps, the registration is let finish
 *
 * It prints each thread's id as "locker_tid=N" and "unlocker_tid=N". */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static unsigned char *buffer;
static size_t bytes;
static long unlocker_tid;

static void pause_ms(long ms)
{
    struct timespec delay = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&delay, NULL);
}

/* The fake driver's query API, once the shim has loaded it. */
static void *driver_symbol(const char *name)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return driver != NULL ? dlsym(driver, name) : NULL;
}

/* Whether thread tid of this process sleeps (state S in its stat file). */
static int thread_sleeps(long tid)
{
    char path[64], text[512];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return 0;
    size_t got = fread(text, 1, sizeof(text) - 1, file);
    fclose(file);
    text[got] = '\0';
    const char *after_name = strrchr(text, ')');
    return after_name != NULL && after_name[1] == ' ' && after_name[2] == 'S';
}

static void *locker(void *unused)
{
    (void)unused;
    printf("locker_tid=%ld\n", (long)syscall(SYS_gettid));
    printf("mlock=%d\n", mlock(buffer, bytes));
    return NULL;
}

static void *unlocker(void *unused)
{
    (void)unused;
    __atomic_store_n(&unlocker_tid, (long)syscall(SYS_gettid), __ATOMIC_RELEASE);
    printf("munlock=%d\n", munlock(buffer, bytes));
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *scenario = argc > 1 ? argv[1] : "basic";
    bytes = strcmp(scenario, "wait") == 0 ? 64 * MIB : 8 * MIB;
    if (posix_memalign((void **)&buffer, 4096, bytes) != 0)
        return 3;
    memset(buffer, 0x5a, bytes);
    if (strcmp(scenario, "basic") == 0) {
        printf("mlock=%d\n", mlock(buffer, bytes));
        printf("munlock=%d\n", munlock(buffer, bytes));
        printf("mlock_again=%d\n", mlock(buffer, bytes));
        free(buffer);
        return 0;
    }
    /* The first lock that registers loads the fake runtime (64 KiB: a
     * short sleep of the driver's). */
    mlock(buffer, 64 * 1024);
    munlock(buffer, 64 * 1024);
    size_t (*in_flight)(void) = (size_t(*)(void))driver_symbol("fake_cuda_registrations_in_flight");
    void (*wake)(void) = (void (*)(void))driver_symbol("fake_cuda_wake_sleepers");
    if (in_flight == NULL || wake == NULL) {
        printf("no fake driver\n");
        return 4;
    }
    pthread_t lock_thread, unlock_thread;
    pthread_create(&lock_thread, NULL, locker, NULL);
    while (in_flight() == 0)
        pause_ms(1);
    pthread_create(&unlock_thread, NULL, unlocker, NULL);
    long tid;
    while ((tid = __atomic_load_n(&unlocker_tid, __ATOMIC_ACQUIRE)) == 0)
        pause_ms(1);
    /* Asleep three looks in a row: waiting for the locker's registration
     * (it stays in flight until woken). */
    for (int asleep = 0; asleep < 3; asleep = thread_sleeps(tid) ? asleep + 1 : 0)
        pause_ms(5);
    printf("unlocker_tid=%ld\n", tid);
    while (in_flight() != 0) {
        wake();
        pause_ms(1);
    }
    pthread_join(lock_thread, NULL);
    pthread_join(unlock_thread, NULL);
    free(buffer);
    return 0;
}
