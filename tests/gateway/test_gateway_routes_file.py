"""The routes file may be missing: the gateway starts with no routes and follows the file when it appears."""
import json

from sluice_gateway.reloader import RoutesReloader

TABLE = {"version": 1, "generation": 4, "routes": {"chat": {"backends": [
    {"name": "m", "servedModelName": "m", "weight": 1, "endpoints": ["http://127.0.0.1:1"]}]}}}


def test_a_missing_file_is_an_empty_table_until_it_appears_and_again_once_it_goes(tmp_path):
    path = tmp_path / "routes" / "routing-table.json"
    applied = []
    reloader = RoutesReloader(path, 1.0, applied.append, lambda: None)
    assert reloader.load_now().routes == {}

    reloader.check()
    assert applied == [], "nothing changed"
    path.parent.mkdir()
    path.write_text(json.dumps(TABLE))
    reloader.check()
    assert [t.generation for t in applied] == [4] and "chat" in applied[0].routes

    path.unlink()
    reloader.check()
    assert len(applied) == 2 and applied[1].routes == {}
