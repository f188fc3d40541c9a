# The two set-up commands of the README. Each installs what it needs first into a
# local virtualenv (.venv), then runs. Nothing here needs root except installing Java.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test install java clean

demo: $(STAMP) java
	$(VENV)/bin/fanout demo

test: $(STAMP) java
	$(VENV)/bin/pytest $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

java:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])' || { \
	  echo "fanout needs Java 17+ for Spark. On Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2; \
	  exit 1; }

clean:
	rm -rf run reports .pytest_cache .hypothesis build *.egg-info
