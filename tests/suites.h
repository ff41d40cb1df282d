/* suites.h -- every Check suite of the project, one row each.
 * A module's tests live in tests/check_<name>.c and export
 * `Suite *suite_<name>(void)`. */
#ifndef GDDR_TESTS_SUITES_H
#define GDDR_TESTS_SUITES_H
#include <check.h>

#define GDDR_SUITES(X) \
    X(conf)            \
    X(opts)            \
    X(model)           \
    X(kernels)         \
    X(checkpoint)      \
    X(server)          \
    X(security)        \
    X(ops)             \
    X(consistency)     \
    X(recovery)        \
    X(residual)        \
    X(integrity)       \
    X(shard)           \
    X(optim)           \
    X(view)            \
    X(table)           \
    X(table_ckpt)      \
    X(rows)            \
    X(pushlog)

#define GDDR__SUITE_DECL(name) Suite *suite_##name(void);
GDDR_SUITES(GDDR__SUITE_DECL)
#undef GDDR__SUITE_DECL

#endif
