"""Mutants of graphkernel's files, and a child process that loads and runs them
(tests/test_file_fuzz.py).

Three kinds of file: a GKIR export (`graphkernel.export`; a static seed and a shape-generic one),
a `.ckpt` checkpoint and a compile-cache entry (`.gkc`). A mutant is its seed file changed by
one *recipe*, a JSON list that says what was done and replays it exactly (`apply`), so a failure
prints its own reproducer:

  byte level, any file:  ["flip", pos, bit], ["cut", size], ["set", pos, byte],
                         ["del", pos, n], ["dup", pos, n]          (checksums left stale)
  inside the zip (GKIR, .gkc), checksums recomputed so the change reaches the parser:
                         ["json", path, "set", value], ["json", path, "del"],
                         ["json", path, "swap", other_key], ["json", path, "dup"],
                         ["npy", entry, what, value], ["entry", what, name, ...]
  inside the checkpoint's protobuf:  ["ckpt", i, what, value]

The formats' byte-level readers, writers and mutations are in tests/fuzz_formats.py.
`python tests/file_fuzz.py JOBS.json` is the child: it loads and runs each job and prints one
JSON line per job as it finishes, so the parent knows how far a batch got before a signal.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from typing import Any

from fuzz_formats import (
    ckpt_entries,
    document,
    forge,
    json_parent,
    json_paths,
    mutate_ckpt,
    mutate_npy,
    read_zip,
)


# -- the seed files' nets ---------------------------------------------------------------------
def input_array() -> Any:
    import numpy as np
    return np.random.default_rng(7).standard_normal((2, 6)).astype(np.float32)


def _nets() -> Any:
    """(Block, CkptNet, FUSED), made on first use: importing this module stays cheap."""
    import numpy as np

    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions

    class Block(nn.Cell):
        """Dense-GeLU-Dense with a residual and a LayerNorm: products, fused groups, a
        reduction."""

        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Dense(6, 8, activation="gelu")
            self.down = nn.Dense(8, 6)
            self.norm = nn.LayerNorm((6,))
            rng = np.random.default_rng(0)
            for p in self.get_parameters():
                p.set_data(rng.standard_normal(p.shape).astype(np.float32))

        def construct(self, x: Any) -> Any:
            return self.norm(x + self.down(self.up(x)))

    class CkptNet(Block):
        """Block with parameters of the other dtypes a checkpoint holds (not computed with)."""

        def __init__(self) -> None:
            super().__init__()
            self.steps = graphkernel.Parameter(np.arange(3, dtype=np.int32), "steps")
            self.count = graphkernel.Parameter(np.array(5, np.int64), "count")
            self.half = graphkernel.Parameter(np.ones((2, 2), np.float16), "half")
            self.mask = graphkernel.Parameter(np.array([True, False]), "mask")

    return Block, CkptNet, CompileOptions(enable_graph_kernel=True)


def make_seeds(folder: str) -> dict[str, str]:
    """Write the seed files and the seeds' outputs into `folder`; returns their paths,
    and the compile-cache entry's path as "entry" (where mutants of it go)."""
    import numpy as np

    import graphkernel
    Block, CkptNet, fused = _nets()
    x = input_array()
    paths = {"gkir": os.path.join(folder, "seed.gkir"), "ckpt": os.path.join(folder, "seed.ckpt"),
             "gkc": os.path.join(folder, "seed.gkc"), "want": os.path.join(folder, "want.npy")}
    graphkernel.export(Block(), graphkernel.Tensor(x), file_name=paths["gkir"],
                       include_library=False, options=fused)
    # The same block shape-generic (format version 2: dynamic sizes and their rules)
    generic = Block()
    generic.set_inputs(graphkernel.Tensor(shape=[graphkernel.Symbol(min=1, max=64), 6],
                                          dtype=graphkernel.float32))
    paths["gkir_generic"] = graphkernel.export(
        generic, graphkernel.Tensor(x), file_name=os.path.join(folder, "seed_generic.gkir"),
        include_library=False, options=fused)
    paths["want_generic"] = os.path.join(folder, "want_generic.npy")
    np.save(paths["want_generic"], graphkernel.compile(generic, x, options=fused).run_arrays(x)[0])
    graphkernel.save_checkpoint(CkptNet(), paths["ckpt"])
    graphkernel.compile(Block(), x, options=fused)
    again = graphkernel.compile(Block(), x, options=fused)
    note = again.report.compile_cache
    assert note.startswith("hit: "), note
    paths["entry"] = note[len("hit: "):]
    with open(paths["entry"], "rb") as src, open(paths["gkc"], "wb") as dst:
        dst.write(src.read())
    np.save(paths["want"], again.run_arrays(x)[0])
    return paths


# Numbers at the edges of their types (and of JSON's).
EDGE_INTS = [0, -1, 1, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 32, 2 ** 63 - 1, 2 ** 63, -2 ** 63,
             2 ** 64, 10 ** 30]
EDGE_VALUES: list[Any] = EDGE_INTS + [math.nan, math.inf, -math.inf, 1e308, 0.5, "", "x" * 300,
                                      None, True, [], {}, [0] * 70, "float64", "../x"]
NPY_DESCRS = ["<f8", "<f2", "<i8", "<i4", "|b1", ">f4", "<c8", "|O", "<U4", "|u1", "<V4"]
CKPT_TYPES = ["Float16", "Float32", "Float64", "Int32", "Int64", "Bool", "BFloat16", "Int8",
              "UInt8", "String", ""]
BYTE_OPS = ["flip", "flip", "flip", "cut", "set", "del", "dup"]


# -- recipes --------------------------------------------------------------------------------
def apply(kind: str, seed: bytes, recipe: list) -> bytes:
    """The seed file changed by `recipe` (see the module's doc)."""
    op = recipe[0]
    if op == "flip":
        data = bytearray(seed)
        data[recipe[1]] ^= 1 << recipe[2]
        return bytes(data)
    if op == "cut":
        return seed[:recipe[1]]
    if op == "set":
        data = bytearray(seed)
        data[recipe[1]] = recipe[2]
        return bytes(data)
    if op == "del":
        return seed[:recipe[1]] + seed[recipe[1] + recipe[2]:]
    if op == "dup":
        return seed[:recipe[1] + recipe[2]] + seed[recipe[1]:]
    if op == "ckpt":
        return mutate_ckpt(seed, *recipe[1:])
    entries = list(read_zip(seed).items())
    manifest = document(dict(entries))
    if op == "json":
        path, how = recipe[1], recipe[2]
        parent, key = json_parent(manifest, path), path[-1]
        if how == "set":
            parent[key] = recipe[3]
        elif how == "del":
            del parent[key]
        elif how == "swap":  # two fields of one object trade values
            parent[key], parent[recipe[3]] = parent[recipe[3]], parent[key]
        elif how == "dup":
            parent.insert(key, parent[key])
    elif op == "npy":
        entries = [(n, mutate_npy(b, recipe[2], recipe[3]) if n == recipe[1] else b)
                   for n, b in entries]
    elif op == "entry":
        how, name = recipe[1], recipe[2]
        blob = dict(entries).get(name, b"x")
        if how == "drop":
            entries = [(n, b) for n, b in entries if n != name]
        elif how == "rename":
            entries = [(recipe[3] if n == name else n, b) for n, b in entries]
        elif how == "twice":
            entries.append((name, blob[::-1]))
        elif how == "add":
            entries.append((name, blob))
    return forge(entries, manifest)


def _byte_recipe(rng: random.Random, size: int) -> list:
    op = rng.choice(BYTE_OPS)
    pos = rng.randrange(size)
    if op == "flip":
        return ["flip", pos, rng.randrange(8)]
    if op == "cut":
        return ["cut", pos]
    if op == "set":
        return ["set", pos, rng.choice([0, 0xFF, 0x7F, 0x80, 0x01])]
    return [op, pos, rng.choice([1, 2, 4, 8, 64])]


def _zip_recipe(rng: random.Random, seed: bytes) -> list:
    entries = read_zip(seed)
    manifest = document(entries)
    arrays = sorted(n for n in entries if n.endswith(".npy"))
    roll = rng.random()
    if roll < 0.55:
        paths = json_paths(manifest)
        path = list(rng.choice(paths))
        parent = json_parent(manifest, path)
        how = rng.choice(["set", "set", "set", "del", "swap", "dup"])
        if how == "swap" and isinstance(parent, dict) and len(parent) > 1:
            return ["json", path, "swap", rng.choice([k for k in parent if k != path[-1]])]
        if how == "dup" and isinstance(parent, list):
            return ["json", path, "dup"]
        if how == "del":
            return ["json", path, "del"]
        return ["json", path, "set", rng.choice(EDGE_VALUES)]
    if roll < 0.85 and arrays:
        name = rng.choice(arrays)
        what = rng.choice(["shape", "shape", "descr", "fortran", "fill", "fill", "cut", "grow"])
        value: Any = {
            "shape": lambda: rng.choice([[2 ** 31], [-1], [2 ** 63], [0], [2 ** 32, 2 ** 32],
                                         [], [1] * 70, [3, -3], [10 ** 12, 10 ** 12]]),
            "descr": lambda: rng.choice(NPY_DESCRS),
            "fortran": lambda: True,
            "fill": lambda: rng.choice([math.nan, math.inf, -math.inf, 0, -1, 2 ** 31, 1e38]),
            "cut": lambda: rng.choice([0, 1, 3]),
            "grow": lambda: rng.choice([1, 4, 4096]),
        }[what]()
        return ["npy", name, what, value]
    how = rng.choice(["drop", "rename", "twice", "add"])
    name = rng.choice(sorted(entries))
    if how == "rename":
        return ["entry", how, name, rng.choice(["../" + name, name.upper(), "arrays/x9.npy"])]
    if how == "add":
        return ["entry", how, rng.choice(["arrays/const99.npy", "prebuilt/" + "0" * 32 + ".so",
                                          "kernels.c", "/etc/passwd"])]
    return ["entry", how, name]


def _ckpt_recipe(rng: random.Random, seed: bytes) -> list:
    i = rng.randrange(len(ckpt_entries(seed)))
    what = rng.choice(["dims", "dims", "type", "type", "cut", "grow", "fill", "fill", "name",
                       "swapname", "drop", "twice", "extra", "negate", "wrap"])
    value: Any = {
        "dims": lambda: rng.choice([[-1], [2 ** 31], [2 ** 63 - 1], [2 ** 32, 2 ** 32],
                                    [0], [], [1] * 40, [2 ** 64 - 1], [-2, -3], [3, 4, 5]]),
        "type": lambda: rng.choice(CKPT_TYPES),
        "cut": lambda: rng.choice([0, 1, 3]),
        "grow": lambda: rng.choice([1, 4, 4096]),
        "fill": lambda: rng.choice([math.nan, math.inf, -1, 2 ** 31, 1e300, 0]),
        "name": lambda: rng.choice(["", "x" * 5000, "\udcff\udcfe", "fc1.weight",
                                    "moments.fc1.weight", "../w"]),
        "swapname": lambda: rng.randrange(8),
        "drop": lambda: None,
        "twice": lambda: None,
        "negate": lambda: None,
        "wrap": lambda: None,
        "extra": lambda: rng.choice([[0x28, 0x01], [0x33, 0x34], [0x0F], [0x20, 0xFF]]),
    }[what]()
    return ["ckpt", i, what, value]


def recipes(kind: str, seed: bytes, stream: int, count: int) -> list[list]:
    """`count` recipes for `seed`, drawn from the stream numbered `stream` (the same numbers
    give the same recipes); about a third change bytes, the rest the structure."""
    rng = random.Random(f"{kind}/{stream}")
    out: list[list] = []
    seen: set[str] = set()
    while len(out) < count:
        if rng.random() < 0.35:
            recipe = _byte_recipe(rng, len(seed))
        elif kind == "ckpt":
            recipe = _ckpt_recipe(rng, seed)
        else:
            recipe = _zip_recipe(rng, seed)
        text = json.dumps(recipe)
        if text not in seen:
            seen.add(text)
            out.append(recipe)
    return out


def edge_recipes(kind: str, seed: bytes) -> list[list]:
    """Edge numbers in the places numbers go (every dimension, axis, index and size field of
    the manifest, every checkpoint tensor's dims), for the long run."""
    out: list[list] = []
    if kind == "ckpt":
        for i in range(len(ckpt_entries(seed))):
            out += [["ckpt", i, "dims", [v]] for v in EDGE_INTS]
            out += [["ckpt", i, "dims", [v, 2]] for v in EDGE_INTS]
            out += [["ckpt", i, "type", t] for t in CKPT_TYPES]
        return out
    manifest = document(read_zip(seed))
    numbers = [path for path in json_paths(manifest)
               if type(_get(manifest, path)) in (int, float) and "loc" not in path]
    for path in numbers:
        out += [["json", list(path), "set", v] for v in EDGE_INTS + [math.nan]]
    return out


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def forged(recipe: list) -> bool:
    """Whether the recipe changes what the file says (checksums recomputed, or a checkpoint,
    which has none) rather than damaging it."""
    return recipe[0] in ("json", "npy", "entry", "ckpt")


# -- the child --------------------------------------------------------------------------------
def _run_job(job: dict[str, Any], state: dict[str, Any]) -> tuple[str, str]:
    """("ran" | "wrong" | "hit" | "miss", detail) when the mutant loaded and ran; an exception
    otherwise."""
    if job["kind"] == "selftest":  # the harness's own test: the job does what it says
        from graphkernel.errors import FormatError
        how = job["how"]
        if how == "signal":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif how == "hang":
            time.sleep(3600)
        elif how == "raw":
            raise KeyError("a raw error")
        elif how == "refused":
            raise FormatError("a clear error")
        return "ran", ""
    import shutil

    import numpy as np

    import graphkernel
    from graphkernel import nn

    Block, CkptNet, fused = _nets()
    x = input_array()
    kind = job["kind"]
    if kind in ("gkir", "gkir_generic"):
        cell = nn.GraphCell(graphkernel.load(job["path"]))
        out = cell(graphkernel.Tensor(x)).asnumpy()
    elif kind == "ckpt":
        if "ckpt_net" not in state:
            state["ckpt_net"] = CkptNet()
        net = state["ckpt_net"]
        params = graphkernel.load_checkpoint(job["path"])
        not_loaded, _ = graphkernel.load_param_into_net(net, params)
        for _, param in net.parameters_and_names():
            if param.name in params and param.name not in not_loaded:
                got, said = param.asnumpy(), params[param.name].asnumpy()
                if not _holds(got, said):
                    return "wrong", (f"parameter {param.name} holds {got.ravel()[:3]} "
                                     f"({got.dtype}) where the file says {said.ravel()[:3]} "
                                     f"({said.dtype})")
        out = net(graphkernel.Tensor(x)).asnumpy()
    else:
        shutil.copyfile(job["path"], job["entry"])
        exe = graphkernel.compile(Block(), x, options=fused)
        out = exe.run_arrays(x)[0]
        note = exe.report.compile_cache.split(":")[0]  # hit or miss
    want = np.load(job["want"])
    same = out.shape == want.shape and np.array_equal(out, want, equal_nan=True)
    if not same and not job["forged"]:
        return "wrong", f"output {out.ravel()[:4]} differs from the seed's {want.ravel()[:4]}"
    if kind == "gkc":
        return f"{note}{'' if same else ', another result'}", ""
    return "ran", ""


def _holds(got: Any, said: Any) -> bool:
    """Whether a loaded parameter holds the checkpoint's values: exactly, or rounded when both
    are floats (MindSpore converts float32 to float16); never another number."""
    import numpy as np
    if got.dtype.kind == said.dtype.kind == "f":
        with np.errstate(all="ignore"):
            return bool(np.allclose(got.astype(np.float64), said.astype(np.float64), rtol=1e-3,
                                    atol=1e-7, equal_nan=True))
    return bool(np.array_equal(got, said))


def child(jobs_file: str) -> None:
    from graphkernel.errors import GraphKernelError

    with open(jobs_file) as fh:
        jobs = json.load(fh)
    state: dict[str, Any] = {}
    for job in jobs:
        try:
            status, detail = _run_job(job, state)
        except GraphKernelError as exc:
            status, detail = "refused", f"{type(exc).__name__}: {str(exc)[:200]}"
        except BaseException as exc:  # what the fuzzer looks for
            status, detail = "raw", f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps({"id": job["id"], "status": status, "detail": detail}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--seeds":
        print(json.dumps(make_seeds(sys.argv[2])))
    else:
        child(sys.argv[1])
