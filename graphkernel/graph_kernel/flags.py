"""`graph_kernel_flags`: a string in MindSpore's form, e.g.
"--opt_level=2 --disable_expand_ops=Softmax --disable_cluster_ops=Exp --dump_as_text".

Every flag MindSpore 2.x registers (its graph_kernel_flags.cc) is accepted, so a MindSpore
script starts unchanged. The flags graphkernel implements act; the others are parsed, checked for
a well-formed value, and named in one warning as having no effect here. A flag name MindSpore does
not know is an error that suggests the closest known flag (MindSpore itself only logs a warning,
and a misspelt flag then silently does nothing). Op and stage names inside a list flag are
MindSpore's vocabulary, larger than graphkernel's (Conv2D expanders, `highlevelopt2.atomic_clean`
passes): one graphkernel lacks is named in the same warning, with the closest name it has, as
MindSpore warns about names it does not know, and never fails the program.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from graphkernel.errors import FlagError, warn_no_effect
from graphkernel.passes.stage_names import SWITCHABLE

DEFAULT_OP_LIMIT = 64

# MindSpore 2.x's flags by value kind: "bool" (`--flag` means true), "int", "str", "list"
# (comma-separated names).
MINDSPORE_FLAGS: dict[str, str] = {
    "opt_level": "int",
    "dump_as_text": "bool",
    "enable_stitch_fusion": "bool",
    "enable_recompute_fusion": "bool",
    "enable_parallel_fusion": "bool",
    "enable_horizontal_fusion": "bool",
    "enable_auto_tensor_inplace": "bool",
    "enable_dynamic_batch": "bool",
    "enable_low_precision": "bool",
    "enable_csr_fusion": "bool",
    "enable_debug_mode": "bool",
    "enable_lite_conv_tuning": "bool",
    "enable_vectorization": "bool",
    "enable_dynamic_shape_fusion": "bool",
    "enable_parallel_op_combine": "bool",
    "enable_cce_lib": "bool",
    "reduce_fuse_depth": "int",
    "online_tuning": "int",
    "cpu_refer_thread_num": "int",
    "fusion_ops_level": "int",
    "parallel_ops_level": "int",
    "recompute_increment_threshold": "int",
    "recompute_peak_threshold": "int",
    "composite_op_limit_size": "int",
    "repository_path": "str",
    "target_os": "str",
    "cpu_arch": "str",
    "cpu_feature": "str",
    "cpu_type": "str",
    "kernel_generator": "str",
    "enable_expand_ops": "list",
    "enable_expand_ops_only": "list",
    "disable_expand_ops": "list",
    "enable_cluster_ops": "list",
    "enable_cluster_ops_only": "list",
    "disable_cluster_ops": "list",
    "enable_simplify_exprs_only": "list",
    "disable_simplify_exprs": "list",
    "enable_pass": "list",
    "disable_pass": "list",
    "enable_cce_lib_ops": "list",
    "enable_cce_lib_ops_only": "list",
    "disable_cce_lib_ops": "list",
}

# The flags that change what graphkernel does (the fields of GraphKernelFlags).
IMPLEMENTED = ("opt_level", "dump_as_text", "composite_op_limit_size", "enable_expand_ops",
               "enable_expand_ops_only", "disable_expand_ops", "enable_cluster_ops",
               "enable_cluster_ops_only", "disable_cluster_ops", "enable_pass", "disable_pass",
               "enable_parallel_fusion", "online_tuning")
KNOWN_FLAGS = IMPLEMENTED  # kept for callers that list what acts

_OP_LISTS = ("enable_expand_ops", "enable_expand_ops_only", "disable_expand_ops",
             "enable_cluster_ops", "enable_cluster_ops_only", "disable_cluster_ops")
_TRUE = ("", "true", "on", "1")
_FALSE = ("false", "off", "0")


@dataclass(frozen=True)
class GraphKernelFlags:
    """Parsed flags.

    opt_level: 0 no graph-kernel passes; 1 elementwise fusion only (composite ops with
    reductions stay library kernels unless named in enable_expand_ops, reductions are not
    clustered unless named in enable_cluster_ops, and the simplify stage is off); 2 (default)
    every fusion pattern and simplification; 3 the same as 2 today (reserved for fusions that
    trade accuracy or memory for speed).
    `*_only` lists replace the default choice (the plain enable/disable lists are then ignored,
    as in MindSpore). enable_pass/disable_pass name backend stages (`hwopt_2_basic_op_fusion`
    or `basic_op_fusion`). enable_parallel_fusion (on by default, from opt_level 1): independent
    fused groups and siblings of one input launched as one kernel where the cost model says it
    pays (graph_kernel/parallel_fusion.py); `--enable_parallel_fusion=false` turns it off.
    online_tuning (MindSpore's level, 0 off by default): how hard the backend measures its
    kernels' schedule choices on this machine while compiling (backends/c/tuning.py: 1 each
    choice alone, 2 and 3 every combination, longer), stored in the kernel cache for the next
    compile.
    `no_effect` lists the MindSpore flags given that do nothing here; `unused_names` the op
    and stage names in list flags that name nothing graphkernel has (each `--flag=Name` with
    why), which the stages asking these flags never match.
    """

    opt_level: int = 2
    enable_expand_ops: frozenset[str] = field(default_factory=frozenset)
    enable_expand_ops_only: frozenset[str] = field(default_factory=frozenset)
    disable_expand_ops: frozenset[str] = field(default_factory=frozenset)
    enable_cluster_ops: frozenset[str] = field(default_factory=frozenset)
    enable_cluster_ops_only: frozenset[str] = field(default_factory=frozenset)
    disable_cluster_ops: frozenset[str] = field(default_factory=frozenset)
    enable_pass: frozenset[str] = field(default_factory=frozenset)
    disable_pass: frozenset[str] = field(default_factory=frozenset)
    composite_op_limit_size: int = DEFAULT_OP_LIMIT
    dump_as_text: bool = False
    enable_parallel_fusion: bool = True
    online_tuning: int = 0
    no_effect: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # given, but overridden by a *_only flag
    unused_names: tuple[str, ...] = ()

    # -- decisions the graph-kernel stages ask --------------------------------------------
    def expands(self, op: str, has_reduction: bool) -> bool:
        """Whether the expand stage turns `op` into a composite of basic ops."""
        if self.enable_expand_ops_only:
            return op in self.enable_expand_ops_only
        if op in self.disable_expand_ops:
            return False
        return not (has_reduction and self.opt_level <= 1 and op not in self.enable_expand_ops)

    def cluster_refusal(self, op: str, is_reduction: bool) -> str | None:
        """Why the flags keep a basic op out of every fused group, or None."""
        if self.enable_cluster_ops_only:
            if op not in self.enable_cluster_ops_only:
                return f"{op} is not listed in --enable_cluster_ops_only"
            return None
        if op in self.disable_cluster_ops:
            return f"{op} is listed in --disable_cluster_ops"
        if self.opt_level <= 1 and is_reduction and op not in self.enable_cluster_ops:
            return f"opt_level {self.opt_level} fuses elementwise ops only"
        return None

    def stage_runs(self, stage: str, level: int) -> bool:
        """Whether backend stage `stage` (on from opt_level `level`) runs."""
        names = (stage, short_stage_name(stage))
        if any(n in names for n in self.disable_pass):
            return False
        return self.opt_level >= level or any(n in names for n in self.enable_pass)


def short_stage_name(stage: str) -> str:
    """`hwopt_2_basic_op_fusion` -> `basic_op_fusion` (the name without its order prefix)."""
    parts = stage.split("_", 2)
    if len(parts) == 3 and parts[0] == "hwopt" and parts[1].isdigit():
        return parts[2]
    return stage


def _suggest(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _parse_value(key: str, kind: str, sep: str, raw: str) -> object:
    if kind == "bool":
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise FlagError(f"graph_kernel_flags: --{key} takes true or false, got {raw!r}")
    if not sep or not raw:
        raise FlagError(f"graph_kernel_flags: --{key} needs a value (--{key}=...)")
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise FlagError(f"graph_kernel_flags: --{key} needs an integer, got {raw!r}"
                            ) from None
    if kind == "list":
        names = [n for n in raw.split(",") if n]
        if not names:
            raise FlagError(f"graph_kernel_flags: --{key} needs a comma-separated list")
        return frozenset(names)
    return raw


def parse_flags(text: str, warn: bool = False) -> GraphKernelFlags:
    """Parse a flags string. An unknown flag or a bad value raises FlagError; with `warn`, the
    MindSpore flags that have no effect here, and the op or stage names graphkernel lacks, are
    named in one NoEffectWarning."""
    values: dict[str, Any] = {}
    no_effect: list[str] = []
    unused: list[str] = []
    for token in text.split():
        if not token.startswith("--") or len(token) == 2:
            raise FlagError(f"graph_kernel_flags: {token!r} does not start with '--'; flags are "
                            "written --name or --name=value, separated by spaces")
        key, sep, raw = token[2:].partition("=")
        kind = MINDSPORE_FLAGS.get(key)
        if kind is None:
            raise FlagError(f"graph_kernel_flags: unknown flag --{key}"
                            f"{_suggest_flag(key)}; the flags that act here: "
                            f"{', '.join('--' + k for k in IMPLEMENTED)}")
        if key in values or key in no_effect:
            raise FlagError(f"graph_kernel_flags: --{key} is given twice")
        # Its type follows `kind` (an int, a bool, a string or a list of names), a tie between
        # the flag's name and its type that the checker cannot see.
        value: Any = _parse_value(key, kind, sep, raw)
        if key not in IMPLEMENTED:
            no_effect.append(key)
            continue
        if key == "opt_level" and not 0 <= value <= 3:
            raise FlagError(f"graph_kernel_flags: --opt_level must be 0, 1, 2 or 3, got {value}")
        if key == "online_tuning" and not 0 <= value <= 3:
            raise FlagError(f"graph_kernel_flags: --online_tuning must be 0, 1, 2 or 3, got "
                            f"{value}")
        if key == "composite_op_limit_size" and value < 1:
            raise FlagError(f"graph_kernel_flags: --composite_op_limit_size must be >= 1, "
                            f"got {value}")
        if key in _OP_LISTS:
            unused += _unused_op_names(key, value)
        if key in ("enable_pass", "disable_pass"):
            unused += _unused_stage_names(key, value)
        values[key] = value
    both = {short_stage_name(n) for n in values.get("enable_pass", ())} & \
        {short_stage_name(n) for n in values.get("disable_pass", ())}
    if both:
        raise FlagError(f"graph_kernel_flags: stage {', '.join(sorted(both))} is both in "
                        "--enable_pass and --disable_pass")
    ignored = [k for base in ("expand_ops", "cluster_ops") if f"enable_{base}_only" in values
               for k in (f"enable_{base}", f"disable_{base}") if k in values]
    flags = GraphKernelFlags(**values, no_effect=tuple(no_effect),
                             ignored=tuple(ignored), unused_names=tuple(unused))
    if warn:
        warn_no_effect_flags(flags)
    return flags


def _unused_op_names(key: str, names: frozenset[str]) -> list[str]:
    """`--key=Name (why)` for each name in an op list that selects no graphkernel op."""
    from graphkernel.ir.opset import OPS
    out = []
    for name in sorted(names):
        if name not in OPS:
            out.append(f"--{key}={name} (graphkernel has no op {name}{_suggest(name, OPS)})")
        elif "expand" in key and not OPS[name].composite:
            # The op table's composite ops are the ones graph_kernel/expanders.py expands.
            out.append(f"--{key}={name} (graphkernel does not expand {name}; the ops it "
                       f"expands: {', '.join(sorted(n for n, o in OPS.items() if o.composite))})")
    return out


def _unused_stage_names(key: str, names: frozenset[str]) -> list[str]:
    choices = list(SWITCHABLE) + [short_stage_name(k) for k in SWITCHABLE]
    return [f"--{key}={name} (graphkernel has no stage {name}{_suggest(name, choices)}; the "
            f"stages that can be switched: {', '.join(SWITCHABLE)})"
            for name in sorted(names) if name not in choices]


def _suggest_flag(key: str) -> str:
    close = difflib.get_close_matches(key, list(MINDSPORE_FLAGS), n=1, cutoff=0.6)
    return f" (did you mean --{close[0]}?)" if close else ""


def warn_no_effect_flags(flags: GraphKernelFlags) -> None:
    """One warning naming every given flag, op name and stage name that does nothing here."""
    parts = []
    if flags.no_effect:
        parts.append(f"{', '.join('--' + k for k in flags.no_effect)} "
                     f"{'has' if len(flags.no_effect) == 1 else 'have'} no effect in graphkernel "
                     "(accepted for MindSpore scripts)")
    if flags.ignored:
        parts.append(f"{', '.join('--' + k for k in flags.ignored)} ignored because the "
                     "matching *_only flag is set")
    if flags.unused_names:
        parts.append(f"{'; '.join(flags.unused_names)}: no effect")
    if parts:
        warn_no_effect("graph_kernel_flags: " + "; ".join(parts))


def flags_text(flags: GraphKernelFlags) -> str:
    """The flags that differ from the defaults, written back in MindSpore's form."""
    default = GraphKernelFlags()
    parts = []
    for name in IMPLEMENTED:
        value = getattr(flags, name)
        if value == getattr(default, name):
            continue
        if isinstance(value, bool):
            parts.append(f"--{name}" if value else f"--{name}=false")
        elif isinstance(value, frozenset):
            parts.append(f"--{name}={','.join(sorted(value))}")
        else:
            parts.append(f"--{name}={value}")
    return " ".join(parts + [f"--{name}" + " (no effect)" for name in flags.no_effect])
