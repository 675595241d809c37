/* Loads libpinshim.so with dlopen (argv[1], an absolute path) and exits
 * normally, so the shim's constructor reads the environment and its destructor
 * writes the stats. The loader ignores LD_PRELOAD for a secure-execution
 * (setuid) program, so the secure-execution test copies this program setuid
 * and the shim gets in this way. Prints whether the process runs in
 * secure-execution mode, so the test can tell when the setuid bit had no
 * effect (a nosuid mount, no_new_privs). With "lock-and-die" after the path,
 * it locks a buffer through the shim's mlock and kills itself, so that a
 * live record, if one was made, stays for the test to find. */
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/auxv.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: load_shim /abs/path/libpinshim.so\n");
        return 2;
    }
    printf("secure=%lu uid=%d euid=%d pid=%ld\n", getauxval(AT_SECURE), (int)getuid(),
           (int)geteuid(), (long)getpid());
    fflush(stdout);
    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (shim == NULL) {
        fprintf(stderr, "load_shim: %s\n", dlerror());
        return 1;
    }
    if (argc > 2 && strcmp(argv[2], "lock-and-die") == 0) {
        int (*shim_mlock)(const void *, size_t) =
            (int (*)(const void *, size_t))dlsym(shim, "mlock");
        void *buffer = NULL;
        if (shim_mlock == NULL || posix_memalign(&buffer, 4096, 1 << 20) != 0)
            return 1;
        memset(buffer, 1, 1 << 20);
        if (shim_mlock(buffer, 1 << 20) != 0)
            return 1;
        raise(SIGKILL);
    }
    return 0;
}
