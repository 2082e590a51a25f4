# rlsync: patch series, overlay and forked wheel for SGLang, plus the trainer library.
# Developer tooling (devtools/) is driven from here and never shipped.
# `make help` lists the targets.

PYTHON   ?= python3
DEVTOOLS := PYTHONPATH=$(CURDIR) $(PYTHON) -m devtools
# Every pin (pins/<version>/), oldest first; PIN=<version> picks one, else the
# oldest for the one-pin targets, and every pin for check and test.
PINS     := $(shell cd pins && ls -v */upstream.pin | cut -d/ -f1)
PIN      ?=
# RELEASE=<version>: a release a pin's series serves (pins/releases), not a
# pin; the one-pin targets then work on the pin that serves it.
OTHER_RELEASE := $(filter-out $(PINS),$(RELEASE))
SERVING  := $(if $(OTHER_RELEASE),$(shell awk '$$1 == "$(OTHER_RELEASE)" && $$3 != "none" {print $$2}' pins/releases))
P        := $(or $(PIN),$(filter $(RELEASE),$(PINS)),$(SERVING),$(firstword $(PINS)))
# A release's server smoke: a sync per model family against upstream's own
# disk load, health while a trainer joins late, a trainer killed mid-transfer,
# an abort in band, a dead trainer's late calls, admin-only routes, no key in
# any answer or log line, what /rlsync_info reports.
SMOKE_TESTS := tests/test_model_families.py::test_two_phase_sync_equals_upstream_disk_load \
        tests/test_health.py::test_late_trainer_health_stays_200_and_watchdog_quiet \
        tests/test_two_phase.py::test_trainer_killed_mid_transfer \
        tests/test_sender.py::test_trainer_exception_mid_broadcast_aborts_every_engine \
        tests/test_session_ids.py::test_a_dead_trainers_late_calls_leave_the_new_trainers_session_alone \
        tests/test_admin.py::test_every_admin_endpoint_needs_the_admin_key \
        tests/test_admin.py::test_no_answer_or_log_line_carries_a_key \
        tests/test_admin.py::test_rlsync_info_on_the_patched_server
PIN_FILE := pins/$(P)/upstream.pin
SERIES   := $(shell sed -n 's/^series *= *//p' $(PIN_FILE))
VERSION  := $(shell sed -n 's/^version *= *//p' $(PIN_FILE))
# Wheel-only releases: the forked wheel keeps upstream's wheel tags.
UPSTREAM_WHEEL := $(shell sed -n 's/^wheel *= *//p' $(PIN_FILE))
WHEEL_TAGS := $(if $(UPSTREAM_WHEEL),$(shell echo $(UPSTREAM_WHEEL) | sed 's/\.whl$$//' | cut -d- -f3-),py3-none-any)
WHEEL    := dist/sglang-$(VERSION)+rlsync.$(SERIES)-$(WHEEL_TAGS).whl
VENV_PY  := .venv-$(P)/bin/python
LIB_VERSION := $(shell sed -n 's/^__version__ = "\([^"]*\)".*/\1/p' python/rlsync/__init__.py)
LIB_WHEEL := dist/rlsync-$(LIB_VERSION)-py3-none-any.whl
PYTEST_ARGS ?=
# A later pin's run leaves out what does not depend on the pin (tooling,
# trainer library alone, and the server tests marked release_independent,
# whose subject is the library with a server as its counterpart, and the
# first_pin_only cases another case of the same test covers): the tests of
# the series' behaviour in a real server.
PIN_MARKS = $(if $(filter $(P),$(firstword $(PINS))),,-m "(server or per_pin) and not release_independent and not first_pin_only")

.PHONY: help upstream worktree patches overlay check new-releases port port-export port-restamp rewrites \
        rewrite-series \
        smoke support-matrix \
        check-releases \
        apply revert pr-branch \
        venv wheel install test test-pin demo serve-cpu rl-demo soak format clean bench-cpu \
        bench-memory

help:
	@echo "make test                       every pin: venv + wheels + the whole suite (real SGLang on CPU)"
	@echo "make test PIN=<version>         the same for one pin ($(PINS))"
	@echo "make test-fast                  venv + wheel + the tests that start no server and build nothing (about 5 minutes)"
	@echo "make demo                       two real servers (TP 1 + TP 2), three syncs under load, checked"
	@echo "make test-quickstart            README \"Try it on CPU\" as written, the trainer install included (minutes, network)"
	@echo "make test-pr-branch             the pull-request branch's unit tests at its head and each commit adding them, every pin (3 minutes)"
	@echo "make serve-cpu [MODEL=<dir>] [TP=<n>] [PORT=<port>] [ARGS=\"<sglang flags>\"]"
	@echo "                                the patched server on this CPU, no GPU needed (a tiny model by default); Ctrl-C stops it"
	@echo "make rl-demo                    an RL loop (tiny Llama, GRPO-style) syncing TP 1 + TP 2 while they serve rollouts:"
	@echo "                                reward table, docs/rl-loop.png, bench/results/rl-loop-<date>.json"
	@echo "make soak                       30 syncs with random faults into TP 1 + TP 2 under load, checked (bench/results/)"
	@echo "make check                      fail on any drift between series, pristine, overlay and common/ (every pin)"
	@echo "make new-releases               releases on the package index that pins/releases does not map yet"
	@echo "make check-releases             every release a series serves: its wheel (fetched), its series applied, imports resolved"
	@echo "make apply SGLANG_DIR=<tree>    apply the series that serves the tree's SGLang version (pins/releases): a checkout"
	@echo "                                (local commits and edits are fine), an unpacked sdist or wheel,"
	@echo "                                site-packages or the sglang package dir; all-or-nothing,"
	@echo "                                3-way merge in git checkouts"
	@echo "make revert SGLANG_DIR=<tree>   remove it again (after a plain or 3-way apply)"
	@echo "make wheel RELEASE=<version>    the forked wheel of a release a pin's series serves (pins/releases)"
	@echo "make port RELEASE=<version>     build/<release>/work: the release + its series by git am -3 (resolve, continue)"
	@echo "  [FROM=<release>]                starting from a nearer release's ports where it has none"
	@echo "make port-export RELEASE=<v>    keep the patches that differ from the pin's as its port (pins/<pin>/releases/<v>/)"
	@echo "make port-restamp [SINCE=<rev>] carry pin patches' new names and messages (since HEAD) into their ports"
	@echo "make rewrite-series SCRIPT=<s>  carry a scripted code change (python SCRIPT TREE, idempotent) through every"
	@echo "                                commit of every pin and port, then export patches, overlays and ports"
	@echo "make smoke RELEASE=<version>    the release's server smoke in its pin's environment; kept in pins/release-smokes"
	@echo "make support-matrix             regenerate docs/support-matrix.md's table of releases (pins/releases, pins/release-smokes)"
	@echo "make pr-branch SGLANG_DIR=<git checkout> [AUTHOR=\"Name <mail>\"]"
	@echo "                                branch off HEAD: the series cut into signed-off commits (pr/series)"
	@echo "                                (author defaults to the checkout's git user.name/user.email)"
	@echo "The one-pin targets take PIN=<version> (default $(firstword $(PINS))):"
	@echo "make upstream                   fetch + verify + unpack the pinned archive (build/<pin>/upstream/python)"
	@echo "make worktree                   build/<pin>/work: git repo at the pin, one commit per patch"
	@echo "make rewrites                   list in pins/<pin>/rewrites the patches that rewrite an earlier one's lines"
	@echo "make patches                    re-export pins/<pin>/patches from the worktree (deterministic)"
	@echo "make overlay                    regenerate pins/<pin>/overlay and common/ from pristine + series"
	@echo "make wheel                      the forked wheel ($(WHEEL)) and the library's"
	@echo "make bench-cpu                  CPU benchmark: raw vs upstream vs two-phase (bench/results/)"
	@echo "make bench-memory               staging per rank and on the trainer, and time vs the series"
	@echo "                                without shard staging, TP 1 + TP 2 (bench/results/memory-<pin>-<date>.json)"

upstream worktree patches overlay:
	@$(DEVTOOLS) --pin $(P) $@

check:
	@$(DEVTOOLS) $(if $(PIN),--pin $(PIN)) check

new-releases:
	@$(DEVTOOLS) new-releases

port port-export:
	@test -n "$(RELEASE)" || { echo "error: set RELEASE=<version> (a release pins/releases maps adjusted)" >&2; exit 2; }
	@$(DEVTOOLS) --release $(RELEASE) $@ $(if $(and $(filter port,$@),$(FROM)),--from $(FROM))

rewrites:
	@$(DEVTOOLS) $(if $(PIN),--pin $(PIN)) rewrites

rewrite-series:
	@test -n "$(SCRIPT)" || { echo "error: set SCRIPT=<script> (python SCRIPT TREE edits TREE)" >&2; exit 2; }
	@$(DEVTOOLS) rewrite-series $(SCRIPT)

port-restamp:
	@$(DEVTOOLS) $(if $(PIN),--pin $(PIN)) port-restamp $(if $(SINCE),--since $(SINCE))

# The release's wheel + its series, run by the serving pin's test environment
# (with the pin's wheels installed: `install` of the pin, not of the release).
smoke:
	@test -n "$(SERVING)" || { echo "error: set RELEASE=<version> (a release pins/releases maps as-is or adjusted)" >&2; exit 2; }
	@$(MAKE) --no-print-directory install RELEASE= PIN=$(P)
	@tree=$$($(DEVTOOLS) --release $(OTHER_RELEASE) smoke-tree) && own=$$($(DEVTOOLS) --release $(OTHER_RELEASE) smoke-pins) && \
	  { test -z "$$own" || PIP_CONSTRAINT= $(VENV_PY) -m pip install --quiet --no-deps --target $$tree $$own; } && \
	  needed=$$($(DEVTOOLS) --release $(OTHER_RELEASE) smoke-pins --needed-in $$tree) && \
	  { test -z "$$needed" || PIP_CONSTRAINT= $(VENV_PY) -m pip install --quiet --no-deps --target $$tree $$needed; } && own="$$own$${needed:+ $$needed}" && \
	  echo "=== SGLang $(OTHER_RELEASE) ($$tree) in $(P)'s environment$${own:+, with the release's $$own}" && \
	  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u PIN RLSYNC_SGLANG_TREE=$$tree RLSYNC_SMOKE_RELEASE=$(OTHER_RELEASE) \
	  $(VENV_PY) -m pytest -p no:cacheprovider --junitxml=build/$(OTHER_RELEASE)/smoke.xml $(SMOKE_TESTS); \
	  $(DEVTOOLS) --release $(OTHER_RELEASE) smoke-record --junit build/$(OTHER_RELEASE)/smoke.xml \
	  --environment "$(P)'s test environment (torch $$($(VENV_PY) -c 'import torch; print(torch.__version__)')$${own:+; the release's $$own})"

support-matrix check-releases:
	@$(DEVTOOLS) $@

# The tree and the author reach devtools as given: through the environment,
# never expanded by make or the shell (a path may hold `$`, a backtick or a
# quote, which would otherwise run as code).
RAW_SGLANG_DIR := $(value SGLANG_DIR)
RAW_AUTHOR := $(value AUTHOR)
export RAW_SGLANG_DIR RAW_AUTHOR
unexport SGLANG_DIR AUTHOR

apply revert pr-branch:
	@test -n "$$RAW_SGLANG_DIR" || { echo "error: set SGLANG_DIR=<sglang checkout>" >&2; exit 2; }
	@$(DEVTOOLS) $(if $(PIN),--pin $(PIN)) $@ "$$RAW_SGLANG_DIR" $(if $(and $(filter pr-branch,$@),$(value AUTHOR)),--author "$$RAW_AUTHOR")

venv:
	@PYTHON=$(PYTHON) tools/venv.sh pins/$(P)

# Both wheels build with setuptools alone (fetched into pip's isolated build
# environment under the constraints): no test environment needed. A wheel-only
# pin's forked wheel is upstream's wheel repacked with the series.
wheel:
ifneq ($(OTHER_RELEASE),)
	@$(DEVTOOLS) --release $(OTHER_RELEASE) check
	@mkdir -p dist
	@$(DEVTOOLS) --release $(OTHER_RELEASE) wheel --dist dist
else
	@$(DEVTOOLS) --pin $(P) check
	@rm -rf build/$(P)/wheel-src build/bdist* build/lib $(WHEEL) $(LIB_WHEEL)
	@mkdir -p dist
ifeq ($(UPSTREAM_WHEEL),)
	@RLSYNC_PIN=$(P) PIP_CONSTRAINT=$(CURDIR)/pins/$(P)/constraints.txt $(PYTHON) -m pip wheel --quiet --no-deps -w dist .
else
	@$(DEVTOOLS) --pin $(P) wheel --dist dist >/dev/null
endif
endif
	@PIP_CONSTRAINT=$(CURDIR)/pins/$(P)/constraints.txt $(PYTHON) -m pip wheel --quiet --no-deps -w dist ./python
	@rm -rf *.egg-info python/*.egg-info python/build
	@ls $(if $(OTHER_RELEASE),,$(WHEEL)) $(LIB_WHEEL)

install: venv wheel
	@$(VENV_PY) -m pip install --quiet --no-deps --force-reinstall $(WHEEL) $(LIB_WHEEL)

# Every pin in turn (PIN=<version>: one), each in its own environment.
test:
	@set -e; for p in $(or $(PIN),$(PINS)); do $(MAKE) --no-print-directory test-pin PIN=$$p; done

test-pin: install
	@echo '=== SGLang $(P): $(VENV_PY) -m pytest $(PIN_MARKS) $(PYTEST_ARGS)'
	@# Tests run make themselves: PIN (exported, and in MAKEFLAGS) must not reach them.
	@env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u PIN $(VENV_PY) -m pytest $(PIN_MARKS) $(PYTEST_ARGS)

.PHONY: test-fast test-quickstart test-pr-branch
test-fast: install
	@VENV_PY=$(VENV_PY) tools/test-fast.sh $(PYTEST_ARGS)

# README "Try it on CPU" as a new user runs it, the trainer install included
# (a new venv, a CPU-only torch from its index, the library; needs the network).
test-quickstart: install
	@env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u PIN RLSYNC_QUICKSTART_INSTALL=1 \
	  $(VENV_PY) -m pytest tests/test_serve_cpu.py -k quickstart $(PYTEST_ARGS)

# The pull-request branch's unit tests, at its head and at each commit that
# adds them, every pin (make test checks only the branch; CI runs both).
test-pr-branch:
	@set -e; for p in $(or $(PIN),$(PINS)); do $(MAKE) --no-print-directory install PIN=$$p; \
	  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u PIN RLSYNC_PR_UNIT_TESTS=1 \
	  .venv-$$p/bin/python -m pytest tests/test_pr_branch.py $(PYTEST_ARGS); done

format:
	@$(VENV_PY) -m black python devtools harness tests bench examples setup.py pr
	@$(VENV_PY) -m isort --profile black -p sglang -p rlsync -p harness -p devtools python devtools harness tests bench examples setup.py
	@$(VENV_PY) -m isort --profile black -p sglang pr

clean:
	rm -rf build dist .pytest_cache

demo: install
	@$(VENV_PY) -m harness.demo

# The CPU recipe of the tests and the demo, for a try without a GPU.
serve-cpu: install
	@$(VENV_PY) -m harness.serve_cpu $(if $(MODEL),--model-path "$(MODEL)") \
	  $(if $(TP),--tp-size $(TP)) $(if $(PORT),--port $(PORT)) $(if $(ARGS),-- $(ARGS))

# The plot needs matplotlib, which the suite does not: it is added to the
# pin's environment here, at the versions examples/requirements.txt names.
rl-demo: install
	@$(VENV_PY) -m pip install --quiet -c pins/$(P)/constraints.txt -r examples/requirements.txt
	@$(VENV_PY) -m examples.rl_loop

soak: install
	@$(VENV_PY) -m harness.soak

bench-cpu: install
	@$(VENV_PY) bench/cpu_sync.py

# Today = the pin's series without the shard staging: its worktree at the
# parent of that patch's commit, in build/<pin>/today.
SHARD_STAGING_SUBJECT := ^weight sync: each rank stages only its own shard
bench-memory: install worktree
	@rm -rf build/$(P)/today && git -C build/$(P)/work worktree prune
	@git -C build/$(P)/work worktree add --quiet --detach $(CURDIR)/build/$(P)/today \
	  "$$(git -C build/$(P)/work log -1 --format=%H --grep='$(SHARD_STAGING_SUBJECT)')~1"
	@grep -v '"shard_staging",' build/$(P)/work/python/sglang/srt/weight_sync/_series.py \
	  > build/$(P)/today/python/sglang/srt/weight_sync/_series.py
	@$(VENV_PY) bench/memory.py --today-tree build/$(P)/today/python
