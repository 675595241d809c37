/* refuse_syscalls NAME[,NAME...] PROGRAM [ARG...]
 *
 * Runs PROGRAM with the named system calls refused with EPERM, as a
 * container's seccomp profile refuses them (Docker's refuses move_pages, and
 * get_mempolicy without CAP_SYS_NICE): the filter is installed before exec,
 * so every thread of the program, the shim's included, inherits it. Knows
 * the calls the tests refuse: move_pages and get_mempolicy.
 *
 * Exits 77 (the tests' "skip") where this kernel or emulator takes no
 * seccomp filter (qemu-user refuses PR_SET_SECCOMP), 2 on bad arguments or
 * when a refused call still answers. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define THIS_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define THIS_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "refuse_syscalls: add this architecture's AUDIT_ARCH"
#endif

#define MAX_REFUSED 4

static long number_of(const char *name, size_t length)
{
    if (length == strlen("move_pages") && strncmp(name, "move_pages", length) == 0)
        return SYS_move_pages;
    if (length == strlen("get_mempolicy") && strncmp(name, "get_mempolicy", length) == 0)
        return SYS_get_mempolicy;
    return -1;
}

/* Asks the call with arguments that succeed when it is allowed. */
static long ask(long number)
{
    if (number == SYS_move_pages)
        return syscall(SYS_move_pages, 0, 0UL, NULL, NULL, NULL, 0);
    int node = -1;
    return syscall(SYS_get_mempolicy, &node, NULL, 0UL, NULL, 0UL);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: refuse_syscalls NAME[,NAME...] PROGRAM [ARG...]\n");
        return 2;
    }
    long refused[MAX_REFUSED];
    size_t count = 0;
    for (const char *at = argv[1]; *at != '\0';) {
        size_t length = strcspn(at, ",");
        long number = number_of(at, length);
        if (number < 0 || count == MAX_REFUSED) {
            fprintf(stderr, "refuse_syscalls: cannot refuse '%.*s'\n", (int)length, at);
            return 2;
        }
        refused[count++] = number;
        at += length + (at[length] == ',');
    }

    /* Load the architecture; other architectures' calls pass. Then one
     * comparison per refused call: equal, refuse; else on to the next. */
    struct sock_filter filter[3 + 2 * MAX_REFUSED + 1];
    size_t n = 0;
    filter[n++] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    filter[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, THIS_AUDIT_ARCH, 1, 0);
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    filter[n++] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (size_t i = 0; i < count; i++) {
        filter[n++] =
            (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)refused[i], 0, 1);
        filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    }
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog program = {.len = (unsigned short)n, .filter = filter};

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0) {
        fprintf(stderr, "refuse_syscalls: no seccomp filter here: %s\n", strerror(errno));
        return 77;
    }
    for (size_t i = 0; i < count; i++) {
        errno = 0;
        if (ask(refused[i]) != -1 || errno != EPERM) {
            fprintf(stderr, "refuse_syscalls: system call %ld still answers\n", refused[i]);
            return 2;
        }
    }
    execv(argv[2], argv + 2);
    fprintf(stderr, "refuse_syscalls: cannot run %s: %s\n", argv[2], strerror(errno));
    return 127;
}
