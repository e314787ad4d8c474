"""The read side: what reads a run folder back, for the dashboard, the load generator's report, the job's own
summary and anyone else. Its files (``reader``), the window table and its figures (``table``), the run's markers
(``runinfo``), results and summary (``results``), the saturation verdict a reader applies to a window table
(``saturation`` judges each window, ``verdict`` the run), and comparisons of runs (``compare``, ``bootstrap``,
``history``). It imports only ``core``: reading a run needs no Spark."""
