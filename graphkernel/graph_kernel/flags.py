"""`graph_kernel_flags`: a string in MindSpore's form, e.g.
"--opt_level=2 --disable_expand_ops=Softmax --disable_cluster_ops=Exp --dump_as_text"."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.errors import FlagError

DEFAULT_OP_LIMIT = 64


@dataclass(frozen=True)
class GraphKernelFlags:
    """Parsed flags.

    opt_level: 0 no graph-kernel passes; 1 elementwise fusion only (composite ops with
    reductions stay library kernels unless named in enable_expand_ops, reductions are not
    clustered unless named in enable_cluster_ops); 2 (default) every fusion pattern; 3 the same
    as 2 today (reserved for fusions that trade accuracy or memory for speed).
    """

    opt_level: int = 2
    enable_expand_ops: frozenset[str] = field(default_factory=frozenset)
    disable_expand_ops: frozenset[str] = field(default_factory=frozenset)
    enable_cluster_ops: frozenset[str] = field(default_factory=frozenset)
    disable_cluster_ops: frozenset[str] = field(default_factory=frozenset)
    composite_op_limit_size: int = DEFAULT_OP_LIMIT
    dump_as_text: bool = False


_LIST_FLAGS = ("enable_expand_ops", "disable_expand_ops", "enable_cluster_ops",
               "disable_cluster_ops")
KNOWN_FLAGS = ("opt_level",) + _LIST_FLAGS + ("composite_op_limit_size", "dump_as_text")


def parse_flags(text: str) -> GraphKernelFlags:
    """Parse a flags string; an unknown flag or bad value names the known ones."""
    from graphkernel.ir.opset import OPS
    values: dict[str, object] = {}
    for token in text.split():
        if not token.startswith("--"):
            raise FlagError(f"graph_kernel_flags: {token!r} does not start with '--'; known "
                            f"flags: {', '.join('--' + k for k in KNOWN_FLAGS)}")
        key, sep, raw = token[2:].partition("=")
        if key not in KNOWN_FLAGS:
            raise FlagError(f"graph_kernel_flags: unknown flag --{key}; known flags: "
                            f"{', '.join('--' + k for k in KNOWN_FLAGS)}")
        if key == "dump_as_text":
            if sep and raw.lower() not in ("true", "false"):
                raise FlagError("graph_kernel_flags: --dump_as_text takes true or false, got "
                                f"{raw!r}")
            values[key] = (raw.lower() != "false") if sep else True
        elif key in ("opt_level", "composite_op_limit_size"):
            try:
                number = int(raw)
            except ValueError:
                raise FlagError(f"graph_kernel_flags: --{key} needs an integer, got {raw!r}"
                                ) from None
            if key == "opt_level" and not 0 <= number <= 3:
                raise FlagError("graph_kernel_flags: --opt_level must be 0, 1, 2 or 3, got "
                                f"{number}")
            if key == "composite_op_limit_size" and number < 1:
                raise FlagError(f"graph_kernel_flags: --composite_op_limit_size must be >= 1, "
                                f"got {number}")
            values[key] = number
        else:
            names = [n for n in raw.split(",") if n]
            if not names:
                raise FlagError(f"graph_kernel_flags: --{key} needs a comma-separated list of ops")
            unknown = [n for n in names if n not in OPS]
            if unknown:
                raise FlagError(f"graph_kernel_flags: --{key} names unknown op(s) "
                                f"{', '.join(unknown)}")
            values[key] = frozenset(names)
    return GraphKernelFlags(**values)  # type: ignore[arg-type]
