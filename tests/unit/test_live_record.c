/* Unit tests of the live record (issue 19): the file it makes, the names it
 * takes, the directories it accepts, and the engine's counters moving into it. */
#include <criterion/criterion.h>

#include "child.h"
#include "engine.h"
#include "mock_codes.h"
#include "live_record.h"
#include "stats.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct live_record_identity identity = {
    .host = "testhost",
    .exe = "/usr/bin/example",
    .context_mode = "program",
    .stats_path = "/tmp/stats.testhost.1.json",
    .fork_child = false,
};

static char *directory;

static void make_directory(void)
{
    directory = make_temp_dir();
    cr_assert_not_null(directory);
}

static void remove_directory(void)
{
    remove_tree(directory);
    free(directory);
}

static int open_directory(void)
{
    char why[256];
    int fd = live_record_open_directory(directory, false, why, sizeof(why));
    cr_assert_geq(fd, 0, "%s", why);
    return fd;
}

static void *create(struct live_record *record, const char *base_name)
{
    char why[512];
    void *counters = live_record_create(record, open_directory(), directory, base_name, &identity,
                                        NULL, sizeof(struct engine_statistics), why, sizeof(why));
    cr_assert_not_null(counters, "%s", why);
    return counters;
}

static bool exists(const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", directory, name);
    struct stat info;
    return lstat(path, &info) == 0;
}

/* The file as a reader sees it: read(2), not the mapping. */
static char *read_record(const char *name, size_t *length)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", directory, name);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    struct stat info;
    cr_assert_eq(fstat(fd, &info), 0);
    char *bytes = malloc((size_t)info.st_size);
    cr_assert_eq(read(fd, bytes, (size_t)info.st_size), info.st_size);
    close(fd);
    *length = (size_t)info.st_size;
    return bytes;
}

/* A value by its name in the record's own field table, as a reader finds it. */
static uint64_t field_value(const char *bytes, size_t length, const char *name)
{
    const struct live_record_header *header = (const struct live_record_header *)bytes;
    for (uint32_t i = 0; i < header->field_count; i++) {
        const struct live_record_field *field =
            (const struct live_record_field *)(bytes + header->header_bytes +
                                               (size_t)i * header->field_bytes);
        if (strncmp(field->name, name, sizeof(field->name)) != 0)
            continue;
        cr_assert_leq(header->data_offset + field->offset + sizeof(uint64_t), length);
        uint64_t value;
        memcpy(&value, bytes + header->data_offset + field->offset, sizeof(value));
        return value;
    }
    cr_assert_fail("no field %s", name);
    return 0;
}

TestSuite(live_record, .init = make_directory, .fini = remove_directory);

Test(live_record, the_file_describes_itself)
{
    struct live_record record;
    struct engine_statistics *counters = create(&record, "testhost.1");
    cr_assert_str_eq(record.name, "testhost.1.live");
    counters->counters.register_ok = 3;
    counters->counters.live_bytes = 12 << 20;
    counters->lock_calls = 4;
    counters->devices[2].bytes = 5;
    size_t length;
    char *bytes = read_record(record.name, &length);
    const struct live_record_header *header = (const struct live_record_header *)bytes;
    cr_assert_eq(memcmp(header->magic, LIVE_RECORD_MAGIC, 8), 0);
    cr_assert_eq(header->version, LIVE_RECORD_VERSION);
    cr_assert_eq(header->byte_order, LIVE_RECORD_BYTE_ORDER);
    cr_assert_eq(header->state, LIVE_RECORD_RUNNING);
    cr_assert_eq(header->pid, (int64_t)getpid());
    cr_assert_gt(header->start_ticks, 0);
    cr_assert_gt(header->created_ns, 0);
    cr_assert_eq(header->field_bytes, sizeof(struct live_record_field));
    cr_assert_geq(header->data_offset, header->header_bytes + header->field_count * 64);
    cr_assert_eq(header->data_bytes, sizeof(struct engine_statistics));
    cr_assert_leq(header->data_offset + header->data_bytes, length);
    cr_assert_str_eq(header->host, "testhost");
    cr_assert_str_eq(header->exe, "/usr/bin/example");
    cr_assert_str_eq(header->context_mode, "program");
    cr_assert_str_eq(header->stats_path, "/tmp/stats.testhost.1.json");
    cr_assert_str_eq(header->version_text, PINSHIM_VERSION_STRING);
    cr_assert_str_empty(header->ended_by);
    /* Written through the mapping, read through the file. */
    cr_assert_eq(field_value(bytes, length, "register.ok"), 3);
    cr_assert_eq(field_value(bytes, length, "live.bytes"), 12 << 20);
    cr_assert_eq(field_value(bytes, length, "calls.lock"), 4);
    /* An array's element i: device i. */
    cr_assert_eq(field_value(bytes, length, "devices[].bytes"), 0);
    uint64_t device_two;
    const struct live_record_field *table;
    size_t count = live_record_field_table(&table);
    bool found = false;
    for (size_t i = 0; i < count; i++)
        if (strcmp(table[i].name, "devices[].bytes") == 0) {
            cr_assert_eq(table[i].count, ENGINE_MAX_DEVICES);
            memcpy(&device_two, bytes + header->data_offset + table[i].offset + 2 * table[i].stride,
                   sizeof(device_two));
            found = true;
        }
    cr_assert(found);
    cr_assert_eq(device_two, 5);
    free(bytes);
    live_record_finish(&record, "exit", true);
    cr_assert_not(exists("testhost.1.live"));
}

Test(live_record, fields_lie_inside_the_counters_and_have_unique_names)
{
    const struct live_record_field *table;
    size_t count = live_record_field_table(&table);
    cr_assert_gt(count, 40);
    for (size_t i = 0; i < count; i++) {
        cr_assert_neq(table[i].name[0], '\0');
        cr_assert(memchr(table[i].name, '\0', sizeof(table[i].name)) != NULL);
        /* A text field alone says its size in stride; in an array, each is an error's name. */
        size_t text = table[i].count == 1 ? table[i].stride : ENGINE_ERROR_NAME_BYTES;
        size_t element = table[i].kind == LIVE_FIELD_INT32  ? 4
                         : table[i].kind == LIVE_FIELD_TEXT ? text
                                                            : 8;
        size_t last = table[i].offset + (size_t)(table[i].count - 1) * table[i].stride + element;
        cr_assert_leq(last, sizeof(struct engine_statistics), "%s", table[i].name);
        cr_assert_eq(table[i].offset % (element == 8 ? 8 : 4), 0, "%s", table[i].name);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(table[i].name, table[j].name);
    }
}

/* Every plain field names a key path of the JSON document written at exit,
 * so that a reader rebuilds the same document from a record. */
Test(live_record, every_field_is_a_key_of_the_stats_document)
{
    struct pinshim_config config;
    config_set_defaults(&config);
    struct stats_report report;
    memset(&report, 0, sizeof(report));
    report.config = &config;
    report.numa = true; /* PINSHIM_NUMA's default */
    char path[1024];
    snprintf(path, sizeof(path), "%s/stats.json", directory);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert(stats_write_json(fd, &report));
    close(fd);
    char *json = read_file_text(path);
    cr_assert_not_null(json);
    const struct live_record_field *table;
    size_t count = live_record_field_table(&table);
    for (size_t i = 0; i < count; i++) {
        const char *name = table[i].name;
        if (strchr(name, '[') != NULL || strcmp(name, "last_change") == 0)
            continue;
        const char *dot = strchr(name, '.');
        cr_assert_not_null(dot, "%s", name);
        char section[64], key[64];
        snprintf(section, sizeof(section), "\"%.*s\": {", (int)(dot - name), name);
        snprintf(key, sizeof(key), "\"%s\": ", dot + 1);
        const char *object = strstr(json, section);
        cr_assert_not_null(object, "the document has no %s (for %s)", section, name);
        /* The object's own closing brace (it may hold objects). */
        const char *end = strchr(object, '{');
        for (int depth = 0; *end != '\0'; end++) {
            depth += *end == '{' ? 1 : *end == '}' ? -1 : 0;
            if (depth == 0)
                break;
        }
        const char *at = strstr(object, key);
        cr_assert(at != NULL && at < end, "the document's %s has no %s", section, key);
    }
    cr_assert_not_null(strstr(json, "\"devices\": ["));
    cr_assert_not_null(strstr(json, "\"errors\": {"));
    free(json);
}

Test(live_record, a_name_taken_by_another_process_gets_the_next)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/testhost.1.live", directory);
    /* A planted symlink at the name is never followed. */
    cr_assert_eq(symlink("/etc/passwd", path), 0);
    struct live_record record;
    create(&record, "testhost.1");
    cr_assert_str_eq(record.name, "testhost.1.1.live");
    struct stat info;
    cr_assert_eq(lstat(path, &info), 0);
    cr_assert(S_ISLNK(info.st_mode));
    live_record_finish(&record, "exit", true);
    cr_assert_not(exists("testhost.1.1.live"));
    cr_assert(exists("testhost.1.live"), "the symlink is not this record's: it stays");
}

/* A record of this very process at the name (what an exec leaves) ended by
 * exec; at the clean end of the last image both go. */
Test(live_record, an_earlier_image_of_this_process_ended_by_exec)
{
    struct live_record before_exec, after_exec;
    create(&before_exec, "testhost.1");
    create(&after_exec, "testhost.1");
    cr_assert_str_eq(after_exec.name, "testhost.1.1.live");
    size_t length;
    char *bytes = read_record(before_exec.name, &length);
    const struct live_record_header *header = (const struct live_record_header *)bytes;
    cr_assert_eq(header->state, LIVE_RECORD_REPLACED);
    cr_assert_str_eq(header->ended_by, "exec");
    cr_assert_gt(header->ended_ns, 0);
    free(bytes);
    live_record_finish(&after_exec, "exit", true);
    cr_assert_not(exists("testhost.1.live"));
    cr_assert_not(exists("testhost.1.1.live"));
}

Test(live_record, a_record_kept_at_the_end_says_how_it_ended)
{
    struct live_record record;
    create(&record, "testhost.1");
    live_record_finish(&record, "_exit", false);
    size_t length;
    char *bytes = read_record("testhost.1.live", &length);
    const struct live_record_header *header = (const struct live_record_header *)bytes;
    cr_assert_eq(header->state, LIVE_RECORD_EXITED);
    cr_assert_str_eq(header->ended_by, "_exit");
    free(bytes);
}

Test(live_record, a_file_put_at_the_name_since_is_not_removed)
{
    struct live_record record;
    create(&record, "testhost.1");
    char path[1024], moved[1024];
    snprintf(path, sizeof(path), "%s/testhost.1.live", directory);
    snprintf(moved, sizeof(moved), "%s/elsewhere", directory);
    cr_assert_eq(rename(path, moved), 0);
    FILE *other = fopen(path, "w");
    cr_assert_not_null(other);
    fclose(other);
    live_record_finish(&record, "exit", true);
    cr_assert(exists("testhost.1.live"), "another file at the name was removed");
}

Test(live_record, the_private_directory_is_made_and_checked)
{
    char path[1024], why[256];
    snprintf(path, sizeof(path), "%s/pinshim-private", directory);
    int fd = live_record_open_directory(path, true, why, sizeof(why));
    cr_assert_geq(fd, 0, "%s", why);
    close(fd);
    struct stat info;
    cr_assert_eq(stat(path, &info), 0);
    cr_assert_eq(info.st_mode & 0777, 0700);
    /* Writable by others: refused, saying why. */
    cr_assert_eq(chmod(path, 0777), 0);
    cr_assert_eq(live_record_open_directory(path, true, why, sizeof(why)), -1);
    cr_assert_not_null(strstr(why, "others can write to it"), "%s", why);
    /* A symlink at the name: refused, never followed. */
    char link[1024];
    snprintf(link, sizeof(link), "%s/pinshim-link", directory);
    cr_assert_eq(chmod(path, 0700), 0);
    cr_assert_eq(symlink(path, link), 0);
    cr_assert_eq(live_record_open_directory(link, true, why, sizeof(why)), -1);
    /* Another user's: refused (root can make one to try). */
    if (geteuid() == 0) {
        struct passwd *nobody = getpwnam("nobody");
        if (nobody != NULL && nobody->pw_uid != 0) {
            cr_assert_eq(chown(path, nobody->pw_uid, nobody->pw_gid), 0);
            cr_assert_eq(live_record_open_directory(path, true, why, sizeof(why)), -1);
            cr_assert_not_null(strstr(why, "belongs to uid"), "%s", why);
        }
    }
}

Test(live_record, the_default_directory)
{
    char out[1024];
    unsigned uid = (unsigned)geteuid();
    cr_assert(live_record_default_directory(directory, uid, out, sizeof(out)));
    char wanted[1024];
    snprintf(wanted, sizeof(wanted), "%s/pinshim", directory);
    cr_assert_str_eq(out, wanted);
    /* Not the user's, relative, or unset: the memory file system's. */
    struct stat shm;
    bool have_shm = stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode);
    snprintf(wanted, sizeof(wanted), have_shm ? "/dev/shm/pinshim-%u" : "/tmp/pinshim-%u", uid + 1);
    cr_assert(live_record_default_directory(directory, uid + 1, out, sizeof(out)));
    cr_assert_str_eq(out, wanted);
    snprintf(wanted, sizeof(wanted), have_shm ? "/dev/shm/pinshim-%u" : "/tmp/pinshim-%u", uid);
    cr_assert(live_record_default_directory("relative/dir", uid, out, sizeof(out)));
    cr_assert_str_eq(out, wanted);
    cr_assert(live_record_default_directory(NULL, uid, out, sizeof(out)));
    cr_assert_str_eq(out, wanted);
    cr_assert_not(live_record_default_directory(NULL, uid, out, 8));
}

static int backend_register_code(void *context, struct range_place *place, void *base,
                                 size_t length)
{
    (void)context;
    (void)place;
    (void)base;
    (void)length;
    return 0;
}

static struct engine_result backend_register(void *context, struct range_place *place, void *base,
                                             size_t length)
{
    return mock_result(backend_register_code(context, place, base, length));
}

static int backend_unregister_code(void *context, const struct range_place *place, void *base)
{
    (void)context;
    (void)place;
    (void)base;
    return 0;
}

static struct engine_result backend_unregister(void *context, const struct range_place *place,
                                               void *base, size_t length)
{
    (void)length;
    return mock_result(backend_unregister_code(context, place, base));
}

static enum engine_choice backend_choose_place(void *context, bool from_worker,
                                               const struct range_place *hint,
                                               struct range_place *place)
{
    (void)context;
    (void)from_worker;
    (void)hint;
    place->device = 0;
    return ENGINE_PLACE_READY;
}

static long run_nothing(void *arguments)
{
    (void)arguments;
    return 0;
}

Test(live_record, the_engine_counts_in_the_record_after_the_move)
{
    static const struct engine_backend backend = {
        .register_range = backend_register,
        .unregister_range = backend_unregister,
        .choose_place = backend_choose_place,
    };
    struct engine_options options = {.min_bytes = 4096, .page_size = 4096};
    static struct engine engine;
    cr_assert(engine_init(&engine, &backend, &options));
    struct engine_call call = {run_nothing, NULL, "test"};
    static char buffers[4][16384] __attribute__((aligned(4096)));
    cr_assert_eq(engine_lock(&engine, (uintptr_t)buffers[0], sizeof(buffers[0]), 0, &call), 0);
    engine_count(&engine_stats(&engine)->lock_calls);

    struct live_record record;
    struct engine_statistics *place = create(&record, "testhost.1");
    engine_statistics_move_to(&engine, place);
    cr_assert_eq(engine_stats(&engine), place);
    cr_assert_eq(place->counters.register_ok, 1, "what was counted before moved along");
    cr_assert_eq(place->lock_calls, 1);
    cr_assert_eq(engine.own_statistics.lock_calls, 0, "a relaxed count is taken over, not copied");
    cr_assert_eq(engine_lock(&engine, (uintptr_t)buffers[2], sizeof(buffers[2]), 0, &call), 0);
    engine_count(&engine_stats(&engine)->lock_calls);
    size_t length;
    char *bytes = read_record(record.name, &length);
    cr_assert_eq(field_value(bytes, length, "register.ok"), 2);
    cr_assert_eq(field_value(bytes, length, "live.ranges"), 2);
    cr_assert_eq(field_value(bytes, length, "live.bytes"), 2 * sizeof(buffers[0]));
    cr_assert_eq(field_value(bytes, length, "calls.lock"), 2);
    cr_assert_eq(field_value(bytes, length, "devices[].registrations"), 2);
    cr_assert_gt(field_value(bytes, length, "last_change"), 0);
    free(bytes);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 2);
    engine_shutdown(&engine);
    engine_destroy(&engine);
}
