/* data.h -- datasets for gddr-train: IDX files (Fashion-MNIST), a generated
 * dataset for fast tests, and per-worker shards.
 *
 * A dataset is n examples of dim floats in [0,1] with a class label each,
 * held row-major in one array so that the model can read a row by pointer.
 * Every call here is plain C with no global state; one dataset may be read
 * by any number of threads at once but written by one.
 */
#ifndef GDDR_TRAIN_DATA_H
#define GDDR_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct gddr_dataset {
    int n, dim, classes;
    float *x;   /* n*dim, row-major, pixel/255 */
    uint8_t *y; /* n labels, each < classes */
    int owns;   /* 1 when gddr_dataset_free() must free x and y */
} gddr_dataset;

/* Reads an IDX image file (magic 0x00000803, n x rows x cols bytes) and an
 * IDX label file (magic 0x00000801, n bytes), gzip-compressed or plain.
 * Checks the magics, the dims, that the counts agree, that nothing trails
 * the data and that every label is < 10. On success fills *out (owns=1,
 * classes=10; the caller frees it with gddr_dataset_free) and returns
 * GDDR_OK. On failure returns GDDR_EINVAL (bad arguments), GDDR_EIO (a file
 * that cannot be read or is malformed) or GDDR_ENOMEM, leaves *out empty,
 * and writes "path: what is wrong" into err when err is not NULL. */
int gddr_idx_load(const char *images_path, const char *labels_path, gddr_dataset *out,
                  char *err, size_t errlen);

/* Loads dir/train-{images-idx3,labels-idx1}-ubyte.gz into *train and
 * dir/t10k-... into *test (Debian's dataset-fashion-mnist installs them in
 * /usr/share/datasets/fashion-mnist). Same returns and err as
 * gddr_idx_load; on failure neither dataset holds anything. The caller owns
 * both datasets. */
int gddr_fashion_mnist_load(const char *dir, gddr_dataset *train, gddr_dataset *test,
                            char *err, size_t errlen);

/* Fills *out with n examples drawn from `classes` Gaussian blobs in `dim`
 * dimensions: random centres in [0.1,0.9]^dim, noise sigma 0.15, values
 * clipped to [0,1], labels drawn at random (not i % classes, so that
 * every shard of gddr_dataset_shard sees every class). The same seed gives
 * the same bytes. Meant for unit tests: softmax regression separates it.
 * On bad arguments (n, dim < 1, classes outside 2..256) or no memory,
 * *out is left empty (n = 0). The caller owns *out. */
void gddr_dataset_synthetic(gddr_dataset *out, int n, int dim, int classes, uint64_t seed);

/* Makes *out the shard of worker `rank` out of `world`: the examples i with
 * i % world == rank, in order. The rows are copied (owns=1), because a
 * strided view would not be contiguous; the caller frees *out and may free
 * `in` first. Returns GDDR_OK, GDDR_EINVAL (rank outside 0..world-1, world
 * < 1, NULL pointers) or GDDR_ENOMEM, leaving *out empty on failure. A shard
 * may have n = 0 when world > in->n. */
int gddr_dataset_shard(const gddr_dataset *in, int rank, int world, gddr_dataset *out);

/* Frees what *d owns and zeroes it; safe on a zeroed or already freed
 * dataset and on NULL. */
void gddr_dataset_free(gddr_dataset *d);

#endif
