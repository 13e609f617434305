"""Every store key is built by nbdist.world.keys: the layout it documents, and no key written by hand elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nbdist.world import keys
from nbdist.world.world import World, step_name

PACKAGE = Path(keys.__file__).resolve().parent.parent
# The store client's operations that take keys, and World.key, which puts a name under the world's round.
TAKES_KEYS = {"set", "get", "get_if", "get_json_if", "set_json", "add", "check", "compare_set", "append", "wait",
              "delete", "multi_get", "key", "_key"}


@pytest.mark.parametrize(("built", "expected"), [
    (keys.in_round(3, keys.TURN), "r/3/turn"),
    (keys.in_round(3, keys.rank(1)), "r/3/rank/1"),
    (keys.heartbeat("abc"), "hb/abc"),
    (keys.arrival(7), "t/7/in"),
    (keys.arrivals(keys.arrival(7)), "t/7/in/n"),
    (keys.state(keys.arrival(7)), "t/7/in/state"),
    (keys.record(step_name(7), 2), "t/7/src/2"),
    (keys.failed(keys.step(7)), "t/7/failed"),
    (keys.ending(keys.step(7)), "t/7/out"),
    (keys.state(keys.ending(keys.step(7))), "t/7/out/state"),
    (keys.out(keys.step(7), 1), "t/7/out/1"),
    (keys.live(keys.step(7), 1), "t/7/live/1"),
    (keys.member(keys.compared(keys.step(7), "0", 4), 1), "t/7/fp/0/4/1"),
    (keys.compared(keys.step(7), "0", 4).startswith(keys.comparing(keys.step(7))), True),
    (keys.member(keys.init_build(keys.step(7), 2), 0), "t/7/init/2/0"),
    (keys.plain_failed(4), "plain/failed/4"),
    (keys.drive(9), "drive/9"),
    (keys.stop(2), "stop/2"),
    (keys.pdb_ask(3), "pdb/3/ask"),
    (keys.pdb_out(3, 1), "pdb/3/out/1"),
    (keys.pdb_in(3, 1), "pdb/3/in/1"),
    (keys.bp_ask(3), "bp/3/ask"),
    (keys.pdb_out(3, 1, "bp"), "bp/3/out/1"),
    (keys.pdb_in(3, 1, "bp"), "bp/3/in/1"),
])
def test_the_keys_are_the_layout_the_module_documents(built: object, expected: object) -> None:
    assert built == expected
    if isinstance(built, str) and not built.startswith(("r/", "hb/")):
        head = built.split("/")[0]
        assert head in keys.__doc__, f"{head}: not in nbdist.world.keys' table"


def test_a_world_puts_names_under_its_round() -> None:
    world = World.__new__(World)
    world.round = 5
    assert world.key(keys.last(2)) == "r/5/last/2"


def _hand_built(node: ast.AST) -> str | None:
    """A key spelt out in the call: a string, or an f-string, with a ``/`` in its own text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "/" in node.value:
        return node.value
    if isinstance(node, ast.JoinedStr) and any(
            isinstance(part, ast.Constant) and "/" in str(part.value) for part in node.values):
        return ast.unparse(node)
    if isinstance(node, ast.List | ast.Tuple):
        return next((found for item in node.elts if (found := _hand_built(item)) is not None), None)
    if isinstance(node, ast.ListComp):
        return _hand_built(node.elt)
    return None


def hand_built_keys(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "keys.py" and path.parent.name == "world":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = ast.unparse(node.func.value)
            if node.func.attr not in TAKES_KEYS or not (node.func.attr in ("key", "_key") or "client" in receiver):
                continue
            for arg in node.args[:1]:
                text = _hand_built(arg)
                if text is not None:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {text}")
    return found


def test_no_key_is_built_by_hand_outside_the_keys_module() -> None:
    assert hand_built_keys(PACKAGE) == [], "build these with nbdist.world.keys"


def test_the_scan_finds_a_key_built_by_hand(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text('def f(world, client, n):\n    world.client.set(world.key(f"t/{n}/x"), "1")\n'
                                  '    client.check([f"r/{n}/ready"])\n    client.get_if("round")\n')
    assert {line.split(": ", 1)[1] for line in hand_built_keys(package)} == {"f't/{n}/x'", "f'r/{n}/ready'"}
