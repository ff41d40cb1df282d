/* pipeline.c -- placeholder for the step pipeline thread. */
#include "client_int.h"

void gddr__pipeline_stop(gddr_client *c)
{
    (void)c;
}
