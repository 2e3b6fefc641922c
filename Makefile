# mqserver: `make run` starts a broker on the defaults, `make test` runs every test.
# Both create the virtualenv in .venv and install the project into it when needed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: install java run test bench bench-floor bench-cost bench-rocketmq bench-nsq bench-security bench-faults bench-compare bench-audit audit audit-zip clean

$(STAMP): setup.cfg setup.py pyproject.toml $(wildcard */*/*.c) $(wildcard mqserver/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q --config-settings editable_mode=compat -e '.[test,bench,spark]'
	touch $(STAMP)

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

# The broker on the defaults: data in ./data, smss on 127.0.0.1:12301.
run: $(STAMP) java
	PYTHONPATH=$(CURDIR) $(PY) -m mqserver -n --pidfile= mqserver $(ARGS)

# Every test, then the unit tests again on the pure-Python paths (the reference of each C
# speedup, and what runs where none is built).
test: $(STAMP) java
	PYTHONPATH=$(CURDIR) $(PY) -m pytest tests -q -p no:cacheprovider
	MQSERVER_PURE_PYTHON=1 PYTHONPATH=$(CURDIR) $(PY) -m pytest tests/unit -q -p no:cacheprovider

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

# what the wire trace and fault rules cost a publish (docs/benchmarks.md)
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
