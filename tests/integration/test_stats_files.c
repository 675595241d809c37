/* Integration: which processes write statistics, and how safely.
 *  - the issue's one-liner: a symlink planted at the old predictable temporary
 *    name "<path>.tmp.<pid>" no longer makes the shim overwrite its target;
 *  - by default only a process that locked memory or got a warning writes
 *    stats (file or summary), PINSHIM_STATS_ALL=1 gets every process;
 *  - a setuid program that loads the shim ignores PINSHIM_STATS and
 *    PINSHIM_CUDART, with one warning (root only; skipped otherwise). */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "emulation.h"
#include "json_lite.h"

static const char *required_env(const char *name)
{
    const char *value = getenv(name);
    cr_assert_not_null(value, "%s is not set (run through meson test)", name);
    return value;
}

/* Every PINSHIM_ variable the shim reads, unset, so the caller's do not leak in. */
#define UNSET_SHIM_VARIABLES                                                                       \
    "PINSHIM_REGISTER=", "PINSHIM_MIN_BYTES=", "PINSHIM_FLAGS=", "PINSHIM_CUDART=",                \
        "PINSHIM_STATS=", "PINSHIM_STATS_ALL=", "PINSHIM_LOG=", "PINSHIM_BLOCK_SIZE="

static void write_text(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    cr_assert_not_null(file, "%s: %s", path, strerror(errno));
    fputs(text, file);
    fclose(file);
}

/* Names in directory that start with prefix. */
static int count_files(const char *directory, const char *prefix)
{
    DIR *listing = opendir(directory);
    cr_assert_not_null(listing, "%s", directory);
    int count = 0;
    for (struct dirent *entry; (entry = readdir(listing)) != NULL;)
        count += strncmp(entry->d_name, prefix, strlen(prefix)) == 0;
    closedir(listing);
    return count;
}

static size_t count_lines_with(const char *text, const char *needle)
{
    size_t count = 0;
    for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle))
        count++;
    return count;
}

/* ---- the issue's one-liner ---- */

/* sh -c 'ln -s VICTIM X.json.tmp.$$; exec env LD_PRELOAD=... PINSHIM_STATS=X.json PROGRAM':
 * the shell's pid is the program's (exec), so the link sits at the name the
 * old writer opened with O_TRUNC, and the victim got the stats JSON. */
static void one_liner(const char *program_and_arguments)
{
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    char victim[512], stats[512], script[4096];
    snprintf(victim, sizeof(victim), "%s/victim", directory);
    snprintf(stats, sizeof(stats), "%s/x.json", directory);
    write_text(victim, "precious\n");
    snprintf(script, sizeof(script),
             "ln -s '%s' '%s.tmp.'$$ && exec env LD_PRELOAD='%s' PINSHIM_CUDART='%s' "
             "PINSHIM_STATS='%s' %s",
             victim, stats, required_env("PINSHIM_LIB"), required_env("FAKE_CUDART"), stats,
             program_and_arguments);
    const char *argv[] = {"sh", "-c", script, NULL};
    const char *environment[] = {UNSET_SHIM_VARIABLES, "LD_PRELOAD=", NULL};
    struct child_result result;
    child_run(argv, environment, NULL, &result);
    cr_assert_eq(result.status, 0, "%s\nstdout:\n%s\nstderr:\n%s", script, result.out, result.err);

    char *content = read_file_text(victim);
    cr_assert_not_null(content);
    cr_assert_str_eq(content, "precious\n", "the symlink's target was overwritten");
    free(content);
    struct stat info;
    cr_assert_eq(lstat(stats, &info), 0, "no stats written; stderr:\n%s", result.err);
    cr_assert(S_ISREG(info.st_mode));
    char *document = read_file_text(stats);
    char why[256];
    cr_assert(json_lite_valid(document, why, sizeof(why)), "%s\n%s", why, document);
    double lock_calls = 0;
    cr_assert(json_lite_get_number(document, "calls.lock", &lock_calls));
    cr_assert_geq(lock_calls, 1);
    free(document);
    /* The planted link is still there, still pointing at the victim; no
     * temporary file is left. */
    cr_assert_eq(count_files(directory, "x.json.tmp."), 1);
    cr_assert_eq(count_files(directory, ".x.json."), 0);
    child_result_free(&result);
    remove_tree(directory);
    free(directory);
}

Test(stats_files, issue_one_liner_with_memtester, .timeout = 120)
{
    SKIP_BUILD_MACHINE_PROGRAM("memtester");
    const char *memtester = getenv("MEMTESTER");
    if (memtester == NULL || memtester[0] == '\0')
        cr_skip_test("memtester is not installed (scripts/deps); the same attack is tested "
                     "with the scenarios program");
    char command[1024];
    snprintf(command, sizeof(command), "'%s' 1M 1", memtester);
    one_liner(command);
}

Test(stats_files, issue_one_liner_with_a_locking_program, .timeout = 120)
{
    char command[1024];
    snprintf(command, sizeof(command), "'%s' basic", required_env("SCENARIOS"));
    one_liner(command);
}

/* ---- who writes ---- */

struct run {
    struct child_result result;
    char *directory;
    int files;
};

/* Runs argv with the shim preloaded, PINSHIM_STATS set to stats (a template
 * under a new directory when it contains "DIR/", else as given) and settings. */
static void run_with_shim(struct run *run, const char *const argv[], const char *stats,
                          const char *const *settings)
{
    memset(run, 0, sizeof(*run));
    run->directory = make_temp_dir();
    cr_assert_not_null(run->directory);
    char preload[1024], cudart[1024], stats_setting[1024];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", required_env("PINSHIM_LIB"));
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", required_env("FAKE_CUDART"));
    if (strncmp(stats, "DIR/", 4) == 0)
        snprintf(stats_setting, sizeof(stats_setting), "PINSHIM_STATS=%s/%s", run->directory,
                 stats + 4);
    else
        snprintf(stats_setting, sizeof(stats_setting), "PINSHIM_STATS=%s", stats);
    const char *environment[32] = {UNSET_SHIM_VARIABLES};
    size_t count = 8;
    environment[count++] = preload;
    environment[count++] = cudart;
    environment[count++] = stats_setting;
    for (size_t i = 0; settings && settings[i] && count < 31; i++)
        environment[count++] = settings[i];
    environment[count] = NULL;
    child_run(argv, environment, NULL, &run->result);
    run->files = count_files(run->directory, "s.");
}

static void run_free(struct run *run)
{
    child_result_free(&run->result);
    remove_tree(run->directory);
    free(run->directory);
}

/* A process that locks nothing: the scenarios program listing its scenarios
 * (one of the shim's architecture, which an emulator runs too). */
#define IDLE_PROGRAM                                                                               \
    {                                                                                              \
        required_env("SCENARIOS"), "--list", NULL                                                  \
    }

Test(stats_files, a_process_that_locks_nothing_writes_nothing)
{
    const char *argv[] = IDLE_PROGRAM;
    struct run run;
    run_with_shim(&run, argv, "DIR/s.%p.json", NULL);
    cr_assert_eq(run.result.status, 0, "%s", run.result.err);
    cr_assert_eq(run.files, 0, "a stats file from a process that locked nothing");
    cr_assert_str_empty(run.result.err);
    run_free(&run);

    run_with_shim(&run, argv, "1", NULL);
    cr_assert_eq(run.result.status, 0);
    cr_assert_str_empty(run.result.err, "a summary from a process that locked nothing");
    run_free(&run);
}

Test(stats_files, stats_all_gets_every_process)
{
    const char *argv[] = IDLE_PROGRAM;
    const char *settings[] = {"PINSHIM_STATS_ALL=1", NULL};
    struct run run;
    run_with_shim(&run, argv, "DIR/s.%p.json", settings);
    cr_assert_eq(run.result.status, 0, "%s", run.result.err);
    cr_assert_eq(run.files, 1);
    run_free(&run);

    run_with_shim(&run, argv, "1", settings);
    cr_assert_eq(count_lines_with(run.result.err, ": registered 0 ("), 1, "%s", run.result.err);
    run_free(&run);
}

Test(stats_files, a_process_that_locks_writes)
{
    const char *argv[] = {required_env("SCENARIOS"), "basic", NULL};
    const char *settings[] = {"REQUIRE_SHIM=1", NULL};
    struct run run;
    run_with_shim(&run, argv, "DIR/s.%p.json", settings);
    cr_assert_eq(run.result.status, 0, "%s", run.result.err);
    cr_assert_eq(run.files, 1);
    run_free(&run);
}

Test(stats_files, a_warning_is_something_to_say)
{
    const char *argv[] = IDLE_PROGRAM;
    const char *settings[] = {"PINSHIM_FLAGS=pinned", NULL};
    struct run run;
    run_with_shim(&run, argv, "DIR/s.%p.json", settings);
    cr_assert_eq(run.files, 1, "%s", run.result.err);
    run_free(&run);

    /* Printed or not: PINSHIM_LOG=quiet hides the warning, not the stats. */
    const char *quiet[] = {"PINSHIM_FLAGS=pinned", "PINSHIM_LOG=quiet", NULL};
    run_with_shim(&run, argv, "DIR/s.%p.json", quiet);
    cr_assert_eq(run.files, 1, "%s", run.result.err);
    cr_assert_str_empty(run.result.err);
    run_free(&run);
}

/* The issue: "a shell pipeline under pinshim --stats should not print a summary
 * per ls". */
Test(stats_files, a_pipeline_under_the_command_prints_no_summaries)
{
    SKIP_BUILD_MACHINE_PROGRAM("sh (with ls, wc, cat, sort and uniq)");
    const char *argv[] = {required_env("PINSHIM_CLI"),
                          "--stats",
                          "--",
                          "sh",
                          "-c",
                          "ls / | wc -l >/dev/null; cat /dev/null | sort | uniq",
                          NULL};
    const char *environment[] = {UNSET_SHIM_VARIABLES, "LD_PRELOAD=", NULL};
    struct child_result result;
    child_run(argv, environment, NULL, &result);
    cr_assert_eq(result.status, 0, "%s", result.err);
    cr_assert_str_empty(result.err);
    child_result_free(&result);
}

/* ---- secure-execution mode ---- */

static bool copy_file(const char *from, const char *to, mode_t mode)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return false;
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (out < 0) {
        close(in);
        return false;
    }
    char buffer[65536];
    bool ok = true;
    for (ssize_t n; ok && (n = read(in, buffer, sizeof(buffer))) != 0;)
        ok = n > 0 && write(out, buffer, (size_t)n) == n;
    close(in);
    ok = close(out) == 0 && ok;
    return ok && chmod(to, mode) == 0;
}

/* How this test runs a program as an unprivileged user, or NULL. */
static const char *find_setpriv(void)
{
    static const char *const candidates[] = {"/usr/bin/setpriv", "/bin/setpriv"};
    for (size_t i = 0; i < sizeof(candidates) / sizeof(*candidates); i++)
        if (access(candidates[i], X_OK) == 0)
            return candidates[i];
    return NULL;
}

struct secure_setup {
    char *directory;
    char program[512];   /* setuid-root copy of load_shim */
    char plain[512];     /* the same, not setuid */
    char library[512];   /* copy of libpinshim.so that the user can read */
    char out[512];       /* world-writable: where stats could land */
    char uid_option[64]; /* --reuid=... for setpriv */
    char gid_option[64];
    const char *setpriv;
};

static void secure_setup(struct secure_setup *setup)
{
    memset(setup, 0, sizeof(*setup));
    if (geteuid() != 0)
        cr_skip_test("needs root to make a setuid-root program; not tested as uid %d",
                     (int)geteuid());
    setup->setpriv = find_setpriv();
    if (setup->setpriv == NULL)
        cr_skip_test("setpriv (util-linux) is not installed: cannot run as another user");
    struct passwd *nobody = getpwnam("nobody");
    if (nobody == NULL || nobody->pw_uid == 0)
        cr_skip_test("no unprivileged user 'nobody' to run the setuid program as");
    snprintf(setup->uid_option, sizeof(setup->uid_option), "--reuid=%d", (int)nobody->pw_uid);
    snprintf(setup->gid_option, sizeof(setup->gid_option), "--regid=%d", (int)nobody->pw_gid);
    /* What the user runs and loads is copied where it can reach it: the
     * build tree may sit in a directory it cannot enter (a 0700 home). */
    char why[1024];
    setup->directory = make_shared_temp_dir(why, sizeof(why));
    if (setup->directory == NULL)
        cr_skip_test("cannot hand the programs to the user nobody: %s", why);
    snprintf(setup->program, sizeof(setup->program), "%s/load_shim_setuid", setup->directory);
    snprintf(setup->plain, sizeof(setup->plain), "%s/load_shim_plain", setup->directory);
    snprintf(setup->library, sizeof(setup->library), "%s/libpinshim.so", setup->directory);
    snprintf(setup->out, sizeof(setup->out), "%s/out", setup->directory);
    cr_assert(copy_file(required_env("LOAD_SHIM"), setup->plain, 0755));
    cr_assert(copy_file(required_env("LOAD_SHIM"), setup->program, 0755));
    cr_assert_eq(chown(setup->program, 0, 0), 0);
    cr_assert_eq(chmod(setup->program, 04755), 0);
    cr_assert(copy_file(required_env("PINSHIM_LIB"), setup->library, 0644));
    cr_assert_eq(mkdir(setup->out, 0777), 0);
    cr_assert_eq(chmod(setup->out, 0777), 0);
}

static void secure_teardown(struct secure_setup *setup)
{
    remove_tree(setup->directory);
    free(setup->directory);
}

/* Runs program (with the library's path, and mode when not NULL) as the
 * unprivileged user. */
static void run_as_user_in_mode(const struct secure_setup *setup, const char *program,
                                const char *mode, const char *const *settings,
                                struct child_result *result)
{
    const char *argv[] = {setup->setpriv,
                          setup->uid_option,
                          setup->gid_option,
                          "--clear-groups",
                          "--",
                          program,
                          setup->library,
                          mode,
                          NULL};
    const char *environment[32] = {UNSET_SHIM_VARIABLES, "LD_PRELOAD="};
    size_t count = 9;
    for (size_t i = 0; settings && settings[i] && count < 31; i++)
        environment[count++] = settings[i];
    environment[count] = NULL;
    child_run(argv, environment, NULL, result);
}

static void run_as_user(const struct secure_setup *setup, const char *program,
                        const char *const *settings, struct child_result *result)
{
    run_as_user_in_mode(setup, program, NULL, settings, result);
}

Test(stats_files, secure_execution_ignores_the_stats_path_and_runtime, .timeout = 60)
{
    struct secure_setup setup;
    secure_setup(&setup);
    char stats[600];
    snprintf(stats, sizeof(stats), "PINSHIM_STATS=%s/s.%%p.json", setup.out);
    const char *settings[] = {stats, "PINSHIM_STATS_ALL=1",
                              "PINSHIM_CUDART=/nonexistent/libcudart.so", NULL};

    /* The control: the same program, not setuid, writes its stats there. */
    struct child_result result;
    run_as_user(&setup, setup.plain, settings, &result);
    cr_assert_eq(result.status, 0, "%s", result.err);
    cr_assert(strstr(result.out, "secure=0 ") != NULL, "%s", result.out);
    cr_assert_eq(count_files(setup.out, "s."), 1,
                 "the program that is not setuid wrote no stats: the test proves nothing\n%s",
                 result.err);
    cr_assert(strstr(result.err, "secure-execution") == NULL, "%s", result.err);
    child_result_free(&result);

    run_as_user(&setup, setup.program, settings, &result);
    cr_assert_eq(result.status, 0, "%s", result.err);
    if (strstr(result.out, "secure=0 ") != NULL) {
        char out[256];
        snprintf(out, sizeof(out), "%s", result.out);
        child_result_free(&result);
        secure_teardown(&setup);
        cr_skip_test("the setuid bit had no effect here (nosuid mount or no_new_privs): %s", out);
    }
    cr_assert(strstr(result.out, "secure=1 ") != NULL, "%s", result.out);
    cr_assert(strstr(result.out, "euid=0") != NULL, "%s", result.out);
    cr_assert_eq(count_files(setup.out, "s."), 1, "the setuid program wrote stats");
    /* One warning names what was ignored (other warnings may come: under ASan
     * the one about the allocator that comes first). */
    cr_assert_eq(count_lines_with(result.err, "secure-execution"), 1, "%s", result.err);
    cr_assert(strstr(result.err,
                     "pinshim: secure-execution mode (setuid, setgid or file capabilities): "
                     "ignoring PINSHIM_CUDART, PINSHIM_STATS, which name files or libraries; "
                     "using PINSHIM_CUDART=search, PINSHIM_STATS=0\n") != NULL,
              "%s", result.err);
    /* Nothing tried to load the named runtime or write the named file. */
    cr_assert(strstr(result.err, "/nonexistent/") == NULL, "%s", result.err);
    cr_assert(strstr(result.err, "cannot write stats") == NULL, "%s", result.err);
    child_result_free(&result);
    secure_teardown(&setup);
}

/* No live record in secure-execution mode (issue 19): not where PINSHIM_LIVE
 * says (it names a directory), nor in the default directory. The programs
 * lock a buffer and kill themselves, so a record made would stay. */
Test(stats_files, secure_execution_makes_no_live_record, .timeout = 60)
{
    struct secure_setup setup;
    secure_setup(&setup);
    char live[600];
    snprintf(live, sizeof(live), "PINSHIM_LIVE=%s", setup.out);
    const char *settings[] = {live, "PINSHIM_CONTEXT=create", "PINSHIM_LOG=quiet", NULL};

    /* The control: the same program, not setuid, leaves its record there. */
    struct child_result result;
    run_as_user_in_mode(&setup, setup.plain, "lock-and-die", settings, &result);
    cr_assert_eq(result.status, 128 + 9, "%s%s", result.out, result.err);
    cr_assert(strstr(result.out, "secure=0 ") != NULL, "%s", result.out);
    char host[256] = "";
    cr_assert_eq(gethostname(host, sizeof(host) - 1), 0);
    cr_assert_eq(count_files(setup.out, host), 1,
                 "the program that is not setuid left no live record: the test proves nothing");
    child_result_free(&result);
    remove_tree(setup.out);
    cr_assert_eq(mkdir(setup.out, 0777), 0);
    cr_assert_eq(chmod(setup.out, 0777), 0);

    /* Records of killed processes stay a day in the default directories: one
     * of an older process that had the same pid is not this program's. A
     * record made now has a modification time from now on (1 s of slack for
     * the file system's coarse clock); the older ones have theirs. */
    struct timespec started;
    cr_assert_eq(clock_gettime(CLOCK_REALTIME, &started), 0);
    run_as_user_in_mode(&setup, setup.program, "lock-and-die", settings, &result);
    if (strstr(result.out, "secure=0 ") != NULL) {
        child_result_free(&result);
        secure_teardown(&setup);
        cr_skip_test("the setuid bit had no effect here (nosuid mount or no_new_privs)");
    }
    cr_assert(strstr(result.out, "secure=1 ") != NULL, "%s", result.out);
    cr_assert_eq(result.status, 128 + 9, "%s%s", result.out, result.err);
    const char *pid_text = strstr(result.out, "pid=");
    cr_assert_not_null(pid_text, "%s", result.out);
    long pid = strtol(pid_text + 4, NULL, 10);
    cr_assert_eq(count_files(setup.out, host), 0, "the setuid program made a live record");
    /* Nor in any default directory (euid 0: the root user's). */
    const char *defaults[] = {"/dev/shm/pinshim-0", "/tmp/pinshim-0", "/run/user/0/pinshim"};
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s.%ld.live", defaults[i], host, pid);
        struct stat info;
        bool made_now = lstat(path, &info) == 0 && info.st_mtim.tv_sec >= started.tv_sec - 1;
        cr_assert(!made_now, "the setuid program made %s", path);
    }
    child_result_free(&result);
    secure_teardown(&setup);
}
