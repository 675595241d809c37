/* json_lite: see json_lite.h. A recursive-descent parser that validates as it
 * goes; lookups validate the whole document first, then walk it with the same
 * parser to skip the values they pass over. */
#include "json_lite.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deep enough for any real report, shallow enough not to exhaust the stack. */
#define JSON_LITE_MAX_DEPTH 512

struct parser {
    const char *start;
    const char *at;
    int depth;
    char *err;
    size_t errlen;
};

static bool fail(struct parser *parser, const char *message)
{
    if (parser->err && parser->errlen > 0)
        snprintf(parser->err, parser->errlen, "offset %zu: %s",
                 (size_t)(parser->at - parser->start), message);
    return false;
}

static void skip_whitespace(struct parser *parser)
{
    while (*parser->at == ' ' || *parser->at == '\t' || *parser->at == '\n' || *parser->at == '\r')
        parser->at++;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool is_continuation(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

/* Length of the well-formed UTF-8 sequence at text (no overlongs, no
 * surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_sequence_length(const unsigned char *text)
{
    unsigned char lead = text[0];
    if (lead < 0x80)
        return 1;
    if (lead >= 0xC2 && lead <= 0xDF)
        return is_continuation(text[1]) ? 2 : 0;
    if (lead >= 0xE0 && lead <= 0xEF) {
        unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;
        unsigned char high = lead == 0xED ? 0x9F : 0xBF;
        return text[1] >= low && text[1] <= high && is_continuation(text[2]) ? 3 : 0;
    }
    if (lead >= 0xF0 && lead <= 0xF4) {
        unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
        unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;
        return text[1] >= low && text[1] <= high && is_continuation(text[2]) &&
                       is_continuation(text[3])
                   ? 4
                   : 0;
    }
    return 0;
}

static bool parse_value(struct parser *parser);

static bool parse_string(struct parser *parser)
{
    parser->at++; /* the opening quote */
    for (;;) {
        unsigned char c = (unsigned char)*parser->at;
        if (c == '"') {
            parser->at++;
            return true;
        }
        if (c == '\0')
            return fail(parser, "unterminated string");
        if (c < 0x20)
            return fail(parser, "control character in string");
        if (c == '\\') {
            char escape = parser->at[1];
            if (escape == 'u') {
                for (int i = 2; i < 6; i++) {
                    if (hex_value(parser->at[i]) < 0) {
                        parser->at += i;
                        return fail(parser, "bad \\u escape");
                    }
                }
                parser->at += 6;
            } else if (escape && strchr("\"\\/bfnrt", escape)) {
                parser->at += 2;
            } else {
                return fail(parser, "bad escape");
            }
            continue;
        }
        size_t length = utf8_sequence_length((const unsigned char *)parser->at);
        if (!length)
            return fail(parser, "invalid UTF-8 in string");
        parser->at += length;
    }
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool parse_number(struct parser *parser)
{
    if (*parser->at == '-')
        parser->at++;
    if (*parser->at == '0') {
        parser->at++;
        if (is_digit(*parser->at))
            return fail(parser, "leading zero in number");
    } else if (is_digit(*parser->at)) {
        while (is_digit(*parser->at))
            parser->at++;
    } else {
        return fail(parser, "expected a digit");
    }
    if (*parser->at == '.') {
        parser->at++;
        if (!is_digit(*parser->at))
            return fail(parser, "expected a digit after '.'");
        while (is_digit(*parser->at))
            parser->at++;
    }
    if (*parser->at == 'e' || *parser->at == 'E') {
        parser->at++;
        if (*parser->at == '+' || *parser->at == '-')
            parser->at++;
        if (!is_digit(*parser->at))
            return fail(parser, "expected a digit in exponent");
        while (is_digit(*parser->at))
            parser->at++;
    }
    return true;
}

static bool parse_literal(struct parser *parser, const char *word)
{
    size_t length = strlen(word);
    if (strncmp(parser->at, word, length) != 0)
        return fail(parser, "unexpected character");
    parser->at += length;
    return true;
}

static bool parse_container(struct parser *parser, char close, bool is_object)
{
    if (++parser->depth > JSON_LITE_MAX_DEPTH)
        return fail(parser, "nesting too deep");
    parser->at++; /* '{' or '[' */
    skip_whitespace(parser);
    if (*parser->at == close) {
        parser->at++;
        parser->depth--;
        return true;
    }
    for (;;) {
        if (is_object) {
            if (*parser->at != '"')
                return fail(parser, "expected a string key");
            if (!parse_string(parser))
                return false;
            skip_whitespace(parser);
            if (*parser->at != ':')
                return fail(parser, "expected ':'");
            parser->at++;
            skip_whitespace(parser);
        }
        if (!parse_value(parser))
            return false;
        skip_whitespace(parser);
        if (*parser->at == close) {
            parser->at++;
            parser->depth--;
            return true;
        }
        if (*parser->at != ',')
            return fail(parser, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        parser->at++;
        skip_whitespace(parser);
        if (*parser->at == close)
            return fail(parser, "trailing comma");
    }
}

/* Parses one value at parser->at (no leading whitespace). */
static bool parse_value(struct parser *parser)
{
    switch (*parser->at) {
    case '{':
        return parse_container(parser, '}', true);
    case '[':
        return parse_container(parser, ']', false);
    case '"':
        return parse_string(parser);
    case 't':
        return parse_literal(parser, "true");
    case 'f':
        return parse_literal(parser, "false");
    case 'n':
        return parse_literal(parser, "null");
    case '\0':
        return fail(parser, "unexpected end of text");
    default:
        if (*parser->at == '-' || is_digit(*parser->at))
            return parse_number(parser);
        return fail(parser, "unexpected character");
    }
}

bool json_lite_valid(const char *doc, char *err, size_t errlen)
{
    struct parser parser = {doc, doc, 0, err, errlen};
    if (!doc)
        return fail(&parser, "no document");
    skip_whitespace(&parser);
    if (!parse_value(&parser))
        return false;
    skip_whitespace(&parser);
    if (*parser.at != '\0')
        return fail(&parser, "trailing characters after the value");
    if (err && errlen > 0)
        err[0] = '\0';
    return true;
}

/* ------------------------------------------------------------------------ */
/* Lookup over a document already known to be valid.                       */

static void skip_value(const char **at)
{
    struct parser parser = {*at, *at, 0, NULL, 0};
    parse_value(&parser);
    *at = parser.at;
}

static void skip_whitespace_at(const char **at)
{
    while (**at == ' ' || **at == '\t' || **at == '\n' || **at == '\r')
        (*at)++;
}

static unsigned read_hex4(const char *text)
{
    unsigned value = 0;
    for (int i = 0; i < 4; i++)
        value = value * 16 + (unsigned)hex_value(text[i]);
    return value;
}

static size_t encode_utf8(uint32_t code_point, unsigned char out[4])
{
    if (code_point < 0x80) {
        out[0] = (unsigned char)code_point;
        return 1;
    }
    if (code_point < 0x800) {
        out[0] = (unsigned char)(0xC0 | (code_point >> 6));
        out[1] = (unsigned char)(0x80 | (code_point & 0x3F));
        return 2;
    }
    if (code_point < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (code_point >> 12));
        out[1] = (unsigned char)(0x80 | ((code_point >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (code_point & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (code_point >> 18));
    out[1] = (unsigned char)(0x80 | ((code_point >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((code_point >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (code_point & 0x3F));
    return 4;
}

/* Decodes the next character of a string body at *at into out; returns its
 * byte count, or 0 at the closing quote (which it steps over). A lone
 * surrogate escape decodes to U+FFFD. */
static size_t decode_next(const char **at, unsigned char out[4])
{
    const char *text = *at;
    if (*text == '"') {
        *at = text + 1;
        return 0;
    }
    if (*text != '\\') {
        size_t length = utf8_sequence_length((const unsigned char *)text);
        memcpy(out, text, length);
        *at = text + length;
        return length;
    }
    char escape = text[1];
    *at = text + 2;
    switch (escape) {
    case 'b':
        out[0] = '\b';
        return 1;
    case 'f':
        out[0] = '\f';
        return 1;
    case 'n':
        out[0] = '\n';
        return 1;
    case 'r':
        out[0] = '\r';
        return 1;
    case 't':
        out[0] = '\t';
        return 1;
    case 'u':
        break;
    default: /* '"', '\\', '/' */
        out[0] = (unsigned char)escape;
        return 1;
    }
    uint32_t code_point = read_hex4(text + 2);
    *at = text + 6;
    if (code_point >= 0xD800 && code_point <= 0xDBFF && text[6] == '\\' && text[7] == 'u') {
        uint32_t low = read_hex4(text + 8);
        if (low >= 0xDC00 && low <= 0xDFFF) {
            code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
            *at = text + 12;
        }
    }
    if (code_point >= 0xD800 && code_point <= 0xDFFF)
        code_point = 0xFFFD;
    return encode_utf8(code_point, out);
}

/* Does the string at *at (opening quote) equal key[0..key_length)? Leaves *at
 * after the closing quote. */
static bool string_equals(const char **at, const char *key, size_t key_length)
{
    bool equal = true;
    size_t matched = 0;
    unsigned char bytes[4];
    size_t length;
    (*at)++;
    while ((length = decode_next(at, bytes)) > 0) {
        if (equal && (matched + length > key_length || memcmp(key + matched, bytes, length)))
            equal = false;
        matched += length;
    }
    return equal && matched == key_length;
}

static bool parse_index(const char *segment, size_t length, size_t *index)
{
    if (length == 0 || length > 9)
        return false;
    size_t value = 0;
    for (size_t i = 0; i < length; i++) {
        if (!is_digit(segment[i]))
            return false;
        value = value * 10 + (size_t)(segment[i] - '0');
    }
    *index = value;
    return true;
}

/* Steps from the container at *at to its member named by segment. */
static bool descend(const char **at, const char *segment, size_t length)
{
    const char *cursor = *at;
    bool is_object = *cursor == '{';
    size_t wanted_index = 0;
    if (*cursor != '{' && *cursor != '[')
        return false;
    if (!is_object && !parse_index(segment, length, &wanted_index))
        return false;
    cursor++;
    skip_whitespace_at(&cursor);
    for (size_t index = 0; *cursor != '}' && *cursor != ']'; index++) {
        bool found;
        if (is_object) {
            found = string_equals(&cursor, segment, length);
            skip_whitespace_at(&cursor);
            cursor++; /* ':' */
            skip_whitespace_at(&cursor);
        } else {
            found = index == wanted_index;
        }
        if (found) {
            *at = cursor;
            return true;
        }
        skip_value(&cursor);
        skip_whitespace_at(&cursor);
        if (*cursor == ',') {
            cursor++;
            skip_whitespace_at(&cursor);
        }
    }
    return false;
}

/* The start of the value at path, or NULL. */
static const char *find_value(const char *doc, const char *path)
{
    if (!doc || !path || !json_lite_valid(doc, NULL, 0))
        return NULL;
    const char *at = doc;
    skip_whitespace_at(&at);
    if (*path == '\0')
        return at;
    for (const char *segment = path;;) {
        const char *dot = strchr(segment, '.');
        size_t length = dot ? (size_t)(dot - segment) : strlen(segment);
        if (!descend(&at, segment, length))
            return NULL;
        if (!dot)
            return at;
        segment = dot + 1;
    }
}

static int type_at(const char *value)
{
    if (!value)
        return JSON_LITE_MISSING;
    switch (*value) {
    case '{':
        return JSON_LITE_OBJECT;
    case '[':
        return JSON_LITE_ARRAY;
    case '"':
        return JSON_LITE_STRING;
    case 't':
    case 'f':
        return JSON_LITE_BOOL;
    case 'n':
        return JSON_LITE_NULL;
    default:
        return JSON_LITE_NUMBER;
    }
}

int json_lite_type(const char *doc, const char *path)
{
    return type_at(find_value(doc, path));
}

bool json_lite_get_number(const char *doc, const char *path, double *out)
{
    const char *value = find_value(doc, path);
    if (type_at(value) != JSON_LITE_NUMBER)
        return false;
    *out = strtod(value, NULL);
    return true;
}

bool json_lite_get_bool(const char *doc, const char *path, bool *out)
{
    const char *value = find_value(doc, path);
    if (type_at(value) != JSON_LITE_BOOL)
        return false;
    *out = *value == 't';
    return true;
}

bool json_lite_get_string(const char *doc, const char *path, char *out, size_t outlen)
{
    const char *value = find_value(doc, path);
    if (type_at(value) != JSON_LITE_STRING || outlen == 0)
        return false;
    const char *at = value + 1;
    size_t used = 0;
    unsigned char bytes[4];
    size_t length;
    while ((length = decode_next(&at, bytes)) > 0) {
        if (used + length >= outlen || (length == 1 && bytes[0] == '\0')) {
            out[used] = '\0';
            return false;
        }
        memcpy(out + used, bytes, length);
        used += length;
    }
    out[used] = '\0';
    return true;
}

int json_lite_count(const char *doc, const char *path)
{
    const char *at = find_value(doc, path);
    if (!at || (*at != '{' && *at != '['))
        return -1;
    bool is_object = *at == '{';
    int count = 0;
    at++;
    skip_whitespace_at(&at);
    while (*at != '}' && *at != ']') {
        if (is_object) {
            skip_value(&at); /* the key */
            skip_whitespace_at(&at);
            at++; /* ':' */
            skip_whitespace_at(&at);
        }
        skip_value(&at);
        count++;
        skip_whitespace_at(&at);
        if (*at == ',') {
            at++;
            skip_whitespace_at(&at);
        }
    }
    return count;
}
