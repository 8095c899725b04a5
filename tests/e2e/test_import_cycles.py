"""No two comlrl modules import each other, directly or through others: imports inside functions count too."""

from __future__ import annotations

import grimp


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of a directed graph (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycle_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One import chain that leaves the component's first module and comes back to it."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
                if child == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(parents[chain[-1]])
                    return [*reversed(chain), start]
                if child in members and child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return component


def test_strongly_connected_finds_a_cycle_and_leaves_a_chain_apart():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    components = sorted(strongly_connected(edges))
    assert components == [["a", "b", "c"], ["d"], ["e"]]
    assert cycle_in(["a", "b", "c"], edges) == ["a", "b", "c", "a"]


def test_no_import_cycle_between_comlrl_modules():
    graph = grimp.build_graph("comlrl")
    edges = {
        module: {imported for imported in graph.find_modules_directly_imported_by(module) if imported in graph.modules}
        for module in graph.modules
    }
    cycles = [component for component in strongly_connected(edges) if len(component) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(
        f"  {component}: e.g. {' -> '.join(cycle_in(component, edges))}" for component in cycles
    )
