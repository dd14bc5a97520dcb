"""MindSpore's gradient API: `grad`, `value_and_grad`, `GradOperation`, `ParameterTuple`.

A gradient function traced inside a `construct` (TrainOneStepCell's, or a user's) traces the
function into the graph being recorded and appends its backward with the autodiff pass
(passes/autodiff.py): forward and backward are one graph, compiled, fused and dumped together.
Called from Python, it compiles a small cell around that (cached per input signature, as any
cell) and runs it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.errors import GradientError, InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.frontend.tracing import Tracer, current_tracer, user_location
from graphkernel.ir.build import GraphBuilder
from graphkernel.ir.graph import Constant
from graphkernel.passes.autodiff import differentiable, gradients


class ParameterTuple(tuple):
    """A tuple of Parameters (MindSpore's), e.g. `ParameterTuple(net.trainable_params())`."""

    def __new__(cls, params: Sequence[Parameter] = ()) -> ParameterTuple:
        params = tuple(params)
        for p in params:
            if not isinstance(p, Parameter):
                raise InputError(f"ParameterTuple holds Parameters, got {type(p).__name__}",
                                 user_location())
        return super().__new__(cls, params)

    def clone(self, prefix: str, init: Any = "same") -> ParameterTuple:
        """New Parameters shaped as these, named "{prefix}.{name}" (MindSpore's: an optimizer's
        `self.parameters.clone(prefix="moments", init="zeros")`), holding a copy of each value
        (init "same"), zeros, ones, or a number."""
        if not isinstance(prefix, str) or not prefix:
            raise InputError(f"ParameterTuple.clone: prefix must be a non-empty str, got "
                             f"{prefix!r}", user_location())
        fills = {"zeros": 0, "ones": 1}
        if not (init == "same" or init in fills or
                (isinstance(init, (int, float)) and not isinstance(init, bool))):
            raise InputError(f"ParameterTuple.clone: init {init!r} is not supported here; "
                             "give 'same', 'zeros', 'ones' or a number", user_location())
        clones = []
        for p in self:
            value = p.asnumpy().copy() if init == "same" else \
                np.full(p.shape, fills.get(init, init), p.dtype)
            clones.append(Parameter(value, f"{prefix}.{p.name}", requires_grad=False))
        return ParameterTuple(clones)


@dataclass(frozen=True)
class _Spec:
    """What a gradient function returns. positions: the differentiated arguments (None: none);
    single: positions was an int (one gradient, not a tuple); weights: differentiated
    Parameters (None: none); single_weight: a lone Parameter was given; with_value: return the
    function's value too; has_aux: only output 0 is differentiated, the others returned as
    they are; sens_param: the last argument is the output's sensitivity."""

    positions: tuple[int, ...] | None
    single: bool
    weights: tuple[Parameter, ...] | None
    single_weight: bool = False
    with_value: bool = False
    has_aux: bool = False
    sens_param: bool = False
    sens: float = 1.0  # the default sensitivity (TrainOneStepCell's `sens`)


def _positions(grad_position: int | tuple[int, ...] | list[int] | None
               ) -> tuple[tuple[int, ...] | None, bool]:
    if grad_position is None:
        return None, False
    if isinstance(grad_position, (int, np.integer)) and not isinstance(grad_position, bool):
        return (int(grad_position),), True
    if isinstance(grad_position, (tuple, list)) and grad_position and all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in grad_position):
        return tuple(int(p) for p in grad_position), False
    raise InputError(f"grad_position must be an int, a non-empty tuple of ints or None, got "
                     f"{grad_position!r}", user_location())


def _weights(weights: Any) -> tuple[tuple[Parameter, ...] | None, bool]:
    if weights is None:
        return None, False
    if isinstance(weights, Parameter):
        return (weights,), True
    if isinstance(weights, (list, tuple)) and all(isinstance(w, Parameter) for w in weights):
        return tuple(weights), False
    raise InputError("weights must be a Parameter, a list or a ParameterTuple of Parameters "
                     "(e.g. net.trainable_params())", user_location())


class GradFunction:
    """`fn`'s gradient function: call it like `fn` (plus the sensitivity with sens_param)."""

    def __init__(self, fn: Callable[..., Any], spec: _Spec) -> None:
        if not callable(fn):
            raise InputError(f"cannot differentiate a {type(fn).__name__}: pass a Cell or a "
                             "function", user_location())
        if spec.positions is None and spec.weights is None:
            raise InputError("grad_position and weights cannot both be None: nothing to "
                             "differentiate with respect to", user_location())
        self.fn = fn
        self.spec = spec
        self._cell: _GradCell | None = None

    def __call__(self, *args: Any) -> Any:
        tracer = current_tracer()
        if tracer is not None:
            return traced_gradients(tracer, self.fn, self.spec, args)
        if self._cell is None:
            name = getattr(self.fn, "__name__", None) or type(self.fn).__name__
            cls = type(f"Grad_{name}", (_GradCell,), {})
            self._cell = cls(self)
        return self._cell.run(args)


class _GradCell(Cell):
    """The cell a gradient function called from Python compiles: flat outputs, restructured
    after the call."""

    grad_fn: GradFunction
    _layout: Any  # the nesting of the result, set when construct is traced

    def __init__(self, grad_fn: GradFunction) -> None:
        super().__init__(auto_prefix=False)  # never renames the differentiated cell's weights
        object.__setattr__(self, "grad_fn", grad_fn)
        if isinstance(grad_fn.fn, Cell):
            self.network = grad_fn.fn  # its parameters are this cell's

    def construct(self, *args: Any) -> Any:
        tracer = current_tracer()
        assert tracer is not None
        result = traced_gradients(tracer, self.grad_fn.fn, self.grad_fn.spec, args)
        # The nesting of the result; the compiled graph returns its tensors flat. It depends on
        # the spec and the function's outputs, not on the input shapes.
        object.__setattr__(self, "_layout", layout_of(result))
        flat: list[Tensor] = []
        _flatten(result, flat)
        return tuple(flat)

    def run(self, args: tuple[Any, ...]) -> Any:
        from graphkernel.frontend.compile import compile_cached
        flat = compile_cached(self, args)(*args)
        flat = list(flat) if isinstance(flat, (tuple, list)) else [flat]
        return _unflatten(self._layout, iter(flat))


def _flatten(result: Any, flat: list[Tensor]) -> None:
    if isinstance(result, (tuple, list)):
        for item in result:
            _flatten(item, flat)
    else:
        flat.append(result)


def layout_of(result: Any) -> Any:
    """The nesting of a gradient function's result: None for a tensor, a tuple of layouts."""
    if isinstance(result, (tuple, list)):
        return tuple(layout_of(r) for r in result)
    return None


def _unflatten(layout: Any, flat: Any) -> Any:
    if layout is None:
        return next(flat)
    return tuple(_unflatten(item, flat) for item in layout)


def traced_gradients(tracer: Tracer, fn: Callable[..., Any], spec: _Spec,
                     args: tuple[Any, ...]) -> Any:
    """Trace `fn(*args)` into the graph being recorded and append its gradients."""
    loc = user_location()
    args = tuple(args)
    sens_arg = None
    if spec.sens_param:
        if not args:
            raise InputError("with sens_param=True the last argument is the sensitivity; none "
                             "was given", loc)
        args, sens_arg = args[:-1], args[-1]
    # Every argument becomes a value of this graph first, so the function and the gradient
    # see the same value (a concrete Tensor would otherwise become two constants).
    symbolic = tuple(Tensor._symbolic(tracer.value_of(a), tracer) if isinstance(a, Tensor)
                     else a for a in args)
    positions = spec.positions or ()
    for p in positions:
        if not -len(args) <= p < len(args):
            raise InputError(f"grad_position {p} is out of range: the function got "
                             f"{len(args)} argument(s)", loc)
        if not isinstance(symbolic[p], Tensor):
            raise InputError(f"argument {p} is a {type(args[p]).__name__}; only Tensor "
                             "arguments can be differentiated", loc)
    result = fn(*symbolic)
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    for i, out in enumerate(outs):
        if not isinstance(out, Tensor):
            raise GradientError(f"the differentiated function returned a "
                                f"{type(out).__name__} (output {i}); it must return tensors",
                                loc)
    differentiated = outs[:1] if spec.has_aux else outs
    values = [tracer.value_of(o) for o in differentiated]
    builder = GraphBuilder(tracer.graph, loc, tracer.unique)
    for v in values:
        if not differentiable(v):
            raise GradientError(f"cannot differentiate an output of dtype {v.dtype.name}: "
                                "gradients flow through float tensors only", loc)
    if sens_arg is not None:
        sens_items = list(sens_arg) if isinstance(sens_arg, (tuple, list)) else [sens_arg]
        if len(sens_items) != len(values):
            raise InputError(f"the sensitivity has {len(sens_items)} item(s), the function "
                             f"{len(values)} output(s)", loc)
        sens = [tracer.value_of(s if isinstance(s, Tensor) else Tensor(s)) for s in sens_items]
    else:
        # MindSpore's default: ones like each output.
        sens = [builder.broadcast_to(Constant(np.full((), spec.sens, v.dtype)), v.shape)
                for v in values]
    wrt_tensors = [symbolic[p] for p in positions] + list(spec.weights or ())
    wrt = [tracer.value_of(t) for t in wrt_tensors]
    for t, v in zip(wrt_tensors, wrt):
        if not differentiable(v):
            raise GradientError(f"cannot differentiate with respect to a {v.dtype.name} "
                                f"tensor ({getattr(t, 'name', '') or v.name}): gradients flow "
                                "through float tensors only", loc)
    grads = [Tensor._symbolic(g, tracer) for g in gradients(tracer.graph, values, sens, wrt,
                                                             builder)]
    by_position, by_weight = grads[:len(positions)], grads[len(positions):]
    parts: list[Any] = []
    if spec.positions is not None:
        parts.append(by_position[0] if spec.single else tuple(by_position))
    if spec.weights is not None:
        parts.append(by_weight[0] if spec.single_weight else tuple(by_weight))
    gradient = parts[0] if len(parts) == 1 else tuple(parts)
    if spec.with_value:
        value = result if not isinstance(result, list) else tuple(result)
        return value, gradient
    if spec.has_aux:
        return gradient, tuple(outs[1:])
    return gradient


def grad(fn: Callable[..., Any], grad_position: int | tuple[int, ...] | None = 0,
         weights: Any = None, has_aux: bool = False) -> GradFunction:
    """MindSpore's `grad`: a function giving the gradients of `fn`'s output(s) with respect to
    the arguments at `grad_position` and to `weights` (Parameters)."""
    positions, single = _positions(grad_position)
    params, single_weight = _weights(weights)
    return GradFunction(fn, _Spec(positions, single, params, single_weight, has_aux=has_aux))


def value_and_grad(fn: Callable[..., Any], grad_position: int | tuple[int, ...] | None = 0,
                   weights: Any = None, has_aux: bool = False) -> GradFunction:
    """MindSpore's `value_and_grad`: `(fn's outputs, gradients)` in one call."""
    positions, single = _positions(grad_position)
    params, single_weight = _weights(weights)
    return GradFunction(fn, _Spec(positions, single, params, single_weight, with_value=True,
                                  has_aux=has_aux))


class GradOperation:
    """MindSpore's `ops.GradOperation(get_all=False, get_by_list=False, sens_param=False)`:
    `GradOperation(...)(net[, weights])` is the gradient function of `net`."""

    def __init__(self, get_all: bool = False, get_by_list: bool = False,
                 sens_param: bool = False) -> None:
        self.get_all = get_all
        self.get_by_list = get_by_list
        self.sens_param = sens_param

    def __call__(self, fn: Callable[..., Any], weights: Any = None) -> GradFunction:
        if self.get_by_list and weights is None:
            raise InputError("GradOperation(get_by_list=True) needs the weights: "
                             "grad_op(net, ParameterTuple(net.trainable_params()))",
                             user_location())
        params = _weights(weights)[0] if self.get_by_list else None
        if self.get_all:
            spec = _Spec(None, False, params, sens_param=self.sens_param)
            return _AllInputs(fn, spec)
        positions = None if self.get_by_list else (0,)
        return GradFunction(fn, _Spec(positions, True, params, sens_param=self.sens_param))

    def __repr__(self) -> str:
        return (f"GradOperation(get_all={self.get_all}, get_by_list={self.get_by_list}, "
                f"sens_param={self.sens_param})")


class _AllInputs(GradFunction):
    """get_all=True: gradients for every argument, known once the function is called."""

    def __init__(self, fn: Callable[..., Any], spec: _Spec) -> None:
        self.fn = fn
        self.spec = spec
        self._by_count: dict[int, GradFunction] = {}

    def __call__(self, *args: Any) -> Any:
        count = len(args) - (1 if self.spec.sens_param else 0)
        if count < 1:
            raise InputError("GradOperation(get_all=True) needs at least one argument to "
                             "differentiate", user_location())
        if count not in self._by_count:
            spec = _Spec(tuple(range(count)), False, self.spec.weights,
                         sens_param=self.spec.sens_param)
            self._by_count[count] = GradFunction(self.fn, spec)
        return self._by_count[count](*args)
