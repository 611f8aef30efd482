"""Pytree helpers: dotted-path flatten/unflatten and equinox-style partition/combine.

A params tree is nested dicts and lists of `mx.array`. Its flat form maps dotted paths
(`"encoder.layer.0.attention.self.query.weight"`) to leaves, as `mlx.utils.tree_flatten` does.
`partition` splits a tree into two sparse trees by a predicate on the path; `combine` merges
sparse trees back. Sparse lists keep their indices (missing entries are `{}`), so a partition of
`layers.3.*` still combines with the full `layers` list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlx.utils import tree_flatten, tree_map, tree_unflatten

Tree = Any
PathPredicate = Callable[[str, Any], bool]


def flatten(tree: Tree) -> dict[str, Any]:
    """Nested tree -> {dotted path: leaf}; order is the tree's own (depth first)."""
    return dict(tree_flatten(tree))


def unflatten(flat: dict[str, Any]) -> Tree:
    """{dotted path: leaf} -> nested tree (digit path parts become list indices).

    Dict keys are inserted in sorted path order, so trees built from the same leaves have the
    same leaf order whatever order the leaves came in (a checkpoint, a partition): reductions
    over leaves (the global gradient norm) then add in the same order and give identical bits.
    """
    if not flat:
        return {}
    return tree_unflatten(sorted(flat.items()))


def partition(tree: Tree, predicate: PathPredicate) -> tuple[Tree, Tree]:
    """Split `tree` into (selected, rest) sparse trees; `predicate(path, leaf)` picks selected."""
    flat = flatten(tree)
    selected = {k: v for k, v in flat.items() if predicate(k, v)}
    rest = {k: v for k, v in flat.items() if k not in selected}
    return unflatten(selected), unflatten(rest)


def combine(*trees: Tree) -> Tree:
    """Merge sparse trees into one; a path present in several trees is an error."""
    merged: dict[str, Any] = {}
    for tree in trees:
        for path, leaf in flatten(tree).items():
            if path in merged:
                raise ValueError(f"combine: path {path!r} is in more than one tree")
            merged[path] = leaf
    return unflatten(merged)


def map_leaves(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """`fn` applied leaf-wise over trees of the same structure."""
    return tree_map(fn, tree, *rest)


def count_params(tree: Tree) -> int:
    """Total number of scalar entries in the tree's arrays."""
    return sum(leaf.size for leaf in flatten(tree).values())
