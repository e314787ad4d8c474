"""Links to the dashboard that open what they name: ``?run=RUN``, ``?run=RUN&compare=BASELINE``,
``?scenario=SCENARIO_RUN`` (``ui.app`` reads them, and keeps the URL in step as the user changes the view)."""
from __future__ import annotations

from urllib.parse import urlencode

from core import settings


def dashboard(host: str = "127.0.0.1", **names: str | None) -> str:
    """The dashboard's URL (``FLIGHTWATCH_UI_PORT``) with ``run``, ``compare`` or ``scenario`` as its query."""
    port = int(settings.get("FLIGHTWATCH_UI_PORT", "18501"))
    query = urlencode({k: v for k, v in names.items() if v})
    return f"http://{host}:{port}/" + (f"?{query}" if query else "")
