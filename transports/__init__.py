"""The transports, one package each: what sends a run's events over a protocol (its target) and what receives them
(its receiver's source), with the protocol's own parts beside them (a codec, an engine, a server). Below the
components: the load generator, the agents, the stack and the scenarios import them; a transport imports only the
core and the shared parts here (``base``: the target's contract, ``errors``, ``spec``: a target's URL; ``amqp``:
both AMQP transports' addresses and helpers). ``transports.registry`` is where they are registered.

    transports/http/      CloudEvents over HTTP: target, receiver, server (the sink's HTTP/1.1 framing)
    transports/kafka/     the Kafka protocol: target, receiver
    transports/amqp091/   AMQP 0-9-1 (RabbitMQ): target, receiver
    transports/amqp1/     AMQP 1.0 (Artemis, RabbitMQ's plugin, Dispatch Router): target, receiver, codec, engine
"""
