/* check_opts.c -- the client options' table (common/client_conf.c) against
 * the struct it describes, and everything the table drives: defaults
 * (GDDR_CLIENT_OPTS_INIT, gddr_client_opts_init, its frozen-prefix symbol),
 * the sized entry points' size rules, setters and getters by name, the
 * option list, the [client] keys and the environment look-ups. A field
 * appended to gddr_client_opts without its row fails here. */
#include "gddr/gddr.h"
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_conf.h"
#include "conf.h"
#include "suites.h"

/* client/src/options.c */
int gddr__env_rank(void);
int gddr__env_world(void);

#define TABLE gddr__client_opts_table

static size_t type_size(gddr__opt_type t)
{
    switch (t) {
    case GDDR_OPT_U64: return sizeof(uint64_t);
    case GDDR_OPT_DOUBLE: return sizeof(double);
    case GDDR_OPT_STRING: return sizeof(const char *);
    case GDDR_OPT_PTR: return sizeof(void *);
    default: return sizeof(int);
    }
}

/* Every byte of gddr_client_opts but padding is one row's field, the rows
 * in the fields' order, each of its type's size; names are unique. */
START_TEST(test_rows_cover_the_struct)
{
    size_t end = 0, n = 0;
    for (const gddr__client_opt *r = TABLE; r->name; r++, n++) {
        for (const gddr__client_opt *q = TABLE; q < r; q++)
            ck_assert_msg(strcmp(q->name, r->name) != 0, "option %s has two rows", r->name);
        ck_assert_msg(r->help && r->help[0] && r->def, "option %s lacks its help or default", r->name);
        if (r->offset == GDDR_OPT_NOFIELD) {
            ck_assert_msg(r->flags & GDDR_OPT_INI, "%s has neither a field nor an INI key", r->name);
            continue;
        }
        ck_assert_msg(r->size == type_size(r->type), "option %s: a %s of %zu bytes", r->name,
                      gddr__opt_type_name(r->type), r->size);
        ck_assert_msg(r->offset >= end, "option %s is not after the row before it (struct order)", r->name);
        ck_assert_msg(r->offset - end < r->size, "%zu bytes before option %s belong to no row", r->offset - end,
                      r->name);
        end = r->offset + r->size;
        ck_assert_msg(!(r->type == GDDR_OPT_PTR && (r->flags & GDDR_OPT_INI)), "pointer %s as an INI key",
                      r->name);
    }
    ck_assert_msg(sizeof(gddr_client_opts) - end < 8, "gddr_client_opts has %zu bytes after its last row: "
                  "a field appended without its row in common/client_conf.c",
                  sizeof(gddr_client_opts) - end);
    ck_assert_uint_eq(n, gddr__client_opts_count());
    ck_assert_uint_le(n, GDDR_CONF_MAXKEYS);
    ck_assert_uint_ge(sizeof(gddr_client_opts), GDDR_CLIENT_OPTS_V0_SIZE);
    ck_assert_uint_eq(gddr_client_opts_size(), sizeof(gddr_client_opts));
}
END_TEST

/* The fields of a and b within their first `upto` bytes are the same. */
static void same_fields(const gddr_client_opts *a, const gddr_client_opts *b, size_t upto, const char *what)
{
    for (const gddr__client_opt *r = TABLE; r->name; r++)
        if (r->offset != GDDR_OPT_NOFIELD && r->offset + r->size <= upto)
            ck_assert_msg(memcmp((const char *)a + r->offset, (const char *)b + r->offset, r->size) == 0,
                          "%s: option %s differs", what, r->name);
}

/* GDDR_CLIENT_OPTS_INIT, gddr_client_opts_init (the macro: the sized call)
 * and the exported symbol of the first gddr.h all give the rows' defaults. */
START_TEST(test_defaults_are_the_rows)
{
    const gddr_client_opts lit = GDDR_CLIENT_OPTS_INIT;
    gddr_client_opts a, b;
    memset(&a, 0xa5, sizeof a);
    memset(&b, 0x5a, sizeof b);
    gddr_client_opts_init(&a);
    (gddr_client_opts_init)(&b); /* the symbol, not the macro */
    same_fields(&lit, &a, sizeof a, "GDDR_CLIENT_OPTS_INIT vs gddr_client_opts_init");
    /* The first gddr.h's symbol fills its struct: the frozen prefix. */
    same_fields(&lit, &b, GDDR_CLIENT_OPTS_V0_SIZE, "GDDR_CLIENT_OPTS_INIT vs the frozen-prefix symbol");
    ck_assert_msg(b.pull_delta_auto == (int)0x5a5a5a5a, "the frozen-prefix symbol wrote past the first gddr.h's struct");
    /* Each default reads back as the text of its row. */
    char buf[256];
    for (const gddr__client_opt *r = TABLE; r->name; r++) {
        if (r->offset == GDDR_OPT_NOFIELD || r->type == GDDR_OPT_PTR)
            continue;
        ck_assert_int_eq(gddr_opts_get(&a, sizeof a, r->name, buf, sizeof buf), GDDR_OK);
        ck_assert_msg(strcmp(buf, r->def) == 0 || strtod(buf, NULL) == strtod(r->def, NULL),
                      "option %s: default '%s', row says '%s'", r->name, buf, r->def);
    }
    ck_assert_ptr_null(a.server);
    ck_assert_ptr_null(a.log);
}
END_TEST

/* A struct smaller than the frozen prefix is refused; one larger than the
 * library's (a program built against a newer gddr.h) too, with a sentence
 * that says to upgrade, before anything is sent. */
START_TEST(test_sizes)
{
    struct { gddr_client_opts o; int newer_field; double another; } big;
    memset(&big, 0xff, sizeof big);
    ck_assert_int_eq(gddr_client_opts_init_sized(&big.o, GDDR_CLIENT_OPTS_V0_SIZE - 1), GDDR_EINVAL);
    ck_assert_msg(strstr(gddr_opts_errmsg(), "smaller than the first gddr.h"), "%s", gddr_opts_errmsg());
    ck_assert_int_eq(gddr_client_opts_init_sized(&big.o, sizeof big), GDDR_ENOTSUP);
    ck_assert_msg(strstr(gddr_opts_errmsg(), "newer gddr.h") && strstr(gddr_opts_errmsg(), "upgrade"),
                  "%s", gddr_opts_errmsg());
    const gddr_client_opts lit = GDDR_CLIENT_OPTS_INIT;
    same_fields(&lit, &big.o, sizeof big.o, "init_sized of a larger struct");
    ck_assert_int_eq(big.newer_field, 0);
    big.o.server = "tcp://127.0.0.1:1";
    big.o.rank = 0;
    big.o.world_size = 1;
    gddr_client *c = (gddr_client *)&big;
    ck_assert_int_eq(gddr_client_open_sized(&big.o, sizeof big, &c), GDDR_ENOTSUP);
    ck_assert_msg(strstr(gddr_opts_errmsg(), "built against a newer gddr.h"), "%s", gddr_opts_errmsg());
    ck_assert_int_eq(gddr_client_open_sized(&big.o, 16, &c), GDDR_EINVAL);
    ck_assert_int_eq(gddr_client_open_sized(NULL, sizeof big.o, &c), GDDR_EINVAL);
    char err[512] = "";
    ck_assert_int_eq(gddr_client_open_ini_sized("config/gddr-client.ini", &big.o, sizeof big, &c, err,
                                                sizeof err), GDDR_ENOTSUP);
    ck_assert_msg(strstr(err, "newer gddr.h"), "err: %s", err);
    /* Exactly the frozen prefix (no trailing padding) is a whole struct. */
    gddr_client_opts o;
    ck_assert_int_eq(gddr_client_opts_init_sized(&o, GDDR_CLIENT_OPTS_V0_SIZE), GDDR_OK);
    same_fields(&lit, &o, GDDR_CLIENT_OPTS_V0_SIZE, "init_sized of the frozen prefix");
    ck_assert_str_eq(gddr_opts_errmsg(), "");
}
END_TEST

/* Setters by name parse with the row's type and bounds; getters write what
 * the setters take back; mistakes are named. */
START_TEST(test_set_get_by_name)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    const size_t z = sizeof o;
    char buf[256];
    ck_assert_int_eq(gddr_opts_set(&o, z, "timeout_ms", "1234"), GDDR_OK);
    ck_assert_int_eq(o.timeout_ms, 1234);
    ck_assert_int_eq(gddr_opts_set(&o, z, "seed", "9000000000000000000"), GDDR_OK);
    ck_assert_uint_eq(o.seed, 9000000000000000000ull);
    ck_assert_int_eq(gddr_opts_set(&o, z, "delay_fraction", "0.25"), GDDR_OK);
    ck_assert(o.delay_fraction == 0.25);
    ck_assert_int_eq(gddr_opts_set(&o, z, "dc_mode", "identity"), GDDR_OK);
    ck_assert_int_eq(o.dc_mode, GDDR_DC_IDENTITY);
    ck_assert_int_eq(gddr_opts_set(&o, z, "dc_mode", "0"), GDDR_OK); /* by value */
    ck_assert_int_eq(o.dc_mode, GDDR_DC_DIAG);
    ck_assert_int_eq(gddr_opts_set(&o, z, "pull_delta_bits", "16"), GDDR_OK);
    ck_assert_int_eq(o.pull_delta_bits, 16);
    ck_assert_int_eq(gddr_opts_set(&o, z, "log_level", "debug"), GDDR_OK);
    ck_assert_int_eq(o.log_level, GDDR_LOG_DEBUG);
    ck_assert_int_eq(gddr_opts_set(&o, z, "observer", "yes"), GDDR_OK);
    ck_assert_int_eq(o.observer, 1);
    const char *ep = "tcp://127.0.0.1:9";
    ck_assert_int_eq(gddr_opts_set(&o, z, "server", ep), GDDR_OK);
    ck_assert_ptr_eq(o.server, ep); /* the caller's string, as a field set by hand */
    ck_assert_int_eq(gddr_opts_set(&o, z, "curve_key_file", ""), GDDR_OK);
    ck_assert_ptr_null(o.curve_key_file);
    int user;
    ck_assert_int_eq(gddr_opts_set_ptr(&o, z, "log_user", &user), GDDR_OK);
    ck_assert_ptr_eq(o.log_user, &user);
    ck_assert_int_eq(gddr_opts_get(&o, z, "dc_mode", buf, sizeof buf), GDDR_OK);
    ck_assert_str_eq(buf, "diag");
    ck_assert_int_eq(gddr_opts_get(&o, z, "delay_fraction", buf, sizeof buf), GDDR_OK);
    ck_assert_str_eq(buf, "0.25");
    ck_assert_int_eq(gddr_opts_get(&o, z, "observer", buf, sizeof buf), GDDR_OK);
    ck_assert_str_eq(buf, "true");
    /* Every option's text round-trips. */
    gddr_client_opts back = GDDR_CLIENT_OPTS_INIT;
    for (const gddr__client_opt *r = TABLE; r->name; r++) {
        if (r->offset == GDDR_OPT_NOFIELD || r->type == GDDR_OPT_PTR || r->type == GDDR_OPT_STRING)
            continue;
        ck_assert_int_eq(gddr_opts_get(&o, z, r->name, buf, sizeof buf), GDDR_OK);
        ck_assert_msg(gddr_opts_set(&back, z, r->name, buf) == GDDR_OK, "%s=%s: %s", r->name, buf,
                      gddr_opts_errmsg());
        ck_assert_msg(memcmp((char *)&o + r->offset, (char *)&back + r->offset, r->size) == 0,
                      "option %s does not round-trip through '%s'", r->name, buf);
    }
    static const struct { const char *name, *value, *words; } bad[] = {
        { "delay_fractoin", "0.5", "unknown client option 'delay_fractoin'" },
        { "delay_fraction", "1.5", "out of range" },
        { "timeout_ms", "0", "out of range" },
        { "timeout_ms", "soon", "not an integer" },
        { "dc_mode", "sideways", "not one of diag, identity" },
        { "pull_delta_bits", "4", "not one of 0, 8, 16" },
        { "observer", "maybe", "not a boolean" },
        { "log", "0", "gddr_opts_set_ptr" },
        { "servers", "tcp://a:1", "INI file only" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gddr_client_opts before = o;
        ck_assert_int_eq(gddr_opts_set(&o, z, bad[i].name, bad[i].value), GDDR_EINVAL);
        ck_assert_msg(strstr(gddr_opts_errmsg(), bad[i].words), "%s=%s: '%s' lacks '%s'", bad[i].name,
                      bad[i].value, gddr_opts_errmsg(), bad[i].words);
        ck_assert(memcmp(&before, &o, sizeof o) == 0); /* left alone */
    }
    ck_assert_int_eq(gddr_opts_set_ptr(&o, z, "rank", &user), GDDR_EINVAL);
    ck_assert_int_eq(gddr_opts_set(&o, 8, "rank", "1"), GDDR_EINVAL);
    ck_assert_int_eq(gddr_opts_get(&o, z, "nope", buf, sizeof buf), GDDR_EINVAL);
    ck_assert_str_eq(buf, "");
}
END_TEST

/* gddr_opts_describe lists the field rows in order, NULL after the last. */
START_TEST(test_describe)
{
    size_t i = 0;
    for (const gddr__client_opt *r = TABLE; r->name; r++) {
        if (r->offset == GDDR_OPT_NOFIELD)
            continue;
        const char *type, *def, *choices, *help;
        const char *name = gddr_opts_describe(i++, &type, &def, &choices, &help);
        ck_assert_str_eq(name, r->name);
        ck_assert_str_eq(type, gddr__opt_type_name(r->type));
        ck_assert_str_eq(def, r->def);
        ck_assert_str_eq(help, r->help);
        if (strcmp(name, "dc_mode") == 0)
            ck_assert_str_eq(choices, "diag=0,identity=1");
        else if (strcmp(name, "pull_delta_bits") == 0)
            ck_assert_str_eq(choices, "0=0,8=8,16=16");
        else if (r->type != GDDR_OPT_ENUM)
            ck_assert_str_eq(choices, "");
    }
    ck_assert_ptr_null(gddr_opts_describe(i, NULL, NULL, NULL, NULL));
    ck_assert_str_eq(gddr_opts_describe(0, NULL, NULL, NULL, NULL), "server");
}
END_TEST

/* The [client] keys are the INI rows, in order, with the INI's defaults. */
START_TEST(test_ini_keys_are_the_ini_rows)
{
    const gddr__conf_key *k = gddr__client_conf_keys();
    for (const gddr__client_opt *r = TABLE; r->name; r++) {
        if (!(r->flags & GDDR_OPT_INI))
            continue;
        ck_assert_ptr_nonnull(k->name);
        ck_assert_str_eq(k->name, r->name);
        ck_assert_str_eq(k->section, "client");
        ck_assert_str_eq(k->def, r->ini_def ? r->ini_def : r->def);
        ck_assert_str_eq(k->help, r->help);
        k++;
    }
    ck_assert_ptr_null(k->name);
    gddr__client_slot slots[GDDR_CONF_MAXKEYS];
    char err[256];
    ck_assert_msg(gddr__conf_defaults(gddr__client_conf_keys(), slots, err, sizeof err) == 0, "%s", err);
}
END_TEST

/* rank and world_size left unset come from the rows' environment
 * variables, the first set one winning. */
START_TEST(test_env_from_rows)
{
    const gddr__client_opt *rank = gddr__client_opt_find("rank"), *world = gddr__client_opt_find("world_size");
    ck_assert_ptr_nonnull(rank->env);
    ck_assert_ptr_nonnull(world->env);
    const char *vars[] = { "GDDR_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "RANK", "GDDR_WORLD_SIZE",
                           "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    ck_assert_int_eq(gddr__env_rank(), 0);
    ck_assert_int_eq(gddr__env_world(), 1);
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    ck_assert_int_eq(gddr__env_rank(), 5);
    ck_assert_int_eq(gddr__env_world(), 8);
    setenv("GDDR_RANK", "3", 1);
    setenv("SLURM_NTASKS", "junk", 1); /* not a number: the next one */
    ck_assert_int_eq(gddr__env_rank(), 3);
    ck_assert_int_eq(gddr__env_world(), 8);
}
END_TEST

Suite *suite_opts(void)
{
    Suite *s = suite_create("opts");
    TCase *tc = tcase_create("opts");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_rows_cover_the_struct);
    tcase_add_test(tc, test_defaults_are_the_rows);
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_set_get_by_name);
    tcase_add_test(tc, test_describe);
    tcase_add_test(tc, test_ini_keys_are_the_ini_rows);
    tcase_add_test(tc, test_env_from_rows);
    suite_add_tcase(s, tc);
    return s;
}
