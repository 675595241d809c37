/* Configuration: one table of options drives the environment parser, the
 * pinshim command's options and --help, and the README's option table. */
#ifndef PINSHIM_OPTIONS_H
#define PINSHIM_OPTIONS_H

#include "log.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum stats_mode { STATS_NONE = 0, STATS_TEXT, STATS_JSON };
/* Where registrations go: through the GPU runtime the program started, into
 * its own context (never a new one), or through a runtime the shim loads and
 * starts, creating a context when needed. */
enum context_mode { CONTEXT_PROGRAM = 0, CONTEXT_CREATE };
/* Which vendors' runtimes the shim may use (accelerator.h keeps the order). */
enum vendor_choice {
    VENDOR_CHOICE_AUTO = 0,
    VENDOR_CHOICE_CUDA,
    VENDOR_CHOICE_HIP,
    VENDOR_CHOICE_ZE
};
enum onfault_mode { ONFAULT_RESIDENT = 0, ONFAULT_SKIP, ONFAULT_ALL };
enum fork_mode { FORK_COPY = 0, FORK_DONTFORK };
/* Where a process's live record goes (live_record.h). */
enum live_mode { LIVE_AUTO = 0, LIVE_OFF, LIVE_DIRECTORY };
/* Huge pages for memory about to be locked (huge_pages.h). */
enum huge_pages_mode { HUGE_PAGES_AUTO = 0, HUGE_PAGES_OFF };

#define CONFIG_PATH_MAX 1024

struct pinshim_config {
    bool register_enabled;
    uint64_t min_bytes;
    unsigned register_flags;      /* ENGINE_REGISTER_* */
    char cudart[CONFIG_PATH_MAX]; /* empty: search for the runtime */
    enum stats_mode stats_mode;
    char stats_path[CONFIG_PATH_MAX]; /* template with %p %h %%, for STATS_JSON */
    bool stats_all; /* write stats for every process, not only those with something to say */
    enum log_level log_level;
    bool block_size_from_allocator; /* free always asks malloc_usable_size */
    enum context_mode context_mode;
    enum vendor_choice vendor;
    int device; /* PINSHIM_DEVICE for CONTEXT_CREATE; -1: the calling thread's */
    bool asynchronous;
    uint64_t max_registration_bytes;
    enum onfault_mode onfault;
    enum fork_mode fork_mode;
    uint64_t fork_warn_bytes; /* 0: never warn */
    enum live_mode live_mode;
    char live_directory[CONFIG_PATH_MAX]; /* for LIVE_DIRECTORY */
    bool numa;                            /* locate each registration's pages on NUMA nodes */
    bool nvtx;                            /* NVTX ranges for registrations and the waits for them */
    enum huge_pages_mode huge_pages;
};

enum option_id {
    OPT_REGISTER,
    OPT_MIN_BYTES,
    OPT_FLAGS,
    OPT_CUDART,
    OPT_STATS,
    OPT_STATS_ALL,
    OPT_LOG,
    OPT_BLOCK_SIZE,
    OPT_CONTEXT,
    OPT_VENDOR,
    OPT_DEVICE,
    OPT_ASYNC,
    OPT_MAX_REGISTRATION,
    OPT_ONFAULT,
    OPT_FORK,
    OPT_FORK_WARN,
    OPT_LIVE,
    OPT_NUMA,
    OPT_NVTX,
    OPT_HUGE_PAGES,
    OPT_COUNT
};

struct option_spec {
    enum option_id id;
    /* The value names a file or a library the shim would open, load or write.
     * Such options are ignored in secure-execution mode (setuid, setgid, file
     * capabilities), as secure_getenv(3) would: set it on every new option that
     * names a file, and config_load applies the rule. */
    bool names_file;
    const char *env_name;     /* PINSHIM_... */
    const char *cli_name;     /* long option of the pinshim command, without "--" */
    const char *cli_argument; /* placeholder of its argument, NULL for a flag */
    const char *flag_value;   /* for a flag: the value it sets */
    const char *accepted;     /* what values are accepted, for messages and docs */
    const char *default_text; /* the default, as a user would write it */
    const char *help;         /* one sentence */
    /* Parses value into cfg; on failure writes why (a short phrase) and leaves cfg alone. */
    bool (*parse)(const char *value, struct pinshim_config *cfg, char *why, size_t why_size);
};

extern const struct option_spec option_table[OPT_COUNT];

void config_set_defaults(struct pinshim_config *cfg);

typedef const char *(*config_lookup_fn)(const char *name, void *context);

/* Reads every option through lookup (getenv for the shim) and sets the log
 * level from PINSHIM_LOG first. A bad value gets one
 * "pinshim: ..." warning naming the variable, the value, what is accepted and the
 * default used instead. With secure_execution, the options marked names_file
 * keep their defaults whatever the environment says, and one warning names
 * those that were set. Returns the number of bad values. */
int config_load(struct pinshim_config *cfg, config_lookup_fn lookup, void *context,
                bool secure_execution);

/* Whether this process runs in secure-execution mode: getauxval(AT_SECURE),
 * the test secure_getenv(3) makes (set-user-ID or set-group-ID program, file
 * capabilities, or a security module that asks for it). */
bool config_secure_execution(void);

const struct option_spec *option_find_by_env(const char *env_name);
const struct option_spec *option_find_by_cli(const char *cli_name);

/* Writes the effective value of one option as text ("on", "65536", "portable,mapped"). */
void config_format_value(const struct pinshim_config *cfg, enum option_id id, char *out,
                         size_t out_size);

/* Parses a byte count with an optional K/M/G suffix (powers of 1024). */
bool parse_byte_size(const char *text, uint64_t *out);

/* Writes the option table as Markdown (the README's table), as the entries
 * of pinshim.7's ENVIRONMENT section (roff), or as --help text. */
void options_write_markdown(int fd);
void options_write_man(int fd);
void options_write_help(int fd);

#endif
