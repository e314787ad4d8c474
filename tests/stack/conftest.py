"""The deployment tests' shared fixture: the manifests every overlay renders to (kustomize through kubectl)."""
from __future__ import annotations

import pytest
from support.manifests import WITH_NODE_EXPORTER

from stack import deploy


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """Every overlay, and the small one with flightwatch's node exporter."""
    return {**{o: deploy.render(o) for o in deploy.overlays()}, WITH_NODE_EXPORTER: deploy.render("small", node_exporter=True)}
