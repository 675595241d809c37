/* json_lite: a strict RFC 8259 validator and a path lookup, for checking the
 * JSON that pinshim writes (its stats report). Test-only; it re-parses the
 * document on every call, which is fine for documents of a few kilobytes.
 *
 * Paths are dotted: "register.ok", "errors.cudaErrorMemoryAllocation". On an
 * array a segment is a decimal index ("ranges.0.size"). The empty path is the
 * whole document. Keys containing '.' cannot be addressed. When an object
 * repeats a key, the first occurrence wins.
 */
#ifndef JSON_LITE_H
#define JSON_LITE_H

#include <stdbool.h>
#include <stddef.h>

enum json_lite_type {
    JSON_LITE_NULL,
    JSON_LITE_BOOL,
    JSON_LITE_NUMBER,
    JSON_LITE_STRING,
    JSON_LITE_OBJECT,
    JSON_LITE_ARRAY,
    JSON_LITE_MISSING /* no such path, or the document is not valid JSON */
};

/* Is doc (NUL-terminated) exactly one valid JSON text? On failure, err (if
 * not NULL) receives "offset N: what is wrong". */
bool json_lite_valid(const char *doc, char *err, size_t errlen);

/* The type of the value at path (an enum json_lite_type). */
int json_lite_type(const char *doc, const char *path);

/* These return false when doc is invalid, path is missing, or the value has
 * another type; *out is then left alone. */
bool json_lite_get_number(const char *doc, const char *path, double *out);
bool json_lite_get_bool(const char *doc, const char *path, bool *out);

/* Decodes escapes into UTF-8. Returns false also when the string (plus NUL)
 * does not fit in outlen bytes, or contains \u0000. */
bool json_lite_get_string(const char *doc, const char *path, char *out, size_t outlen);

/* Members of the object or elements of the array at path, or -1. */
int json_lite_count(const char *doc, const char *path);

#endif /* JSON_LITE_H */
