"""gddr.torch -- a torch.nn.Module's parameters kept on gddr-ps.

    model = Net()
    with gddr.Client(server, rank=r, world_size=w, delay_fraction=0.4) as c:
        ps = gddr.torch.ParameterServer(model, c)   # registers, then pulls the server's values
        for x, y in loader:
            model.zero_grad()
            loss_fn(model(x), y).backward()
            ps.step()            # push the grads, write the server's parameters into the model

The server applies the update (its lr, momentum, AdaDelay, mode); the
client's options do the worker's part (clip_norm, DC-ASGD, GDDR
delay_fraction). No torch optimizer is needed.

Parameters are registered under their names from model.named_parameters()
(with an optional prefix), in that order. CPU float32 parameters and their
gradients go to the library as pointers to their own memory, never copied.
CUDA parameters take the library's device path (residual and DC-ASGD on
the GPU, only the sent chunks cross to the host) when the library was
built with CUDA; with a CPU-only library they are staged through host
memory instead, with a warning.
"""

import warnings

import numpy as np
import torch

from . import _lib
from .errors import InvalidArgument


def _flat_numpy(t, what):
    """A float32 NumPy view of a contiguous CPU tensor's memory (no copy)."""
    if t.dtype != torch.float32:
        raise InvalidArgument("%s has dtype %s; gddr takes float32 only" % (what, t.dtype))
    if not t.is_contiguous():
        raise InvalidArgument("%s is not contiguous" % what)
    return t.detach().numpy().reshape(-1)


class ParameterServer:
    """Registers every parameter of `model` that requires a gradient on
    `client`'s server and makes the model's parameters the server's.

    model   a torch.nn.Module (float32 parameters, all on one device)
    client  a gddr.Client (its options decide clipping, DC-ASGD, GDDR alpha)
    prefix  put before every name (several models on one server)
    """

    def __init__(self, model, client, prefix=""):
        self.model = model
        self.client = client
        self.named = [(prefix + name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not self.named:
            raise InvalidArgument("the model has no parameter that requires a gradient")
        devices = {p.device for _, p in self.named}
        if len(devices) != 1:
            raise InvalidArgument("the model's parameters are on several devices: %s"
                                  % sorted(map(str, devices)))
        self.device = devices.pop()
        self.cuda = self.device.type == "cuda"
        if self.device.type not in ("cpu", "cuda"):
            raise InvalidArgument("parameters on %s: gddr takes CPU or CUDA tensors" % self.device)
        # CUDA parameters through the library's device path, or (a CPU-only
        # library) through host copies.
        self.staged = self.cuda and not client.has_cuda
        if self.staged:
            warnings.warn("libgddr-client cannot take CUDA memory (%s): CUDA parameters are "
                          "copied through host memory every step" % _lib.CUDA_REASON)
        for name, p in self.named:
            if p.dtype != torch.float32 or not p.is_contiguous():
                raise InvalidArgument("parameter %r must be contiguous float32 (it is %s%s)"
                                      % (name, p.dtype, "" if p.is_contiguous() else ", strided"))
        with torch.no_grad():
            if self.cuda:
                self._host_p = [p.detach().cpu().contiguous().numpy().reshape(-1)
                                for _, p in self.named]
                self._host_g = [np.zeros_like(h) for h in self._host_p]
                for (name, _), h in zip(self.named, self._host_p):
                    client.register(name, h)
                for (name, p), h in zip(self.named, self._host_p):
                    client.pull(name, h)
                    p.copy_(torch.from_numpy(h).view_as(p))
            else:
                self._params = [_flat_numpy(p.data, name) for name, p in self.named]
                for (name, _), a in zip(self.named, self._params):
                    client.register(name, a)
                # The first registration wins: every worker starts from the
                # server's values, whatever its own initialisation was.
                for (name, _), a in zip(self.named, self._params):
                    client.pull(name, a)
        if len(client.tensors) != len(self.named):
            raise InvalidArgument("the client has %d tensors registered, the model %d parameters: "
                                  "give ParameterServer a client of its own"
                                  % (len(client.tensors), len(self.named)))

    def _grad(self, i):
        """Parameter i's gradient; zeros for one that got none this step."""
        name, p = self.named[i]
        g = p.grad
        if g is None:
            return torch.zeros_like(p)
        if g.is_sparse:
            raise InvalidArgument("parameter %r has a sparse gradient; gddr takes dense ones" % name)
        return g if g.is_contiguous() else g.contiguous()

    def step(self):
        """After loss.backward(): pushes every gradient and writes the
        parameters the server returns into the model (gddr_step: clip,
        DC-ASGD, GDDR residual, push, pull, in the server's mode)."""
        grads = [self._grad(i) for i in range(len(self.named))]
        with torch.no_grad():
            if not self.cuda:
                self.client.step([_flat_numpy(g, "grad of " + name)
                                  for (name, _), g in zip(self.named, grads)], self._params)
            elif self.staged:
                for h, g in zip(self._host_g, grads):
                    h[:] = g.detach().reshape(-1).cpu().numpy()
                self.client.step(self._host_g, self._host_p)
                for (_, p), h in zip(self.named, self._host_p):
                    p.copy_(torch.from_numpy(h).view_as(p))
            else:
                # The library reads the gradients on its own stream: they
                # must be complete first.
                torch.cuda.synchronize(self.device)
                self.client.step_ptrs([g.data_ptr() for g in grads],
                                      [p.data_ptr() for _, p in self.named])

    def pull(self):
        """Writes the server's current parameters into the model (e.g. at
        the end, or in an observer that evaluates the server's model)."""
        with torch.no_grad():
            if self.cuda:
                for (name, p), h in zip(self.named, self._host_p):
                    self.client.pull(name, h)
                    p.copy_(torch.from_numpy(h).view_as(p))
            else:
                for (name, _), a in zip(self.named, self._params):
                    self.client.pull(name, a)
