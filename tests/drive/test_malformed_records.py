"""Drive records written into the store by hand, not by nbdist (anyone who reaches the port can): a message the
follower refuses with its why, a refusal the driver reports as such. Real server, real TCP, two worlds in one
process."""

from __future__ import annotations

import json

import pytest

from nbdist.drive.follow import Drive, Follower, holder
from nbdist.errors import DriveError
from nbdist.world import keys, records
from nbdist.world.signing import SigningError
from nbdist.world.world import World

SECRET = "the world's secret"
BODY = "x = RANK\n"


@pytest.fixture
def pair(two_worlds):
    return two_worlds  # (rank 0, rank 1), both just joined


def _genuine(world: World, seq: int) -> dict[str, object]:
    """What the driver would send as message ``seq``, as the JSON object it writes."""
    drive = Drive("s0")
    drive.take(world)
    drive.publish(world, lambda: SECRET, "collective", BODY, {"timeout": 5.0}, world.turns.next())
    return json.loads(world.client.get_if(world.key(keys.drive(seq))) or "")


def test_a_genuine_message_reaches_the_follower_as_the_typed_record(pair):
    driver, world = pair
    follower = Follower(world, "s1", SECRET)
    sent = _genuine(driver, 1)
    got = follower.next()
    assert isinstance(got, records.Message) and got.as_dict() == sent
    assert (got.kind, got.source, got.flags, got.driver, got.number) == ("collective", BODY, {"timeout": 5.0}, 0, 1)


@pytest.mark.parametrize("change,why", [
    ({"seq": "1"}, "its 'seq' is \"1\", not a whole number"),
    ({"driver": -1}, "its 'driver' is -1, below 0"),
    ({"number": True}, "its 'number' is true, not a whole number"),
    ({"kind": "shell"}, "its 'kind' is \"shell\", not one of collective, barrier, release"),
    ({"flags": "--timeout 1"}, "its 'flags' is \"--timeout 1\", not a JSON object"),
    (None, "not a JSON object"),
])
def test_a_malformed_message_is_refused_with_its_why_and_the_driver_hears_of_it(pair, change, why):
    driver, world = pair
    drive = Drive("s0")
    drive.take(driver)
    follower = Follower(world, "s1", SECRET)
    fields = {"round": 0, "seq": 1, "driver": 0, "session": "s0", "kind": "collective", "source": BODY,
              "flags": {}, "gen": 0, "number": world.turns.next(), "t": 1.0, "sig": "00"}
    world.client.set(world.key(keys.drive(1)), "import os" if change is None else json.dumps({**fields, **change}))
    with pytest.raises(SigningError) as refused:
        follower.next()
    assert f"it is not a message nbdist sends ({why})" in str(refused.value), refused.value
    assert "Nothing of it ran" in str(refused.value)
    stored = records.Refusal.from_json(world.client.get_if(world.key(keys.DRIVE_REFUSED)))
    assert (stored.rank, stored.seq) == (1, 1) and why in stored.reason
    with pytest.raises(DriveError) as told:  # the driver's next message: the follower burned slot 1
        drive.publish(driver, lambda: SECRET, "collective", BODY, {}, driver.turns.next())
    assert f"rank 1 (h, pid 2) refused message #1 sent as from this notebook (it is not a message nbdist sends " \
           f"({why}))" in str(told.value), told.value


@pytest.mark.parametrize("text", ["garbage", "[]", "{}", json.dumps({"rank": "1", "seq": 1, "reason": "x"}),
                                  json.dumps({"rank": 1, "seq": -1, "reason": "x"}),
                                  json.dumps({"rank": 1, "seq": 1, "reason": None})])
def test_a_malformed_refusal_still_tells_the_driver_and_never_raises_a_key_or_type_error(pair, text):
    driver, world = pair
    drive = Drive("s0")
    drive.take(driver)
    driver.client.add(driver.key(keys.DRIVE_SEQ), 1)  # a slot burned, as a follower's refusal burns it
    driver.client.set(driver.key(keys.DRIVE_REFUSED), text)
    with pytest.raises(DriveError) as told:
        drive.publish(driver, lambda: SECRET, "collective", BODY, {}, driver.turns.next())
    assert "a follower refused a message sent as from this notebook and stopped following, but its refusal is " \
           "not one nbdist writes (" in str(told.value), told.value
    assert driver.client.get_if(driver.key(keys.DRIVE_REFUSED)) is None  # told once


def test_the_drive_claim_nbdist_writes_reads_back_as_written_and_is_the_text_it_gives_back():
    claim = records.DriveClaim(rank=0, session="s0")
    assert records.DriveClaim.from_json(claim.to_json()) == claim
    assert claim.to_json() == json.dumps({"rank": 0, "session": "s0"})  # as the version before compares and sets it


@pytest.mark.parametrize(("text", "why"), [
    ("garbage", "not a JSON object"),
    ("[0]", "not a JSON object"),
    (json.dumps({"session": "s0"}), "it has no 'rank'"),
    (json.dumps({"rank": "0", "session": "s0"}), "its 'rank' is \"0\", not a whole number"),
    (json.dumps({"rank": -1, "session": "s0"}), "its 'rank' is -1, below 0"),
    (json.dumps({"rank": 0}), "it has no 'session'"),
    (json.dumps({"rank": 0, "session": None}), "its 'session' is null, not text"),
])
def test_a_drive_claim_that_is_not_one_raises_naming_why_and_reads_as_held_by_no_one(text, why):
    with pytest.raises(records.MalformedRecord, match="^" + why.replace("[", r"\[") + "$"):
        records.DriveClaim.from_json(text)
    assert records.DriveClaim.read(text) is None and records.DriveClaim.read("") is None


@pytest.mark.parametrize("text", ["garbage", json.dumps({"rank": "0", "session": "s0"}), json.dumps({"rank": 0})])
def test_a_malformed_drive_claim_is_held_by_no_one_the_next_driver_takes_it_and_a_follower_reads_no_driver(pair,
                                                                                                             text):
    driver, world = pair
    world.client.set(world.key(keys.DRIVE_CLAIM), text)  # written by hand, by anyone who reached the port
    follower = Follower(world, "s1", SECRET)
    assert holder(world) is None
    follower._tick()  # the driver check: no driver is not a gone one
    drive = Drive("s0")
    drive.take(driver)
    assert drive.holding and holder(world) == records.DriveClaim(0, "s0")
