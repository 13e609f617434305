"""The session is the composition of its parts (nbdist.session): each attribute the magics, the extension and the
layers below use reads and sets the part that holds it. No kernel: a session as the explorer makes one."""

from __future__ import annotations

from nbdist.session import Held, Session
from nbdist.world import keys
from nbdist.world.link import StoreLink


def held() -> dict[str, Held]:
    return {name: value for name, value in vars(Session).items() if isinstance(value, Held)}


def test_every_name_the_session_keeps_is_an_attribute_of_the_part_that_holds_it():
    session = Session(None)
    assert held(), "the session holds nothing through its parts"
    for name, attribute in held().items():
        part = getattr(session, attribute.part)
        assert name in vars(part), f"Session.{name}: {type(part).__name__} has no {name}"


def test_setting_an_attribute_on_the_session_sets_it_on_its_part_and_only_there():
    session = Session(None)
    world, view, workers = object(), "ranks", object()
    session.world, session.view, session.workers, session.pg_timeout = world, view, workers, 5.0
    assert session.link.world is world and session.world is world
    assert session.cell_turn.view == view and session.driving.workers is workers and session.backend.pg_timeout == 5.0
    assert not {"world", "view", "workers", "pg_timeout"} & set(vars(session))


def test_a_link_leaves_its_world_once_the_others_see_it_and_leaving_again_does_nothing(two_worlds):
    leaving, other = two_worlds
    link = StoreLink()
    link.world = leaving
    link.leave_world()
    assert link.world is None
    assert other.client.check([other.key(keys.left(leaving.rank))])  # real store: the other rank sees it left
    link.leave_world()
    link.disconnect()
    link.stop_server()
    assert (link.client, link.watch_client, link.heartbeat, link.server) == (None, None, None, None)
