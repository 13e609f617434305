"""The words of ``%dist_init``'s summary and of ``%dist_status``' and ``%dist_workers``' tables (pure)."""

from __future__ import annotations

from typing import Any


def version_note(ranks: list[dict[str, Any]]) -> str:
    notes = []
    for key in ("torch", "nbdist"):
        values = {str(r.get(key)) for r in ranks}
        if len(values) > 1:
            notes.append(f"warning: {key} versions differ between ranks ({', '.join(sorted(values))})")
    return "; ".join(notes)


def replaced_note(world: Any) -> str:
    if world is None or world.replaced is None:
        return ""
    old = world.replaced
    return (f" rejoined in place of pid {old.pid} on {old.host}, which stopped responding; "
            "every rank rebuilds the process group at its next %%collective")


def worker_state(row: dict[str, Any]) -> str:
    if row.get("down"):
        return f"left down: {row['down']}; {row.get('after_down', '')}".rstrip("; ")
    if not row["alive"]:
        return "exited, starting again" if row.get("exits") else "exited"
    if row["failed"]:
        return f"failed to join: {row['failed']}"
    return "joined, following" if row["joined"] else "starting"


def alive(row: dict[str, Any]) -> str:
    age = row["heartbeat_age"]
    if row.get("gone"):
        return "NO: its kernel is gone"
    if age is None:
        return "no heartbeat"
    if row["alive"] and row.get("busy", 0.0) > 2:
        return f"yes, busy for {row['busy']:.0f} s (its Python is inside one long call)"
    return f"{'yes' if row['alive'] else 'NO'} (heartbeat {age:.1f} s ago)"


def last_cell(row: dict[str, Any]) -> str:
    if not row["last"]:
        return ""
    return f"{row['last']} ({row['last_age']:.0f} s ago)"
