/* Locks and ends as its standard input says, one command a line, answering
 * each on standard output ("ok COMMAND pid PID"), so that test_live_records
 * can look at its live record between steps and end it every way a process
 * ends (issue 19):
 *   lock     posix_memalign + mlock of 1 MiB (kept)
 *   unlock   munlock + free of the last one locked
 *   fork     the child locks two more, answers "child PID" and waits to be killed
 *   exec     runs this program again in this process (the commands go on)
 *   exit     exit(0); _exit: _exit(0); end of input: return from main */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BUFFER_BYTES ((size_t)1 << 20)
#define MAX_BUFFERS 64

static void *buffers[MAX_BUFFERS];
static int buffer_count;

static int lock_one(void)
{
    void *buffer = NULL;
    if (buffer_count == MAX_BUFFERS || posix_memalign(&buffer, 4096, BUFFER_BYTES) != 0)
        return 1;
    memset(buffer, 1, BUFFER_BYTES);
    if (mlock(buffer, BUFFER_BYTES) != 0)
        return 1;
    buffers[buffer_count++] = buffer;
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    setvbuf(stdout, NULL, _IONBF, 0);
    char line[64];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        int failed = 0;
        if (strcmp(line, "lock") == 0) {
            failed = lock_one();
        } else if (strcmp(line, "unlock") == 0) {
            failed = buffer_count == 0 || munlock(buffers[buffer_count - 1], BUFFER_BYTES) != 0;
            if (!failed)
                free(buffers[--buffer_count]);
        } else if (strcmp(line, "fork") == 0) {
            pid_t child = fork();
            if (child == 0) {
                if (lock_one() != 0 || lock_one() != 0)
                    _exit(3);
                printf("child %ld\n", (long)getpid());
                for (;;)
                    pause();
            }
            failed = child < 0;
        } else if (strcmp(line, "exec") == 0) {
            printf("ok exec pid %ld\n", (long)getpid());
            char *again[] = {argv[0], NULL};
            execv(argv[0], again);
            return 4;
        } else if (strcmp(line, "exit") == 0) {
            printf("ok exit pid %ld\n", (long)getpid());
            exit(0);
        } else if (strcmp(line, "_exit") == 0) {
            printf("ok _exit pid %ld\n", (long)getpid());
            _exit(0);
        } else {
            failed = 1;
        }
        printf("%s %s pid %ld\n", failed ? "failed" : "ok", line, (long)getpid());
    }
    return 0;
}
