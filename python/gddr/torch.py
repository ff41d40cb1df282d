"""gddr.torch -- a torch.nn.Module's parameters kept on gddr-ps.

    model = Net()
    with gddr.Client(server, rank=r, world_size=w, delay_fraction=0.4) as c:
        ps = gddr.torch.ParameterServer(model, c)   # registers, then pulls the server's values
        for x, y in loader:
            model.zero_grad()
            loss_fn(model(x), y).backward()
            ps.step()            # push the grads, write the server's parameters into the model

The server applies the update (its optimizer, lr, AdaDelay, mode); the
client's options do the worker's part (clip_norm, DC-ASGD, GDDR
delay_fraction). No torch optimizer is needed, and one stepping the same
parameters is refused: ps.step() raises RuntimeError when a parameter was
changed in place since the ParameterServer last wrote it. The server's
optimizer is chosen at registration (optimizer="adam lr=0.001" or a
gddr.Optimizer); ServerOptimizer(ps) stands in for a torch optimizer where
one is expected, so that torch.optim.lr_scheduler drives the server's lr:

    ps = gddr.torch.ParameterServer(model, c, optimizer="sgd lr=0.05 momentum=0.9")
    opt = gddr.torch.ServerOptimizer(ps)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()           # set_lr(param_groups[0]["lr"]), then ps.step()
        sched.step()

Sparse embedding tables: Embedding(client, key, dim, ...) is an
nn.Module over a gddr table (rows by 64-bit id, created on first touch,
stepped by the server's optimizer): forward pulls the rows the ids use,
loss.backward() pushes their summed gradients (see the class).

Parameters are registered under their names from model.named_parameters()
(with an optional prefix), in that order. CPU float32 parameters and their
gradients go to the library as pointers to their own memory, never copied.
CUDA parameters take the library's device path (residual and DC-ASGD on
the GPU, only the sent chunks cross to the host) when the library was
built with CUDA; with a CPU-only library they are staged through host
memory instead, with a warning.
"""

import math
import warnings

import numpy as np
import torch

from . import _lib
from .errors import InvalidArgument
from .optim import LR_MAX, Optimizer, optimizer_text

# The smallest positive double: what ServerOptimizer sends for a scheduled
# lr of exactly 0, since lr 0 on the wire means "the tensor's own lr". The
# server computes in float32, where it is 0: the step is nothing.
MIN_LR = 5e-324


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
    optimizer  what the server runs for every parameter (gddr.Optimizer or
            its text, e.g. "adam lr=0.001"); None: the server's [optimizer]
            section. The first worker to register a parameter decides; a
            worker naming another optimizer gets gddr.ConfigError.

    ps.lr (settable: client.set_lr) is the lr every later push carries, 0
    for the tensors' own; ps.optimizer_text what the server runs.

    The server runs the optimizer, so nothing else may write the
    parameters: step() and pull() raise RuntimeError when a parameter's
    torch _version moved since the ParameterServer last wrote it (a torch
    optimizer's step(), or any in-place change). Gradients, zero_grad(),
    train()/eval() and forward passes leave _version alone.
    """

    def __init__(self, model, client, prefix="", optimizer=None):
        self.model = model
        self.client = client
        text = optimizer_text(optimizer)  # None or "": the server's section
        self.optimizer = None if text is None else Optimizer.parse(text)
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
                    client.register(name, h, optimizer=self.optimizer)
                for (name, p), h in zip(self.named, self._host_p):
                    client.pull(name, h)
                    p.copy_(torch.from_numpy(h).view_as(p))
            else:
                self._params = [_flat_numpy(p.data, name) for name, p in self.named]
                for (name, _), a in zip(self.named, self._params):
                    client.register(name, a, optimizer=self.optimizer)
                # The first registration wins: every worker starts from the
                # server's values, whatever its own initialisation was.
                for (name, _), a in zip(self.named, self._params):
                    client.pull(name, a)
        if len(client.tensors) != len(self.named):
            raise InvalidArgument("the client has %d tensors registered, the model %d parameters: "
                                  "give ParameterServer a client of its own"
                                  % (len(client.tensors), len(self.named)))
        self._mark()

    # ---- the server's optimizer and lr -------------------------------------

    @property
    def optimizer_text(self):
        """What the server runs for the model's first parameter, as text
        ("sgd lr=0.05 momentum=0.9 weight_decay=0"); optimizers() has every
        parameter's."""
        return self.client.tensor_optimizer(self.named[0][0])

    def optimizers(self):
        """{name: the server's optimizer text} for every parameter."""
        return {name: self.client.tensor_optimizer(name) for name, _ in self.named}

    @property
    def lr(self):
        """The lr the pushes carry (client.lr; 0.0: the tensors' own)."""
        return self.client.lr

    @lr.setter
    def lr(self, value):
        self.client.set_lr(value)

    # ---- nobody else writes the parameters ---------------------------------

    def _mark(self):
        """Records every parameter's torch version counter: the
        ParameterServer's own writes go through pointers (no bump) or
        copy_ (a bump, recorded here after it)."""
        self._versions = [p._version for _, p in self.named]

    def _check_untouched(self, where):
        moved = [(name, v0, p._version) for (name, p), v0 in zip(self.named, self._versions)
                 if p._version != v0]
        if not moved:
            return
        name, v0, v1 = moved[0]
        raise RuntimeError(
            "gddr.torch.ParameterServer.%s: parameter %r (and %d more) was changed in place since "
            "the ParameterServer last wrote it (torch _version %d -> %d). The server runs the "
            "optimizer: a torch optimizer (torch.optim.SGD, Adam, ...) stepping the same "
            "parameters would apply a second, local update that the server's values then "
            "overwrite. Remove the torch optimizer; choose the server's with "
            "ParameterServer(..., optimizer=\"adam lr=0.001\") (or gddr.Optimizer), and use "
            "gddr.torch.ServerOptimizer(ps) where an optimizer object is needed (zero_grad, "
            "lr schedulers). To drop a deliberate local change, call ps.pull(discard_local=True)."
            % (where, name, len(moved) - 1, v0, v1))

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
        DC-ASGD, GDDR residual, push, pull, in the server's mode).
        RuntimeError, before anything is sent, if a parameter was changed
        in place since the last step or pull (a torch optimizer)."""
        self._check_untouched("step")
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
        self._mark()

    def pull(self, discard_local=False):
        """Writes the server's current parameters into the model (e.g. at
        the end, or in an observer that evaluates the server's model).
        Like step(), refuses parameters changed in place since the last
        step or pull, unless discard_local: then the server's values simply
        replace them."""
        if not discard_local:
            self._check_untouched("pull")
        self._pull()
        self._mark()

    def _pull(self):
        with torch.no_grad():
            if self.cuda:
                for (name, p), h in zip(self.named, self._host_p):
                    self.client.pull(name, h)
                    p.copy_(torch.from_numpy(h).view_as(p))
            else:
                for (name, _), a in zip(self.named, self._params):
                    self.client.pull(name, a)


class ServerOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer for code that wants one (lr schedulers,
    training loops) that runs nothing itself: step() sets the server's lr
    from param_groups[0]["lr"] (client.set_lr) and calls ps.step(), which
    pushes the gradients and writes the server's parameters back.

    ps        the ParameterServer
    lr        the starting lr; None: ps.lr if set, else the lr the server
              runs for the model's first parameter (ps.optimizer_text)
    schedule  optional callable: schedule(k) -> lr for the k-th step()
              (k = 0, 1, ...), written to param_groups[0]["lr"] first;
              or drive param_groups[0]["lr"] with any
              torch.optim.lr_scheduler (StepLR, CosineAnnealingLR,
              LambdaLR, ...), as for a torch optimizer.

    lr 0 on the wire means "the tensor's own lr", so an lr of exactly 0
    (a schedule's end) is sent as MIN_LR = 5e-324, the smallest positive
    double: the server's float32 step is then 0 (plain sgd and adam do not
    move; sgd's momentum still coasts, v = mu*v, w -= v). zero_grad() is
    torch's. One param group, holding the model's parameters.
    """

    def __init__(self, ps, lr=None, schedule=None):
        if not isinstance(ps, ParameterServer):
            raise InvalidArgument("ServerOptimizer takes a gddr.torch.ParameterServer, not %s"
                                  % type(ps).__name__)
        if schedule is not None and not callable(schedule):
            raise InvalidArgument("schedule must be a callable step -> lr, not %r" % (schedule,))
        if lr is None:
            lr = ps.lr or Optimizer.parse(ps.optimizer_text).lr or 0.0
        self.ps = ps
        self.schedule = schedule
        self.steps = 0
        super().__init__([p for _, p in ps.named], {"lr": _check_lr(lr)})

    def add_param_group(self, param_group):
        if getattr(self, "param_groups", None):
            raise InvalidArgument("ServerOptimizer has one param group (the server has one lr "
                                  "per push)")
        super().add_param_group(param_group)

    def wire_lr(self):
        """The lr step() sends: param_groups[0]["lr"], or MIN_LR for 0."""
        lr = _check_lr(self.param_groups[0]["lr"])
        return lr if lr > 0 else MIN_LR

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.schedule is not None:
            self.param_groups[0]["lr"] = _check_lr(self.schedule(self.steps))
        self.ps.lr = self.wire_lr()
        self.ps.step()
        self.steps += 1
        return loss


def _check_lr(lr):
    if isinstance(lr, torch.Tensor):
        lr = lr.item()
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating, np.integer)):
        raise InvalidArgument("lr must be a number, not %r" % (lr,))
    lr = float(lr)
    if not math.isfinite(lr) or not 0 <= lr <= LR_MAX:
        raise InvalidArgument("lr %r is not in [0, 1e6]" % lr)
    return lr


# ---- sparse embedding tables ----------------------------------------------------


class _Lookup(torch.autograd.Function):
    """rows[inverse] forward; backward sums the gradient of every use of
    a row (index_add over the inverse index: repeats add up) and hands
    the (unique keys, summed gradients) to the Embedding, which pushes
    them or keeps them for step(). No gradient flows to `rows` itself
    (a leaf made for this call only)."""

    @staticmethod
    def forward(ctx, rows, inverse, emb, keys):
        ctx.save_for_backward(inverse)
        ctx.emb, ctx.keys, ctx.n = emb, keys, rows.shape[0]
        return rows.index_select(0, inverse)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        g = torch.zeros((ctx.n, grad.shape[-1]), dtype=torch.float32, device=grad.device)
        g.index_add_(0, inverse, grad.to(torch.float32))
        ctx.emb._gradient(ctx.keys, g)
        return None, None, None, None


class Embedding(torch.nn.Module):
    """A torch.nn.Embedding whose rows live in a gddr table on the server
    (gddr.Client.register_table): any number of ids, 64-bit keys, rows
    created at first touch and stepped by the server's optimizer.

        emb = gddr.torch.Embedding(client, "words", 64, init="uniform",
                                   init_scale=0.01, optimizer="adagrad lr=0.1")
        v = emb(ids)               # ids: int64 tensor, any shape -> (*ids.shape, 64)
        loss(v).backward()         # pushes the summed gradient of every row used
        emb.step()                 # in sync mode: an empty push if nothing was pushed

    forward(ids) takes torch.unique of the ids, pulls those rows (one
    pull; a training pull in train(), an inference pull that creates
    nothing in eval()), and returns them gathered by unique's inverse
    index, float32, requiring a gradient when autograd is on. Ids are
    int64 (or any integer dtype); a negative id is the uint64 key with the
    same bits (-1 is 2**64 - 1), so hashed ids may use all 64 bits.

    push="backward" (the default): the backward pass pushes the table's
    gradient at once: one push a backward, holding every row the forward
    used, a row's uses summed (the sum torch's nn.Embedding computes).
    push="step": backward only collects; step() pushes what the backward
    passes since the last step() collected, as one push (a row in two
    batches summed). In sync mode every worker must push every table once
    a step: call step() every step in both modes, which then makes an
    empty push when there is nothing to push (push="backward" with no
    backward since the last step(), or nothing collected); outside sync
    mode step() pushes nothing then. In sync mode with push="backward",
    run one backward per step (a second push of a step is refused).

    The server runs the optimizer: there is no parameter here for a torch
    optimizer to step (module.parameters() is empty). Rows are returned on
    the ids' device (pulled through host memory). Other keywords go to
    register_table (init, init_scale, init_seed, admit, admit_count,
    admit_prob, optimizer, max_rows, row_ttl).
    """

    def __init__(self, client, key, dim, push="backward", **table_kw):
        super().__init__()
        if push not in ("backward", "step"):
            raise InvalidArgument("push must be 'backward' or 'step', not %r" % (push,))
        self.client = client
        self.table = client.register_table(key, dim, **table_kw)
        self.key, self.dim, self.push_mode = key, dim, push
        self._pending = []       # (keys, grads) collected for step() (push="step")
        self._pushed = False     # a push since the last step()
        self.version = 0         # the table's version after the last pull or push

    def forward(self, ids):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InvalidArgument("Embedding ids must be integers, not %s" % ids.dtype)
        flat = ids.reshape(-1).to(device="cpu", dtype=torch.int64)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        keys = uniq.numpy().view(np.uint64)
        rows = self.table.pull(keys, create=self.training)
        self.version = self.table.version
        rows_t = torch.from_numpy(rows)
        if ids.device.type != "cpu":
            rows_t, inverse = rows_t.to(ids.device), inverse.to(ids.device)
        if torch.is_grad_enabled():
            rows_t.requires_grad_(True)
            out = _Lookup.apply(rows_t, inverse, self, keys)
        else:
            out = rows_t.index_select(0, inverse)
        return out.view(*ids.shape, self.dim)

    def _gradient(self, keys, g):
        g = g.detach().cpu().contiguous().numpy()
        if self.push_mode == "backward":
            self.version = self.table.push(keys, g)
            self._pushed = True
        else:
            self._pending.append((keys, g))

    def step(self):
        """push="step": pushes the gradients the backward passes collected
        since the last step() (one push; the library sums a key's
        repeats). Both modes, sync server: an empty push if this step
        pushed nothing, as the sync step needs one push of every worker.
        Returns the table's version."""
        if self._pending:
            keys = np.concatenate([k for k, _ in self._pending])
            grads = np.concatenate([g for _, g in self._pending])
            self._pending = []
            self.version = self.table.push(keys, grads)
        elif not self._pushed and self.client.mode == "sync":
            self.version = self.table.push(np.zeros(0, np.uint64), np.zeros((0, self.dim), np.float32))
        self._pushed = False
        return self.version

    def extra_repr(self):
        return "%r, %d, push=%r" % (self.key, self.dim, self.push_mode)
