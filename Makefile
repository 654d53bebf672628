# tf_otel: `make demo` and `make test` work on a fresh machine and are idempotent.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install tools tools-demo nccl-plugin test test-fast demo lint bench clean cluster cluster-down \
	settings-table

install:
	@bash scripts/install.sh

tools:  # Jaeger v2, the collector, Prometheus (tests)
	@bash scripts/build_go_tools.sh all

tools-demo:  # the demo runs Jaeger v2 only
	@bash scripts/build_go_tools.sh jaeger

nccl-plugin:
	@bash scripts/build_nccl_plugin.sh || true

# the venv install (network, Horovod's C++ build) and the Go builds overlap: they leave each
# other idle CPU on 2 cores
test:
	@$(MAKE) --no-print-directory -j2 install tools
	@$(MAKE) --no-print-directory nccl-plugin
	@bash scripts/run_tests.sh

test-fast: install
	@bash scripts/run_tests.sh -m "not integration"

demo:
	@$(MAKE) --no-print-directory -j2 install tools-demo
	@$(PY) scripts/demo.py

PY_DIRS := tf_otel tests bench examples scripts

lint: install  # ruff (lint + format) over the Python dirs, mypy over tf_otel ([tool.mypy])
	@$(VENV)/bin/ruff check $(PY_DIRS)
	@$(VENV)/bin/ruff format --check $(PY_DIRS)
	@$(VENV)/bin/mypy

settings-table:  # README.md's settings table from tf_otel/config.py (a test checks it)
	@$(PY) scripts/settings_table.py

bench: install tools
	@$(PY) bench/run_all.py

cluster: install  # hosts as network namespaces on one machine (docs/guides/CLUSTER.md)
	@bash scripts/cluster/cluster.sh up $(CLUSTER_ARGS)

cluster-down:
	@bash scripts/cluster/cluster.sh down

clean:
	rm -rf $(VENV) build dist *.egg-info out
