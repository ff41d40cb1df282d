"""optim.py -- gddr.Optimizer: the optimizer the server runs for a tensor,
and the text form gddr_register_opt() takes.

    gddr.Optimizer("adam", lr=1e-3)            # -> "adam lr=0.001"
    gddr.Optimizer("sgd", lr=0.05, momentum=0.9)
    gddr.Optimizer.parse("adamw lr=0.001 betas=0.9,0.98 weight_decay=0.01")

The server (server/optim.c) runs the update: sgd with heavy-ball momentum
(v = mu*v + lr*g, w -= v), adam and adamw (bias-corrected with the tensor's
version as the step counter), adagrad. A hyperparameter left out takes
torch.optim's default on the server (adam: beta1 0.9, beta2 0.999, eps
1e-8; adagrad: eps 1e-10); lr left out (or 0) is the server's [optimizer]
lr. The first registration of a tensor decides its optimizer; a later one
naming another raises gddr.ConfigError.

Everything is checked here, before anything is sent, with the server's
own bounds: a bad kind, key or value is a ValueError (gddr.InvalidArgument).
"""

import math
import numbers

from .errors import InvalidArgument

KINDS = ("sgd", "adam", "adamw", "adagrad")

# The keys each kind takes (the ones server/optim.c uses for it), in the
# order the text lists them.
KEYS = {
    "sgd": ("lr", "momentum", "weight_decay"),
    "adam": ("lr", "beta1", "beta2", "eps", "weight_decay"),
    "adamw": ("lr", "beta1", "beta2", "eps", "weight_decay"),
    "adagrad": ("lr", "eps", "weight_decay"),
}
ALL_KEYS = ("lr", "momentum", "beta1", "beta2", "eps", "weight_decay")
LR_MAX = 1e6  # gddr_set_lr's and the server's bound


def _number(kind, key, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidArgument("optimizer %s: %s must be a number, not %r" % (kind, key, v))
    v = float(v)
    if not math.isfinite(v):
        raise InvalidArgument("optimizer %s: %s=%r is not finite" % (kind, key, v))
    if key == "lr" and not 0 <= v <= LR_MAX:
        raise InvalidArgument("optimizer %s: lr=%r is not in [0, 1e6] (0: the server's lr)"
                              % (kind, v))
    if key in ("momentum", "beta1", "beta2") and not 0 <= v < 1:
        raise InvalidArgument("optimizer %s: %s=%r is not in [0, 1)" % (kind, key, v))
    if key == "eps" and not v > 0:
        raise InvalidArgument("optimizer %s: eps=%r must be above 0" % (kind, v))
    if key == "weight_decay" and not v >= 0:
        raise InvalidArgument("optimizer %s: weight_decay=%r must be at least 0" % (kind, v))
    return v


class Optimizer:
    """The optimizer the server runs for the tensors registered with it.

    kind    "sgd", "adam", "adamw" or "adagrad"
    lr      step size; None or 0: the server's [optimizer] lr
    momentum (sgd), beta1, beta2 or betas=(b1, b2) (adam, adamw), eps
    (adam, adamw, adagrad), weight_decay (all): None leaves the server's
    default (torch.optim's).

    str(opt) is the text gddr_register_opt() takes; Optimizer.parse(text)
    reads one back (also the text Client.tensor_optimizer() returns).
    A key the kind does not use is refused, e.g. momentum for adam.
    """

    __slots__ = ("kind", "params")

    def __init__(self, kind="sgd", lr=None, momentum=None, beta1=None, beta2=None, eps=None,
                 weight_decay=None, betas=None):
        if not isinstance(kind, str) or kind.lower() not in KINDS:
            raise InvalidArgument("optimizer kind must be one of %s, not %r"
                                  % (", ".join(KINDS), kind))
        kind = kind.lower()
        if betas is not None:
            if beta1 is not None or beta2 is not None:
                raise InvalidArgument("optimizer %s: give betas or beta1/beta2, not both" % kind)
            try:
                beta1, beta2 = betas
            except (TypeError, ValueError):
                raise InvalidArgument("optimizer %s: betas must be two numbers (beta1, beta2), "
                                      "not %r" % (kind, betas)) from None
        given = dict(lr=lr, momentum=momentum, beta1=beta1, beta2=beta2, eps=eps,
                     weight_decay=weight_decay)
        self.kind = kind
        self.params = {}
        for key in KEYS[kind]:
            if given[key] is not None:
                self.params[key] = _number(kind, key, given[key])
        wrong = [k for k in ALL_KEYS if given[k] is not None and k not in KEYS[kind]]
        if wrong:
            raise InvalidArgument("optimizer %s takes %s; not %s%s"
                                  % (kind, ", ".join(KEYS[kind]), ", ".join(wrong),
                                     " (adam and adamw have beta1 instead of momentum)"
                                     if "momentum" in wrong else ""))

    @classmethod
    def parse(cls, text):
        """An Optimizer from its text, "KIND [key=value ...]" (keys lr,
        momentum, beta1, beta2, betas=B1,B2, eps, weight_decay)."""
        if isinstance(text, Optimizer):
            return text
        if not isinstance(text, str):
            raise InvalidArgument("an optimizer is a gddr.Optimizer or its text, not %r" % (text,))
        if "\0" in text:
            raise InvalidArgument("optimizer text %r holds a NUL byte" % text)
        words = text.split()
        if not words:
            raise InvalidArgument("optimizer text is empty (None means the server's default)")
        kw = {}
        for w in words[1:]:
            key, eq, val = w.partition("=")
            if not eq or not key or not val:
                raise InvalidArgument("optimizer text %r: %r is not key=value" % (text, w))
            if key not in ALL_KEYS + ("betas",):
                raise InvalidArgument("optimizer text %r: unknown key %r (%s, betas)"
                                      % (text, key, ", ".join(ALL_KEYS)))
            if key in kw:
                raise InvalidArgument("optimizer text %r: %s given twice" % (text, key))
            try:
                kw[key] = (tuple(float(x) for x in val.split(",")) if key == "betas"
                           else float(val))
            except ValueError:
                raise InvalidArgument("optimizer text %r: %s=%s is not a number%s"
                                      % (text, key, val, "s pair B1,B2" if key == "betas" else "")
                                      ) from None
        return cls(words[0], **kw)

    def __getitem__(self, key):
        return self.params[key]

    def get(self, key, default=None):
        return self.params.get(key, default)

    @property
    def lr(self):
        """The lr given (None: the server's)."""
        return self.params.get("lr")

    def text(self):
        """The text form, e.g. "adam lr=0.001 beta1=0.9" (values as repr()
        writes them: the server reads back the same doubles)."""
        return " ".join([self.kind] + ["%s=%r" % (k, self.params[k])
                                       for k in KEYS[self.kind] if k in self.params])

    __str__ = text

    def __repr__(self):
        return "gddr.Optimizer(%r)" % self.text()

    def __eq__(self, other):
        if isinstance(other, str):
            other = Optimizer.parse(other)
        if not isinstance(other, Optimizer):
            return NotImplemented
        return self.kind == other.kind and self.params == other.params

    def __hash__(self):
        return hash(self.text())


def optimizer_text(optimizer):
    """The text to send for `optimizer`: None or "" (the server's
    [optimizer] section) give None; an Optimizer or its text is checked and written
    out in the canonical form."""
    if optimizer is None or (isinstance(optimizer, str) and not optimizer.strip()):
        return None  # as gddr_register_opt reads NULL and ""
    return Optimizer.parse(optimizer).text()


def check_name(name):
    """A tensor name as the server takes it, or ValueError
    (gddr.InvalidArgument) before anything is sent: a non-empty str without
    NUL bytes (ctypes would cut the name at the first one, silently
    registering another tensor) of at most 127 bytes. The server also wants
    printable ASCII without spaces, and says so itself. Returns the
    encoded name."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a tensor name must be a non-empty str, not %r" % (name,))
    if "\0" in name:
        raise InvalidArgument("tensor name %r holds a NUL byte at %d: C would see only %r"
                              % (name, name.index("\0"), name[:name.index("\0")]))
    raw = name.encode()
    if len(raw) > 127:
        raise InvalidArgument("tensor name %r is %d bytes; at most 127" % (name[:40] + "...",
                                                                             len(raw)))
    return raw
