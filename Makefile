# flightwatch: live flight-time telemetry for load tests of event brokers.
# Tunables (override on the command line: make stream RUN=r1 BOOTSTRAP=kafka:9092)
PYTHON     ?= $(CURDIR)/.venv/bin/python
FLIGHTWATCH ?= $(CURDIR)/.venv/bin/flightwatch
RUN        ?= demo
BOOTSTRAP  ?= $(or $(FLIGHTWATCH_BOOTSTRAP),127.0.0.1:$(or $(FLIGHTWATCH_TELEMETRY_PORT),19092))
TOPIC      ?= flightwatch.telemetry
RATE       ?= 5000
DURATION   ?= 60s
PACE       ?=
TARGET     ?=
SUT        ?=
PAYLOAD    ?= 2048
WORKERS    ?= auto
MAX_INFLIGHT ?= 1000
TIMEOUT    ?= 30s
UI_PORT    ?= $(or $(FLIGHTWATCH_UI_PORT),18501)
OVERLAY    ?= small
PROMETHEUS_RELEASE ?=
DRY_RUN    ?=
SPARK_WORKERS ?= 2
PYTEST_ARGS ?=
TEST_WORKERS ?= 3
BROKER_WORKERS ?= 2
CLUSTER_WORKERS ?= 2
EXAMPLES   ?=
SOAK_ARGS  ?=
SCENARIO   ?=
LABEL      ?=
FAIL_ON_CHANGE ?=
WARMUP     ?=
COOLDOWN   ?=
NAME       ?=
SHORT      ?=
ONLY       ?=
PAIRS      ?=
BASELINE   ?=
GATE       ?=
FAIL_ON    ?=
ABORT_ON   ?=
# VENV_CACHE=DIR: the venv made in DIR, one per pyproject.toml and Python (its hash), and .venv a link to it, so that
# a fresh clone on the same machine finds its packages and the job's class archive made (CI sets it); pip re-points
# the editable install at this checkout, under a lock. The two newest are kept. One checkout at a time uses a venv.
VENV_CACHE ?=
VENV_LOCK  := $(if $(VENV_CACHE),flock "$(VENV_CACHE)/.lock")
# pip run by the venv's own path, not through the link: the scripts it writes (pytest, mkdocs) name their
# interpreter by that path, which outlives the clone
VENV_PIP   := $(if $(VENV_CACHE),"$$(readlink -f .venv)/bin/python",$(PYTHON)) -m pip

PACKAGES   := core runs agents streaming loadgen ui stack bench scenarios flightwatch
.DEFAULT_GOAL := help
.PHONY: docs docs-serve docs-shots scenario help install up down status ui stream replay summary demo lint test test-serial test-fast test-cluster test-brokers bench clean attack compare history deploy undeploy image spark-cluster test-faults soak workday

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

.venv/.installed: pyproject.toml
	@if [ -n "$(VENV_CACHE)" ]; then set -e; mkdir -p "$(VENV_CACHE)"; \
	  dir="$(VENV_CACHE)/venv-$$( (cat pyproject.toml; python3 -VV) | sha256sum | cut -c1-16)"; \
	  if [ -d .venv ] && [ ! -L .venv ]; then echo "VENV_CACHE: .venv is a folder of its own; kept (remove it to use the cache)"; \
	  else [ -x "$$dir/bin/python" ] || python3 -m venv "$$dir"; ln -sfn "$$dir" .venv; echo "the venv: .venv -> $$dir"; fi; fi
	test -x $(PYTHON) || python3 -m venv .venv
	$(VENV_LOCK) $(VENV_PIP) install -q --upgrade pip
	$(VENV_LOCK) $(VENV_PIP) install -q -e '.[test,docs]'
	touch $@
	@if [ -n "$(VENV_CACHE)" ]; then ls -t "$(VENV_CACHE)"/venv-*/.installed 2>/dev/null | tail -n +3 | xargs -r -n1 dirname | xargs -r rm -rf; fi

install: .venv/.installed ## create .venv and install the pinned dependencies; the project's bytecode compiled (every process of a run, a Spark worker too, imports it compiled: ~0.25 s of CPU less each where PYTHONDONTWRITEBYTECODE is set) and the job's JVM class archive built (core.classarchive: a job's start 5 s of CPU shorter)
	@$(PYTHON) -m compileall -q -j 0 $(PACKAGES) > /dev/null
	@$(PYTHON) -m stack.classarchive || echo "(the job starts without its class archive)"

up: install ## start the embedded stack on loopback (brokers, Prometheus, node exporter, receivers, node metrics); prints addresses (SUT=rabbitmq|rabbitmq-amqp1|artemis|kafka: that broker as the SUT)
	$(FLIGHTWATCH) up $(if $(SUT),--sut $(SUT))

down: ## stop exactly what `make up` started
	@test -x $(PYTHON) && $(PYTHON) -m stack down || true

status: ## what of the embedded stack is running
	$(FLIGHTWATCH) status

ui: install ## serve the dashboard on 127.0.0.1:$(UI_PORT) (opens on the live run, else the latest)
	$(FLIGHTWATCH) ui --server.port $(UI_PORT)

stream: install ## run the streaming job for RUN (results in checkpoints/RUN); SPARK_MASTER=spark://HOST:7077: on that Spark cluster (make spark-cluster)
	$(PYTHON) -m streaming run --run $(RUN) --bootstrap $(BOOTSTRAP) --topic $(TOPIC) $(if $(SPARK_MASTER),--master $(SPARK_MASTER))

replay: install ## recompute RUN from its archive into checkpoints/RUN/replay (DROP_TIMEOUT=10s WINDOW=500ms: into replay-drop10s-window500ms)
	$(FLIGHTWATCH) replay --run $(RUN) $(if $(DROP_TIMEOUT),--drop-timeout $(DROP_TIMEOUT)) \
		$(if $(WINDOW),--window $(WINDOW)) $(if $(WATERMARK_DELAY),--watermark-delay $(WATERMARK_DELAY))

summary: install ## print RUN's summary
	$(FLIGHTWATCH) summary --run $(RUN)

demo: up ## a synthetic run of known truth through the whole pipeline: 60 s at 1,000 events/s, with drops, duplicates, a 3 s pause and an OOM event (RUN)
	$(PYTHON) -m loadgen.synthetic --bootstrap $(BOOTSTRAP) --topic $(TOPIC) --run $(RUN) --rate 1000 --duration 60
	$(PYTHON) -m streaming run --run $(RUN) --bootstrap $(BOOTSTRAP) --topic $(TOPIC) --no-heartbeat --available-now
	$(PYTHON) -m streaming summary --run $(RUN)

attack: install ## attack the target (default: the stack's SUT broker, the one `make up SUT=` started or SUT=tansu|rabbitmq|rabbitmq-amqp1|artemis|kafka, restarted empty first; with TARGET=, no SUT broker is started) at RATE for DURATION, or PACE; streams the run (WARMUP=5s, COOLDOWN=1s: seconds sent and counted but left out of its latency figures; 0s unless given) (BASELINE=run or r1,r2,r3: then compares with it; SCENARIO=name: a series for `make history`; LABEL=v1.2: the build under test, named at a change; REPEAT=3: three runs one after the other, RUN-1 ... RUN-3, a baseline set; FAIL_ON='p99>500ms for 10s': exit 1 past it, ABORT_ON='p99>2s for 5s': stop the attack there, exit 3; TARGET=kafka://HOST:PORT/TOPIC: a receiver consumes it for the run unless the stack's does, NO_RECEIVER=1: yours do; a probe first: no receiver recorded it within PROBE_TIMEOUT=10s, exit 2 before the load)
	@set -e; for i in $$(seq 1 $(or $(REPEAT),1)); do \
	  $(FLIGHTWATCH) attack $(if $(PACE),--pace $(PACE),--rate $(RATE) --duration $(DURATION)) $(if $(SUT),--sut $(SUT)) \
	    $(if $(TARGET),--target $(TARGET)) --payload $(PAYLOAD) --workers $(WORKERS) --max-inflight $(MAX_INFLIGHT) \
	    --timeout $(TIMEOUT) --telemetry-bootstrap $(BOOTSTRAP) --telemetry-topic $(TOPIC) \
	    $(if $(NO_RECEIVER),--no-receiver) $(if $(PROBE_TIMEOUT),--probe-timeout $(PROBE_TIMEOUT)) \
	    $(if $(filter command line,$(origin RUN)),--run $(RUN)$(if $(REPEAT),-$$i)) $(if $(SCENARIO),--scenario '$(SCENARIO)') $(if $(LABEL),--label '$(LABEL)') \
	    $(if $(WARMUP),--warmup $(WARMUP)) $(if $(COOLDOWN),--cooldown $(COOLDOWN)) \
	    $(if $(BASELINE),--baseline $(BASELINE)) $(if $(GATE),--fail-on-regression '$(GATE)') \
	    $(if $(FAIL_ON),--fail-on '$(FAIL_ON)') $(if $(ABORT_ON),--abort-on '$(ABORT_ON)'); \
	done

scenario: install ## run a seed's experiment on the stack, one report (NAME=kafka-matrix; SUT=, SHORT=1: the CI's form; ONLY=payload=128,1024; PAIRS=1000; TARGET=http://...: bursts at your broker; PEER=1: the broker's own tool after each cell); `python -m scenarios list`
	$(if $(NAME),,$(error give NAME=<scenario>: $(shell $(PYTHON) -m scenarios list 2>/dev/null | cut -d' ' -f1 | tr '\n' ' ')))
	$(FLIGHTWATCH) scenario $(NAME) $(if $(SUT),--sut $(SUT)) $(if $(SHORT),--short) $(if $(PEER),--peer) $(if $(ONLY),--only $(ONLY)) \
	  $(if $(TARGET),--target $(TARGET)) $(if $(PAIRS),--only pairs=$(PAIRS))

compare: install ## is RUN worse than BASELINE beyond the noise? per figure and pace step, with 95% intervals (GATE='p99>+10%': exit 1 past it)
	$(if $(BASELINE),,$(error give BASELINE=<run> (and RUN=<run>): make compare BASELINE=r1 RUN=r2))
	$(FLIGHTWATCH) compare $(BASELINE) $(RUN) $(if $(GATE),--fail-on-regression '$(GATE)')

history: install ## a scenario's runs, their p50/p99/throughput and significant changes (SCENARIO=name; without it, the series there are; FAIL_ON_CHANGE=1: exit 1 on a recent regression, for CI)
	$(FLIGHTWATCH) history $(if $(SCENARIO),'$(SCENARIO)') $(if $(FAIL_ON_CHANGE),--fail-on-change)

lint: install ## the layers (import-linter contracts in pyproject.toml), ruff, and the CI workflows (actionlint)
	$(CURDIR)/.venv/bin/lint-imports --no-cache
	$(CURDIR)/.venv/bin/ruff check --no-cache .
	$(CURDIR)/.venv/bin/actionlint .github/workflows/*.yml

test: install lint ## the layers and lint, then the test suite (real broker, real Spark), TEST_WORKERS at once; the tests that need the machine to themselves are `make test-serial`
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial and not cluster and not brokers and not quickstart" $(PYTEST_ARGS)

test-quickstart: install ## the README's quick start as written (make attack RATE=5000, 60 s at 5,000/s, on a stack of its own): its figures need the machine, so CI runs it last
	$(PYTHON) -m pytest -m quickstart $(PYTEST_ARGS)

test-serial: install ## the tests whose figures need the machine to themselves (a relay's knee, timings, CPU hogs), one at a time; CI runs them after `make test`
	$(PYTHON) -m pytest -m "serial and not cluster and not brokers" $(PYTEST_ARGS) || test $$? -eq 5

test-brokers: install ## the seeds' real brokers (RabbitMQ from Debian's packages, over AMQP 0-9-1 and 1.0; Artemis and Apache Kafka from the Maven registry): runs, bad input, kill -9 of the broker; BROKER_WORKERS at once, the scenarios first (each worker starts its own brokers); the examples 10 s each (EXAMPLES=full: as their files say, 2,000/s for 30 s)
	$(if $(EXAMPLES),EXAMPLES=$(EXAMPLES)) $(PYTHON) -m pytest -n $(BROKER_WORKERS) --dist worksteal -m brokers $(PYTEST_ARGS)

test-cluster: install ## the cluster path: Spark standalone clusters, and (as root) seven hosts stood in for by network namespaces, with faults, skewed clocks and limits; on CLUSTER_WORKERS (2), in two shares balanced by their times (tests/conftest.py CLUSTER_SHARES), ~11-13 minutes
	$(PYTHON) -m pytest -m cluster $(if $(filter-out 1,$(CLUSTER_WORKERS)),-n $(CLUSTER_WORKERS) --dist loadfile) $(PYTEST_ARGS)

test-faults: install ## the fault suite alone: kill -9 of job, receivers and load generator, broker away, fuzzing
	$(PYTHON) -m pytest -m faults $(PYTEST_ARGS)

docs: install ## the documentation site into site/ (mkdocs --strict: a broken link or a missing page fails), its reference pages generated from the code
	NO_MKDOCS_2_WARNING=1 $(CURDIR)/.venv/bin/mkdocs build --strict --quiet

docs-serve: install ## the documentation site on http://127.0.0.1:8000/, rebuilt as you edit
	NO_MKDOCS_2_WARNING=1 $(CURDIR)/.venv/bin/mkdocs serve --dev-addr 127.0.0.1:8000

docs-shots: install ## the documentation's screenshots (docs/img/), from the dashboard's browser test in Debian's chromium
	DOCS_SHOTS=$(CURDIR)/docs/img $(PYTHON) -m pytest -p no:cacheprovider tests/ui/test_app.py -k real_browser

test-fast: install ## the tests that need neither broker nor Spark
	$(PYTHON) -m pytest -n $(TEST_WORKERS) -m "not integration" $(PYTEST_ARGS)

soak: up ## 15 minutes at 2,000 events/s through the stack (MINUTES=30 RATE=5000, or SOAK_ARGS); memory of every process, engine state, completeness
	$(PYTHON) -m bench.soak $(if $(MINUTES),--minutes $(MINUTES)) $(if $(filter command line,$(origin RATE)),--rate $(RATE)) $(SOAK_ARGS)

workday: install ## a day of testing, compressed: make up, 9 attacks over 45 minutes with idle stretches, every process's CPU, memory and logs (SHORT=1: 6 minutes, 3 runs)
	$(PYTHON) -m bench.workday $(if $(SHORT),--short) $(if $(MINUTES),--minutes $(MINUTES))

bench: install ## benchmarks: flightwatch's own footprint, a job's start with and without its JVM class archive, wire encodings, what saying where each event arrived costs, load generator vs hey, HTTP receiver vs wrk, pipeline at rising rates, the executors' join state (commit protocol vs Spark's state store), the join per core and its projection for 1M events/s, replay speed, verdict lag and false alarms, run comparison's false alarms and power, its calibration with run-to-run effects (false alarms, detection, coverage), change-point detectors, each transport's generator beside the broker's own tool (RabbitMQ PerfTest, artemis perf, kafka-producer-perf-test)
	$(PYTHON) -m bench.footprint
	$(PYTHON) -m bench.jobstart
	$(PYTHON) -m bench.encoding
	$(PYTHON) -m bench.where
	$(PYTHON) -m bench.loadgen
	$(PYTHON) -m bench.receiver
	$(PYTHON) -m bench.pipeline
	$(PYTHON) -m bench.pipeline --cluster 2 --rates 5000,20000
	$(PYTHON) -m bench.state_store
	$(PYTHON) -m bench.join
	$(PYTHON) -m bench.replay
	$(PYTHON) -m bench.verdict
	$(PYTHON) -m bench.compare
	$(PYTHON) -m bench.calibrate
	$(PYTHON) -m bench.changepoints
	$(PYTHON) -m bench.transports

spark-cluster: install ## a Spark standalone master + SPARK_WORKERS workers on 127.0.0.1:7077 (then: make stream SPARK_MASTER=spark://127.0.0.1:7077)
	$(PYTHON) -m stack.spark up --workers $(SPARK_WORKERS)

deploy: install ## apply deploy/overlays/OVERLAY to the current Kubernetes cluster, STORAGE_CLASS a ReadWriteMany class (DRY_RUN=1: only print what it would apply; NODE_EXPORTER=1: with our node exporter, for a cluster without one; PROMETHEUS_RELEASE: kube-prometheus-stack's Helm release name)
	$(PYTHON) -m stack.deploy apply --overlay $(OVERLAY) $(if $(STORAGE_CLASS),--storage-class $(STORAGE_CLASS)) $(if $(DRY_RUN),--dry-run) \
	  $(if $(NODE_EXPORTER),--node-exporter) $(if $(PROMETHEUS_RELEASE),--prometheus-release $(PROMETHEUS_RELEASE))

image: install ## build the two images (deploy/Dockerfile) with docker, podman or buildah, whichever is here (REGISTRY, TAG, PUSH=1: then deploy/overlays/pushed names them by digest, on OVERLAY)
	$(PYTHON) -m stack.image $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(TAG),--tag $(TAG)) $(if $(PUSH),--push) \
	  $(if $(filter command line,$(origin OVERLAY)),--overlay $(OVERLAY))

undeploy: install ## delete what `make deploy` applied (DRY_RUN=1: only print it)
	$(PYTHON) -m stack.deploy delete --overlay $(OVERLAY) $(if $(STORAGE_CLASS),--storage-class $(STORAGE_CLASS)) $(if $(DRY_RUN),--dry-run) \
	  $(if $(NODE_EXPORTER),--node-exporter)

clean: ## remove run folders and the stack's state (not the venv); refused while the stack or a run is up
	@if test -x $(PYTHON); then $(PYTHON) -m stack clean; else rm -rf checkpoints/*/ .stack; fi
