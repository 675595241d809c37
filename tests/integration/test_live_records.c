/* Integration (issue 19): a process that locks memory keeps its counters in
 * a live record, a file mapped shared, so that however it ends its counts
 * are there: killed by SIGKILL or SIGTERM, ended by exit or _exit with the
 * statistics file written or not, a fork child's of its own, an exec's
 * taken over by the next image; updated in place while it runs. The
 * records are read here straight from the file, by its own field table, as
 * any reader would (pinshim report and top are tested in tests/jobs). */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "emulation.h"
#include "live_record.h"
#include "shim_run.h"

extern char **environ;

/* ---- the program, driven a command at a time ---- */

struct session {
    pid_t pid;
    FILE *commands, *answers;
};

/* Starts live_endings under the shim (create mode, the fake runtime) with
 * settings ("K=V") added to this process's environment. */
static void session_start(struct session *session, const char *const *settings)
{
    char *environment[256];
    size_t count = 0;
    for (char **entry = environ; *entry != NULL && count < 200; entry++)
        if (strncmp(*entry, "PINSHIM_", 8) != 0 && strncmp(*entry, "LD_PRELOAD=", 11) != 0 &&
            strncmp(*entry, "XDG_RUNTIME_DIR=", 16) != 0)
            environment[count++] = *entry;
    static char preload[1024], runtime[1024];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", shim_run_required_env("PINSHIM_LIB"));
    snprintf(runtime, sizeof(runtime), "PINSHIM_CUDART=%s", shim_run_required_env("FAKE_CUDART"));
    environment[count++] = preload;
    environment[count++] = runtime;
    environment[count++] = (char *)"PINSHIM_CONTEXT=create";
    environment[count++] = (char *)"PINSHIM_MIN_BYTES=64K";
    for (size_t i = 0; settings != NULL && settings[i] != NULL && count < 254; i++)
        environment[count++] = (char *)settings[i];
    environment[count] = NULL;
    int to_child[2], from_child[2];
    cr_assert_eq(pipe(to_child), 0);
    cr_assert_eq(pipe(from_child), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    const char *program = shim_run_required_env("LIVE_ENDINGS");
    char *argv[] = {(char *)program, NULL};
    cr_assert_eq(posix_spawn(&session->pid, program, &actions, NULL, argv, environment), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    session->commands = fdopen(to_child[1], "w");
    session->answers = fdopen(from_child[0], "r");
    setvbuf(session->commands, NULL, _IONBF, 0);
}

/* Sends a command and waits for its answer line; returns the line. */
static const char *session_say(struct session *session, const char *command, const char *wanted)
{
    static char line[256];
    fprintf(session->commands, "%s\n", command);
    for (;;) {
        cr_assert_not_null(fgets(line, sizeof(line), session->answers),
                           "the program ended before answering %s", command);
        if (strncmp(line, wanted, strlen(wanted)) == 0)
            return line;
    }
}

/* Waits for the program; its status as child_result has it. */
static int session_end(struct session *session, int signal_number)
{
    if (signal_number != 0)
        kill(session->pid, signal_number);
    fclose(session->commands);
    int status = 0;
    cr_assert_eq(waitpid(session->pid, &status, 0), session->pid);
    fclose(session->answers);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* ---- records, read as a reader would ---- */

struct record {
    char *bytes;
    size_t length;
    const struct live_record_header *header;
};

static bool record_read(const char *path, struct record *record)
{
    memset(record, 0, sizeof(*record));
    record->bytes = read_file_text(path);
    if (record->bytes == NULL)
        return false;
    struct stat info;
    cr_assert_eq(stat(path, &info), 0);
    record->length = (size_t)info.st_size;
    record->header = (const struct live_record_header *)record->bytes;
    cr_assert_geq(record->length, sizeof(struct live_record_header));
    cr_assert_eq(memcmp(record->header->magic, LIVE_RECORD_MAGIC, 8), 0, "%s", path);
    cr_assert_leq(record->header->data_offset + record->header->data_bytes, record->length);
    return true;
}

/* Where the field called name lies in the file, by the file's own table. */
static size_t record_field_offset(const struct record *record, const char *name)
{
    const struct live_record_header *header = record->header;
    for (uint32_t i = 0; i < header->field_count; i++) {
        const struct live_record_field *field =
            (const struct live_record_field *)(record->bytes + header->header_bytes +
                                               (size_t)i * header->field_bytes);
        if (strncmp(field->name, name, sizeof(field->name)) == 0)
            return header->data_offset + field->offset;
    }
    cr_assert_fail("no field %s", name);
    return 0;
}

static uint64_t record_value(const struct record *record, const char *name)
{
    uint64_t value;
    memcpy(&value, record->bytes + record_field_offset(record, name), sizeof(value));
    return value;
}

static void record_free(struct record *record)
{
    free(record->bytes);
    memset(record, 0, sizeof(*record));
}

static char *directory;
static char live_setting[1100];
static char hostname[256];

static void setup(void)
{
    directory = make_temp_dir();
    cr_assert_not_null(directory);
    snprintf(live_setting, sizeof(live_setting), "PINSHIM_LIVE=%s", directory);
    cr_assert_eq(gethostname(hostname, sizeof(hostname) - 1), 0);
}

static void teardown(void)
{
    remove_tree(directory);
    free(directory);
}

static void record_path(char *out, size_t out_size, long pid, int attempt)
{
    if (attempt == 0)
        snprintf(out, out_size, "%s/%s.%ld.live", directory, hostname, pid);
    else
        snprintf(out, out_size, "%s/%s.%ld.%d.live", directory, hostname, pid, attempt);
}

static int files_in(const char *path)
{
    DIR *listing = opendir(path);
    if (listing == NULL)
        return 0;
    int count = 0;
    for (struct dirent *entry; (entry = readdir(listing)) != NULL;)
        count += entry->d_name[0] != '.';
    closedir(listing);
    return count;
}

TestSuite(live_records, .init = setup, .fini = teardown, .timeout = 60);

/* Three buffers locked, then the signal: the record says three registered,
 * three live, the process running when it died (a reader compares the pid's
 * start time to tell it is gone). */
static void killed_by(int signal_number)
{
    struct session session;
    const char *settings[] = {live_setting, NULL};
    session_start(&session, settings);
    for (int i = 0; i < 3; i++)
        session_say(&session, "lock", "ok lock");
    cr_assert_eq(session_end(&session, signal_number), 128 + signal_number);
    char path[1300];
    record_path(path, sizeof(path), (long)session.pid, 0);
    struct record record;
    cr_assert(record_read(path, &record), "no record at %s", path);
    cr_assert_eq(record.header->state, LIVE_RECORD_RUNNING);
    cr_assert_eq(record.header->pid, (int64_t)session.pid);
    cr_assert_gt(record.header->start_ticks, 0);
    cr_assert_str_eq(record.header->ended_by, "");
    cr_assert_str_eq(record.header->context_mode, "create");
    cr_assert_eq(record_value(&record, "calls.lock"), 3);
    cr_assert_eq(record_value(&record, "register.ok"), 3);
    cr_assert_eq(record_value(&record, "register.bytes"), 3 << 20);
    cr_assert_eq(record_value(&record, "live.ranges"), 3);
    cr_assert_eq(record_value(&record, "live.bytes"), 3 << 20);
    cr_assert_gt(record_value(&record, "last_change"), 0);
    record_free(&record);
}

Test(live_records, sigkill_leaves_the_counts)
{
    killed_by(SIGKILL);
}

Test(live_records, sigterm_leaves_the_counts)
{
    killed_by(SIGTERM);
}

/* The record is the process's counters as they change: read while it runs. */
Test(live_records, updated_in_place_while_the_process_runs)
{
    struct session session;
    const char *settings[] = {live_setting, NULL};
    session_start(&session, settings);
    session_say(&session, "lock", "ok lock");
    session_say(&session, "lock", "ok lock");
    char path[1300];
    record_path(path, sizeof(path), (long)session.pid, 0);
    struct record record;
    cr_assert(record_read(path, &record));
    cr_assert_eq(record_value(&record, "live.ranges"), 2);
    record_free(&record);
    session_say(&session, "unlock", "ok unlock");
    cr_assert(record_read(path, &record));
    cr_assert_eq(record_value(&record, "live.ranges"), 1);
    cr_assert_eq(record_value(&record, "unregister.munlock"), 1);
    cr_assert_eq(record_value(&record, "calls.unlock"), 1);
    record_free(&record);
    cr_assert_eq(session_end(&session, SIGKILL), 128 + SIGKILL);
}

/* A clean end leaves no record: the statistics file holds what it said (or,
 * without one, nothing is kept, as before live records). */
static void clean_end(const char *command, const char *ended_by, bool writable_stats)
{
    char stats[1300];
    snprintf(stats, sizeof(stats), "PINSHIM_STATS=%s/%s/s.%%p.json", directory,
             writable_stats ? "." : "missing-directory");
    struct session session;
    const char *settings[] = {live_setting, stats, "PINSHIM_LOG=quiet", NULL};
    session_start(&session, settings);
    session_say(&session, "lock", "ok lock");
    if (command != NULL)
        session_say(&session, command, "ok");
    cr_assert_eq(session_end(&session, 0), 0);
    char path[1300];
    record_path(path, sizeof(path), (long)session.pid, 0);
    struct record record;
    if (writable_stats) {
        cr_assert_not(record_read(path, &record), "a clean end left its record");
        char json[1300];
        snprintf(json, sizeof(json), "%s/s.%ld.json", directory, (long)session.pid);
        char *text = read_file_text(json);
        cr_assert_not_null(text, "no statistics file %s", json);
        char wanted[64];
        snprintf(wanted, sizeof(wanted), "\"ended_by\": \"%s\"", ended_by);
        cr_assert_not_null(strstr(text, wanted), "%s", text);
        free(text);
        return;
    }
    /* The JSON could not be written: the record stays, ended, so nothing is lost. */
    cr_assert(record_read(path, &record), "the statistics were lost with the record");
    cr_assert_eq(record.header->state, LIVE_RECORD_EXITED);
    cr_assert_str_eq(record.header->ended_by, ended_by);
    cr_assert_gt(record.header->ended_ns, 0);
    cr_assert_eq(record_value(&record, "register.ok"), 1);
    record_free(&record);
}

Test(live_records, exit_writes_the_statistics_and_removes_the_record)
{
    clean_end(NULL, "exit", true);
}

Test(live_records, underscore_exit_writes_the_statistics_and_removes_the_record)
{
    clean_end("_exit", "_exit", true);
}

Test(live_records, exit_without_a_statistics_file_keeps_the_record_ended)
{
    clean_end("exit", "exit", false);
}

Test(live_records, underscore_exit_without_a_statistics_file_keeps_the_record_ended)
{
    clean_end("_exit", "_exit", false);
}

Test(live_records, without_statistics_a_clean_end_leaves_nothing)
{
    struct session session;
    const char *settings[] = {live_setting, NULL};
    session_start(&session, settings);
    session_say(&session, "lock", "ok lock");
    cr_assert_eq(files_in(directory), 1);
    cr_assert_eq(session_end(&session, 0), 0);
    cr_assert_eq(files_in(directory), 0);
}

/* The child's counts start at the fork, in a record of its own; the
 * parent's record is untouched by them. */
Test(live_records, a_fork_child_has_a_record_of_its_own)
{
    struct session session;
    const char *settings[] = {live_setting, NULL};
    session_start(&session, settings);
    session_say(&session, "lock", "ok lock");
    const char *answer = session_say(&session, "fork", "child ");
    long child = strtol(answer + 6, NULL, 10);
    cr_assert_gt(child, 0);
    session_say(&session, "lock", "ok lock");
    kill((pid_t)child, SIGKILL);
    char parent_path[1300], child_path[1300];
    record_path(parent_path, sizeof(parent_path), (long)session.pid, 0);
    record_path(child_path, sizeof(child_path), child, 0);
    struct record record;
    cr_assert(record_read(child_path, &record), "the child has no record");
    cr_assert_eq(record.header->fork_child, 1);
    cr_assert_eq(record.header->pid, child);
    cr_assert_eq(record_value(&record, "calls.lock"), 2);
    record_free(&record);
    cr_assert(record_read(parent_path, &record));
    cr_assert_eq(record.header->fork_child, 0);
    cr_assert_eq(record_value(&record, "calls.lock"), 2, "the child counted into its parent's");
    cr_assert_eq(record_value(&record, "register.ok"), 2);
    record_free(&record);
    cr_assert_eq(session_end(&session, SIGKILL), 128 + SIGKILL);
}

/* exec replaces the program, not the process: the first image's record
 * ends by exec when the next one locks, and each keeps its own counts. */
Test(live_records, exec_hands_over_to_the_next_image)
{
    /* The next image knows the record for its process's by pid and start
     * time; qemu-user makes /proc/self/stat's start time up from its own
     * start, which exec restarts (seen: 1483347 before exec, 1483350 after). */
    SKIP_UNDER_EMULATOR("its /proc/self/stat start time changes at exec, which Linux's never does");
    struct session session;
    const char *settings[] = {live_setting, NULL};
    session_start(&session, settings);
    session_say(&session, "lock", "ok lock");
    session_say(&session, "exec", "ok exec");
    session_say(&session, "lock", "ok lock");
    session_say(&session, "lock", "ok lock");
    char first[1300], second[1300];
    record_path(first, sizeof(first), (long)session.pid, 0);
    record_path(second, sizeof(second), (long)session.pid, 1);
    struct record record;
    cr_assert(record_read(first, &record));
    cr_assert_eq(record.header->state, LIVE_RECORD_REPLACED);
    cr_assert_str_eq(record.header->ended_by, "exec");
    cr_assert_eq(record_value(&record, "register.ok"), 1);
    record_free(&record);
    cr_assert(record_read(second, &record), "the second image has no record");
    cr_assert_eq(record.header->state, LIVE_RECORD_RUNNING);
    cr_assert_eq(record_value(&record, "register.ok"), 2);
    record_free(&record);
    /* A clean end of the last image takes both (no statistics asked for). */
    cr_assert_eq(session_end(&session, 0), 0);
    cr_assert_eq(files_in(directory), 0);
}

/* By default the record goes to the per-user runtime directory, made 0700;
 * PINSHIM_LIVE=off makes none; a process that locks nothing, none either. */
Test(live_records, the_default_directory_and_off)
{
    char xdg[1200], expected[1300];
    snprintf(xdg, sizeof(xdg), "XDG_RUNTIME_DIR=%s", directory);
    snprintf(expected, sizeof(expected), "%s/pinshim", directory);
    struct session session;
    const char *nothing[] = {xdg, NULL};
    session_start(&session, nothing);
    session_say(&session, "unlock", "failed unlock");
    cr_assert_eq(session_end(&session, SIGKILL), 128 + SIGKILL);
    cr_assert_eq(files_in(expected), 0, "a process that locked nothing left a record");

    const char *off[] = {xdg, "PINSHIM_LIVE=off", NULL};
    session_start(&session, off);
    session_say(&session, "lock", "ok lock");
    cr_assert_eq(session_end(&session, SIGKILL), 128 + SIGKILL);
    cr_assert_eq(files_in(expected), 0, "PINSHIM_LIVE=off made a record");

    const char *automatic[] = {xdg, NULL};
    session_start(&session, automatic);
    session_say(&session, "lock", "ok lock");
    struct stat info;
    cr_assert_eq(stat(expected, &info), 0, "no %s", expected);
    cr_assert_eq(info.st_mode & 0777, 0700);
    cr_assert_eq(files_in(expected), 1);
    cr_assert_eq(session_end(&session, SIGKILL), 128 + SIGKILL);
    cr_assert_eq(files_in(expected), 1);
}

/* Makes the record at path look last changed seconds_ago (creation and
 * the last_change field), as a reader of its format would write it. */
static void age_record(const char *path, uint64_t seconds_ago)
{
    struct record record;
    cr_assert(record_read(path, &record), "no record at %s", path);
    uint64_t then = ((uint64_t)time(NULL) - seconds_ago) * 1000000000ull;
    off_t last_change = (off_t)record_field_offset(&record, "last_change");
    record_free(&record);
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, &then, sizeof(then), offsetof(struct live_record_header, created_ns)),
                 (ssize_t)sizeof(then));
    cr_assert_eq(pwrite(fd, &then, sizeof(then), last_change), (ssize_t)sizeof(then));
    close(fd);
}

static bool exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* Killed processes' records do not pile up in the default directory: the
 * next process that makes a record there removes those of processes that
 * are gone, at once without a statistics file, after a day with one (what
 * pinshim report DIR reads); running processes' and other hosts' stay. */
Test(live_records, the_default_directory_keeps_no_records_of_processes_gone)
{
    char xdg[1200], stats[1300], records[1300];
    snprintf(xdg, sizeof(xdg), "XDG_RUNTIME_DIR=%s", directory);
    snprintf(stats, sizeof(stats), "PINSHIM_STATS=%s/s.%%p.json", directory);
    snprintf(records, sizeof(records), "%s/pinshim", directory);
    const char *plain[] = {xdg, NULL}, *with_stats[] = {xdg, stats, NULL};
    struct session killed, killed_with_stats, old_with_stats, running;
    char killed_path[1600], killed_with_stats_path[1600], old_path[1600], running_path[1600],
        other_host_path[1600];

    session_start(&killed, plain);
    session_say(&killed, "lock", "ok lock");
    snprintf(killed_path, sizeof(killed_path), "%s/%s.%ld.live", records, hostname,
             (long)killed.pid);
    cr_assert_eq(session_end(&killed, SIGKILL), 128 + SIGKILL);
    cr_assert(exists(killed_path));
    /* Another host's record (a shared home's runtime directory, say). */
    snprintf(other_host_path, sizeof(other_host_path), "%s/another-host.1.live", records);
    char *copy = read_file_text(killed_path);
    cr_assert_not_null(copy);
    memset(copy + offsetof(struct live_record_header, host), 0,
           sizeof(((struct live_record_header *)0)->host));
    memcpy(copy + offsetof(struct live_record_header, host), "another-host", 12);
    struct stat info;
    cr_assert_eq(stat(killed_path, &info), 0);
    int fd = open(other_host_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, copy, (size_t)info.st_size), info.st_size);
    close(fd);
    free(copy);

    session_start(&killed_with_stats, with_stats);
    session_say(&killed_with_stats, "lock", "ok lock");
    snprintf(killed_with_stats_path, sizeof(killed_with_stats_path), "%s/%s.%ld.live", records,
             hostname, (long)killed_with_stats.pid);
    cr_assert_not(exists(killed_path), "a killed process's record without statistics stayed");
    cr_assert_eq(session_end(&killed_with_stats, SIGKILL), 128 + SIGKILL);

    session_start(&old_with_stats, with_stats);
    session_say(&old_with_stats, "lock", "ok lock");
    snprintf(old_path, sizeof(old_path), "%s/%s.%ld.live", records, hostname,
             (long)old_with_stats.pid);
    cr_assert(exists(killed_with_stats_path), "removed before its day was over");
    cr_assert_eq(session_end(&old_with_stats, SIGKILL), 128 + SIGKILL);
    age_record(old_path, 2 * 24 * 3600);

    session_start(&running, plain);
    session_say(&running, "lock", "ok lock");
    snprintf(running_path, sizeof(running_path), "%s/%s.%ld.live", records, hostname,
             (long)running.pid);
    cr_assert_not(exists(old_path), "a record with statistics two days old stayed");
    cr_assert(exists(killed_with_stats_path));
    cr_assert(exists(other_host_path), "another host's record was removed");

    /* The running process's record stays while another comes and goes. */
    struct session last;
    session_start(&last, plain);
    session_say(&last, "lock", "ok lock");
    cr_assert(exists(running_path), "a running process's record was removed");
    cr_assert_eq(session_end(&last, 0), 0);
    cr_assert(exists(running_path));
    cr_assert_eq(session_end(&running, 0), 0);
    cr_assert_eq(files_in(records), 2, "left: the killed one with statistics, the other host's");
}

/* A directory that cannot take the record: one warning, the program goes on. */
Test(live_records, a_directory_that_does_not_exist_is_one_warning)
{
    char setting[1300];
    snprintf(setting, sizeof(setting), "PINSHIM_LIVE=%s/no/such/directory", directory);
    const char *argv[] = {shim_run_required_env("LIVE_ENDINGS"), NULL};
    char preload[1024], runtime[1024];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", shim_run_required_env("PINSHIM_LIB"));
    snprintf(runtime, sizeof(runtime), "PINSHIM_CUDART=%s", shim_run_required_env("FAKE_CUDART"));
    const char *environment[] = {preload, runtime, "PINSHIM_CONTEXT=create", setting, NULL};
    struct child_result result;
    child_run(argv, environment, "lock\nlock\n", &result);
    cr_assert_eq(result.status, 0, "%s", result.err);
    cr_assert_eq(strstr(result.out, "ok lock") != NULL, 1, "%s", result.out);
    const char *warning = strstr(result.err, "pinshim: no live record in ");
    cr_assert_not_null(warning, "%s", result.err);
    cr_assert_null(strstr(warning + 1, "pinshim: no live record in "), "%s", result.err);
    cr_assert_not_null(strstr(result.err, "No such file or directory"), "%s", result.err);
    child_result_free(&result);
}

Test(live_records, a_bad_value_is_one_warning)
{
    const char *argv[] = {shim_run_required_env("LIVE_ENDINGS"), NULL};
    char preload[1024];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", shim_run_required_env("PINSHIM_LIB"));
    const char *environment[] = {preload, "PINSHIM_LIVE=relative/dir", NULL};
    struct child_result result;
    child_run(argv, environment, "", &result);
    cr_assert_eq(result.status, 0, "%s", result.err);
    cr_assert_not_null(strstr(result.err, "pinshim: PINSHIM_LIVE=\"relative/dir\" is not valid "
                                          "(not auto, off or an absolute directory path); "
                                          "accepted: auto, off, or an absolute directory path; "
                                          "using auto\n"),
                       "%s", result.err);
    child_result_free(&result);
}
