"""Up-front size limits: refuse work that cannot fit in memory before allocating any of it.

A request that is too large (a model override of 10**7 channels, `express --size 100000`)
would otherwise fail deep inside PyTorch with an allocator error, or be killed by the
operating system, possibly after minutes of work. The commands estimate what they need
first and raise one AttnconvError naming the input, the amount and the limit.

    check_memory(need_bytes, "", "give a smaller {size}", name="size", value=100000, mentions=("size",))
    with AllocationLimit(parameter_limit(), "model 'sa-quadratic' ...", "fix its model_overrides"):
        model = build_model("sa-quadratic", hidden=10**7)   # refused at the first oversized tensor

Estimates are rough (within a small factor); the limits only refuse what clearly cannot fit.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from attnconv.errors import AttnconvError, ParameterError

__all__ = ["COMPUTED", "MAX_PARAMETERS", "MAX_SIDE", "AllocationLimit", "as_real", "autocast_on", "check_memory",
           "dense_problem", "format_bytes", "is_whole", "parameter_limit", "physical_memory", "plain_number",
           "positive_ints", "probabilities_argument", "real_number", "shown_value", "tensor_argument",
           "weights_with_values", "whole_number"]

# The largest network attnconv builds. The paper's largest model has 30M parameters; 2e9 float32
# parameters are 8 GB of weights before gradients and optimizer state.
MAX_PARAMETERS = 2_000_000_000
# The largest image side, grid side or count an argument may give: past it, no tensor of it could be allocated.
MAX_SIDE = 1 << 20
# Used when the machine's memory cannot be read (os.sysconf missing).
_FALLBACK_MEMORY = 16 * 2**30


def physical_memory() -> int:
    """Bytes of physical memory of this machine (16 GiB if the operating system does not say)."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return _FALLBACK_MEMORY
    return pages * size if pages > 0 and size > 0 else _FALLBACK_MEMORY


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is running out of memory: MemoryError, torch's OutOfMemoryError (CUDA), or the CPU
    allocator's failure (a RuntimeError saying it can't allocate memory)."""
    return (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err)))


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 3.2e12 -> '2.9 TiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_memory(need: float, what: str, fix: str, *, name: str | None = None, value: object = None,
                 mentions: tuple[str, ...] = ()) -> None:
    """Raise AttnconvError if `need` bytes are more than this machine's physical memory.

    `what` names the input ("size 5000"), `fix` says what to change ("give a smaller size"). Given
    the parameter `name` and its `value`, the error is a ParameterError: `what` follows the value
    ("with {channels} 8"), and `what` and `fix` may name the parameters in `mentions` as {name}.
    """
    have = physical_memory()
    if need > have:
        rest = f"{what}: needs about {format_bytes(need)} of memory, more than this machine's {format_bytes(have)}; {fix}"
        if name is not None:
            raise ParameterError(name, value, rest, mentions=mentions)
        raise AttnconvError(rest)


class AllocationLimit(TorchFunctionMode):
    """Refuses tensor allocations, before they happen, once their sizes add up to more than `limit` bytes.

        with AllocationLimit(8 * 2**30, "model 'sa-quadratic' with hidden 10000000", "fix the overrides"):
            model = build_model(...)      # one AttnconvError instead of an allocator failure

    Counts the tensor factories (torch.empty, zeros, ones, full, rand, randn, randint, eye,
    empty_strided: what nn.Linear, nn.Conv2d, nn.Embedding, norms and positional tables
    call) that do not go to the meta device (asked for, or the default device: `with torch.device("meta")`). No
    build runs twice and nothing is estimated: the request that would pass the limit is refused, having allocated
    at most `limit`.
    """

    def __init__(self, limit: int, what: str, fix: str):
        super().__init__()
        self.limit, self.what, self.fix, self.total = limit, what, fix, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and torch.device(kwargs.get("device") or torch.get_default_device()).type != "meta":
            shape = _factory_shape(func, args, kwargs)
            if shape is not None:
                dtype = kwargs.get("dtype") or torch.get_default_dtype()
                self.total += math.prod(shape) * dtype.itemsize
                if self.total > self.limit:
                    raise AttnconvError(
                        f"{self.what}: its tensors would take more than {format_bytes(self.limit)} (the limit: "
                        f"{MAX_PARAMETERS:.0e} float32 parameters, and at most this machine's memory; it asks for a "
                        f"{'x'.join(map(str, shape))} tensor); {self.fix}")
        return func(*args, **kwargs)


def parameter_limit() -> int:
    """Bytes of MAX_PARAMETERS float32 numbers, or of the machine's memory if that is smaller."""
    return min(4 * MAX_PARAMETERS, physical_memory())


_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
                        torch.eye, torch.empty_strided})


def _factory_shape(func, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The shape a factory call asks for (None if it cannot be read: left to the call)."""
    if func is torch.eye:
        n = kwargs.get("n", args[0] if args else None)
        m = kwargs.get("m", args[1] if len(args) > 1 and isinstance(args[1], int) else n)
        shape = (n, m)
    elif "size" in kwargs:
        shape = kwargs["size"]
    elif func is torch.randint:  # randint(high, size) or randint(low, high, size)
        shape = next((a for a in args if isinstance(a, (tuple, list, torch.Size))), None)
    elif func in (torch.full, torch.empty_strided) or (len(args) == 1 and isinstance(args[0], (tuple, list))):
        shape = args[0] if args else None
    else:
        shape = args
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(isinstance(n, int) for n in shape):
        return None
    return tuple(shape)


def shown_value(value: Any) -> str:
    """An argument's value as one short line says it: a tensor or array by its shape (one of no dimension by its value,
    `tensor(3.5000)`), a long or many-line repr by its type."""
    shape = getattr(value, "shape", None)
    scalar = type(value).__module__ == "numpy" and type(value).__name__ != "ndarray"  # np.True_, np.float32(3)
    if shape is not None and not isinstance(value, numbers.Number) and not scalar and tuple(shape) != ():
        kind = "tensor" if isinstance(value, torch.Tensor) else {"ndarray": "array"}.get(type(value).__name__,
                                                                                       type(value).__name__)
        return f"{_article(kind)} {kind} of shape {tuple(shape)}"
    try:
        shown = repr(value)
    except Exception:  # noqa: BLE001 - an int past Python's digits for str (10**5000), a repr that fails
        shown = "\n"
    return shown if len(shown) <= 80 and "\n" not in shown else f"{_article(type(value).__name__)} {type(value).__name__}"


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def is_whole(value: Any, least: float = -math.inf, most: float = math.inf) -> bool:
    """Whether `value` is a whole number (an int, numpy's, a 0-d integer tensor: what `operator.index` takes; no bool)
    from `least` to `most`."""
    if isinstance(value, torch.SymInt):  # a size torch.compile made symbolic: a tensor's own, whole and >= 0
        return True
    if type(value) is int:  # the common case, without the getattr below (which torch.compile cannot trace on an int)
        return least <= value <= most
    if isinstance(value, bool) or getattr(value, "dtype", None) in (torch.bool, bool):
        return False
    try:
        return least <= operator.index(value) <= most
    except Exception:  # noqa: BLE001 - not a whole number (a meta tensor, which has no value, raises RuntimeError)
        return False


def whole_number(value: Any, name: str, what: str, *, least: int = 1, most: float = MAX_SIDE) -> int:
    """`value` as a Python int (numpy's integers taken too); one ParameterError naming `name` and `what` it is if it
    is not a whole number from `least` to `most` (no bool, float, string or tensor)."""
    if not is_whole(value, least, most):
        upto = f"from {least} to {most}" if most != math.inf else f">= {least}"
        raise ParameterError(name, value, f"is invalid: give {what}, a whole number {upto}", shown=shown_value(value))
    return operator.index(value)


def positive_ints(values: Any, count: int | None, name: str, what: str, most: int = MAX_SIDE, least: int = 1
                  ) -> tuple[int, ...]:
    """`values` as `count` (None: one or more) Python ints (numpy's integers taken too); one AttnconvError naming
    `name` and `what` they are if they are not so many whole numbers from `least` (default: positive) to `most`."""
    try:
        ok = not isinstance(values, (str, bytes)) and (len(values) == count if count is not None else len(values) >= 1) \
            and all([is_whole(v, least, most) for v in values])  # a list, not a generator: torch.compile traces it
    except Exception:  # noqa: BLE001 - no length, or not iterable (a 0-d or meta tensor raises its own kinds)
        ok = False
    if not ok:
        kind = "positive integers" if least == 1 else f"whole numbers >= {least}"
        many = f"{count} {kind}" if count is not None else f"one or more {kind}"
        bound = f" of at most {most}" if most != math.inf else ""
        raise AttnconvError(f"{name} {shown_value(values)} is invalid: give {what}, {many}{bound}")
    return tuple([v if isinstance(v, torch.SymInt) else operator.index(v) for v in values])


# The dtypes attnconv computes in (float8 and other narrow floats have no arithmetic to promote with).
COMPUTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dense_problem(value: torch.Tensor) -> str | None:
    """What keeps the tensor `value` from being read as a dense array of one shape (a sparse layout, a nested
    tensor), as a sentence's object; None for an ordinary (strided) tensor."""
    if value.is_nested:
        return "a nested tensor (a list of tensors of their own shapes)"
    if value.layout != torch.strided:
        return f"a {str(value.layout).replace('torch.', '').replace('_', ' ')} tensor"
    return None


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for `device_type` (never for one autocast does not know, as the meta device)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # "unknown device type for autocast"
        return False


def weights_with_values(weights: torch.Tensor, owner: str = "the layer", then: str = "",
                        device: torch.device | str = "cpu") -> None:
    """One AttnconvError if `weights` (the `owner`'s) are on the meta device, which holds no values: what computes
    with them (an analysis, a forward on an input with values) would fail inside torch or answer from nothing."""
    if weights.device.type == "meta":
        raise AttnconvError(f"{owner}'s weights are on the meta device, which holds no values: load them first "
                            f"({owner.split()[-1]}.to_empty(device='{device}'), then load_state_dict){then}")


def one_image_hint(x: torch.Tensor, channels: int, name: str = "x") -> str:
    """` (one image: give x[None])` where a model that takes batches only was given one unbatched image (x[None][None]
    for one image of one channel without its channel axis), else ''; `name`: the argument's."""
    axes = 1 if x.ndim == 3 and x.shape[0] == channels else 2 if x.ndim == 2 and channels == 1 else 0
    return f" (one image: give {name}{'[None]' * axes})" if axes else ""


def flag_argument(value: Any, name: str) -> bool:
    """`value`, the on/off argument `name` of a public function, as a bool: True or False, or the ints 1 and 0 (numpy's
    too). Anything else is one AttnconvError naming it: Python takes the string "no" for true (`overwrite="no"` would
    replace a run) and a tensor of two values has no truth at all."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise AttnconvError(f"{name} {shown_value(value)} is invalid: give True or False")


def path_argument(value: Any, name: str, what: str) -> Path:
    """`value`, the path argument `name` of a public function (`what` it names, for the fix), as a Path (`~`
    expanded; `Path.expanduser` raises RuntimeError for a user that does not exist, os.path's leaves it): one
    AttnconvError naming it unless it is a str or an os.PathLike (pathlib would say "expected str, bytes or
    os.PathLike object, not int" from its own code, naming neither)."""
    try:
        text = os.fspath(value) if isinstance(value, os.PathLike) else value  # an __fspath__ may give bytes, or fail
    except Exception:  # noqa: BLE001 - a user's __fspath__: its failure is the argument's
        text = None
    if not isinstance(text, str):
        raise AttnconvError(f"{name} {shown_value(value)} is invalid: give {what}, a str or a path")
    if "\0" in text:  # every OS call would say "embedded null byte", naming neither
        raise AttnconvError(f"{name} {text!r} is invalid: a path holds no NUL character; give {what}")
    return Path(os.path.expanduser(text))  # `~` and `~user` as the shell reads them; an unknown user's left as written


def tensor_argument(value: Any, name: str, what: str, *, like: torch.Tensor | None = None, owner: str = "the layer",
                    values: bool = False, floating: bool = True, same_dtype: bool = True, finite: bool = False
                    ) -> torch.Tensor:
    """`value`, checked as the tensor argument `name` of a public method (`what` it is, for the fix): one AttnconvError
    naming it unless it is a torch.Tensor; of a floating dtype (`floating`: no bool, integer or complex tensor, which
    the layers do not compute with); on the device of `like` (the `owner`'s tensor, its weights: a meta input to a
    CPU layer was computed as if it held values) and, outside autocast, in its floating dtype (`same_dtype`); and,
    with `values` (a number is computed from it) or without `like`, not on the meta device, which holds no values. A
    meta input to a layer on the meta device is taken (shapes inferred without values); with `finite`, every value
    finite (what an average or a measure of them needs). Shapes are the caller's to check."""
    if not isinstance(value, torch.Tensor):
        raise AttnconvError(f"{name} {shown_value(value)} is invalid: give {what}, a torch.Tensor")
    def call(method: str) -> str:  # ` (x.float())`; none for a name in words ("the kernel's probs")
        return f" ({name}.{method})" if " " not in name else ""

    problem = dense_problem(value)
    if problem:
        raise AttnconvError(f"{name} is {problem}: give {what} as a dense tensor of one shape"
                            + (f" (torch.nested.to_padded_tensor({name}, 0.0))" * (" " not in name) if value.is_nested
                               else call("to_dense()")))
    dtype = str(value.dtype).replace("torch.", "")
    if floating and value.dtype not in COMPUTED:
        raise AttnconvError(f"{name} is a tensor of {dtype}, which is not computed with: give {name} in a floating-"
                            f"point dtype, float16, bfloat16, float32 or float64{call('float()')}")
    meta = value.device.type == "meta"
    if meta and (values or like is None or like.device.type != "meta"):
        raise AttnconvError(f"{name} is on the meta device, which holds no values; give {name} with values ({what})")
    if like is not None and not meta:
        weights_with_values(like, owner, f" to compute with {name} on {value.device}", value.device)
    if like is not None and value.device != like.device:
        raise AttnconvError(f"{name} is on {value.device}, {owner}'s weights on {like.device}: give {name} on "
                            f"{like.device}{call(f'to({str(like.device)!r})')}, or move {owner} to {value.device}")
    half = value.dtype in (torch.float16, torch.bfloat16, torch.float32)  # what autocast computes with
    if same_dtype and floating and like is not None and like.is_floating_point() and value.dtype != like.dtype and \
            not (half and autocast_on(value.device.type)):
        held = str(like.dtype).replace("torch.", "")
        raise AttnconvError(f"{name} is {dtype}, {owner}'s weights {held}: give {name} in {held}"
                            f"{call(f'to(torch.{held})')}, or convert {owner} to {dtype} ({owner.split()[-1]}.to(torch."
                            f"{dtype}))" + (", or run it under torch.autocast" if half else ""))
    bad = int((~value.detach().isfinite()).sum()) if finite and (values or not meta) and value.numel() else 0
    if bad:
        raise AttnconvError(f"{name} has {bad} NaN or infinite value{'s' * (bad > 1)}: give {what} "
                            "with finite values")
    return value


def probabilities_argument(value: Any, name: str, what: str, *, like: torch.Tensor | None = None,
                           owner: str = "the layer") -> torch.Tensor:
    """`tensor_argument` for attention probabilities a caller gives (`what` they are): with values (not on the meta
    device), finite, none negative, and no row (the last axis) summing past 1 (a zero padding's keys drop out, so a
    row may sum to less); one AttnconvError naming `name` otherwise, where a measure of them would be NaN or a
    kernel of no attention layer."""
    tensor_argument(value, name, what, like=like, owner=owner, values=True, same_dtype=False, finite=True)
    if value.numel() == 0:
        return value
    given, value = value, value.detach()  # computed with gradients: its values checked, the graph left alone
    low = float(value.amin())
    if low < 0:
        raise AttnconvError(f"{name} has negative values (down to {low:.3g}): give {what}, each at least 0 (a "
                            "softmax's, or a mean of them)")
    most = float(value.double().sum(-1).amax()) if value.dim() else float(value)
    if most > 1 + max(1e-3, 8 * torch.finfo(value.dtype).eps):
        raise AttnconvError(f"{name} has a row summing to {most:.6g}: give {what} with each query's row (the last "
                            "axis) summing to at most 1 (a softmax's, or a mean of them)")
    return given


def real_number(value: Any, name: str, what: str, *, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> float:
    """`value` as a Python float (ints, numpy's numbers and 0-d real tensors and arrays taken); one
    ParameterError naming `name` and `what` it is if it is not a finite real number in the range from `low` to
    `high` (`low_open`/`high_open`: that end excluded). No bool, string, complex number or None."""
    number = as_real(value)
    if number is None or not math.isfinite(number) or number < low or number > high \
            or (low_open and number == low) or (high_open and number == high):
        if low == -math.inf and high == math.inf:
            where = ""
        elif high == math.inf:
            where = f" {'>' if low_open else '>='} {low:g}"
        elif low == -math.inf:
            where = f" {'<' if high_open else '<='} {high:g}"
        else:
            where = f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ParameterError(name, value, f"is invalid: give {what}, a finite number{where}", shown=shown_value(value))
    return number


def as_real(value: Any) -> float | None:
    """`value` as a float if it is one real number (a 0-d tensor or array too; no bool, string or complex; one past
    the float range, 10**400, as an infinity of its sign, which no finite range holds), else None."""
    if isinstance(value, (bool, str, bytes)) or getattr(value, "dtype", None) in (torch.bool, bool):
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_complex() or value.device.type == "meta":
            return None
        value = value.item()
    elif type(value).__name__ == "ndarray":
        if value.ndim != 0 or value.dtype.kind not in "iuf":
            return None
        value = value.item()
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return None


def plain_number(value: Any) -> Any:
    """A numpy scalar, or an array or tensor of one element, as the Python number (or bool) it holds, as JSON can
    write it (the model options take them as one number); lists, tuples and dicts of them likewise, item by item; any
    other value as it is."""
    return _plain(value, set())


def _plain(value: Any, inside: set[int]) -> Any:
    """`plain_number` of `value` within the containers `inside` (by id: a list holding itself is left as it is, for
    JSON to refuse); a tuple of any kind (a namedtuple) as a plain tuple, as JSON writes it (a list)."""
    if isinstance(value, (dict, list, tuple)):
        if id(value) in inside:
            return value
        inside = inside | {id(value)}
        if isinstance(value, dict):
            return {key: _plain(item, inside) for key, item in value.items()}
        return (list if isinstance(value, list) else tuple)(_plain(item, inside) for item in value)
    if type(value).__module__ == "numpy" and (type(value).__name__ != "ndarray" or value.size == 1) or \
            (isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type != "meta"):
        return value.item()
    return value
