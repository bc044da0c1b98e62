/* error.c: status names, the per-thread last error, the error handler, size formatting and
 * bounded text appends.
 *
 * Errors are reported once, where they are detected, through _stash_error(): the message
 * goes into a thread-local buffer read by stash_last_error(), to the registered handler,
 * and to stderr when STASH_SHOW_ERRORS=1.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define STASH_ERRMSG_MAX 1024

static _Thread_local char tls_last_error[STASH_ERRMSG_MAX];
static _Thread_local char tls_provider_msg[STASH_ERRMSG_MAX];

static stash_error_fn g_error_fn;
static void* g_error_arg;

const char* stash_status_name(stash_status_t status) {
  switch (status) {
#define STASH_X_(name, value, text) \
  case name:                        \
    return #name;
    STASH_STATUS_LIST(STASH_X_)
#undef STASH_X_
  }
  return "STASH_ERR_UNKNOWN";
}

const char* stash_status_text(stash_status_t status) {
  switch (status) {
#define STASH_X_(name, value, text) \
  case name:                        \
    return text;
    STASH_STATUS_LIST(STASH_X_)
#undef STASH_X_
  }
  return "unknown status";
}

const char* stash_last_error(void) { return tls_last_error; }

void stash_set_error_handler(stash_error_fn fn, void* arg) {
  g_error_fn = fn;
  g_error_arg = arg;
}

static bool show_errors(void) {
  static int cached = -1;
  if (cached < 0) {
    const char* v = getenv("STASH_SHOW_ERRORS");
    cached = (v && *v && strcmp(v, "0") != 0) ? 1 : 0;
  }
  return cached == 1;
}

stash_status_t _stash_verror(stash_status_t status, const char* fmt, va_list ap) {
  vsnprintf(tls_last_error, sizeof tls_last_error, fmt, ap);
  if (show_errors()) fprintf(stderr, "stash: %s\n", tls_last_error);
  stash_error_fn fn = g_error_fn;
  if (fn) fn(status, tls_last_error, g_error_arg);
  return status;
}

stash_status_t _stash_error(stash_status_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  _stash_verror(status, fmt, ap);
  va_end(ap);
  return status;
}

stash_status_t stash_provider_error(stash_status_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_provider_msg, sizeof tls_provider_msg, fmt, ap);
  va_end(ap);
  return status;
}

const char* _stash_provider_message(void) { return tls_provider_msg; }
void _stash_provider_message_clear(void) { tls_provider_msg[0] = '\0'; }

void _stash_format_size(size_t bytes, char* buf, size_t n) {
  /* PyTorch's format_size (c10/util): bytes up to 1 KiB, then KiB up to 1 MiB, ... */
  if (bytes <= 1024) {
    snprintf(buf, n, "%zu bytes", bytes);
  } else if (bytes <= 1048576) {
    snprintf(buf, n, "%.2f KiB", (double)bytes / 1024.0);
  } else if (bytes <= 1073741824) {
    snprintf(buf, n, "%.2f MiB", (double)bytes / 1048576.0);
  } else {
    snprintf(buf, n, "%.2f GiB", (double)bytes / 1073741824.0);
  }
}

void _stash_appendf(char* buf, size_t n, size_t* len, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = *len < n ? n - *len : 0;
  int w = vsnprintf(room ? buf + *len : NULL, room, fmt, ap);
  va_end(ap);
  if (w > 0) *len += (size_t)w;
}
