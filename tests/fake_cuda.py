"""An emulated CUDA device on a CPU-only torch, to find device bugs without a GPU.

``with fake_cuda():`` makes ``torch.cuda.is_available()`` true and gives every tensor a
device tag while the computation itself stays on the CPU:

* a tensor created with ``device="cuda"`` (or moved there by ``.to``/``.cuda``) is a
  :class:`CudaTensor`: its ``.device`` reads ``cuda:0``, ``.numpy()`` and ``np.asarray``
  raise as on a GPU, and every operation on it gives a :class:`CudaTensor`;
* a tensor created on the CPU under the context (factories without ``device``,
  ``from_numpy``, ``as_tensor`` of numpy data, ``.cpu()``) is a :class:`CpuTensor`;
* an operation that mixes a :class:`CudaTensor` with a :class:`CpuTensor` of one or more
  dimensions raises :class:`DeviceMismatch`, as CUDA does ("Expected all tensors to be on
  the same device"), except where torch allows it (indexing a CUDA tensor with CPU indices;
  ``copy_``, ``to`` and assignment to a basic slice, ``x[:, 0] = y``, across devices).
  0-dim CPU tensors mix freely, as on a GPU.

Tensors made inside autograd (the gradients a backward pass hands on) are untagged and
never flagged; operations on them take their other operands' tag, and ``.grad`` of a CUDA
tensor reads as a CUDA tensor.  torchsort's CUDA kernels are served
by its CPU kernels (inputs must be CUDA tensors).  What this cannot find: numerical
differences of GPU kernels (reduction order, TF32), real memory limits, asynchrony.
``tests/test_cuda.py`` runs on a real GPU; ``tests/test_fake_cuda.py`` checks the emulation
itself, runs every analysis on it, and runs the CUDA tests under it
(``tests/fake_cuda_plugin.py``).
"""
from __future__ import annotations

import contextlib
import sys
import types

import torch
from torch.overrides import TorchFunctionMode, get_default_nowrap_functions

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
T = torch.Tensor
# property getters: a new method-wrapper at every attribute access, so compare with ==
_GET_DEVICE, _GET_IS_CUDA, _GET_IS_CPU, _GET_GRAD = (
    T.device.__get__, T.is_cuda.__get__, T.is_cpu.__get__, T.grad.__get__)


#: operations run on emulated CUDA tensors since import (tests check the CUDA path ran)
CUDA_OPS = [0]
#: host synchronisations since import: CUDA tensors read by the host (``.item()``,
#: ``bool()``, ``.tolist()``, ``.cpu()``...) or operations whose output is sized by the
#: values (``nonzero``, a boolean-mask index, ``unique``...), each a wait for the GPU on
#: a real device
SYNCS = [0]


class DeviceMismatch(RuntimeError):
    """An operation mixed tensors of the emulated CUDA device and the CPU."""


def _plain(x):
    """A plain ``torch.Tensor`` alias of ``x`` (same storage and autograd history)."""
    if isinstance(x, _Tagged):
        with torch._C.DisableTorchFunctionSubclass():
            return x.as_subclass(T)
    return x


def _tag(out, cls):
    """``out`` (tensors, possibly nested in tuples/lists) as ``cls`` (``None``: as is)."""
    if cls is None:
        return out
    if isinstance(out, T):
        if type(out) is cls:
            return out
        with torch._C.DisableTorchFunctionSubclass():
            if out.is_leaf and out.requires_grad:
                # a new leaf sharing the storage (as nn.Parameter is made)
                return T._make_subclass(cls, out.detach(), True)
            return out.as_subclass(cls)
    if isinstance(out, (tuple, list)) and not hasattr(out, "_fields"):
        return type(out)(_tag(o, cls) for o in out)
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # torch.return_types
        return type(out)([_tag(o, cls) for o in out])
    return out


def _tensors(obj, depth=0):
    if isinstance(obj, T):
        yield obj
    elif isinstance(obj, (tuple, list)) and depth < 3:
        for o in obj:
            yield from _tensors(o, depth + 1)
    elif isinstance(obj, dict) and depth < 1:
        for o in obj.values():
            yield from _tensors(o, depth + 1)


def _is_cuda_device(dev):
    if dev is None or isinstance(dev, torch.dtype):
        return None
    if isinstance(dev, int):  # a device index means a CUDA device
        return True
    if isinstance(dev, (str, torch.device)):
        try:
            return torch.device(dev).type == "cuda"
        except (RuntimeError, TypeError):
            return None
    return None


def _describe(func):
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def _mismatch(func, cuda_args, cpu_args):
    shapes = ", ".join(str(tuple(t.shape)) for t in cpu_args)
    return DeviceMismatch(
        f"{_describe(func)}: expected all tensors to be on the same device, but found CUDA "
        f"tensors and CPU tensors of shape {shapes} (emulated CUDA)")


_CROSS_DEVICE_OK = {T.copy_, T.to, T.cpu, T.cuda, T.__setstate__, T.__reduce_ex__,
                    T.__deepcopy__}
_INDEXING = {T.__getitem__, T.__setitem__}
_SYNC = {T.item, T.tolist, T.cpu, T.__bool__, T.__int__, T.__float__, T.__index__}
#: operations whose output's size depends on the values: a GPU must tell the host how
#: much to allocate, so each is a host synchronisation too
_SIZED_BY_VALUES = {T.nonzero, torch.nonzero, torch.argwhere, T.argwhere, T.masked_select,
                    torch.masked_select, torch.unique, T.unique, torch.unique_consecutive,
                    T.unique_consecutive}


def _reads_values(func, args, kwargs):
    """Whether ``func`` on a CUDA tensor waits for the device: a read by the host, an
    output sized by the values, a boolean mask as an index, ``repeat_interleave`` by a
    tensor of repeats without ``output_size``."""
    if func in _SYNC or func in _SIZED_BY_VALUES:
        return True
    if func in _INDEXING or func is T.index_put_ or func is T.index_put:
        index = args[1] if len(args) > 1 else ()
        return any(t.dtype == torch.bool for t in _tensors(index))
    if func in (torch.repeat_interleave, T.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0])
        return isinstance(repeats, T) and kwargs.get("output_size") is None
    return False


class _Tagged(torch.Tensor):
    """A tensor that carries its emulated device in its class."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        with torch._C.DisableTorchFunctionSubclass():  # no recursion while inspecting
            return _dispatch(func, args, kwargs)


class CudaTensor(_Tagged):
    """A tensor of the emulated CUDA device."""


class CpuTensor(_Tagged):
    """A tensor known to live on the CPU (under the emulation)."""


def _run(func, args, kwargs):
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _target(dev):
    flag = _is_cuda_device(dev)
    return None if flag is None else (CudaTensor if flag else CpuTensor)


def _check_mixing(func, args, kwargs):
    if func in _CROSS_DEVICE_OK:
        return
    if func in _INDEXING:
        self, index = args[0], args[1]
        idx = list(_tensors(index))
        if isinstance(self, CpuTensor) and any(isinstance(t, CudaTensor) for t in idx):
            raise _mismatch(func, [t for t in idx if isinstance(t, CudaTensor)], [self])
        if func is T.__setitem__ and len(args) > 2 and idx:
            # advanced indexing (index_put_): the values must be on the tensor's device;
            # basic indexing (ints, slices) copies, across devices too
            value = args[2]
            if isinstance(self, CudaTensor) and isinstance(value, CpuTensor) and value.ndim:
                raise _mismatch(func, [self], [value])
            if isinstance(self, CpuTensor) and isinstance(value, CudaTensor):
                raise _mismatch(func, [value], [self])
        return
    flat = list(_tensors(args)) + list(_tensors(kwargs))
    cuda = [t for t in flat if isinstance(t, CudaTensor)]
    cpu = [t for t in flat if isinstance(t, CpuTensor) and t.ndim]
    if cuda and cpu:
        raise _mismatch(func, cuda, cpu)


def _dispatch(func, args, kwargs):
    self = args[0] if args else None
    on_cuda = isinstance(self, CudaTensor)
    # properties and conversions that reveal the device
    if func == _GET_DEVICE:
        return CUDA if on_cuda else CPU
    if func == _GET_IS_CUDA:
        return on_cuda
    if func == _GET_IS_CPU:
        return not on_cuda
    if func in (T.numpy, T.__array__) and on_cuda:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() "
                        "to copy the tensor to host memory first. (emulated CUDA)")
    if func is T.get_device:
        return 0 if on_cuda else -1
    if on_cuda and _reads_values(func, args, kwargs):
        SYNCS[0] += 1
    if func in (T.cpu, T.cuda, T.to):
        out = _move(func, self, args[1:], kwargs)
        if on_cuda and func is T.to and not isinstance(out, CudaTensor):
            SYNCS[0] += 1
        return out
    if func == _GET_GRAD:
        out = _run(func, args, kwargs)
        return _tag(out, CudaTensor) if on_cuda and out is not None else out

    _check_mixing(func, args, kwargs)
    dev = kwargs.get("device")
    if dev is not None and _is_cuda_device(dev) is not None:
        target = _target(dev)
        kwargs["device"] = "cpu"
    else:
        flat = list(_tensors(args)) + list(_tensors(kwargs))
        if any(isinstance(t, CudaTensor) for t in flat):
            target = CudaTensor
        elif any(isinstance(t, CpuTensor) for t in flat):
            target = CpuTensor
        else:
            target = None
    out = _run(func, args, kwargs)
    if target is CudaTensor:
        CUDA_OPS[0] += 1
    if func in get_default_nowrap_functions():
        return out
    return _tag(out, target)


def _move(func, self, rest, kwargs):
    """``.cpu()``, ``.cuda()``, ``.to(...)``: a copy when the (emulated) device changes, as
    on a GPU, else what torch returns (``self`` when nothing changes)."""
    kwargs = dict(kwargs)
    if func is T.cpu:
        dev, rest = CPU, ()
    elif func is T.cuda:
        dev, rest = CUDA, ()
        kwargs = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
    else:
        dev, keep = kwargs.pop("device", None), []
        for a in rest:
            if isinstance(a, (str, torch.device)) or (isinstance(a, int)
                                                     and not isinstance(a, bool)):
                dev = a
            elif isinstance(a, T):
                dev = CUDA if isinstance(a, CudaTensor) else CPU
                keep.append(a.dtype)
            else:
                keep.append(a)
        rest = tuple(keep)
        if func is T.to and not rest and not kwargs and dev is None:
            return self
    was_cuda = isinstance(self, CudaTensor)
    flag = _is_cuda_device(dev)
    plain = _plain(self)
    with torch._C.DisableTorchFunctionSubclass():
        out = plain.to(*rest, **kwargs) if (rest or kwargs) else plain
        converted = out is not plain
        if flag is None or flag == was_cuda:  # the device does not change
            if not converted:
                return self
            return _tag(out, type(self)) if isinstance(self, _Tagged) else out
        if not converted:
            out = plain.clone()
    return _tag(out, CudaTensor if flag else CpuTensor)


#: functions that make tensors from nothing (their ``device`` says where)
_FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace,
    torch.logspace, torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm,
    torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy, torch.empty_strided,
    torch.tril_indices, torch.triu_indices, torch.scalar_tensor, torch.zeros_like,
    torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like,
    torch.randint_like, torch.normal, torch.sparse_coo_tensor,
}
_LIKE = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
         torch.rand_like, torch.randn_like, torch.randint_like}


class _Mode(TorchFunctionMode):
    """Tags tensors made by factories with the device they ask for, and serves moves of
    untagged tensors (a mode sees every call before the tensors' own dispatch)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (T.cpu, T.cuda, T.to):
            with torch._C.DisableTorchFunctionSubclass():
                return _move(func, args[0], args[1:], kwargs)
        flag = _is_cuda_device(kwargs.get("device"))
        if flag:
            gen = kwargs.get("generator")
            if gen is not None and gen.device.type != "cuda":
                raise DeviceMismatch(f"{_describe(func)}: a CPU generator for a CUDA tensor "
                                     "(emulated CUDA: expected a 'cuda' device generator)")
            kwargs["device"] = "cpu"
            if func in _FACTORIES:
                args = tuple(_plain(a) for a in args)
            return _tag(func(*args, **kwargs), CudaTensor)
        if func not in _FACTORIES:
            return func(*args, **kwargs)
        src = args[0] if args else None
        if flag is None and (func in _LIKE or (func in (torch.as_tensor, torch.asarray)
                                               and isinstance(src, T))):
            return func(*args, **kwargs)  # keeps its input's tag (subclass dispatch)
        if func in _FACTORIES:
            args = tuple(_plain(a) for a in args)
        out = func(*args, **kwargs)
        return _tag(out, CpuTensor)


class _Props:
    """What ``torch.cuda.get_device_properties`` returns under the emulation."""

    name = "Emulated CUDA device (CPU)"
    total_memory = 80 * 2**30
    major, minor = 9, 0
    multi_processor_count = 132


def _torchsort_kernels(stack):
    """Serve torchsort's CUDA kernel table with its CPU kernels (CUDA inputs required)."""
    try:
        from torchsort import ops
    except ImportError:  # pragma: no cover
        return

    def wrap(cpu_kernel):
        def kernel(*tensors):
            for t in tensors:
                if isinstance(t, T) and not isinstance(t, CudaTensor):
                    if isinstance(t, CpuTensor):
                        raise DeviceMismatch("torchsort CUDA kernel given a CPU tensor "
                                             "(emulated CUDA)")
            out = cpu_kernel(*[_plain(t) if isinstance(t, T) else t for t in tensors])
            return _tag(out, CudaTensor)
        return kernel

    for name in ("isotonic_l2", "isotonic_l2_backward", "isotonic_kl", "isotonic_kl_backward"):
        table = getattr(ops, name, None)
        if isinstance(table, dict) and "cpu" in table:
            old = table.get("cuda")
            table["cuda"] = wrap(table["cpu"])
            stack.callback(table.__setitem__, "cuda", old)
    mod = types.ModuleType("torchsort.isotonic_cuda")
    for name in ("isotonic_l2", "isotonic_l2_backward", "isotonic_kl", "isotonic_kl_backward"):
        table = getattr(ops, name, None)
        if isinstance(table, dict):
            setattr(mod, name, table["cuda"])
    old_mod = sys.modules.get("torchsort.isotonic_cuda")
    sys.modules["torchsort.isotonic_cuda"] = mod
    stack.callback(lambda: sys.modules.__setitem__("torchsort.isotonic_cuda", old_mod)
                   if old_mod is not None else sys.modules.pop("torchsort.isotonic_cuda", None))


def _patch(stack, obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    stack.callback(setattr, obj, name, old)


@contextlib.contextmanager
def patched_cuda_module():
    """``torch.cuda`` reporting one GPU (no tagging: enter :func:`fake_cuda` for that)."""
    with contextlib.ExitStack() as stack:
        c = torch.cuda
        _patch(stack, c, "is_available", lambda: True)
        _patch(stack, c, "device_count", lambda: 1)
        _patch(stack, c, "current_device", lambda: 0)
        _patch(stack, c, "synchronize", lambda device=None: None)
        _patch(stack, c, "empty_cache", lambda: None)
        _patch(stack, c, "is_initialized", lambda: True)
        _patch(stack, c, "get_device_name", lambda device=None: _Props.name)
        _patch(stack, c, "get_device_properties", lambda device=None: _Props())
        _patch(stack, c, "mem_get_info", lambda device=None: (70 * 2**30, _Props.total_memory))
        _patch(stack, c, "memory_allocated", lambda device=None: 0)
        _patch(stack, c, "max_memory_allocated", lambda device=None: 0)
        _patch(stack, c, "reset_peak_memory_stats", lambda device=None: None)
        _patch(stack, c, "manual_seed", lambda seed: None)
        _patch(stack, c, "manual_seed_all", lambda seed: None)
        yield


@contextlib.contextmanager
def fake_cuda():
    """Run the block with an emulated CUDA device (see the module's docstring)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_cuda_module())
        _torchsort_kernels(stack)
        from_numpy = torch.from_numpy
        _patch(stack, torch, "from_numpy", lambda a: _tag(from_numpy(a), CpuTensor))
        stack.enter_context(_Mode())
        yield
