"""The routes file may be missing: the gateway starts with no routes and follows the file when it appears."""
import json

from sluice_contracts.routing_table import RoutingTable, RoutingTableError
from sluice_gateway.files.kept_in_force import FollowedFile
from sluice_gateway.routing_table import load_routing_table

TABLE = {"version": 1, "generation": 4, "routes": {"chat": {"backends": [
    {"name": "m", "servedModelName": "m", "weight": 1, "endpoints": ["http://127.0.0.1:1"]}]}}}


def routes_follower(path, apply, rejected):
    """The routing table as the gateway follows it (files/gateway_files.py)."""
    return FollowedFile("routing table", path, load_routing_table, apply, errors=(RoutingTableError,),
                        without_it="not ready until a valid table arrives", rejected=rejected, when_missing=RoutingTable)


def test_a_missing_file_is_an_empty_table_until_it_appears_and_again_once_it_goes(tmp_path):
    path = tmp_path / "routes" / "routing-table.json"
    applied = []
    reloader = routes_follower(path, applied.append, lambda: None)
    reloader.check()
    assert applied[0].routes == {} and reloader.in_force, "no file yet: an empty table, and that is fine"

    reloader.check()
    assert len(applied) == 1, "nothing changed"
    path.parent.mkdir()
    path.write_text(json.dumps(TABLE))
    reloader.check()
    assert [t.generation for t in applied[1:]] == [4] and "chat" in applied[1].routes

    path.unlink()
    reloader.check()
    assert len(applied) == 3 and applied[2].routes == {}


def test_a_malformed_first_table_is_not_in_force_until_it_is_fixed(tmp_path):
    path = tmp_path / "routing-table.json"
    path.write_text("{ not json")
    applied, rejected = [], []
    reloader = routes_follower(path, applied.append, lambda: rejected.append(1))
    reloader.check()
    assert applied == [] and not reloader.in_force and "neither JSON nor YAML" in reloader.problem
    assert rejected == [1]

    path.write_text(json.dumps(TABLE))
    reloader.check()
    assert reloader.in_force and reloader.problem is None and applied[0].generation == 4
