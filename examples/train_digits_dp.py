"""Data-parallel training of the digits MLP over MPI, MindSpore's way:

    mpirun -n 2 --allow-run-as-root --oversubscribe .venv/bin/python \
        examples/train_digits_dp.py                                # half batches per rank
    .venv/bin/python examples/train_digits_dp.py --single      # one process, whole batches

Needs Open MPI (`apt-get install openmpi-bin libopenmpi-dev`) and the examples extra
(scikit-learn's digits, mpi4py): `.venv/bin/pip install -e '.[examples]'`. `--bucket-mb 1`
sends the gradients in buckets of 1 MB whose sums overlap the backward pass (the same weights).

`communication.init()` joins MPI's world, `set_auto_parallel_context(parallel_mode=
"data_parallel", gradients_mean=True)` makes TrainOneStepCell average its gradients over the
ranks (one AllReduce per step, one buffer per dtype) before the momentum update, so every rank
holds the same weights after every step, the weights one process gets on the whole batches.
Prints the loss per epoch, the held-out accuracy and the time per step after the first;
`--out PREFIX` saves each rank's final weights to PREFIX.rank<R>.npz (PREFIX.npz with --single).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_mlp import MLP, digits  # noqa: E402  (the example beside this one)

from graphkernel import Tensor, communication, context, nn  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", action="store_true", help="one process, no MPI")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--batch", type=int, default=64, help="the global batch")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", default=None, help="save the final weights under this prefix")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="send the gradients in buckets of at most this many MB, each "
                             "begun as soon as the backward pass has made it (overlap)")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers of --hidden units")
    args = parser.parse_args(argv)

    rank, size = 0, 1
    if not args.single:
        communication.init()
        rank, size = communication.get_rank(), communication.get_group_size()
        context.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True,
                                          grad_bucket_mb=args.bucket_mb)
    if args.batch % size:
        raise SystemExit(f"the global batch {args.batch} does not split over {size} ranks")
    share = args.batch // size
    context.set_context(enable_graph_kernel=True)
    x_train, y_train, x_test, y_test = digits(0)
    # The same initial weights on every rank.
    net = MLP(sizes=(64, *[args.hidden] * args.layers, 10), seed=0)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=args.lr, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    rng = np.random.default_rng(1)  # the same batch order on every rank
    steps, times = 0, []
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        losses = []
        for start in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[start:start + args.batch][rank * share:(rank + 1) * share]
            began = time.perf_counter()
            loss = step(Tensor(x_train[idx]), Tensor(y_train[idx]))
            losses.append(float(loss.asnumpy()))
            times.append(time.perf_counter() - began)
            steps += 1
            if args.steps is not None and steps >= args.steps:
                break
        if rank == 0:
            print(f"epoch {epoch}: mean loss of rank 0's shares {np.mean(losses):.4f}")
        if args.steps is not None and steps >= args.steps:
            break
    weights = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    if args.out:
        np.savez(f"{args.out}.npz" if args.single else f"{args.out}.rank{rank}.npz", **weights)
    if rank == 0:
        accuracy = float((net(Tensor(x_test)).asnumpy().argmax(axis=1) == y_test).mean())
        per_step = np.median(times[1:]) * 1e3 if len(times) > 1 else float("nan")
        print(f"{size} process(es), {share} rows each per step of {args.batch}: held-out "
              f"accuracy {accuracy:.4f}; {per_step:.3f} ms per step (median after the first, "
              f"{steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
