# rlsync: patch series, overlay and forked wheel for SGLang, plus the trainer library.
# Developer tooling (devtools/) is driven from here and never shipped.
# `make help` lists the targets.

PYTHON   ?= python3
DEVTOOLS := PYTHONPATH=$(CURDIR) $(PYTHON) -m devtools
VENV_PY  := .venv/bin/python
SERIES   := $(shell sed -n 's/^series *= *//p' upstream.pin)
VERSION  := $(shell sed -n 's/^version *= *//p' upstream.pin)
WHEEL    := dist/sglang-$(VERSION)+rlsync.$(SERIES)-py3-none-any.whl
LIB_VERSION := $(shell sed -n 's/^__version__ = "\([^"]*\)".*/\1/p' python/rlsync/__init__.py)
LIB_WHEEL := dist/rlsync-$(LIB_VERSION)-py3-none-any.whl
PYTEST_ARGS ?=

.PHONY: help upstream worktree patches overlay check apply revert pr-branch \
        venv wheel install test demo soak format clean bench-cpu

help:
	@echo "make test                       venv + wheel + the whole suite (real SGLang on CPU)"
	@echo "make test-fast                  venv + wheel + the tests that start no server and build nothing (under a minute)"
	@echo "make demo                       two real servers (TP 1 + TP 2), three syncs under load, checked"
	@echo "make soak                       30 syncs with random faults into TP 1 + TP 2 under load, checked (bench/results/)"
	@echo "make upstream                   fetch + verify + unpack the pinned sdist (build/upstream/python)"
	@echo "make worktree                   build/work: git repo at the pin, one commit per patch"
	@echo "make patches                    re-export patches/ from build/work (deterministic)"
	@echo "make overlay                    regenerate overlay/ from pristine + series"
	@echo "make check                      fail on any drift between series, pristine and overlay"
	@echo "make apply SGLANG_DIR=<tree>    apply the series to SGLang $(VERSION): a checkout (local commits"
	@echo "                                and edits are fine), an unpacked sdist, site-packages or the"
	@echo "                                sglang package dir; all-or-nothing, 3-way merge in git checkouts"
	@echo "make revert SGLANG_DIR=<tree>   remove it again (after a plain or 3-way apply)"
	@echo "make pr-branch SGLANG_DIR=<git checkout> [AUTHOR=\"Name <mail>\"]"
	@echo "                                branch off HEAD, one signed-off commit per patch"
	@echo "                                (author defaults to the checkout's git user.name/user.email)"
	@echo "make wheel                      $(WHEEL)"
	@echo "make bench-cpu                  CPU benchmark: raw vs upstream vs two-phase (bench/results/)"

upstream:
	@$(DEVTOOLS) upstream

worktree:
	@$(DEVTOOLS) worktree

patches:
	@$(DEVTOOLS) patches

overlay:
	@$(DEVTOOLS) overlay

check:
	@$(DEVTOOLS) check

apply revert pr-branch:
	@test -n "$(SGLANG_DIR)" || { echo "error: set SGLANG_DIR=<sglang checkout>" >&2; exit 2; }
	@$(DEVTOOLS) $@ "$(SGLANG_DIR)" $(if $(and $(filter pr-branch,$@),$(AUTHOR)),--author "$(AUTHOR)")

venv:
	@PYTHON=$(PYTHON) tools/venv.sh

# Both wheels build with setuptools alone (fetched into pip's isolated build
# environment under the constraints): no test environment needed.
wheel: check
	@rm -rf dist build/wheel-src build/bdist* build/lib
	@PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PYTHON) -m pip wheel --quiet --no-deps -w dist . ./python
	@rm -rf *.egg-info python/*.egg-info python/build
	@ls dist/*.whl

install: venv wheel
	@$(VENV_PY) -m pip install --quiet --no-deps --force-reinstall $(WHEEL) $(LIB_WHEEL)

test: install
	@$(VENV_PY) -m pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: install
	@tools/test-fast.sh $(PYTEST_ARGS)

format:
	@$(VENV_PY) -m black python devtools harness tests bench setup.py
	@$(VENV_PY) -m isort --profile black -p sglang -p rlsync -p harness -p devtools python devtools harness tests bench setup.py

clean:
	rm -rf build dist .pytest_cache

demo: install
	@$(VENV_PY) -m harness.demo

soak: install
	@$(VENV_PY) -m harness.soak

bench-cpu: install
	@$(VENV_PY) bench/cpu_sync.py
