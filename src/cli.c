/* The pinshim command: runs a program with libpinshim.so preloaded.
 *   pinshim [options] [--] COMMAND [ARGS...]
 *   pinshim report [--all] [--json] [--prune] [--no-runtime-records] FILES...
 *   pinshim report [--prometheus] [--prometheus-file PATH] [--prune]
 *                  [--no-runtime-records] FILES...
 *   pinshim top [--once] [--bytes] [--interval SECONDS] [DIR...]
 *   pinshim top [--once] [--prometheus] [--prometheus-file PATH]
 *               [--interval SECONDS] [DIR...]
 * Options map one-to-one to the PINSHIM_* variables and are checked by the same
 * parser as the environment (options.c). */
#include "options.h"

#include "pinshim.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PINSHIM_LIBDIR
#define PINSHIM_LIBDIR "/usr/local/lib"
#endif
#ifndef PINSHIM_LIBDIR_FROM_BINDIR
#define PINSHIM_LIBDIR_FROM_BINDIR "../lib"
#endif
#ifndef PINSHIM_SOURCE_SCRIPTS
#define PINSHIM_SOURCE_SCRIPTS ""
#endif

static const char usage_line[] =
    "usage: pinshim [OPTION...] [--print-env] [--] COMMAND [ARGS...]\n"
    "       pinshim report [--all] [--json] [--prune] [--no-runtime-records] FILES...\n"
    "       pinshim report [--prometheus] [--prometheus-file PATH] [--prune] "
    "[--no-runtime-records] FILES...\n"
    "       pinshim top [--once] [--bytes] [--interval SECONDS] [DIR...]\n"
    "       pinshim top [--once] [--prometheus] [--prometheus-file PATH] [--interval SECONDS] "
    "[DIR...]\n"
    "       pinshim --help | --version\n";

static void print_help(void)
{
    fputs(usage_line, stdout);
    fputs("\nRuns COMMAND with libpinshim.so preloaded, so the memory it locks with mlock,\n"
          "mlock2 or MAP_LOCKED is registered with its GPU runtime and DMA-pinned: by\n"
          "default through the runtime the program started (CUDA, HIP or Level Zero), in\n"
          "the context it uses, once it has one.\n"
          "Each OPTION sets the environment variable named below; the rest of the\n"
          "environment is kept, and LD_PRELOAD gets libpinshim.so in front.\n\nOptions:\n",
          stdout);
    fflush(stdout);
    options_write_help(STDOUT_FILENO);
    fputs("  --print-env            print the variables that would be set, run nothing\n"
          "  --help, --version      this text; the version\n\n"
          "Subcommands (a COMMAND named report or top runs after --):\n"
          "  report [--all] [--json] [--prune] [--no-runtime-records] FILES\n"
          "                         merge per-process JSON stats (PINSHIM_STATS=dir/%h.%p.json)\n"
          "                         and live records, also of killed processes; with\n"
          "                         --prometheus(-file) in Prometheus' text format\n"
          "  top [--once] [--bytes] [--interval SECONDS] [DIR...]\n"
          "                         the processes running with the shim now, from their live\n"
          "                         records (of a job's stats DIR), refreshed every second;\n"
          "                         --prometheus(-file) as report\n",
          stdout);
}

static int usage_error(const char *format, const char *a, const char *b)
{
    fputs("pinshim: ", stderr);
    fprintf(stderr, format, a, b);
    fputs("\n", stderr);
    fputs(usage_line, stderr);
    return 2;
}

static bool file_exists(const char *path)
{
    return access(path, R_OK) == 0;
}

static bool exe_directory(char *out, size_t out_size)
{
    ssize_t n = readlink("/proc/self/exe", out, out_size - 1);
    if (n <= 0)
        return false;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (slash == NULL)
        return false;
    *slash = '\0';
    return true;
}

/* The library to preload: PINSHIM_LIBRARY, next to this program (build tree),
 * the install prefix relative to this program (DESTDIR or moved installs),
 * then the configured libdir. */
static bool find_library(char *out, size_t out_size)
{
    const char *override = getenv("PINSHIM_LIBRARY");
    if (override != NULL && override[0] != '\0') {
        snprintf(out, out_size, "%s", override);
        return file_exists(out);
    }
    char directory[PATH_MAX / 2];
    if (exe_directory(directory, sizeof(directory))) {
        snprintf(out, out_size, "%s/libpinshim.so", directory);
        if (file_exists(out))
            return true;
        snprintf(out, out_size, "%s/%s/libpinshim.so", directory, PINSHIM_LIBDIR_FROM_BINDIR);
        if (file_exists(out)) {
            char resolved[PATH_MAX];
            if (realpath(out, resolved) != NULL)
                snprintf(out, out_size, "%s", resolved);
            return true;
        }
    }
    snprintf(out, out_size, "%s/libpinshim.so", PINSHIM_LIBDIR);
    return file_exists(out);
}

/* Finds command as execvp would, for the static/setuid check. */
static bool find_command(const char *command, char *out, size_t out_size)
{
    if (strchr(command, '/') != NULL) {
        snprintf(out, out_size, "%s", command);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t length = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(out, out_size, "%.*s/%s", (int)length, length ? path : ".", command);
        if (access(out, X_OK) == 0)
            return true;
        if (colon == NULL)
            break;
        path = colon + 1;
    }
    return false;
}

enum elf_kind { ELF_NOT_ELF, ELF_DYNAMIC, ELF_STATIC };

static enum elf_kind elf_kind_of(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ELF_NOT_ELF;
    Elf64_Ehdr header;
    enum elf_kind kind = ELF_NOT_ELF;
    if (read(fd, &header, sizeof(header)) == (ssize_t)sizeof(header) &&
        memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 && header.e_ident[EI_CLASS] == ELFCLASS64) {
        kind = ELF_STATIC;
        for (unsigned i = 0; i < header.e_phnum; i++) {
            Elf64_Phdr program_header;
            off_t at = (off_t)header.e_phoff + (off_t)i * header.e_phentsize;
            if (pread(fd, &program_header, sizeof(program_header), at) !=
                (ssize_t)sizeof(program_header))
                break;
            if (program_header.p_type == PT_INTERP) {
                kind = ELF_DYNAMIC;
                break;
            }
        }
    } else if (memcmp(header.e_ident, ELFMAG, SELFMAG) == 0) {
        kind = ELF_DYNAMIC; /* 32-bit: the loader will say whether the 64-bit shim fits */
    }
    close(fd);
    return kind;
}

static void check_target(const char *command)
{
    char path[PATH_MAX];
    if (!find_command(command, path, sizeof(path)))
        return; /* execvp reports it */
    struct stat info;
    if (stat(path, &info) == 0 && (info.st_mode & (S_ISUID | S_ISGID)))
        fprintf(stderr,
                "pinshim: %s is set%s: the dynamic loader ignores LD_PRELOAD for it, so it runs "
                "without the shim\n",
                path, (info.st_mode & S_ISUID) ? "uid" : "gid");
    else if (elf_kind_of(path) == ELF_STATIC)
        fprintf(stderr,
                "pinshim: %s is statically linked: nothing can be preloaded into it, so it runs "
                "without the shim\n",
                path);
}

/* A subcommand: runs the Python script name (pinshim-report, pinshim-top)
 * from next to this program (installed), else from the source tree's scripts
 * (a build tree), with the arguments after the subcommand's name. */
static int run_script(const char *name, const char *purpose, int argc, char **argv)
{
    char script[PATH_MAX];
    char directory[PATH_MAX / 2];
    bool found = false;
    if (exe_directory(directory, sizeof(directory))) {
        snprintf(script, sizeof(script), "%s/%s", directory, name);
        found = file_exists(script);
    }
    if (!found && PINSHIM_SOURCE_SCRIPTS[0] != '\0') {
        snprintf(script, sizeof(script), "%s/%s", PINSHIM_SOURCE_SCRIPTS, name);
        found = file_exists(script);
    }
    if (!found) {
        fprintf(stderr, "pinshim: %s is not installed next to pinshim\n", name);
        return 2;
    }
    char **arguments = calloc((size_t)argc + 2, sizeof(char *));
    if (arguments == NULL)
        return 2;
    arguments[0] = "python3";
    arguments[1] = script;
    for (int i = 1; i < argc; i++)
        arguments[i + 1] = argv[i];
    execvp("python3", arguments);
    fprintf(stderr, "pinshim: cannot run python3 for %s: %s\n", purpose, strerror(errno));
    free(arguments);
    return 127;
}

int main(int argc, char **argv)
{
    struct pinshim_config scratch;
    config_set_defaults(&scratch);
    /* Values to set, by option id; NULL keeps the caller's environment. */
    const char *values[OPT_COUNT] = {0};
    bool print_env = false;
    int index = 1;

    /* Only as the first argument: "pinshim -- report" runs a program named report. */
    if (argc >= 2 && strcmp(argv[1], "report") == 0)
        return run_script("pinshim-report", "the report", argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "top") == 0)
        return run_script("pinshim-top", "top", argc - 1, argv + 1);

    for (; index < argc; index++) {
        const char *argument = argv[index];
        if (strcmp(argument, "--") == 0) {
            index++;
            break;
        }
        if (strncmp(argument, "--", 2) != 0)
            break;
        const char *name = argument + 2;
        if (strcmp(name, "help") == 0) {
            print_help();
            return 0;
        }
        if (strcmp(name, "version") == 0) {
            printf("pinshim %s\n", PINSHIM_VERSION_STRING);
            return 0;
        }
        if (strcmp(name, "print-env") == 0) {
            print_env = true;
            continue;
        }
        if (strcmp(name, "help-options-markdown") == 0) {
            options_write_markdown(STDOUT_FILENO);
            return 0;
        }
        if (strcmp(name, "help-options-man") == 0) {
            options_write_man(STDOUT_FILENO);
            return 0;
        }
        char option_name[64];
        const char *equals = strchr(name, '=');
        size_t name_length = equals ? (size_t)(equals - name) : strlen(name);
        if (name_length >= sizeof(option_name))
            return usage_error("unknown option %s%s", argument, "");
        memcpy(option_name, name, name_length);
        option_name[name_length] = '\0';
        const struct option_spec *spec = option_find_by_cli(option_name);
        if (spec == NULL)
            return usage_error("unknown option %s%s", argument, "");
        const char *value;
        if (spec->cli_argument == NULL) {
            /* A flag: --no-register, --stats-all. */
            if (equals)
                return usage_error("--%s takes no value%s", spec->cli_name, "");
            value = spec->flag_value;
        } else if (spec->id == OPT_STATS) {
            /* --stats alone means a summary on stderr; a file needs '=' so the
             * command that follows is never taken for one. */
            value = equals ? equals + 1 : "1";
        } else if (equals) {
            value = equals + 1;
        } else if (index + 1 < argc) {
            value = argv[++index];
        } else {
            return usage_error("--%s needs a value (%s)", spec->cli_name, spec->accepted);
        }
        char why[96] = "";
        if (!spec->parse(value, &scratch, why, sizeof(why))) {
            fprintf(stderr, "pinshim: --%s \"%s\" is not valid (%s); accepted: %s\n",
                    spec->cli_name, value, why, spec->accepted);
            fputs(usage_line, stderr);
            return 2;
        }
        values[spec->id] = value;
    }

    char library[PATH_MAX];
    if (!find_library(library, sizeof(library))) {
        fprintf(stderr, "pinshim: cannot find libpinshim.so (looked for %s); set PINSHIM_LIBRARY\n",
                library);
        return 127;
    }
    /* LD_PRELOAD with the shim in front of what the caller had. */
    const char *old_preload = getenv("LD_PRELOAD");
    bool keep_old = old_preload != NULL && old_preload[0] != '\0';
    char preload[2 * PATH_MAX];
    int preload_length = snprintf(preload, sizeof(preload), "%s%s%s", library, keep_old ? ":" : "",
                                  keep_old ? old_preload : "");
    if (preload_length < 0 || (size_t)preload_length >= sizeof(preload))
        return usage_error("LD_PRELOAD is too long%s%s", "", "");

    if (print_env) {
        printf("LD_PRELOAD=%s\n", preload);
        for (int i = 0; i < OPT_COUNT; i++)
            if (values[i] != NULL)
                printf("%s=%s\n", option_table[i].env_name, values[i]);
        return 0;
    }
    if (index >= argc)
        return usage_error("no command given%s%s", "", "");

    for (int i = 0; i < OPT_COUNT; i++)
        if (values[i] != NULL && setenv(option_table[i].env_name, values[i], 1) != 0)
            return usage_error("cannot set %s%s", option_table[i].env_name, "");
    if (setenv("LD_PRELOAD", preload, 1) != 0)
        return usage_error("cannot set LD_PRELOAD%s%s", "", "");
    check_target(argv[index]);
    execvp(argv[index], argv + index);
    int error = errno;
    fprintf(stderr, "pinshim: cannot run %s: %s\n", argv[index], strerror(error));
    return error == ENOENT ? 127 : 126;
}
