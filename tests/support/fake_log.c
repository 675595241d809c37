/* fake_log: see fake_log.h. While reading, each process keeps its live set in
 * an open-addressing hash map (base -> size); logs of a million registrations
 * must replay in well under a second. */
#include "fake_log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Linear probing with backward-shift deletion, so no tombstones. A base of 0
 * marks an empty slot: the double never registers NULL successfully. */
struct live_map {
    struct fake_log_range *slots;
    size_t capacity; /* a power of two */
    size_t count;
};

static size_t live_map_slot(const struct live_map *map, uintptr_t base)
{
    uint64_t hash = (uint64_t)base * 0x9E3779B97F4A7C15u;
    return (size_t)(hash >> 17) & (map->capacity - 1);
}

static bool live_map_grow(struct live_map *map)
{
    size_t capacity = map->capacity ? map->capacity * 2 : 1024;
    struct fake_log_range *slots = calloc(capacity, sizeof *slots);
    if (!slots)
        return false;
    struct live_map grown = {slots, capacity, map->count};
    for (size_t i = 0; i < map->capacity; i++) {
        if (!map->slots[i].base)
            continue;
        size_t slot = live_map_slot(&grown, map->slots[i].base);
        while (grown.slots[slot].base)
            slot = (slot + 1) & (capacity - 1);
        grown.slots[slot] = map->slots[i];
    }
    free(map->slots);
    *map = grown;
    return true;
}

static bool live_map_put(struct live_map *map, uintptr_t base, size_t size)
{
    if ((map->count + 1) * 2 > map->capacity && !live_map_grow(map))
        return false;
    size_t slot = live_map_slot(map, base);
    while (map->slots[slot].base && map->slots[slot].base != base)
        slot = (slot + 1) & (map->capacity - 1);
    if (!map->slots[slot].base)
        map->count++;
    map->slots[slot] = (struct fake_log_range){base, size};
    return true;
}

static bool live_map_remove(struct live_map *map, uintptr_t base)
{
    if (!map->capacity || !base)
        return false;
    size_t mask = map->capacity - 1;
    size_t slot = live_map_slot(map, base);
    while (map->slots[slot].base != base) {
        if (!map->slots[slot].base)
            return false;
        slot = (slot + 1) & mask;
    }
    /* Pull later entries of the probe chain back into the hole. */
    size_t hole = slot;
    for (size_t next = (hole + 1) & mask; map->slots[next].base; next = (next + 1) & mask) {
        size_t home = live_map_slot(map, map->slots[next].base);
        bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
        if (!stays) {
            map->slots[hole] = map->slots[next];
            hole = next;
        }
    }
    map->slots[hole].base = 0;
    map->count--;
    return true;
}

/* ------------------------------------------------------------------------ */

struct loader {
    int pid_filter;
    struct fake_log_summary *summary;
    size_t capacity;
    struct live_map *live_maps; /* parallel to summary->processes */
    bool out_of_memory;
};

static struct fake_log_process *process_for(struct loader *loader, int pid, struct live_map **map)
{
    struct fake_log_summary *summary = loader->summary;
    for (size_t i = summary->process_count; i-- > 0;) {
        if (summary->processes[i].pid == pid) {
            *map = &loader->live_maps[i];
            return &summary->processes[i];
        }
    }
    if (summary->process_count == loader->capacity) {
        size_t capacity = loader->capacity ? loader->capacity * 2 : 8;
        struct fake_log_process *processes =
            realloc(summary->processes, capacity * sizeof *processes);
        if (processes)
            summary->processes = processes;
        struct live_map *maps = realloc(loader->live_maps, capacity * sizeof *maps);
        if (maps)
            loader->live_maps = maps;
        if (!processes || !maps)
            return NULL;
        loader->capacity = capacity;
    }
    size_t index = summary->process_count++;
    memset(&summary->processes[index], 0, sizeof summary->processes[index]);
    summary->processes[index].pid = pid;
    loader->live_maps[index] = (struct live_map){NULL, 0, 0};
    *map = &loader->live_maps[index];
    return &summary->processes[index];
}

static void count_error(struct fake_log_error_count *counts, size_t *used, int code)
{
    for (size_t i = 0; i < *used; i++) {
        if (counts[i].code == code) {
            counts[i].count++;
            return;
        }
    }
    if (*used < FAKE_LOG_MAX_ERROR_CODES)
        counts[(*used)++] = (struct fake_log_error_count){code, 1};
}

static void add_error_counts(struct fake_log_error_count *into, size_t *into_used,
                             const struct fake_log_error_count *from, size_t from_used)
{
    for (size_t i = 0; i < from_used; i++) {
        size_t j = 0;
        while (j < *into_used && into[j].code != from[i].code)
            j++;
        if (j < *into_used)
            into[j].count += from[i].count;
        else if (*into_used < FAKE_LOG_MAX_ERROR_CODES)
            into[(*into_used)++] = from[i];
    }
}

/* Reads the pid that follows the event word. */
static bool read_pid(const char *text, int *pid, const char **rest)
{
    char *end;
    long value = strtol(text, &end, 10);
    if (end == text || value < 0 || value > INT32_MAX || (*end != ' ' && *end != '\0'))
        return false;
    *pid = (int)value;
    *rest = end;
    return true;
}

/* Every number field must be followed by a space or the end of the line. */
static bool read_unsigned(const char **text, int base, uintmax_t *value)
{
    const char *start = *text;
    while (*start == ' ')
        start++;
    if (*start == '-' || *start == '\0')
        return false;
    char *end;
    *value = strtoumax(start, &end, base);
    if (end == start || (*end != ' ' && *end != '\0'))
        return false;
    *text = end;
    return true;
}

static bool read_signed(const char **text, int *value)
{
    char *end;
    long parsed = strtol(*text, &end, 10);
    if (end == *text || (*end != ' ' && *end != '\0') || parsed < INT32_MIN || parsed > INT32_MAX)
        return false;
    *value = (int)parsed;
    *text = end;
    return true;
}

static bool at_end(const char *text)
{
    while (*text == ' ')
        text++;
    return *text == '\0';
}

static bool word_matches(const char *line, const char *word, const char **rest)
{
    size_t length = strlen(word);
    if (strncmp(line, word, length) != 0 || line[length] != ' ')
        return false;
    *rest = line + length + 1;
    return true;
}

/* One line without its newline. Unrecognised lines are counted, not fatal. */
static void take_line(struct loader *loader, const char *line)
{
    struct fake_log_summary *summary = loader->summary;
    const char *rest;
    int pid;
    if (*line == '\0')
        return;
    summary->lines++;
    enum { REGISTER, UNREGISTER, VIOLATION, GET_LAST_ERROR } kind;
    if (word_matches(line, "register", &rest))
        kind = REGISTER;
    else if (word_matches(line, "unregister", &rest))
        kind = UNREGISTER;
    else if (word_matches(line, "violation", &rest))
        kind = VIOLATION;
    else if (word_matches(line, "getlasterror", &rest))
        kind = GET_LAST_ERROR;
    else
        goto malformed;
    if (!read_pid(rest, &pid, &rest))
        goto malformed;

    uintmax_t base = 0, size = 0, flags = 0;
    int error = 0;
    char violation_kind[64] = "";
    switch (kind) {
    case REGISTER:
        if (!read_unsigned(&rest, 16, &base) || !read_unsigned(&rest, 10, &size) ||
            !read_unsigned(&rest, 10, &flags) || !read_signed(&rest, &error) || !at_end(rest))
            goto malformed;
        break;
    case UNREGISTER:
        if (!read_unsigned(&rest, 16, &base) || !read_signed(&rest, &error) || !at_end(rest))
            goto malformed;
        break;
    case VIOLATION: {
        while (*rest == ' ')
            rest++;
        size_t length = strcspn(rest, " ");
        if (length == 0 || length >= sizeof violation_kind)
            goto malformed;
        memcpy(violation_kind, rest, length);
        rest += length;
        if (!read_unsigned(&rest, 16, &base) || !read_unsigned(&rest, 10, &size) || !at_end(rest))
            goto malformed;
        break;
    }
    case GET_LAST_ERROR:
        if (!read_signed(&rest, &error) || !at_end(rest))
            goto malformed;
        break;
    }
    if (loader->pid_filter != -1 && pid != loader->pid_filter)
        return;

    struct live_map *live;
    struct fake_log_process *process = process_for(loader, pid, &live);
    if (!process) {
        loader->out_of_memory = true;
        return;
    }
    switch (kind) {
    case REGISTER:
        process->register_calls++;
        if (error == 0) {
            process->register_ok++;
            if (!live_map_put(live, (uintptr_t)base, (size_t)size))
                loader->out_of_memory = true;
        } else {
            count_error(process->register_errors, &process->register_error_codes, error);
        }
        break;
    case UNREGISTER:
        process->unregister_calls++;
        if (error == 0) {
            process->unregister_ok++;
            if (!live_map_remove(live, (uintptr_t)base))
                process->unmatched_unregisters++;
        } else {
            count_error(process->unregister_errors, &process->unregister_error_codes, error);
        }
        break;
    case VIOLATION:
        if (process->kept_violations < FAKE_LOG_KEPT_VIOLATIONS) {
            char *kept = process->violation_lines[process->kept_violations++];
            strncpy(kept, line, FAKE_LOG_LINE_MAX - 1);
            kept[FAKE_LOG_LINE_MAX - 1] = '\0';
        }
        process->violations++;
        break;
    case GET_LAST_ERROR:
        process->get_last_error_calls++;
        break;
    }
    return;
malformed:
    summary->malformed_lines++;
}

static int compare_ranges(const void *left, const void *right)
{
    uintptr_t a = ((const struct fake_log_range *)left)->base;
    uintptr_t b = ((const struct fake_log_range *)right)->base;
    return (a > b) - (a < b);
}

/* Turns each process's live map into its sorted live array, and sums. */
static bool finish(struct loader *loader)
{
    struct fake_log_summary *summary = loader->summary;
    struct fake_log_process *total = &summary->total;
    size_t total_live = 0;
    for (size_t i = 0; i < summary->process_count; i++)
        total_live += loader->live_maps[i].count;
    total->pid = -1;
    total->live = calloc(total_live ? total_live : 1, sizeof *total->live);
    if (!total->live)
        loader->out_of_memory = true;

    for (size_t i = 0; i < summary->process_count; i++) {
        struct fake_log_process *process = &summary->processes[i];
        struct live_map *map = &loader->live_maps[i];
        process->live = calloc(map->count ? map->count : 1, sizeof *process->live);
        if (!process->live) {
            loader->out_of_memory = true;
        } else {
            for (size_t slot = 0; slot < map->capacity; slot++) {
                if (!map->slots[slot].base)
                    continue;
                process->live[process->live_count++] = map->slots[slot];
                process->live_bytes += map->slots[slot].size;
            }
            qsort(process->live, process->live_count, sizeof *process->live, compare_ranges);
        }
        free(map->slots);

        total->register_calls += process->register_calls;
        total->register_ok += process->register_ok;
        add_error_counts(total->register_errors, &total->register_error_codes,
                         process->register_errors, process->register_error_codes);
        total->unregister_calls += process->unregister_calls;
        total->unregister_ok += process->unregister_ok;
        add_error_counts(total->unregister_errors, &total->unregister_error_codes,
                         process->unregister_errors, process->unregister_error_codes);
        total->get_last_error_calls += process->get_last_error_calls;
        total->violations += process->violations;
        for (size_t v = 0; v < process->kept_violations; v++) {
            if (total->kept_violations < FAKE_LOG_KEPT_VIOLATIONS)
                memcpy(total->violation_lines[total->kept_violations++],
                       process->violation_lines[v], FAKE_LOG_LINE_MAX);
        }
        total->unmatched_unregisters += process->unmatched_unregisters;
        if (total->live && process->live) {
            memcpy(total->live + total->live_count, process->live,
                   process->live_count * sizeof *process->live);
            total->live_count += process->live_count;
        }
        total->live_bytes += process->live_bytes;
    }
    if (total->live)
        qsort(total->live, total->live_count, sizeof *total->live, compare_ranges);
    free(loader->live_maps);
    return !loader->out_of_memory;
}

static void loader_start(struct loader *loader, int pid_or_minus1, struct fake_log_summary *out)
{
    memset(out, 0, sizeof *out);
    out->total.pid = -1;
    *loader = (struct loader){pid_or_minus1, out, 0, NULL, false};
}

bool fake_log_parse(const char *text, int pid_or_minus1, struct fake_log_summary *out)
{
    struct loader loader;
    loader_start(&loader, pid_or_minus1, out);
    char line[FAKE_LOG_LINE_MAX];
    while (text && *text) {
        size_t length = strcspn(text, "\n");
        size_t kept = length < sizeof line - 1 ? length : sizeof line - 1;
        memcpy(line, text, kept);
        line[kept] = '\0';
        take_line(&loader, line);
        text += length + (text[length] == '\n');
    }
    return finish(&loader);
}

bool fake_log_load(const char *path, int pid_or_minus1, struct fake_log_summary *out)
{
    struct loader loader;
    loader_start(&loader, pid_or_minus1, out);
    FILE *file = fopen(path, "r");
    if (!file)
        return false;
    char *line = NULL;
    size_t capacity = 0;
    ssize_t length;
    while ((length = getline(&line, &capacity, file)) >= 0) {
        if (length > 0 && line[length - 1] == '\n')
            line[length - 1] = '\0';
        take_line(&loader, line);
    }
    free(line);
    fclose(file);
    return finish(&loader);
}

void fake_log_free(struct fake_log_summary *summary)
{
    if (!summary)
        return;
    for (size_t i = 0; i < summary->process_count; i++)
        free(summary->processes[i].live);
    free(summary->processes);
    free(summary->total.live);
    memset(summary, 0, sizeof *summary);
}

const struct fake_log_process *fake_log_find(const struct fake_log_summary *summary, int pid)
{
    for (size_t i = 0; i < summary->process_count; i++) {
        if (summary->processes[i].pid == pid)
            return &summary->processes[i];
    }
    return NULL;
}

static uint64_t error_count(const struct fake_log_error_count *counts, size_t used, int code)
{
    for (size_t i = 0; i < used; i++) {
        if (counts[i].code == code)
            return counts[i].count;
    }
    return 0;
}

uint64_t fake_log_register_errors(const struct fake_log_process *process, int code)
{
    return error_count(process->register_errors, process->register_error_codes, code);
}

uint64_t fake_log_unregister_errors(const struct fake_log_process *process, int code)
{
    return error_count(process->unregister_errors, process->unregister_error_codes, code);
}

static void print_process(const struct fake_log_process *process, FILE *stream)
{
    fprintf(stream, "pid %d: register %" PRIu64 " (ok %" PRIu64 ")", process->pid,
            process->register_calls, process->register_ok);
    for (size_t i = 0; i < process->register_error_codes; i++)
        fprintf(stream, " [%d]x%" PRIu64, process->register_errors[i].code,
                process->register_errors[i].count);
    fprintf(stream, ", unregister %" PRIu64 " (ok %" PRIu64 ")", process->unregister_calls,
            process->unregister_ok);
    for (size_t i = 0; i < process->unregister_error_codes; i++)
        fprintf(stream, " [%d]x%" PRIu64, process->unregister_errors[i].code,
                process->unregister_errors[i].count);
    fprintf(stream, ", live %zu (%" PRIu64 " bytes), violations %" PRIu64 "\n", process->live_count,
            process->live_bytes, process->violations);
    for (size_t i = 0; i < process->kept_violations; i++)
        fprintf(stream, "  %s\n", process->violation_lines[i]);
}

void fake_log_print(const struct fake_log_summary *summary, FILE *stream)
{
    for (size_t i = 0; i < summary->process_count; i++)
        print_process(&summary->processes[i], stream);
    print_process(&summary->total, stream);
    if (summary->malformed_lines)
        fprintf(stream, "malformed lines: %" PRIu64 "\n", summary->malformed_lines);
}
