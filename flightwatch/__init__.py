"""The ``flightwatch`` command (``flightwatch.cli``): one entry to every component's own command."""
