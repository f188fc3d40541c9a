# The two set-up commands of the README. Each installs what it needs first into a
# local virtualenv (.venv) and the Maven jar cache (Kafka, Cassandra, Spark's Kafka
# connector; ~/.cache/fanout/jars, fetched once), then runs. Nothing here needs root
# except installing Java and Maven.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test lint install jars java clean

demo: jars
	$(VENV)/bin/fanout demo

test: jars
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The static checks (docs/style.md §14), a step of their own before the suite in CI.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

install: jars

# A no-op once the cache holds every set; `fanout jars` says what to install if Maven
# is missing. Then the Spark driver's class archive (infra/archive_builder.py), trained
# once on a small run of the job: a no-op while the JVM and the jars stay the same.
jars: $(STAMP) java
	$(VENV)/bin/fanout jars
	$(VENV)/bin/fanout class-archive

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

java:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])' || { \
	  echo "fanout needs Java 17+ (Spark, Kafka, Cassandra). On Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless maven" >&2; \
	  exit 1; }

clean:
	rm -rf run reports .pytest_cache .hypothesis build *.egg-info
