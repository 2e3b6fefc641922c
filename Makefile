# mqserver: `make run` starts a broker on the defaults, `make test` runs every test.
# Both create the virtualenv in .venv and install the project into it when needed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: install run test bench bench-rocketmq bench-nsq clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q --config-settings editable_mode=compat -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

# The broker on the defaults: data in ./data, smss on 127.0.0.1:12301.
run: $(STAMP)
	PYTHONPATH=$(CURDIR) $(VENV)/bin/twistd -n --pidfile= mqserver $(ARGS)

test: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) -m pytest tests -q -p no:cacheprovider

bench: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/smss_bench.py --quick

# RocketMQ figures with the real C++ client (send throughput, catch-up, latency, RSS).
bench-rocketmq: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/rocketmq_bench.py $(ARGS)

# NSQ bench_writer / bench_reader / one-per-round-trip figures (docs/nsq.md)
bench-nsq: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) bench/nsq_bench.py $(ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache
