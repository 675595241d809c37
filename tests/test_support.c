/* Tests of the test-support code: json_lite, fake_log and child. */
#include "child.h"
#include "emulation.h"
#include "fake_cudart.h"
#include "fake_log.h"
#include "json_lite.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* json_lite                                                                */

Test(json_lite, accepts_valid_documents)
{
    static const char *const documents[] = {
        "{}",
        "[]",
        "0",
        "-0",
        "-0.5e+10",
        "1E5",
        "123.456e-7",
        "true",
        "null",
        "\"\"",
        " \n\t{ \"x\" : 1 } \r\n",
        "{\"a\":[1,2,{\"b\":null}],\"c\":true,\"d\":false}",
        "\"escapes \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"",
        "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"",
        "[[[[[]]]]]",
        "{\"a\":{\"a\":{\"a\":{}}}}",
    };
    for (size_t i = 0; i < sizeof documents / sizeof documents[0]; i++) {
        char err[128];
        cr_expect(json_lite_valid(documents[i], err, sizeof err), "rejected %s: %s", documents[i],
                  err);
    }
}

Test(json_lite, rejects_invalid_documents)
{
    static const char *const documents[] = {
        "",
        "   ",
        "{,}",
        "[1,]",
        "{\"a\":1,}",
        "[,1]",
        "01",
        "-01",
        "-",
        "1.",
        ".5",
        "1e",
        "1e+",
        "+1",
        "0x10",
        "NaN",
        "Infinity",
        "\"bad \\x escape\"",
        "\"\\u12\"",
        "\"\\u12G4\"",
        "\"tab\there\"",
        "\"newline\nhere\"",
        "\"unterminated",
        "{\"a\" 1}",
        "{a:1}",
        "{\"a\":}",
        "[1 2]",
        "{} x",
        "{}{}",
        "truex",
        "nul",
        "'a'",
        "[",
        "{\"a\":[}",
        "\"\xff\"",
        "\"\xc0\xaf\"",
        "\"\xed\xa0\x80\"",
        "\"\xf4\x90\x80\x80\"",
        "\"\xe2\x82\"",
    };
    for (size_t i = 0; i < sizeof documents / sizeof documents[0]; i++) {
        char err[128] = "";
        cr_expect_not(json_lite_valid(documents[i], err, sizeof err), "accepted [%s]",
                      documents[i]);
        cr_expect(strncmp(err, "offset ", 7) == 0, "error for [%s]: %s", documents[i], err);
    }
    cr_expect_not(json_lite_valid(NULL, NULL, 0));
}

Test(json_lite, error_names_the_offset)
{
    char err[128];
    cr_assert_not(json_lite_valid("{\"a\":[1,2,]}", err, sizeof err));
    cr_assert_str_eq(err, "offset 10: trailing comma");
    cr_assert_not(json_lite_valid("[1] 2", err, 4), "a short buffer is fine");
    cr_assert_str_eq(err, "off");
}

Test(json_lite, limits_nesting)
{
    char deep[2 * 600 + 1];
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    deep[1200] = '\0';
    cr_assert_not(json_lite_valid(deep, NULL, 0));
    deep[100] = '\0';
    memset(deep + 50, ']', 50);
    cr_assert(json_lite_valid(deep, NULL, 0));
}

static const char report[] = "{\n"
                             "  \"version\": \"0.1.0\",\n"
                             "  \"register\": {\"ok\": 12, \"failed\": 0, \"bytes\": 4.5e6},\n"
                             "  \"errors\": {\"cudaErrorMemoryAllocation\": 3},\n"
                             "  \"enabled\": true, \"dry_run\": false, \"note\": null,\n"
                             "  \"path\": \"/tmp/a\\\"b\\\\c\\u00e9\\n\",\n"
                             "  \"ranges\": [{\"base\": 4096, \"size\": 8192}, {\"base\": 0}],\n"
                             "  \"we\\u0069rd\": 7, \"first\": 1, \"first\": 2\n"
                             "}\n";

Test(json_lite, looks_up_paths)
{
    double number = 0;
    cr_assert(json_lite_get_number(report, "register.ok", &number));
    cr_assert_eq(number, 12);
    cr_assert(json_lite_get_number(report, "register.bytes", &number));
    cr_assert_eq(number, 4.5e6);
    cr_assert(json_lite_get_number(report, "errors.cudaErrorMemoryAllocation", &number));
    cr_assert_eq(number, 3);
    cr_assert(json_lite_get_number(report, "ranges.0.size", &number));
    cr_assert_eq(number, 8192);
    cr_assert(json_lite_get_number(report, "ranges.1.base", &number));
    cr_assert_eq(number, 0);
    cr_assert(json_lite_get_number(report, "weird", &number), "keys are unescaped");
    cr_assert_eq(number, 7);
    cr_assert(json_lite_get_number(report, "first", &number));
    cr_assert_eq(number, 1, "the first duplicate wins");

    number = -1;
    cr_assert_not(json_lite_get_number(report, "register.missing", &number));
    cr_assert_not(json_lite_get_number(report, "ranges.2.base", &number));
    cr_assert_not(json_lite_get_number(report, "ranges.x", &number));
    cr_assert_not(json_lite_get_number(report, "version", &number), "a string");
    cr_assert_not(json_lite_get_number(report, "register.ok.deeper", &number));
    cr_assert_not(json_lite_get_number("{\"a\":1,}", "a", &number), "invalid document");
    cr_assert_eq(number, -1, "left alone on failure");

    bool flag = false;
    cr_assert(json_lite_get_bool(report, "enabled", &flag));
    cr_assert(flag);
    cr_assert(json_lite_get_bool(report, "dry_run", &flag));
    cr_assert_not(flag);
    cr_assert_not(json_lite_get_bool(report, "note", &flag));
}

Test(json_lite, reads_strings)
{
    char text[64];
    cr_assert(json_lite_get_string(report, "version", text, sizeof text));
    cr_assert_str_eq(text, "0.1.0");
    cr_assert(json_lite_get_string(report, "path", text, sizeof text));
    cr_assert_str_eq(text, "/tmp/a\"b\\c\xc3\xa9\n");
    cr_assert_not(json_lite_get_string(report, "path", text, 8), "does not fit");
    cr_assert_not(json_lite_get_string(report, "register", text, sizeof text));
    cr_assert(json_lite_get_string("\"\\uD83D\\uDE00 \\uDE00\"", "", text, sizeof text));
    cr_assert_str_eq(text, "\xf0\x9f\x98\x80 \xef\xbf\xbd", "pair, then a lone surrogate");
    cr_assert_not(json_lite_get_string("\"a\\u0000b\"", "", text, sizeof text));
}

Test(json_lite, reports_types_and_counts)
{
    cr_assert_eq(json_lite_type(report, ""), JSON_LITE_OBJECT);
    cr_assert_eq(json_lite_type(report, "register"), JSON_LITE_OBJECT);
    cr_assert_eq(json_lite_type(report, "ranges"), JSON_LITE_ARRAY);
    cr_assert_eq(json_lite_type(report, "version"), JSON_LITE_STRING);
    cr_assert_eq(json_lite_type(report, "register.ok"), JSON_LITE_NUMBER);
    cr_assert_eq(json_lite_type(report, "enabled"), JSON_LITE_BOOL);
    cr_assert_eq(json_lite_type(report, "note"), JSON_LITE_NULL);
    cr_assert_eq(json_lite_type(report, "nope"), JSON_LITE_MISSING);
    cr_assert_eq(json_lite_type("[1,", ""), JSON_LITE_MISSING);
    cr_assert_eq(json_lite_count(report, "register"), 3);
    cr_assert_eq(json_lite_count(report, "ranges"), 2);
    cr_assert_eq(json_lite_count(report, "ranges.1"), 1);
    cr_assert_eq(json_lite_count("[]", ""), 0);
    cr_assert_eq(json_lite_count(report, "version"), -1);
}

/* ------------------------------------------------------------------------ */
/* fake_log                                                                 */

Test(fake_log, replays_a_log)
{
    static const char log[] = "register 10 0x1000 4096 0 0\n"
                              "register 10 0x3000 8192 1 0\n"
                              "register 10 0x3000 8192 0 712\n"
                              "register 10 0x0 1 0 1\n"
                              "register 10 0x9000 100 0 2\n"
                              "register 10 0x9000 100 0 2\n"
                              "violation 10 register_not_locked 0x3000 8192\n"
                              "unregister 10 0x1000 0\n"
                              "unregister 10 0x1000 713\n"
                              "getlasterror 10 713\n"
                              "register 20 0x1000 64 0 0\n"
                              "unregister 20 0x3000 0\n"
                              "this is not a log line\n"
                              "register 20 0x1000\n"
                              "\n"
                              "register 20 0x5000 64 0 0";
    struct fake_log_summary summary;
    cr_assert(fake_log_parse(log, -1, &summary));
    cr_assert_eq(summary.process_count, 2);
    cr_assert_eq(summary.malformed_lines, 2);

    const struct fake_log_process *first = fake_log_find(&summary, 10);
    cr_assert_not_null(first);
    cr_assert_eq(first->register_calls, 6);
    cr_assert_eq(first->register_ok, 2);
    cr_assert_eq(fake_log_register_errors(first, 712), 1);
    cr_assert_eq(fake_log_register_errors(first, 1), 1);
    cr_assert_eq(fake_log_register_errors(first, 2), 2);
    cr_assert_eq(fake_log_register_errors(first, 3), 0);
    cr_assert_eq(first->unregister_calls, 2);
    cr_assert_eq(first->unregister_ok, 1);
    cr_assert_eq(fake_log_unregister_errors(first, 713), 1);
    cr_assert_eq(first->get_last_error_calls, 1);
    cr_assert_eq(first->violations, 1);
    cr_assert_str_eq(first->violation_lines[0], "violation 10 register_not_locked 0x3000 8192");
    cr_assert_eq(first->live_count, 1);
    cr_assert_eq(first->live[0].base, 0x3000);
    cr_assert_eq(first->live_bytes, 8192);

    const struct fake_log_process *second = fake_log_find(&summary, 20);
    cr_assert_not_null(second);
    cr_assert_eq(second->unmatched_unregisters, 1, "0x3000 was pid 10's");
    cr_assert_eq(second->live_count, 2, "the last line needs no newline");
    cr_assert_eq(second->live[0].base, 0x1000);
    cr_assert_eq(second->live[1].base, 0x5000);

    cr_assert_eq(summary.total.pid, -1);
    cr_assert_eq(summary.total.register_calls, 8);
    cr_assert_eq(summary.total.live_count, 3);
    cr_assert_eq(summary.total.live_bytes, 8192 + 128);
    cr_assert_eq(fake_log_register_errors(&summary.total, 2), 2);
    cr_assert_null(fake_log_find(&summary, 30));
    fake_log_free(&summary);

    cr_assert(fake_log_parse(log, 20, &summary));
    cr_assert_eq(summary.process_count, 1);
    cr_assert_eq(summary.total.register_calls, 2);
    fake_log_free(&summary);
}

Test(fake_log, replays_many_registrations)
{
    const size_t count = 200000;
    size_t capacity = count * 2 * 48 + 1;
    char *log = malloc(capacity);
    cr_assert_not_null(log);
    size_t length = 0;
    for (size_t i = 0; i < count; i++)
        length += (size_t)snprintf(log + length, capacity - length, "register 1 0x%zx 64 0 0\n",
                                   (i + 1) * 64);
    for (size_t i = 0; i < count; i += 2)
        length += (size_t)snprintf(log + length, capacity - length, "unregister 1 0x%zx 0\n",
                                   (i + 1) * 64);
    struct fake_log_summary summary;
    cr_assert(fake_log_parse(log, -1, &summary));
    cr_assert_eq(summary.total.live_count, count / 2);
    cr_assert_eq(summary.total.live_bytes, count / 2 * 64);
    cr_assert_eq(summary.total.unmatched_unregisters, 0);
    size_t unsorted = 0;
    for (size_t i = 0; i < summary.total.live_count; i++)
        unsorted += summary.total.live[i].base != (i * 2 + 2) * 64;
    cr_assert_eq(unsorted, 0);
    fake_log_free(&summary);
    free(log);
}

Test(fake_log, reads_what_the_fake_runtime_writes)
{
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    char path[512];
    snprintf(path, sizeof path, "%s/fake.log", directory);
    setenv("FAKE_CUDART_LOG", path, 1);
    setenv("FAKE_CUDART_CHECK", "1", 1);
    fake_cudart_reset();

    char *memory = malloc(3 * 4096);
    cr_assert_not_null(memory);
    cr_assert_eq(cudaHostRegister(memory, 100, 0), 0);
    cr_assert_eq(cudaHostRegister(memory + 200, 100, 0), 0);
    cr_assert_eq(cudaHostRegister(memory + 250, 100, 0), 712);
    cr_assert_eq(cudaHostUnregister(memory), 0);
    cr_assert_eq(cudaGetLastError(), 712);

    struct fake_log_summary summary;
    cr_assert(fake_log_load(path, (int)getpid(), &summary));
    const struct fake_log_process *process = fake_log_find(&summary, (int)getpid());
    cr_assert_not_null(process);
    cr_assert_eq(process->register_calls, 3);
    cr_assert_eq(process->register_ok, 2);
    cr_assert_eq(fake_log_register_errors(process, 712), 1);
    cr_assert_eq(process->unregister_ok, 1);
    cr_assert_eq(process->get_last_error_calls, 1);
    cr_assert_eq(process->live_count, 1);
    cr_assert_eq(process->live[0].base, (uintptr_t)(memory + 200));
    /* malloc'd memory is not locked, and the second range shares a page. */
    cr_assert_geq(process->violations, 3, "violations: %d", (int)process->violations);
    cr_assert_eq(process->violations, fake_cudart_violation_count());
    cr_assert_eq(summary.malformed_lines, 0);
    fake_log_free(&summary);

    cr_assert_not(fake_log_load("/nonexistent/fake.log", -1, &summary));
    fake_log_free(&summary);
    free(memory);
    cr_assert(remove_tree(directory));
    free(directory);
}

/* ------------------------------------------------------------------------ */
/* child                                                                    */

static int run_shell(const char *script, const char *const extra_env[], const char *input,
                     struct child_result *result)
{
    const char *const argv[] = {"/bin/sh", "-c", script, NULL};
    return child_run(argv, extra_env, input, result);
}

Test(child, reports_exit_codes_and_signals)
{
    struct child_result result;
    cr_assert_eq(run_shell("exit 3", NULL, NULL, &result), 3);
    cr_assert_eq(result.status, 3);
    cr_assert_not(result.signaled);
    child_result_free(&result);

    cr_assert_eq(run_shell("kill -TERM $$", NULL, NULL, &result), 128 + 15);
    cr_assert(result.signaled);
    child_result_free(&result);

    const char *const missing[] = {"/nonexistent/program", NULL};
    if (test_emulator() != NULL) {
        /* posix_spawn learns of a failed exec through memory the child
         * shares (CLONE_VM | CLONE_VFORK); qemu-user runs that child as a
         * fork, so the spawn succeeds and the child exits 127. */
        cr_log_info("under %s: a program that cannot be run exits 127 instead of failing "
                    "child_run",
                    test_emulator());
        cr_assert_eq(child_run(missing, NULL, NULL, &result), 127);
    } else {
        cr_assert_eq(child_run(missing, NULL, NULL, &result), -1);
    }
    cr_assert_str_eq(result.out, "");
    child_result_free(&result);

    const char *const from_path[] = {"true", NULL};
    cr_assert_eq(child_run(from_path, NULL, NULL, &result), 0, "searched in PATH");
    child_result_free(&result);
}

Test(child, captures_stdout_and_stderr)
{
    struct child_result result;
    cr_assert_eq(run_shell("echo out; echo err >&2; printf more", NULL, NULL, &result), 0);
    cr_assert_str_eq(result.out, "out\nmore");
    cr_assert_eq(result.out_len, 8);
    cr_assert_str_eq(result.err, "err\n");
    child_result_free(&result);

    /* More than a pipe holds, on both streams at once. */
    cr_assert_eq(run_shell("head -c 1000000 /dev/zero | tr '\\0' a; "
                           "head -c 300000 /dev/zero | tr '\\0' b >&2",
                           NULL, NULL, &result),
                 0);
    cr_assert_eq(result.out_len, 1000000);
    cr_assert_eq(result.err_len, 300000);
    cr_assert_eq(result.out[999999], 'a');
    child_result_free(&result);
}

Test(child, sets_and_unsets_environment)
{
    setenv("CHILD_TEST_INHERITED", "inherited", 1);
    setenv("CHILD_TEST_REMOVED", "removed", 1);
    setenv("CHILD_TEST_REPLACED", "old", 1);
    const char *const extra[] = {"CHILD_TEST_NEW=new value",
                                 "CHILD_TEST_REMOVED=", "CHILD_TEST_REPLACED=new", NULL};
    struct child_result result;
    cr_assert_eq(run_shell("echo \"$CHILD_TEST_INHERITED|$CHILD_TEST_NEW|"
                           "${CHILD_TEST_REMOVED-unset}|$CHILD_TEST_REPLACED\"",
                           extra, NULL, &result),
                 0);
    cr_assert_str_eq(result.out, "inherited|new value|unset|new\n");
    child_result_free(&result);
    cr_assert_str_eq(getenv("CHILD_TEST_REMOVED"), "removed", "ours is untouched");
}

Test(child, feeds_stdin)
{
    struct child_result result;
    cr_assert_eq(run_shell("cat", NULL, "hello\nworld", &result), 0);
    cr_assert_str_eq(result.out, "hello\nworld");
    child_result_free(&result);

    cr_assert_eq(run_shell("cat", NULL, NULL, &result), 0, "no stdin: /dev/null");
    cr_assert_str_eq(result.out, "");
    child_result_free(&result);

    size_t size = 2000000;
    char *input = malloc(size + 1);
    cr_assert_not_null(input);
    memset(input, 'x', size);
    input[size] = '\0';
    cr_assert_eq(run_shell("cat", NULL, input, &result), 0);
    cr_assert_eq(result.out_len, size, "echoed while still being fed");
    child_result_free(&result);

    /* A child that never reads its input must not kill us with SIGPIPE. */
    cr_assert_eq(run_shell("exit 5", NULL, input, &result), 5);
    child_result_free(&result);
    free(input);
}

Test(child, files_and_directories)
{
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    struct stat info;
    cr_assert_eq(stat(directory, &info), 0);
    cr_assert(S_ISDIR(info.st_mode));

    char path[512];
    snprintf(path, sizeof path, "%s/sub", directory);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/sub/file.txt", directory);
    FILE *file = fopen(path, "w");
    cr_assert_not_null(file);
    fputs("line one\nline two\n", file);
    fclose(file);

    char *text = read_file_text(path);
    cr_assert_not_null(text);
    cr_assert_str_eq(text, "line one\nline two\n");
    free(text);
    cr_assert_null(read_file_text("/nonexistent/file"));

    cr_assert(remove_tree(directory));
    cr_assert_neq(stat(directory, &info), 0, "removed");
    free(directory);
}

static bool starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* For the files a test hands to another user: under TMPDIR when that user can
 * reach it, else under /tmp (issue 23: TMPDIR or the checkout may be private). */
Test(child, shared_temp_dir_passes_over_a_private_tmpdir)
{
    char why[8192];
    unsetenv("TMPDIR");
    char *shared = make_shared_temp_dir(why, sizeof why);
    if (shared == NULL)
        cr_skip_test("%s", why);
    struct stat info;
    cr_assert_eq(stat(shared, &info), 0);
    cr_assert_eq(info.st_mode & 07777, 0755, "mode %o", (unsigned)(info.st_mode & 07777));
    cr_assert(starts_with(shared, "/tmp/pinshim-shared-"), "%s", shared);

    char open_dir[512], closed_dir[512], inside_closed[512];
    snprintf(open_dir, sizeof open_dir, "%s/open", shared);
    snprintf(closed_dir, sizeof closed_dir, "%s/closed", shared);
    snprintf(inside_closed, sizeof inside_closed, "%s/closed/inner", shared);
    cr_assert_eq(mkdir(open_dir, 0755), 0);
    cr_assert_eq(chmod(open_dir, 0755), 0);
    cr_assert_eq(mkdir(closed_dir, 0700), 0);
    cr_assert_eq(mkdir(inside_closed, 0755), 0);
    cr_assert_eq(chmod(inside_closed, 0755), 0);

    setenv("TMPDIR", open_dir, 1);
    char *used = make_shared_temp_dir(why, sizeof why);
    cr_assert_not_null(used, "%s", why);
    cr_assert(starts_with(used, open_dir), "%s is not under TMPDIR %s", used, open_dir);
    free(used);

    setenv("TMPDIR", inside_closed, 1);
    used = make_shared_temp_dir(why, sizeof why);
    cr_assert_not_null(used, "%s", why);
    cr_assert(starts_with(used, "/tmp/pinshim-shared-") && !starts_with(used, shared),
              "%s: TMPDIR %s is closed to other users", used, inside_closed);
    cr_assert(remove_tree(used));
    free(used);

    cr_assert(remove_tree(shared));
    free(shared);
}
