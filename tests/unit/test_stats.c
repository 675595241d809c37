/* The stats writer: valid JSON with the documented keys, the text summary,
 * path templates and unwritable paths. */
#include "stats.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    report->cudart_loaded = true;
    report->cudart_usable = true;
    report->cudart_path = "/usr/local/cuda/lib64/libcudart.so.13";
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
    const char *new_numbers[] = {"context.contexts_created", "deferred.ranges",
                                 "deferred.registered_later", "deferred.pending_bytes_at_exit",
                                 "thread.queued_at_exit", "thread.background_seconds",
                                 "program.registrations", "unregister.program",
                                 "register.skipped_onfault_pages"};
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
    free(doc);
}

Test(stats, json_without_runtime_has_nulls)
{
    struct stats_report report;
    fill(&report);
    report.cudart_loaded = report.cudart_usable = false;
    report.cudart_path = NULL;
    report.cudart_error = "no CUDA runtime found";
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
    cr_assert(strstr(text, "context: the program's, through /usr/lib/x86_64-linux-gnu/libcuda.so.1") !=
                  NULL,
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
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    cr_assert(stats_write_text(pipe_fds[1], &report));
    close(pipe_fds[1]);
    char text[4096];
    ssize_t n = read(pipe_fds[0], text, sizeof(text) - 1);
    close(pipe_fds[0]);
    text[n > 0 ? n : 0] = '\0';
    cr_assert(strstr(text, "runtime /usr/local/cuda/lib64/libcudart.so.13; 1 context(s) created "
                           "by the shim") != NULL,
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
