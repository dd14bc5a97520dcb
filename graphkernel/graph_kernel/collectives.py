"""Where the non-blocking collectives run: each AllReduceStart right after the last of its
tensors is made, each AllReduceWait (with the GetItems of its results) right before the first
use of what it returns. Between the two, the sum travels while the kernels in between run: a
bucket of the last layers' gradients while the backward pass computes the first layers'
(nn.DistributedGradReducer with buckets; ir/opdefs/collective.py). Fusion orders nodes by its
own topological sort, so this runs last, on the graph that runs."""
from __future__ import annotations

from graphkernel.ir.graph import Graph


def schedule_collectives(graph: Graph) -> Graph:
    """Move starts as early and waits as late as their data allows (a topological order
    still: a start after its inputs' producers, a wait before its results' users)."""
    if not any(n.op in ("AllReduceStart", "AllReduceWait") for n in graph.nodes):
        return graph
    nodes = list(graph.nodes)
    # A tuple's items first, right after the node making it (GetItem runs nothing: it names
    # one result), so that a start reading one need not wait for a later GetItem.
    for item in [n for n in nodes if n.op == "GetItem"]:
        nodes.remove(item)
        position = {n.uid: i for i, n in enumerate(nodes)}
        made = position.get(item.inputs[0].uid)
        nodes.insert(len(nodes) if made is None else made + 1, item)
    for start in [n for n in nodes if n.op == "AllReduceStart"]:
        nodes.remove(start)
        produced = {n.uid: i for i, n in enumerate(nodes)}
        ready = max((produced[v.uid] for v in start.inputs if v.uid in produced), default=-1)
        nodes.insert(ready + 1, start)
    users = graph.users()
    leaving = {v.uid for v in graph.results()}
    # Last wait first, so that each one moves past the waits after it where it may.
    for wait in reversed([n for n in nodes if n.op == "AllReduceWait"]):
        items = [u for u in users.get(wait.uid, []) if u.op == "GetItem"]
        for node in [*items, wait]:
            nodes.remove(node)
            position = {n.uid: i for i, n in enumerate(nodes)}
            first = min((position[u.uid] for u in users.get(node.uid, []) if u.uid in position),
                        default=len(nodes))
            if node.uid in leaving:
                first = min(first, len(nodes))
            nodes.insert(first, node)
    graph.nodes = nodes
    return graph
