/* The stats writer: valid JSON with the documented keys, the text summary,
 * path templates, unwritable paths, which processes have something to say,
 * and a stats file written safely in a directory others can write to. */
#include "stats.h"

#include "log.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "json_lite.h"

static struct pinshim_config config;

static void fill(struct stats_report *report)
{
    memset(report, 0, sizeof(*report));
    config_set_defaults(&config);
    report->pid = 4242;
    strcpy(report->host, "node\"01\\");
    strcpy(report->exe, "/usr/bin/prog\twith\ncontrol");
    report->config = &config;
    report->runtime_loaded = true;
    report->runtime_usable = true;
    report->runtime_path = "/usr/local/cuda/lib64/libcudart.so.13";
    report->vendor = "cuda";
    report->vendor_title = "CUDA";
    report->register_call = "cuMemHostRegister";
    report->unregister_call = "cuMemHostUnregister";
    report->counters.register_ok = 5;
    report->counters.register_bytes = 5 << 20;
    report->counters.register_nanoseconds = 1500000000;
    report->counters.unregister_ok = 4;
    report->counters.unregister_munlock = 3;
    report->counters.unregister_free = 1;
    report->counters.peak_bytes = 3 << 20;
    report->live_ranges_at_exit = 1;
    report->live_bytes_at_exit = 1 << 20;
    report->error_count = 1;
    report->errors[0].name = "cudaErrorMemoryAllocation";
    report->errors[0].code = 2;
    report->errors[0].count = 7;
    report->device_count = 4;
    report->devices[3].registrations = 5;
    report->devices[3].bytes = 5 << 20;
    report->deferred_total = 2;
    report->deferred_registered = 1;
    report->pending_ranges_at_exit = 1;
    report->pending_bytes_at_exit = 2 << 20;
    report->background_nanoseconds = 250000000;
    report->driver_path = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
}

static char *render_json(const struct stats_report *report)
{
    char path[] = "/tmp/pinshim-stats-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert(stats_write_json(fd, report));
    close(fd);
    char *text = read_file_text(path);
    unlink(path);
    return text;
}

static double number_at(const char *doc, const char *key)
{
    double value = -1;
    cr_assert(json_lite_get_number(doc, key, &value), "missing %s", key);
    return value;
}

Test(stats, json_is_valid_and_has_the_documented_keys)
{
    struct stats_report report;
    fill(&report);
    char *doc = render_json(&report);
    char why[256];
    cr_assert(json_lite_valid(doc, why, sizeof(why)), "%s\n%s", why, doc);
    char text[256];
    cr_assert(json_lite_get_string(doc, "pinshim", text, sizeof(text)));
    cr_assert_str_eq(text, PINSHIM_VERSION_STRING);
    cr_assert_eq(number_at(doc, "pid"), 4242);
    cr_assert(json_lite_get_string(doc, "host", text, sizeof(text)));
    cr_assert_str_eq(text, "node\"01\\");
    cr_assert(json_lite_get_string(doc, "exe", text, sizeof(text)));
    cr_assert_str_eq(text, "/usr/bin/prog\twith\ncontrol");
    cr_assert_eq(number_at(doc, "config.MIN_BYTES"), 65536);
    cr_assert(json_lite_get_string(doc, "config.REGISTER", text, sizeof(text)));
    cr_assert_str_eq(text, "on");
    bool loaded = false;
    cr_assert(json_lite_get_bool(doc, "cudart.loaded", &loaded));
    cr_assert(loaded);
    cr_assert_eq(json_lite_type(doc, "cudart.error"), JSON_LITE_NULL);
    /* The vendor and its calls (issue 27). */
    cr_assert(json_lite_get_string(doc, "accelerator.vendor", text, sizeof(text)));
    cr_assert_str_eq(text, "cuda");
    cr_assert(json_lite_get_string(doc, "accelerator.register_call", text, sizeof(text)));
    cr_assert_str_eq(text, "cuMemHostRegister");
    cr_assert(json_lite_get_string(doc, "accelerator.unregister_call", text, sizeof(text)));
    cr_assert_str_eq(text, "cuMemHostUnregister");
    cr_assert(json_lite_get_string(doc, "accelerator.library", text, sizeof(text)));
    cr_assert_str_eq(text, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    const char *numbers[] = {"register.ok",
                             "register.failed",
                             "register.already_registered",
                             "register.skipped_small",
                             "register.bytes",
                             "register.seconds",
                             "unregister.ok",
                             "unregister.failed",
                             "unregister.munlock",
                             "unregister.free",
                             "unregister.realloc",
                             "unregister.munmap",
                             "unregister.mremap",
                             "unregister.mmap_fixed",
                             "unregister.exit",
                             "live.ranges",
                             "live.bytes",
                             "live.peak_bytes"};
    for (size_t i = 0; i < sizeof(numbers) / sizeof(*numbers); i++)
        number_at(doc, numbers[i]);
    const char *new_numbers[] = {"context.contexts_created",
                                 "deferred.ranges",
                                 "deferred.registered_later",
                                 "deferred.pending_bytes_at_exit",
                                 "thread.queued_at_exit",
                                 "thread.background_seconds",
                                 "program.registrations",
                                 "unregister.program",
                                 "register.skipped_onfault_pages",
                                 "unregister.join",
                                 "runs.joined",
                                 "runs.join_failed",
                                 "runs.chunked",
                                 "runs.held_ranges_at_exit",
                                 "runs.held_bytes_at_exit"};
    for (size_t i = 0; i < sizeof(new_numbers) / sizeof(*new_numbers); i++)
        number_at(doc, new_numbers[i]);
    cr_assert(json_lite_get_string(doc, "context.mode", text, sizeof(text)));
    cr_assert_str_eq(text, "program");
    cr_assert(json_lite_get_string(doc, "context.driver", text, sizeof(text)));
    cr_assert_str_eq(text, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    cr_assert_eq(json_lite_count(doc, "devices"), 1, "only devices that registered");
    cr_assert_eq(number_at(doc, "devices.0.device"), 3);
    cr_assert_eq(number_at(doc, "devices.0.bytes"), 5 << 20);
    cr_assert_eq(number_at(doc, "deferred.pending_ranges_at_exit"), 1);
    cr_assert_float_eq(number_at(doc, "thread.background_seconds"), 0.25, 1e-9);
    cr_assert_eq(number_at(doc, "register.ok"), 5);
    cr_assert_eq(number_at(doc, "register.bytes"), 5 << 20);
    cr_assert_float_eq(number_at(doc, "register.seconds"), 1.5, 1e-9);
    cr_assert_eq(number_at(doc, "unregister.munlock"), 3);
    cr_assert_eq(number_at(doc, "live.ranges"), 1);
    cr_assert_eq(number_at(doc, "errors.cudaErrorMemoryAllocation"), 7);
    cr_assert_eq(number_at(doc, "warnings"), 0);
    free(doc);
    report.warnings = 3;
    doc = render_json(&report);
    cr_assert_eq(number_at(doc, "warnings"), 3);
    free(doc);
}

Test(stats, json_without_runtime_has_nulls)
{
    struct stats_report report;
    fill(&report);
    report.runtime_loaded = report.runtime_usable = false;
    report.runtime_path = NULL;
    report.runtime_error = "no CUDA runtime found";
    report.error_count = 0;
    char *doc = render_json(&report);
    char why[256];
    cr_assert(json_lite_valid(doc, why, sizeof(why)), "%s", why);
    cr_assert_eq(json_lite_type(doc, "cudart.path"), JSON_LITE_NULL);
    cr_assert_eq(json_lite_type(doc, "errors"), JSON_LITE_OBJECT);
    cr_assert_eq(json_lite_count(doc, "errors"), 0);
    free(doc);
}

Test(stats, text_summary_says_the_same)
{
    struct stats_report report;
    fill(&report);
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    cr_assert(stats_write_text(pipe_fds[1], &report));
    close(pipe_fds[1]);
    char text[4096];
    ssize_t n = read(pipe_fds[0], text, sizeof(text) - 1);
    close(pipe_fds[0]);
    text[n > 0 ? n : 0] = '\0';
    const char *headline = "pinshim: pid 4242 on node\"01\\: registered 5 (5.0 MiB in 1.500 s), "
                           "unregistered 4, failed 0+0, live at exit 1 (1.0 MiB)\n";
    cr_assert(strncmp(text, headline, strlen(headline)) == 0, "%s", text);
    cr_assert(strstr(text,
                     "context: the program's CUDA, through /usr/lib/x86_64-linux-gnu/libcuda.so.1 "
                     "(cuMemHostRegister)") != NULL,
              "%s", text);
    cr_assert(strstr(text, "deferred 2 range(s) until the program had a context: 1 registered "
                           "later, 0 released first, 1 (2.0 MiB) still waiting at exit") != NULL,
              "%s", text);
    cr_assert(strstr(text, "devices: 3: 5 (5.0 MiB)") != NULL, "%s", text);
    cr_assert(strstr(text, "0.250 s registering in the background") != NULL, "%s", text);
    cr_assert(strstr(text, "munlock 3, free 1") != NULL);
    cr_assert(strstr(text, "errors: cudaErrorMemoryAllocation 7") != NULL);
    for (char *line = text; *line; line = strchr(line, '\n') + 1)
        cr_assert(strncmp(line, "pinshim: ", 9) == 0, "line without prefix: %s", line);
}

Test(stats, text_summary_of_create_mode_names_the_runtime)
{
    struct stats_report report;
    fill(&report);
    config.context_mode = CONTEXT_CREATE;
    report.contexts_created = 1;
    report.driver_path = NULL;
    report.register_call = "cudaHostRegister";
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    cr_assert(stats_write_text(pipe_fds[1], &report));
    close(pipe_fds[1]);
    char text[4096];
    ssize_t n = read(pipe_fds[0], text, sizeof(text) - 1);
    close(pipe_fds[0]);
    text[n > 0 ? n : 0] = '\0';
    cr_assert(strstr(text,
                     "runtime /usr/local/cuda/lib64/libcudart.so.13 (CUDA, cudaHostRegister); "
                     "1 context(s) created by the shim") != NULL,
              "%s", text);
}

Test(stats, path_templates)
{
    char out[64];
    cr_assert(stats_expand_path("/tmp/s.%h.%p.json", 77, "hostA", out, sizeof(out)));
    cr_assert_str_eq(out, "/tmp/s.hostA.77.json");
    cr_assert(stats_expand_path("100%%-%p%%", 5, "h", out, sizeof(out)));
    cr_assert_str_eq(out, "100%-5%");
    cr_assert(stats_expand_path("plain", 5, "h", out, sizeof(out)));
    cr_assert_str_eq(out, "plain");
    cr_assert_not(stats_expand_path("/tmp/%h%h%h", 1, "a-very-long-host-name-here", out, 32));
    cr_assert(stats_expand_path("ab", 1, "h", out, 3));
    cr_assert_not(stats_expand_path("abc", 1, "h", out, 3));
}

Test(stats, write_file_is_atomic_and_reports_failures)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    char why[128] = "";
    cr_assert(stats_write_file(path, &report, why, sizeof(why)), "%s", why);
    char *doc = read_file_text(path);
    cr_assert(json_lite_valid(doc, why, sizeof(why)), "%s", why);
    free(doc);
    snprintf(path, sizeof(path), "%s/missing/stats.json", directory);
    cr_assert_not(stats_write_file(path, &report, why, sizeof(why)));
    cr_assert_str_eq(why, "No such file or directory");
    remove_tree(directory);
    free(directory);
}

/* ---- which processes have something to say ---- */

Test(stats, worth_writing_needs_a_lock_call_or_a_warning)
{
    struct stats_report report;
    memset(&report, 0, sizeof(report));
    struct pinshim_config cfg;
    config_set_defaults(&cfg);
    report.config = &cfg;
    const enum stats_mode modes[] = {STATS_TEXT, STATS_JSON};
    for (size_t m = 0; m < 2; m++) {
        cfg.stats_mode = modes[m];
        cfg.stats_all = false;
        memset(&report.counters, 0, sizeof(report.counters));
        report.warnings = 0;
        cr_assert_not(stats_worth_writing(&report, &cfg), "nothing happened");
        /* Unlocking, registering counters and the like without a lock call do
         * not count: only a lock call or a warning. */
        report.counters.unlock_calls = 4;
        report.counters.register_skipped_small = 0;
        cr_assert_not(stats_worth_writing(&report, &cfg));
        report.counters.lock_calls = 1;
        cr_assert(stats_worth_writing(&report, &cfg), "a lock call");
        report.counters.lock_calls = 0;
        report.counters.mlockall_calls = 1;
        cr_assert(stats_worth_writing(&report, &cfg), "an mlockall call");
        report.counters.mlockall_calls = 0;
        report.warnings = 1;
        cr_assert(stats_worth_writing(&report, &cfg), "a warning");
        report.warnings = 0;
        cfg.stats_all = true;
        cr_assert(stats_worth_writing(&report, &cfg), "PINSHIM_STATS_ALL");
    }
    /* Never when PINSHIM_STATS is off. */
    cfg.stats_mode = STATS_NONE;
    cfg.stats_all = true;
    report.counters.lock_calls = 5;
    report.warnings = 5;
    cr_assert_not(stats_worth_writing(&report, &cfg));
}

Test(stats, warnings_are_counted_printed_or_not_and_per_process)
{
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    log_set_fd(pipe_fds[1]);
    uint64_t before = log_warning_count();
    log_set_level(LOG_DEBUG);
    log_message(LOG_INFO, "an info line");
    log_message(LOG_DEBUG, "a debug line");
    cr_assert_eq(log_warning_count(), before);
    log_warn("one");
    cr_assert_eq(log_warning_count(), before + 1);
    log_set_level(LOG_QUIET);
    log_warn("two, not printed");
    cr_assert_eq(log_warning_count(), before + 2);
    log_set_level(LOG_WARN);
    log_set_fd(-1);
    close(pipe_fds[1]);
    close(pipe_fds[0]);

    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        /* A fork child counts only its own warnings. */
        int ok = log_warning_count() == 0;
        log_set_level(LOG_QUIET);
        log_warn("three");
        ok = ok && log_warning_count() == 1;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw its parent's count");
    cr_assert_eq(log_warning_count(), before + 2);
}

/* ---- a stats file written safely ---- */

/* A random source that gives scripted bytes: call i gets bytes filled with
 * script[i] (the last one once the script runs out). */
struct scripted_random {
    unsigned char script[8];
    size_t length;
    size_t calls;
};

static void scripted_fill(void *context, unsigned char *out, size_t length)
{
    struct scripted_random *scripted = context;
    size_t index = scripted->calls < scripted->length ? scripted->calls : scripted->length - 1;
    memset(out, scripted->script[index], length);
    scripted->calls++;
}

static void name_for(const char *path, unsigned char byte, char *out, size_t out_size)
{
    unsigned char bytes[STATS_RANDOM_BYTES];
    memset(bytes, byte, sizeof(bytes));
    cr_assert(stats_temporary_name(path, bytes, out, out_size));
}

static void write_text(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    cr_assert_not_null(file, "%s", path);
    fputs(text, file);
    fclose(file);
}

static void expect_text(const char *path, const char *text)
{
    char *content = read_file_text(path);
    cr_assert_not_null(content, "%s is gone", path);
    cr_assert_str_eq(content, text, "%s was changed", path);
    free(content);
}

static void expect_stats_document(const char *path)
{
    struct stat info;
    cr_assert_eq(lstat(path, &info), 0, "%s", path);
    cr_assert(S_ISREG(info.st_mode), "%s is not a regular file", path);
    char *doc = read_file_text(path);
    char why[256];
    cr_assert(json_lite_valid(doc, why, sizeof(why)), "%s: %s", path, why);
    cr_assert_eq(number_at(doc, "pid"), 4242);
    free(doc);
}

/* The names in directory, sorted, as "a b c". */
static void directory_names(const char *directory, char *out, size_t out_size)
{
    struct dirent **entries;
    int n = scandir(directory, &entries, NULL, alphasort);
    cr_assert_geq(n, 0);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(entries[i]->d_name, ".") != 0 && strcmp(entries[i]->d_name, "..") != 0) {
            if (out[0] != '\0')
                strncat(out, " ", out_size - strlen(out) - 1);
            strncat(out, entries[i]->d_name, out_size - strlen(out) - 1);
        }
        free(entries[i]);
    }
    free(entries);
}

Test(stats, temporary_names_are_in_the_directory_and_follow_the_random_bytes)
{
    unsigned char bytes[STATS_RANDOM_BYTES];
    memset(bytes, 0, sizeof(bytes));
    char name[512];
    cr_assert(stats_temporary_name("/tmp/run/s.json", bytes, name, sizeof(name)));
    cr_assert_str_eq(name, "/tmp/run/.s.json.AAAAAAAAAAAAAAAA.tmp");
    memset(bytes, 0xff, sizeof(bytes));
    cr_assert(stats_temporary_name("s.json", bytes, name, sizeof(name)));
    cr_assert_str_eq(name, "./.s.json.________________.tmp");
    for (size_t i = 0; i < sizeof(bytes); i++)
        bytes[i] = (unsigned char)(i * 37 + 1);
    cr_assert(stats_temporary_name("/s.json", bytes, name, sizeof(name)));
    cr_assert_eq(strncmp(name, "/.s.json.", 9), 0, "%s", name);
    cr_assert_eq(strlen(name), strlen("/.s.json.") + 16 + 4, "%s", name);
    /* A long final name is cut so the temporary one stays within NAME_MAX. */
    char long_path[300] = "/d/";
    memset(long_path + 3, 'n', 250);
    long_path[253] = '\0';
    cr_assert(stats_temporary_name(long_path, bytes, name, sizeof(name)));
    cr_assert_leq(strlen(strrchr(name, '/') + 1), 255);
    /* Different bytes, different names. */
    char other[512];
    bytes[0] ^= 1;
    cr_assert(stats_temporary_name("/s.json", bytes, other, sizeof(other)));
    cr_assert_str_neq(name, other);
}

Test(stats, system_random_gives_different_names)
{
    unsigned char a[STATS_RANDOM_BYTES] = {0}, b[STATS_RANDOM_BYTES] = {0};
    stats_system_random.fill(stats_system_random.context, a, sizeof(a));
    stats_system_random.fill(stats_system_random.context, b, sizeof(b));
    cr_assert_neq(memcmp(a, b, sizeof(a)), 0);
}

/* The attack, at the exact name the next call will use: a symlink
 * planted there is refused (O_EXCL|O_NOFOLLOW), the writer retries with the
 * next name, and the link's target is untouched. */
Test(stats, symlink_at_the_next_temporary_name_is_refused_and_another_name_used)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512], victim[512], planted[512], second[512];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    snprintf(victim, sizeof(victim), "%s/victim", directory);
    write_text(victim, "precious\n");
    name_for(path, 0x11, planted, sizeof(planted));
    name_for(path, 0x22, second, sizeof(second));
    cr_assert_eq(symlink(victim, planted), 0);

    struct scripted_random scripted = {{0x11, 0x22}, 2, 0};
    struct stats_random source = {scripted_fill, &scripted};
    char why[128] = "";
    cr_assert(stats_write_file_using(path, &report, &source, why, sizeof(why)), "%s", why);
    cr_assert_eq(scripted.calls, 2, "the writer did not retry with another name");
    expect_text(victim, "precious\n");
    char target[512] = "";
    cr_assert_gt(readlink(planted, target, sizeof(target) - 1), 0, "the planted link is gone");
    cr_assert_str_eq(target, victim);
    expect_stats_document(path);
    cr_assert_neq(access(second, F_OK), 0, "the second temporary name was left behind");
    char names[1024];
    directory_names(directory, names, sizeof(names));
    char wanted[1024];
    snprintf(wanted, sizeof(wanted), "%s stats.json victim", strrchr(planted, '/') + 1);
    cr_assert_str_eq(names, wanted);
    remove_tree(directory);
    free(directory);
}

/* A regular file planted at the next name (by another user, say) is neither
 * truncated nor written. */
Test(stats, file_at_the_next_temporary_name_is_left_alone)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512], planted[512];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    name_for(path, 0x33, planted, sizeof(planted));
    write_text(planted, "someone else's\n");
    struct scripted_random scripted = {{0x33, 0x44}, 2, 0};
    struct stats_random source = {scripted_fill, &scripted};
    char why[128] = "";
    cr_assert(stats_write_file_using(path, &report, &source, why, sizeof(why)), "%s", why);
    expect_text(planted, "someone else's\n");
    expect_stats_document(path);
    remove_tree(directory);
    free(directory);
}

/* Every name taken: a bounded number of tries, then a failure that says so,
 * and nothing written anywhere. */
Test(stats, every_temporary_name_taken_fails_after_a_bounded_number_of_tries)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512], victim[512], planted[512];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    snprintf(victim, sizeof(victim), "%s/victim", directory);
    write_text(victim, "precious\n");
    name_for(path, 0x55, planted, sizeof(planted));
    cr_assert_eq(symlink(victim, planted), 0);
    struct scripted_random scripted = {{0x55}, 1, 0};
    struct stats_random source = {scripted_fill, &scripted};
    char why[128] = "";
    cr_assert_not(stats_write_file_using(path, &report, &source, why, sizeof(why)));
    cr_assert_eq(scripted.calls, STATS_TEMPORARY_ATTEMPTS);
    cr_assert_str_eq(why, "File exists (16 temporary names taken)");
    expect_text(victim, "precious\n");
    cr_assert_neq(access(path, F_OK), 0);
    remove_tree(directory);
    free(directory);
}

/* The old writer opened "<path>.tmp.<pid>" with O_TRUNC and followed a
 * symlink planted there (the one-liner); that name is not used now. */
Test(stats, symlink_at_the_old_predictable_name_is_not_followed)
{
    struct stats_report report;
    fill(&report);
    report.pid = (long)getpid();
    char *directory = make_temp_dir();
    char path[512], victim[512], old_name[600];
    snprintf(path, sizeof(path), "%s/x.json", directory);
    snprintf(victim, sizeof(victim), "%s/victim", directory);
    snprintf(old_name, sizeof(old_name), "%s.tmp.%ld", path, report.pid);
    write_text(victim, "precious\n");
    cr_assert_eq(symlink(victim, old_name), 0);
    char why[128] = "";
    cr_assert(stats_write_file(path, &report, why, sizeof(why)), "%s", why);
    expect_text(victim, "precious\n");
    char names[1024];
    directory_names(directory, names, sizeof(names));
    char wanted[1024];
    snprintf(wanted, sizeof(wanted), "victim x.json x.json.tmp.%ld", report.pid);
    cr_assert_str_eq(names, wanted, "temporary files were left behind");
    remove_tree(directory);
    free(directory);
}

/* What may be planted at the final name itself: the rename replaces the
 * directory entry, never writes through it. */
Test(stats, symlink_or_hard_link_at_the_final_name_is_replaced_not_followed)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512], victim[512], victim_directory[512];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    snprintf(victim, sizeof(victim), "%s/victim", directory);
    snprintf(victim_directory, sizeof(victim_directory), "%s/victim.d", directory);
    write_text(victim, "precious\n");
    cr_assert_eq(mkdir(victim_directory, 0755), 0);
    char why[128] = "";

    /* A symlink to a file: the link is replaced, its target untouched. */
    cr_assert_eq(symlink(victim, path), 0);
    cr_assert(stats_write_file(path, &report, why, sizeof(why)), "%s", why);
    expect_stats_document(path);
    expect_text(victim, "precious\n");

    /* A symlink to a directory: the file does not land inside it. */
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(symlink(victim_directory, path), 0);
    cr_assert(stats_write_file(path, &report, why, sizeof(why)), "%s", why);
    expect_stats_document(path);
    char names[1024];
    directory_names(victim_directory, names, sizeof(names));
    cr_assert_str_empty(names);

    /* A hard link to a file: the name is replaced, the file's contents are not. */
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(link(victim, path), 0);
    cr_assert(stats_write_file(path, &report, why, sizeof(why)), "%s", why);
    expect_stats_document(path);
    expect_text(victim, "precious\n");

    directory_names(directory, names, sizeof(names));
    cr_assert_str_eq(names, "stats.json victim victim.d");
    remove_tree(directory);
    free(directory);
}

/* A directory at the final name: the rename fails, the reason is given and the
 * temporary file is removed. */
Test(stats, failed_rename_removes_the_temporary_file)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    cr_assert_eq(mkdir(path, 0755), 0);
    char why[128] = "";
    cr_assert_not(stats_write_file(path, &report, why, sizeof(why)));
    cr_assert_str_eq(why, "Is a directory");
    char names[1024];
    directory_names(directory, names, sizeof(names));
    cr_assert_str_eq(names, "stats.json");
    /* A path that ends in '/' names no file. */
    snprintf(path, sizeof(path), "%s/", directory);
    cr_assert_not(stats_write_file(path, &report, why, sizeof(why)));
    cr_assert_str_eq(why, "Is a directory");
    remove_tree(directory);
    free(directory);
}

/* 0666 less the umask, as for any file the user's programs create. */
Test(stats, file_mode_follows_the_umask)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    char path[512];
    const mode_t masks[] = {022, 077, 027};
    const mode_t modes[] = {0644, 0600, 0640};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/stats.%zu.json", directory, i);
        mode_t old = umask(masks[i]);
        char why[128] = "";
        bool ok = stats_write_file(path, &report, why, sizeof(why));
        umask(old);
        cr_assert(ok, "%s", why);
        struct stat info;
        cr_assert_eq(stat(path, &info), 0);
        cr_assert_eq(info.st_mode & 07777, modes[i], "umask %03o gave %03o", masks[i],
                     info.st_mode & 07777);
    }
    remove_tree(directory);
    free(directory);
}

/* A path without a directory is written in the current one. */
Test(stats, relative_path_is_written_in_the_current_directory)
{
    struct stats_report report;
    fill(&report);
    char *directory = make_temp_dir();
    cr_assert_eq(chdir(directory), 0);
    char why[128] = "";
    cr_assert(stats_write_file("plain.json", &report, why, sizeof(why)), "%s", why);
    cr_assert_eq(chdir("/"), 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/plain.json", directory);
    expect_stats_document(path);
    char names[1024];
    directory_names(directory, names, sizeof(names));
    cr_assert_str_eq(names, "plain.json");
    remove_tree(directory);
    free(directory);
}
