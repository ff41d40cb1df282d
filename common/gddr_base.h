/* gddr_base.h -- the words every part of GDDR speaks: error codes, log
 * levels and the logger callback, consistency modes and DC-ASGD forms.
 *
 * The daemon, the kernels, common/ and the client library all use them, so
 * they live here, below all of them. The client's public header
 * (client/include/gddr/gddr.h) includes this file through the link
 * client/include/gddr/gddr_base.h, and `make install` copies it next to
 * gddr.h: it is part of the public API, and a row changed here changes
 * that API.
 */
#ifndef GDDR_BASE_H
#define GDDR_BASE_H

#ifdef __cplusplus
extern "C" {
#endif

/* One list of every error, used for the enum, gddr_strerror() and the wire
 * (the numeric code travels in error replies, so never renumber a row). */
#define GDDR_ERRORS(X)                                                        \
    X(GDDR_OK, 0, "success")                                                  \
    X(GDDR_EINVAL, 1, "invalid argument")                                     \
    X(GDDR_ENOMEM, 2, "out of memory")                                        \
    X(GDDR_ETIMEDOUT, 3, "timed out waiting for the server")                  \
    X(GDDR_EPROTO, 4, "malformed or unexpected message")                      \
    X(GDDR_ENOKEY, 5, "unknown tensor")                                       \
    X(GDDR_ELENGTH, 6, "tensor length does not match")                        \
    X(GDDR_EVERSION, 7, "version from the future")                            \
    X(GDDR_ENONFINITE, 8, "NaN or Inf in values")                             \
    X(GDDR_ETOOBIG, 9, "message too large")                                   \
    X(GDDR_EGRADNORM, 10, "gradient norm above max_grad_norm")                \
    X(GDDR_ENOTSUP, 11, "not supported in this build")                        \
    X(GDDR_ECONFIG, 12, "bad configuration")                                  \
    X(GDDR_EIO, 13, "input/output error")                                     \
    X(GDDR_ESHUTDOWN, 14, "server is shutting down")                          \
    X(GDDR_EBITMAP, 15, "chunk bitmap does not match the payload")            \
    X(GDDR_ESTATE, 16, "call not valid in this state")                        \
    X(GDDR_ECUDA, 17, "CUDA or cuBLAS call failed")                           \
    X(GDDR_EWORKER, 18, "bad worker rank")                                    \
    X(GDDR_ENOTICKET, 19, "unknown or already completed ticket")            \
    X(GDDR_EBUSY, 20, "too many unread replies or parked requests") \
    X(GDDR_EAUTH, 21, "the server refused this client's security handshake")

typedef enum gddr_err {
#define GDDR__ERR_ENUM(name, num, text) name = num,
    GDDR_ERRORS(GDDR__ERR_ENUM)
#undef GDDR__ERR_ENUM
} gddr_err;

/* Returns a static English sentence for an error code; never NULL. */
const char *gddr_strerror(int err);

/* Log levels, also used by gddr-ps. */
enum { GDDR_LOG_ERROR = 0, GDDR_LOG_WARN = 1, GDDR_LOG_INFO = 2, GDDR_LOG_DEBUG = 3 };

/* A logger callback; msg is one line without a newline, valid only during
 * the call. Called from the thread that logs (the caller's or the library's
 * background thread). */
typedef void (*gddr_log_fn)(void *user, int level, const char *msg);

/* Consistency modes a server runs in (the client learns it at hello). */
typedef enum gddr_mode { GDDR_MODE_ASYNC = 0, GDDR_MODE_SYNC = 1, GDDR_MODE_SSP = 2 } gddr_mode;

/* DC-ASGD compensation forms (docs/design.md section 6 step 3). */
typedef enum gddr_dc_mode { GDDR_DC_DIAG = 0, GDDR_DC_IDENTITY = 1 } gddr_dc_mode;

/* Which chunks a GDDR worker holds (gddr_client_opts.hold_schedule;
 * docs/design.md, "The staggered schedule"). */
typedef enum gddr_hold_schedule {
    GDDR_HOLD_AUTO = 0,      /* staggered in sync mode, smallest otherwise */
    GDDR_HOLD_RANDOM = 1,    /* each chunk held with probability alpha, per worker and step */
    GDDR_HOLD_STAGGERED = 2, /* each chunk held tau steps in a cycle, the workers spread over it */
    GDDR_HOLD_SMALLEST = 3,  /* the delay_fraction share of chunks with the least r + g held */
} gddr_hold_schedule;

#ifdef __cplusplus
}
#endif
#endif /* GDDR_BASE_H */
