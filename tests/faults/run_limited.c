/* run_limited MEMLOCK_BYTES PROGRAM [ARGS...]: runs PROGRAM with RLIMIT_MEMLOCK
 * set to MEMLOCK_BYTES (soft and hard) as an unprivileged user. When started
 * as root it first becomes uid/gid 65534 (nobody/nogroup on Debian) with no
 * supplementary groups, so the limit applies (root has CAP_IPC_LOCK). The
 * environment passes through unchanged. Exit status 125: the set-up failed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define UNPRIVILEGED_ID 65534

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: run_limited MEMLOCK_BYTES PROGRAM [ARGS...]\n");
        return 125;
    }
    char *end = NULL;
    unsigned long long bytes = strtoull(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0') {
        fprintf(stderr, "run_limited: bad byte count %s\n", argv[1]);
        return 125;
    }
    struct rlimit limit = {.rlim_cur = (rlim_t)bytes, .rlim_max = (rlim_t)bytes};
    if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
        fprintf(stderr, "run_limited: setrlimit: %s\n", strerror(errno));
        return 125;
    }
    if (geteuid() == 0) {
        if (setgroups(0, NULL) != 0 || setgid(UNPRIVILEGED_ID) != 0 ||
            setuid(UNPRIVILEGED_ID) != 0) {
            fprintf(stderr, "run_limited: cannot drop root privileges: %s\n", strerror(errno));
            return 125;
        }
        if (setuid(0) == 0) { /* must be impossible now */
            fprintf(stderr, "run_limited: still privileged\n");
            return 125;
        }
    }
    execv(argv[2], argv + 2);
    fprintf(stderr, "run_limited: cannot run %s: %s\n", argv[2], strerror(errno));
    return 125;
}
