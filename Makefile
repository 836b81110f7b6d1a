# Velocity's entry points. `make help` lists them.
SHELL := /bin/bash
VENV := .venv/bin
DEMO_EVENTS ?= 200000
DEMO_DIR ?= data/demo

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: ## install Python packages (.venv), Delta JARs (.cache/jars), Java, Redis
	@bash infra/setup.sh

demo: setup ## set up, start Redis, stream generated events live with the sample rules, show alerts
	@bash infra/demo.sh

backtest-demo: setup ## set up, generate 200k sample events, backtest the sample rules
	@$(VENV)/velocity generate --out $(DEMO_DIR)/events --events $(DEMO_EVENTS) --rate 50 \
		--keys 20000 --files 4 --spike-fraction 0.01 --late-fraction 0.01 \
		--duplicate-fraction 0.005 --malformed-fraction 0.005 --seed 7 --overwrite
	@$(VENV)/velocity backtest --rules jobs/velocity/resources/sample_rules.json \
		--events $(DEMO_DIR)/events --out $(DEMO_DIR)/alerts.jsonl

test: ## set up (with chromium for the browser tests), lint, build the docs (--strict), and run every test
	@VELOCITY_SETUP_BROWSER=1 bash infra/setup.sh
	@# ruff and the docs build at once (seconds), each one's failure reported; then the tests,
	@# and mypy beside them at a lower priority (most of a minute of one core on a fresh
	@# clone, when the other was idle), its verdict printed after theirs: either fails the run.
	@$(VENV)/ruff check jobs tests plugins dags benchmarks examples tools & ruff=$$!; \
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict --quiet & docs=$$!; \
	failed=0; for check in $$ruff $$docs; do wait $$check || failed=1; done; exit $$failed
	@typed=$$(mktemp); nice -n 10 $(VENV)/mypy > $$typed 2>&1 & mypy=$$!; \
	$(VENV)/python -m pytest tests; tests=$$?; \
	wait $$mypy; types=$$?; echo "mypy: $$(cat $$typed)"; rm -f $$typed; \
	[ $$tests -eq 0 ] && [ $$types -eq 0 ]

docs: setup ## regenerate the reference pages from the code, build the documentation site into site/ (--strict)
	@$(VENV)/python -m tools.reference_docs --write docs/reference
	@NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict

docs-serve: setup ## the documentation site on http://127.0.0.1:8000, rebuilt as pages change
	@NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs serve --dev-addr 127.0.0.1:8000

lint: setup ## ruff and mypy
	@$(VENV)/ruff check jobs tests plugins dags benchmarks examples tools
	@$(VENV)/mypy

bench: setup ## backtest throughput for 1M events and 8 rules; RULES=file, BEFORE=checkout, KEEP_STATE=1 (Delta bytes per bucket); ARGS= (every bench*: more options, e.g. a size)
	@$(VENV)/python -m benchmarks.backtest $(if $(RULES),--rules $(RULES)) $(if $(BEFORE),--before $(BEFORE)) $(if $(KEEP_STATE),--keep-state) $(ARGS)

bench-cooldown: setup ## alerts vs notified alerts per hour, sample and fire-often rules, 10-minute cooldown (150 events/s, 3,000 payers)
	$(VENV)/python -m benchmarks.cooldown $(ARGS)

bench-cases: setup ## the case queue's read of 600k alerts' cases: the whole fold against the incremental one; a fresh process's first look with the case snapshot and without
	@$(VENV)/python -m benchmarks.cases $(ARGS)

bench-kernel: setup ## the decision kernel alone on 1M synthetic events (sample and fire-often rules), and the reference
	@$(VENV)/python -m benchmarks.kernel --reference 100000 $(ARGS) && \
		$(VENV)/python -m benchmarks.kernel --rules benchmarks/rules/fire_often.json --reference 100000 $(ARGS)

bench-peer: setup ## velocity backtest against its Flink 2.3 peer (benchmarks/peers/flink) on the same 1M events, sample and fire-often rules: seconds, ratio, identical alerts; EVENTS=n, RULES=sample|fire-often|file, RUNS=n
	@mvn -q -B -f benchmarks/peers/flink/pom.xml -Dmaven.repo.local=$(CURDIR)/.cache/m2 package
	@$(VENV)/python -m benchmarks.peer $(if $(EVENTS),--events $(EVENTS)) $(if $(RULES),--rules $(RULES)) \
		$(if $(RUNS),--runs $(RUNS)) $(ARGS)

bench-cluster: setup ## backtest throughput on local[2] vs the two-worker standalone cluster, same events
	@bash infra/cluster.sh up
	@$(VENV)/python -m benchmarks.backtest --baseline-events 0 \
		--master 'local[2]' --master spark://127.0.0.1:$${VELOCITY_CLUSTER_PORT:-7077} $(ARGS); \
		status=$$?; bash infra/cluster.sh down; exit $$status

cluster: setup ## start a Spark standalone cluster on 127.0.0.1:7077 (master + 2 one-core workers)
	@bash infra/cluster.sh up

cluster-down: ## stop the Spark standalone cluster
	@bash infra/cluster.sh down

bench-stream: setup ## stream latency (alert in Redis - landed/produced), throughput; SOURCE=folder|kafka|both, REDIS=single|cluster|both, RULES=file, LAG_SECONDS=s (SOURCE=kafka: partition 0 s late; late/out-of-order events, velocity backfill --late)
	@if [ -n "$(RATE)" ]; then \
		$(VENV)/python -m benchmarks.stream --rate $(RATE) --seconds $(or $(SECONDS),300) \
			--keys $(or $(KEYS),100000) --design $(or $(DESIGN),new) --source $(or $(SOURCE),folder) \
			--redis $(or $(REDIS),single) $(if $(RULES),--rules $(RULES)) \
			$(if $(LAG_SECONDS),--lag-partition-seconds $(LAG_SECONDS)) $(ARGS); \
	elif [ -n "$(SOURCE)" ]; then \
		$(VENV)/python -m benchmarks.stream --rate 1000 --seconds 60 --keys 100000 --source $(SOURCE) \
			$(if $(LAG_SECONDS),--lag-partition-seconds $(LAG_SECONDS)) && \
		$(VENV)/python -m benchmarks.stream --rate 20000 --seconds 60 --keys 100000 --source $(SOURCE) \
			$(if $(LAG_SECONDS),--lag-partition-seconds $(LAG_SECONDS)); \
	else \
		$(VENV)/python -m benchmarks.stream --rate 1000 --seconds 60 --keys 100000 --design both && \
		$(VENV)/python -m benchmarks.stream --rate 1000 --seconds 300 --keys 100000 && \
		$(VENV)/python -m benchmarks.stream --rate 20000 --seconds 60 --keys 100000; \
	fi

bench-stream-steps: setup ## per-event cost of each stream step without Spark (real Redis)
	@$(VENV)/python -m benchmarks.stream_steps $(ARGS)

bench-lookup: setup ## Redis window lookup latency, dense keys at g = 1 s and 60 s; before/now
	@$(VENV)/python -m benchmarks.lookup $(ARGS)

bench-check: setup ## pre-authorization check latency (FCALL_RO, HTTP when built) at 2,000 checks/s while the stream runs at 1,000 payments/s, sample and fire-often rules; the checks/s one Redis sustains at p99 <= 2 ms
	@$(VENV)/python -m benchmarks.check $(ARGS)

bench-page: setup ## every page and API read of the Velocity page (and its clicks) from an HTTP client after 10k and after 10M alerts stored, with the stream at 1,000 payments/s (2,000 alerts/s) beside it: p50/p95/max ms, and the stream's alert p99 with a click every second and without; ARGS="--sizes 10000,1000000 --stream-seconds 300" (--stream-rate 0: nothing streams)
	@$(VENV)/python -m benchmarks.page $(ARGS)

bench-browser: setup ## the browser's storm test (click to the result on screen, during 2,000 payments/s firing two rules) with 10M alerts stored before it; BENCH_ALERTS=10000000
	VELOCITY_BROWSER_STORED_ALERTS=$${BENCH_ALERTS:-10000000} $(VENV)/pytest tests/browser/test_velocity_queue.py -k storm -s -p no:cacheprovider

bench-window: setup ## velocity buckets vs Spark's sliding window(): throughput and state size
	@$(VENV)/python -m benchmarks.window_compare $(ARGS)

soak: setup ## every fault together: the stream on Kafka at 1,000 payments/s for MINUTES (30) while it is SIGKILLed, a decider killed, Redis restarted and flushed, the broker restarted, maintain_state and a backfill run and cases closed, each EACH (2) times; then what held (exit 1: a check failed)
	@$(VENV)/python -m tools.soak --minutes $(or $(MINUTES),30) --each $(or $(EACH),2) $(ARGS)

airflow: setup ## start Redis and Airflow standalone (UI on 127.0.0.1:8790) with the DAGs
	@$(VENV)/velocity up
	@bash infra/airflow.sh up

airflow-down: ## stop Airflow standalone
	@bash infra/airflow.sh down

bench-backfill: setup ## backfill replay of a day of 1M events; compaction time and files
	@$(VENV)/python -m benchmarks.backfill --events $(or $(EVENTS),1000000) $(ARGS)

bench-smoke: setup ## every bench* target at a tiny size, its figures checked for shape (not speed); a table of target, seconds, verdict
	@$(VENV)/python -m benchmarks.smoke

down: ## stop the local Redis and Kafka broker
	@$(VENV)/velocity down

clean: ## remove generated data (keeps .venv and the JAR cache)
	rm -rf data

.PHONY: help setup demo backtest-demo test docs docs-serve lint bench bench-cooldown bench-cases bench-kernel bench-peer bench-cluster cluster cluster-down bench-stream bench-stream-steps bench-lookup bench-check bench-page bench-browser bench-window bench-backfill bench-smoke soak down clean airflow airflow-down
