# The two set-up commands of the README. Each installs what it needs first into a
# local virtualenv (.venv) and the Maven jar cache (Kafka, Cassandra, Spark's Kafka
# connector; ~/.cache/fanout/jars, fetched once), then runs. Nothing here needs root
# except installing Java and Maven. No step goes quiet for more than 10 s.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# `make test` runs every whole-stack test in one process, one stack at a time, and
# beside it, in a CPU control group of an eighth of the weight, the tests that start no
# whole stack: those take the cores the stacks' waits leave idle (tests/steps.py says
# why, and runs the two one after the other where no group can be made). TEST_WORKERS
# is the pytest-xdist workers of the second step, each with its own SparkSession and
# both on one Kafka node and one Cassandra node (tests/plugins/nodes.py): two, one for
# each core the stacks' waits leave idle
# (that step holds the job's kill tests too, which wait on JVM starts). 0 runs
# everything in one process. Both steps always run; `make test`
# fails if either failed. A step whose PYTEST_ARGS select none of its tests passes
# (pytest's exit status 5).
TEST_WORKERS ?= 2
# The suite starts hundreds of Python processes (each `fanout` command, the API's
# workers, the job's Python workers, the verifier) and the demo a dozen; each imports
# the project's modules. Where PYTHONDONTWRITEBYTECODE is set, as some images and
# shells do, every one of them compiled those modules from source again (serving.app:
# 1.9 s against 0.5 s from bytecode) and each pytest process rewrote the asserts of
# every test module (collection 9 s against 4 s). On tests/loadgen/test_loadgen_stack.py
# that was 105 s against 103 s, 73 against 67 CPU-seconds. Bytecode goes into
# __pycache__ (ignored by git).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint install jars class-archive java clean

# The demo needs the packages and the jars only: its job starts without the driver's
# class archive, which would hold up a first demo for about a minute to save its
# job a second or two.
demo: jars
	$(VENV)/bin/fanout demo

# The tests use the class archive (tests/infra/services/test_class_archive.py checks that the
# driver maps it), so the test target builds it.
test: install
ifeq ($(TEST_WORKERS),0)
	$(VENV)/bin/pytest $(PYTEST_ARGS)
else
	$(PY) -m tests.steps --workers $(TEST_WORKERS) $(PYTEST_ARGS)
endif

# The static checks (docs/style.md §14), a step of their own before the suite in CI.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

install: jars class-archive

# A no-op once the cache holds every set; `fanout jars` says what to install if Maven
# is missing.
jars: $(STAMP) java
	$(VENV)/bin/fanout jars

# The Spark driver's class archive (infra/services/archive_builder.py), trained once on a small
# run of the job, ~1 minute: a no-op while the JVM and the jars stay the same. Every
# job started after it starts faster.
class-archive: jars
	$(VENV)/bin/fanout class-archive

# An install says nothing for a while: heartbeat prints "WHAT: N s so far" every 5 s
# while the process whose pid is in shell variable $(1) runs; say_while runs a command
# so, and ends with its exit status.
heartbeat = n=0; while kill -0 $$$(1) 2>/dev/null; do sleep 1; n=$$((n + 1)); \
	  [ $$((n % 5)) -ne 0 ] || echo "  $(2): $$n s so far"; done
say_while = @echo "$(2)"; $(2) & pid=$$!; $(call heartbeat,pid,$(1)); wait $$pid

# uv installs the packages from PyPI into the virtualenv: from empty caches 44 s here,
# against 130 s for pip, which downloads one package at a time and builds pyspark's
# 430 MB wheel at zlib's pace. Fetching the jars needs only Maven and Python's
# standard library (python -m infra.services.jars), so they are fetched meanwhile;
# `fanout jars`, below, then finds them in the cache.
# pyspark comes from PyPI as a source archive whose build uv keeps per download: each
# install into a new virtualenv (a fresh clone) left another ~0.9 GB in ~/.cache/uv
# (66 installs here filled 60 GB of a disk). `uv cache prune` keeps the newest build
# and the packages' archives and drops the rest (about 1 s).
$(STAMP): pyproject.toml | java
	$(PYTHON) -m venv $(VENV)
	$(call say_while,installing uv,$(PY) -m pip install --quiet 'uv>=0.9')
	@$(PYTHON) -m infra.services.jars & jars=$$!; \
	echo "installing the packages (the jars meanwhile)"; \
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[test]' & pip=$$!; \
	$(call heartbeat,pip,installing the packages); \
	wait $$pip || { kill $$jars 2>/dev/null; exit 1; }; wait $$jars
	$(VENV)/bin/uv cache prune --quiet
	touch $(STAMP)

java:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])' || { \
	  echo "fanout needs Java 17+ (Spark, Kafka, Cassandra). On Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless maven" >&2; \
	  exit 1; }

clean:
	rm -rf run reports .pytest_cache .hypothesis build *.egg-info
