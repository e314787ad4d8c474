"""``core.links``: the dashboard's links that open what they name (``ui.app`` reads them: tests/ui/test_app.py)."""
from core import links


def test_a_link_names_the_run_the_comparison_or_the_scenario(monkeypatch):
    monkeypatch.setenv("FLIGHTWATCH_UI_PORT", "18777")
    assert links.dashboard() == "http://127.0.0.1:18777/"
    assert links.dashboard(run="killkafka") == "http://127.0.0.1:18777/?run=killkafka"
    assert links.dashboard(run="a/replay-drop2s", compare="b") == "http://127.0.0.1:18777/?run=a%2Freplay-drop2s&compare=b"
    assert links.dashboard(scenario="scenario-kafka-matrix-20261129-120000", run=None) == \
        "http://127.0.0.1:18777/?scenario=scenario-kafka-matrix-20261129-120000"
