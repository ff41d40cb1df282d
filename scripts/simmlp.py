"""simmlp.py -- what scripts/momsim.py and scripts/adamsim.py share: Fashion-MNIST from Debian's
dataset-fashion-mnist, and a flat-vector MLP 784-H-10 (He-initialised matrices, zero biases) with
its softmax cross-entropy gradient and its test accuracy."""
import gzip

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist/"


def load(stem):
    X = np.frombuffer(gzip.open(DATA + stem + "-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
    y = np.frombuffer(gzip.open(DATA + stem + "-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
    return X.reshape(-1, 784).astype(np.float32) / 255, y.astype(np.int64)


XTR, YTR = load("train")
XTE, YTE = load("t10k")


class MLP:
    def __init__(self, H):
        self.shapes = [(784, H), (H,), (H, 10), (10,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.P = sum(self.sizes)

    def init(self, rng):
        w = np.zeros(self.P, np.float32)
        o = 0
        for s, n in zip(self.shapes, self.sizes):
            if len(s) == 2:  # He initialisation of the matrices, zero biases
                w[o:o + n] = (rng.standard_normal(n) * np.sqrt(2.0 / s[0])).astype(np.float32)
            o += n
        return w

    def unpack(self, v):
        out, o = [], 0
        for s, n in zip(self.shapes, self.sizes):
            out.append(v[o:o + n].reshape(s))
            o += n
        return out

    def grad(self, v, X, y):
        W1, b1, W2, b2 = self.unpack(v)
        h = np.maximum(X @ W1 + b1, 0)
        z = h @ W2 + b2
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        p /= len(y)
        dh = (p @ W2.T) * (h > 0)
        return np.concatenate([(X.T @ dh).ravel(), dh.sum(0), (h.T @ p).ravel(), p.sum(0)]).astype(np.float32)

    def accuracy(self, w):
        W1, b1, W2, b2 = self.unpack(w)
        z = np.maximum(XTE @ W1 + b1, 0) @ W2 + b2
        return float(np.mean(z.argmax(1) == YTE))
