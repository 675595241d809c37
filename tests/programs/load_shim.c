/* Loads libpinshim.so with dlopen (argv[1], an absolute path) and exits
 * normally, so the shim's constructor reads the environment and its destructor
 * writes the stats. The loader ignores LD_PRELOAD for a secure-execution
 * (setuid) program, so the secure-execution test copies this program setuid
 * and the shim gets in this way. Prints whether the process runs in
 * secure-execution mode, so the test can tell when the setuid bit had no
 * effect (a nosuid mount, no_new_privs). */
#include <dlfcn.h>
#include <stdio.h>
#include <sys/auxv.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: load_shim /abs/path/libpinshim.so\n");
        return 2;
    }
    printf("secure=%lu uid=%d euid=%d\n", getauxval(AT_SECURE), (int)getuid(), (int)geteuid());
    fflush(stdout);
    if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == NULL) {
        fprintf(stderr, "load_shim: %s\n", dlerror());
        return 1;
    }
    return 0;
}
