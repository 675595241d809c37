/* Two buffers that share one page, A = pages [0, 16.5) and B = [16.5, 33) of
 * a mapping; a thread locks A while the main thread unlocks B, which unlocks
 * the shared page. With the slow runtime (slow_runtime.c) the interleaving is
 * forced. The mode is argv[1]:
 *   lock_during_load    the thread locks A; while the shim is between that
 *                       mlock and A's registration (loading the runtime) the
 *                       main thread munlocks B
 *   lock_during_unlock  the main thread locks B, then munlocks it; while the
 *                       shim unregisters B before the munlock system call,
 *                       the thread locks A
 * Either way the shared page ends unlocked and must not stay registered.
 * Prints "done"; the fake runtime records what it saw. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static char *region;
static size_t page;
static long thread_delay_ms;

static void sleep_ms(long milliseconds)
{
    struct timespec delay = {.tv_sec = 0, .tv_nsec = milliseconds * 1000 * 1000};
    nanosleep(&delay, NULL);
}

static void *lock_first_buffer(void *argument)
{
    (void)argument;
    sleep_ms(thread_delay_ms);
    if (mlock(region, 16 * page + page / 2) != 0)
        perror("mlock A");
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 ||
        (strcmp(argv[1], "lock_during_load") != 0 && strcmp(argv[1], "lock_during_unlock") != 0)) {
        fprintf(stderr, "usage: shared_page_race lock_during_load|lock_during_unlock\n");
        return 2;
    }
    bool during_unlock = strcmp(argv[1], "lock_during_unlock") == 0;
    page = (size_t)sysconf(_SC_PAGESIZE);
    region = mmap(NULL, 40 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return 1;
    char *second = region + 16 * page + page / 2;
    size_t length = 16 * page + page / 2;
    if (during_unlock && mlock(second, length) != 0)
        perror("mlock B");
    /* The thread's lock comes 100 ms in, inside the runtime's 300 ms delay. */
    thread_delay_ms = during_unlock ? 100 : 0;
    pthread_t thread;
    if (pthread_create(&thread, NULL, lock_first_buffer, NULL) != 0)
        return 1;
    if (!during_unlock)
        sleep_ms(100);
    if (munlock(second, length) != 0)
        perror("munlock B");
    pthread_join(thread, NULL);
    if (munlock(region, length) != 0)
        perror("munlock A");
    puts("done");
    return 0;
}
