# mqserver: `make run` starts a broker on the defaults, `make test` runs every test.
# Both create the virtualenv in .venv and install the project into it when needed: `make
# run` the broker alone, the other targets with the test, benchmark and Spark extras.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.broker-stamp
ARGS ?=
SOURCES := setup.cfg setup.py pyproject.toml $(wildcard */*/*.c) $(wildcard mqserver/*.h)

.PHONY: install java etcd run unit unit-oldest test bench bench-floor bench-cost bench-rocketmq bench-nsq bench-security bench-faults bench-compare bench-audit audit audit-zip clean

# The broker alone (what `make run` needs), with pip's progress shown.
$(RUN_STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install --config-settings editable_mode=compat -e .
	touch $(RUN_STAMP)

# With the extras the tests, benchmarks and the audit need.
$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install --config-settings editable_mode=compat -e '.[test,bench,spark]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

# The Spark audit job (and its tests) need a Java runtime, 11 to 21 for pyspark 3.5.
# Install Debian's headless JRE when it is missing and we may, else say what to do.
java:
	@if java -version 2>&1 | grep -Eq 'version "(11|17|21)[."]'; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make: no Java 11-21 runtime found; installing default-jre-headless for Spark"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends default-jre-headless >/dev/null || \
	  { echo "make: installing default-jre-headless failed; install a Java 17 runtime (e.g. openjdk-17-jre-headless) and retry" >&2; exit 1; }; \
	else \
	  echo "make: Spark needs a Java 11-21 runtime and none was found. Install one (Debian/Ubuntu: sudo apt-get install default-jre-headless) or put it on PATH / set JAVA_HOME, then retry." >&2; \
	  exit 1; \
	fi

# The broker on the defaults: data in ./data, smss on 127.0.0.1:12301. exec: make's child
# is the broker itself, so SIGTERM to it ends make with status 0, and Ctrl-C with no error.
run: $(RUN_STAMP)
	exec $(VENV)/bin/mqserver run $(ARGS)

# The unit tests alone (in-process, no Java): under two minutes. `MQSERVER_PURE_PYTHON=1
# make unit` runs them on the pure-Python paths.
unit: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) -m pytest tests/unit -q -p no:cacheprovider

# The unit tests on the oldest Twisted setup.cfg admits (its twisted[tls]>= bound), in a
# virtualenv of their own with the broker's requirements and the unit extra only: what
# `make test` runs besides every test on the newest Twisted (in .venv).
TWISTED_OLDEST := $(shell sed -n 's/^ *twisted\[tls\]>=\([0-9.]*\).*/\1/p' setup.cfg)
OLDEST_VENV ?= .venv-twisted-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed-stamp

$(OLDEST_STAMP): $(SOURCES)
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install -q --upgrade pip setuptools wheel
	$(OLDEST_PY) -m pip install -q --config-settings editable_mode=compat -e '.[unit]' \
	  'twisted[tls]==$(TWISTED_OLDEST).*'
	touch $(OLDEST_STAMP)

unit-oldest: $(OLDEST_STAMP)
	@$(OLDEST_PY) -c 'import twisted; print("make: unit tests on Twisted", twisted.__version__)'
	PYTHONPATH=$(CURDIR) $(OLDEST_PY) -m pytest $(UNIT_TESTS) -q -p no:cacheprovider

# The replica-group tests (mqserver/cluster) run a real etcd 3.4 on loopback.
# Install Debian's etcd-server when /usr/bin/etcd (or etcd on PATH) is missing and we may,
# else say what to do.
etcd:
	@if command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make: no etcd found; installing etcd-server for the replica-group tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >/dev/null || \
	  { echo "make: installing etcd-server failed; install etcd 3.4 or later and put it on PATH, then retry" >&2; exit 1; }; \
	else \
	  echo "make: the replica-group tests need etcd and none was found. Install it (Debian/Ubuntu: sudo apt-get install etcd-server) or put an etcd 3.4+ binary on PATH, then retry." >&2; \
	  exit 1; \
	fi

# Every test on the newest Twisted, then the unit tests again on the oldest Twisted
# admitted and on the pure-Python paths (the reference of each C speedup, and what runs
# where none is built): one second pass covers both, the C paths being already tested by
# the first. Each pass runs and reports even when the one before it failed; the target
# fails when either did. TESTS and UNIT_TESTS narrow the passes (e.g. make test
# TESTS=tests/unit/test_x.py UNIT_TESTS=tests/unit/test_x.py). The first pass runs on
# JOBS pytest-xdist workers (most integration tests wait on processes and sockets, so
# three keep two cores busy): the Spark tests on one worker, each other file on one
# (tests/conftest.py); JOBS=0 runs it in this process, one test after another.
TESTS ?= tests
UNIT_TESTS ?= tests/unit
JOBS ?= 3
test: $(STAMP) java etcd
	status=0; \
	PYTHONPATH=$(CURDIR) $(PY) -m pytest $(TESTS) -q -p no:cacheprovider -n $(JOBS) || \
	  { echo "make: the tests failed" >&2; status=1; }; \
	MQSERVER_PURE_PYTHON=1 $(MAKE) --no-print-directory unit-oldest UNIT_TESTS="$(UNIT_TESTS)" || \
	  { echo "make: the unit tests on the oldest Twisted admitted ($(TWISTED_OLDEST)) and the pure-Python paths (MQSERVER_PURE_PYTHON=1) failed" >&2; status=1; }; \
	exit $$status

bench: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/smss_bench.py --quick

# RocketMQ figures with the real C++ client (send throughput, catch-up, latency, RSS).
# what any server can do here, one request at a time (bench/README.md)
bench-floor: $(STAMP)
	$(PY) bench/loopback_floor.py $(ARGS)

bench-cost: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/request_cost.py $(ARGS)

bench-rocketmq: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/rocketmq_bench.py $(ARGS)

# NSQ bench_writer / bench_reader / one-per-round-trip figures (docs/nsq.md)
bench-nsq: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/nsq_bench.py $(ARGS)

bench-security: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/security_bench.py $(ARGS)

# what the wire trace and fault rules cost a publish (docs/performance.md)
bench-faults: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/faults_cost.py $(ARGS)

# mqserver side by side with the Go smss server and nsqd 1.3 (bench/README.md). Their
# binaries are built outside the repository and named by SMSS_BIN, NSQD_BIN,
# NSQ_BENCH_WRITER, NSQ_BENCH_READER; a missing one skips its column.
bench-compare: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/compare.py $(ARGS)

# The audit job on a data directory: make audit DATA=data OUT=audit-report [ARGS=--compare ...]
DATA ?= data
OUT ?= audit-report
audit: $(STAMP) java
	PYTHONPATH=$(CURDIR) $(PY) -m spark.audit $(DATA) --out $(OUT) $(ARGS)

# The zip to give spark-submit's --py-files.
audit-zip: $(STAMP)
	mkdir -p dist
	PYTHONPATH=$(CURDIR) $(PY) -m spark.audit.package dist/mqserver-audit.zip

bench-audit: $(STAMP) java
	PYTHONPATH=$(CURDIR) $(PY) bench/audit_bench.py $(ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache
