/* gddr-keygen -- make a CURVE key pair for gddr-ps or a worker.
 *
 *   gddr-keygen NAME     writes NAME.key (mode 600: public and secret key)
 *                        and NAME.pub (public key), prints the public key
 *
 * The server's NAME.key goes in curve_secret_key_file; its public key goes
 * in every client's curve_server_key. Each client's public key goes into
 * the server's authorized_keys file, one per line.
 */
#include <stdio.h>

#include "keys.h"

int main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: gddr-keygen NAME   (writes NAME.key and NAME.pub)\n");
        return 2;
    }
    char pub[GDDR_Z85_KEY], err[512];
    if (gddr__keyfile_generate(argv[1], pub, err, sizeof err) < 0) {
        fprintf(stderr, "gddr-keygen: %s\n", err);
        return 1;
    }
    printf("%s\n", pub);
    return 0;
}
