/* gpu.h -- whether a usable GPU is here, for the suites with GPU cases.
 *
 * Check has no skip status, so a suite registers its GPU cases only when
 * gt_gpu_probe() says a GPU is usable, and otherwise one case that prints
 * "SKIP <what>: <reason>" on stdout and passes (tests/check_kernels.c,
 * tests/check_residual.c). The probe asks gddr_cuda_available() in a forked
 * child, so the runner process never initialises CUDA: a CUDA context would
 * not survive the fork() Check does for every case. Header-only, like
 * harness.h.
 */
#ifndef GDDR_TESTS_GPU_H
#define GDDR_TESTS_GPU_H

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blas.h"

/* 1 when a GPU is usable (why: which one); else 0 (why: the reason). */
static inline int gt_gpu_probe(char *why, size_t whylen)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "could not probe for a GPU (pipe failed)");
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        snprintf(why, whylen, "could not probe for a GPU (fork failed)");
        return 0;
    }
    if (pid == 0) {
        char msg[256];
        msg[0] = (char)('0' + gddr_cuda_available(msg + 1, sizeof msg - 1));
        ssize_t w = write(fds[1], msg, strlen(msg) + 1);
        _exit(w > 0 ? 0 : 1);
    }
    close(fds[1]);
    char msg[256] = { 0 };
    size_t got = 0;
    ssize_t k;
    while (got < sizeof msg - 1 && (k = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0)
        got += (size_t)k;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got == 0 || !WIFEXITED(status)) {
        snprintf(why, whylen, "GPU probe died (%s %d)",
                 WIFSIGNALED(status) ? "signal" : "status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 0;
    }
    snprintf(why, whylen, "%s", msg + 1);
    return msg[0] == '1';
}

#endif
