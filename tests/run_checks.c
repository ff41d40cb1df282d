/* run_checks.c -- one runner for every Check suite (tests/suites.h).
 *
 *   build/bin/gddr-tests              all suites
 *   build/bin/gddr-tests server conf  only those
 *
 * CK_FORK stays on, so a crashing test fails alone. Tests find the built
 * programs through GDDR_BIN (default build/bin).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

int main(int argc, char **argv)
{
    SRunner *sr = NULL;
#define GDDR__ADD(name)                                                       \
    do {                                                                      \
        int want = argc < 2;                                                  \
        for (int i = 1; i < argc; i++)                                        \
            if (strcmp(argv[i], #name) == 0)                                  \
                want = 1;                                                     \
        if (want) {                                                           \
            if (!sr)                                                          \
                sr = srunner_create(suite_##name());                          \
            else                                                              \
                srunner_add_suite(sr, suite_##name());                        \
        }                                                                     \
    } while (0);
    GDDR_SUITES(GDDR__ADD)
#undef GDDR__ADD
    if (!sr) {
        fprintf(stderr, "gddr-tests: no such suite\n");
        return 2;
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
