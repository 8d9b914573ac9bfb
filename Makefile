# fastfs: two commands on a fresh machine (Debian bookworm, root):
#   make demo   - install what is missing, load a generated example directly and through fastfs, on emulated
#                 latency-bound storage and on the local disk, print the speedups and stats
#   make test   - install what is missing, lint, run the whole test suite (real FUSE mounts)
#   make man    - write the fastfs(1) man page to build/man/fastfs.1
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# Quiet installs: no progress, no "running pip as root" / version / script-location warnings.
PIP_INSTALL ?= $(PIP) install -q --disable-pip-version-check --root-user-action=ignore --no-warn-script-location
APT_GET ?= apt-get

.PHONY: system-deps setup demo test lint man bench bench-deps bench-local bench-latency bench-formats bench-stats bench-disktier bench-matrix clean

# fuse3 ships fusermount3 and libfuse3 (never Debian's "fuse": it conflicts with fuse3);
# systemd provides systemd-analyze for the unit test; zsh and fish run the completion tests.
system-deps:
	@command -v fusermount3 >/dev/null && command -v systemd-analyze >/dev/null && command -v zsh >/dev/null && \
		command -v fish >/dev/null || \
		{ $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq fuse3 systemd zsh fish; }
	@test -e /dev/fuse || { echo "fastfs: /dev/fuse is missing (load the fuse module)"; exit 1; }

setup: system-deps
	$(PIP_INSTALL) -e '.[test,ml]'

demo: setup
	$(PYTHON) scripts/demo.py

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

test: lint
	$(PYTHON) -m pytest -q

# The fastfs(1) man page, generated from the argument parser (no install needed: the checkout is
# imported as the package through a temporary symlink named fastfs).
MAN_DIR ?= build/man
man:
	@mkdir -p $(MAN_DIR)
	@tmp=$$(mktemp -d) && ln -s "$(CURDIR)" "$$tmp/fastfs" && \
		PYTHONPATH="$$tmp$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m fastfs.daemon.cli.manpage -o $(MAN_DIR)/fastfs.1; \
		status=$$?; rm -rf "$$tmp"; exit $$status
	@echo "wrote $(MAN_DIR)/fastfs.1 (read it with: man -l $(MAN_DIR)/fastfs.1)"

bench: bench-local bench-latency bench-formats bench-stats bench-disktier

# Clients of the benchmark matrix: fio, the sqlite3 shell, git (Python's sqlite3 module ships with Python).
bench-deps: setup
	@command -v fio >/dev/null && command -v sqlite3 >/dev/null && command -v git >/dev/null || \
		{ $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq fio sqlite3 git; }

# The whole matrix takes hours at --scale 1: split it with BENCH_MATRIX_ARGS="--behaviours base,serial" etc.
bench-matrix: bench-deps
	$(PYTHON) benchmarks/bench_matrix.py $(BENCH_MATRIX_ARGS)

bench-local: setup
	$(PYTHON) benchmarks/bench_local.py

bench-latency: setup
	$(PYTHON) benchmarks/bench_latency.py

bench-formats: setup
	$(PYTHON) benchmarks/bench_formats.py

bench-stats: setup
	$(PYTHON) benchmarks/bench_stats.py

bench-disktier: setup
	$(PYTHON) benchmarks/bench_disktier.py

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache .hypothesis
