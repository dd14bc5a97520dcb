"""nn.Cell and nn.GraphKernel: networks whose `construct` calls primitives."""
from __future__ import annotations

import inspect
from typing import Any

from graphkernel.errors import GraphModeError, InputError
from graphkernel.frontend import context, dynamic, symbolic
from graphkernel.frontend.compile import compile_cached
from graphkernel.frontend.compiled import CompiledCell
from graphkernel.frontend.signature import input_names
from graphkernel.frontend.tensor import Parameter, Tensor, apply_op, parameters_read_as
from graphkernel.frontend.tracing import Tracer, current_tracer, user_location
from graphkernel.ir import types as T
from graphkernel.ir.types import TensorType, TupleType


class Cell:
    """A network or layer. Sub-cells, primitives and Parameters are attributes."""

    # Set in __init__ through object.__setattr__ (this class's own __setattr__ needs _cells).
    _cells: dict[str, Cell]
    _params: dict[str, Parameter]
    _compiled: dict[Any, Any]
    _auto_prefix: bool
    training: bool

    def __init__(self, auto_prefix: bool = True) -> None:
        object.__setattr__(self, "_cells", {})
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_compiled", {})
        object.__setattr__(self, "_auto_prefix", auto_prefix)
        object.__setattr__(self, "training", False)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_cells" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 f"before setting attribute {name!r}")
        self._cells.pop(name, None)  # a sub-cell or weight replaced by something else
        self._params.pop(name, None)
        if isinstance(value, Cell):
            self._cells[name] = value
            if self._auto_prefix:  # MindSpore's names: a child's weight becomes "fc1.weight"
                for _, param in value.parameters_and_names():
                    param.name = f"{name}.{param.name}"
        elif isinstance(value, Parameter):
            if not value.name:
                value.name = name
            self._params[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        self._cells.pop(name, None)
        self._params.pop(name, None)

    def set_inputs(self, *inputs: Tensor) -> None:
        """Declare the inputs' shapes and dtypes, MindSpore's way: a None (or -1) dimension is
        dynamic, and one compiled graph serves every size of it; a `Symbol` is a dynamic
        dimension with constraints, shared by every dimension of a unique one (data [N, F] and
        labels [N]). A call that does not match, or breaks a constraint, is an InputError naming
        the input and the dimension (frontend/dynamic.py)."""
        declared = dynamic.declared_types(self, inputs)
        self.__dict__["_declared_inputs"] = declared
        self._compiled.clear()
        self.__dict__.pop("_last_call", None)
        self.__dict__.pop("_generic", None)

    def construct(self, *inputs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define construct()")

    def cells(self) -> dict[str, Cell]:
        return dict(self._cells)

    def parameters_and_names(self, prefix: str = "") -> list[tuple[str, Parameter]]:
        out = [(prefix + name, p) for name, p in self._params.items()]
        for name, cell in self._cells.items():
            out += cell.parameters_and_names(f"{prefix}{name}.")
        return out

    def trainable_params(self) -> list[Parameter]:
        """Parameters with requires_grad, each once (a shared one is listed where first met)."""
        seen: dict[int, Parameter] = {}
        for _, p in self.parameters_and_names():
            if p.requires_grad:
                seen.setdefault(id(p), p)
        return list(seen.values())

    def get_parameters(self) -> list[Parameter]:
        return [p for _, p in self.parameters_and_names()]

    def parameters_dict(self) -> dict[str, Parameter]:
        """{qualified name: Parameter}, MindSpore's `Cell.parameters_dict()`."""
        return dict(self.parameters_and_names())

    def cells_and_names(self, prefix: str = "") -> list[tuple[str, Cell]]:
        out: list[tuple[str, Cell]] = [(prefix, self)]
        for name, cell in self._cells.items():
            out += cell.cells_and_names(f"{prefix}.{name}" if prefix else name)
        return out

    def set_train(self, mode: bool = True) -> Cell:
        """Training mode for this cell and every cell in it (Dropout drops, BatchNorm uses the
        batch's statistics). A compiled graph that read a changed `training` (this cell's, a
        parent's that inlines it) is stale on its next call (frontend/guards.py)."""
        for _, cell in self.cells_and_names():
            object.__setattr__(cell, "training", bool(mode))
        return self

    def _positional(self, inputs: tuple[Any, ...], keywords: dict[str, Any]) -> tuple[Any, ...]:
        """`cell(x, mask=m)`: the keyword inputs placed by `construct`'s signature, the defaults
        of any skipped before them filled in, so every path below sees positional inputs."""
        try:
            bound = inspect.signature(self.construct).bind(*inputs, **keywords)
        except TypeError as err:
            raise InputError(f"{type(self).__name__}.construct: {err}", user_location()) from None
        bound.apply_defaults()
        if bound.kwargs:
            raise InputError(f"{type(self).__name__}.construct takes {', '.join(bound.kwargs)} "
                             "by keyword only: graphkernel passes a cell's inputs by position "
                             "(make them positional parameters)", user_location())
        return tuple(bound.args)

    def __call__(self, *inputs: Any, **keywords: Any) -> Any:
        if keywords:
            inputs = self._positional(inputs, keywords)
        # The per-call path: the graph this cell ran last, if the context holds and nothing is
        # being traced; its entry checks the guards (every attribute the trace read still the
        # same object: frontend/guards.py) and returns NotImplemented when one moved or for
        # inputs of another shape or dtype, and the full path below decides.
        last = self.__dict__.get("_last_call")
        declined = None  # the executable whose entry declined these inputs just now
        if last is not None and last[0] == context._generation and not symbolic.recording:
            out = last[2](last[3], *inputs)
            if out is not NotImplemented:
                for p in last[1].written:  # its in-place writes: a new version of each
                    p.bump_version()
                return out
            declined = last[1]
        if current_tracer() is not None:
            return self._traced_call(inputs)
        if context.get_context("mode") == context.PYNATIVE_MODE:
            return self._run_construct(inputs)
        exe = compile_cached(self, inputs)
        if isinstance(exe, CompiledCell):  # the same executable: not offered to its entry twice
            out = exe.call(inputs, entry_declined=exe is declined)
        else:
            out = exe(*inputs)
        fast = exe.fast_call if isinstance(exe, CompiledCell) else None  # not a StaticCall
        if fast is not None:
            self.__dict__["_last_call"] = (context._generation, exe, *fast)
        else:  # no compiled entry (numpy steps, number inputs): every call takes this path
            self.__dict__.pop("_last_call", None)
        return out

    def _traced_call(self, inputs: tuple[Any, ...]) -> Any:
        # A plain Cell inside a traced construct is inlined.
        return self._run_construct(inputs)

    def to_float(self, dst_type: Any) -> Cell:
        """MindSpore's `Cell.to_float`: this cell and every cell in it compute in `dst_type`
        (float16 or float32): their float inputs are cast to it and their ops read float
        Parameters through a Cast to it, while the Parameters (and so the optimizer's
        updates) keep their own dtype. Returns the cell."""
        dtype = T.to_dtype(dst_type)
        if not T.is_float(dtype):
            raise InputError(f"to_float takes a float dtype, got {dtype.name}", user_location())
        for _, cell in self.cells_and_names():
            object.__setattr__(cell, "_compute_dtype", dtype)
        return self

    def _run_construct(self, inputs: tuple[Any, ...]) -> Any:
        """construct, in the dtypes `to_float` (and graphkernel.amp's output casts) set. The
        attributes are read through the cell, so a compiled graph that read them is stale
        once they change (frontend/guards.py)."""
        compute = getattr(self, "_compute_dtype", None)
        output = getattr(self, "_output_dtype", None)
        if compute is None and output is None:
            return self.construct(*inputs)
        if compute is None:
            out = self.construct(*inputs)
        else:
            inputs = tuple(_cast_float(x, compute) for x in inputs)
            with parameters_read_as(compute):
                out = self.construct(*inputs)
        return out if output is None else _cast_float(out, output)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _cast_float(value: Any, dtype: Any) -> Any:
    """`value` with its float Tensors (in tuples and lists too) cast to `dtype`."""
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_float(v, dtype) for v in value)
    if isinstance(value, Tensor) and T.is_float(value.dtype) and value.dtype != dtype:
        return apply_op("Cast", [value], {"dtype": dtype})
    return value


class GraphKernel(Cell):
    """A composite operator the user declares: its `construct` becomes one composite node."""

    def _traced_call(self, inputs: tuple[Any, ...]) -> Any:
        outer = current_tracer()
        assert outer is not None
        loc = user_location()
        for i, arg in enumerate(inputs):
            if not isinstance(arg, Tensor):
                raise InputError(f"{type(self).__name__} (a GraphKernel) takes tensors; input {i} "
                                 f"is a {type(arg).__name__}", loc)
        child = Tracer(type(self).__name__, parent=outer)
        names = input_names(self, len(inputs))
        with child:
            args = [child.add_input(TensorType(a.shape, a.dtype), n)
                    for a, n in zip(inputs, names)]
            result = self.construct(*args)
            outs = result if isinstance(result, (tuple, list)) else (result,)
            for o in outs:
                if not isinstance(o, Tensor):
                    raise GraphModeError(f"{type(self).__name__}.construct must return tensors, "
                                         f"got {type(o).__name__}", loc)
            child.graph.outputs = [child.value_of(o) for o in outs]
        child.graph.returns_tuple = isinstance(result, (tuple, list))
        operands = [outer.value_of(a) for a in inputs]
        operands += [outer_value for outer_value, _ in child.captures.values()]
        out_types = [v.tensor_type for v in child.graph.outputs]
        type_ = out_types[0] if len(out_types) == 1 else TupleType(tuple(out_types))
        node = outer.add_node("Composite", operands, {}, type_, loc, subgraph=child.graph,
                              name=type(self).__name__)
        node.notes["user_graph_kernel"] = type(self).__name__  # ir.graph.USER_GRAPH_KERNEL
        if len(out_types) == 1:
            return Tensor._symbolic(node, outer)
        items = []
        for index, item in enumerate(out_types):
            getter = outer.add_node("GetItem", [node], {"index": index}, item, loc)
            items.append(Tensor._symbolic(getter, outer))
        return tuple(items)
