# fastfs: two commands on a fresh machine (Debian bookworm, root):
#   make demo   - install what is missing, load a generated example directly and through fastfs, on emulated
#                 latency-bound storage and on the local disk, print the speedups and stats
#   make test   - install what is missing, lint, type check, run the whole test suite (real FUSE mounts)
#   make man    - write the fastfs(1) man page to build/man/fastfs.1
# While developing (these never call apt-get or pip: they use the tools installed, e.g. by make setup):
#   make lint      - ruff check and ruff format --check
#   make typecheck - mypy over the package (strict on fsio/ and daemon/kernel/, see [tool.mypy] in pyproject.toml)
#   make unit      - the pure tests (tests/unit: no mounts, no ML libraries; seconds)
#   make check     - lint, typecheck and unit
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# Quiet installs: no progress, no "running pip as root" / version / script-location warnings.
PIP_INSTALL ?= $(PIP) install -q --disable-pip-version-check --root-user-action=ignore --no-warn-script-location
APT_GET ?= apt-get

.PHONY: system-deps setup demo test lint typecheck unit check man bench bench-deps bench-local bench-latency bench-formats bench-stats bench-disktier \
	bench-matrix bench-floor bench-net bench-changing bench-churn clean

# fuse3 ships fusermount3 and libfuse3 (never Debian's "fuse": it conflicts with fuse3);
# systemd provides systemd-analyze for the unit test; zsh and fish run the completion tests; gcc,
# pkg-config and libfuse3-dev build the libfuse reference daemon of bench_floor.py and its test
# (libfuse3-dev depends on libfuse3-3, never on "fuse").
system-deps:
	@command -v fusermount3 >/dev/null && command -v systemd-analyze >/dev/null && command -v zsh >/dev/null && \
		command -v fish >/dev/null && command -v gcc >/dev/null && pkg-config --exists fuse3 2>/dev/null || \
		{ $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq \
			fuse3 systemd zsh fish gcc pkg-config libfuse3-dev; }
	@test -e /dev/fuse || { echo "fastfs: /dev/fuse is missing (load the fuse module)"; exit 1; }

setup: system-deps
	$(PIP_INSTALL) -e '.[test,ml]'

demo: setup
	$(PYTHON) scripts/demo.py

# The repository root is the package fastfs (package-dir in pyproject.toml) and a clone's folder may
# have any name, so the checkout is made importable as fastfs through a temporary symlink named fastfs
# on PYTHONPATH (for Python) and MYPYPATH (for mypy): $(call as_package,COMMAND) runs COMMAND so, from
# the checkout's root. No install is needed, and it is this checkout that runs, whatever is installed.
as_package = tmp=$$(mktemp -d) && ln -s "$(CURDIR)" "$$tmp/fastfs" && \
	PYTHONPATH="$$tmp$${PYTHONPATH:+:$$PYTHONPATH}" MYPYPATH="$$tmp" $(1); \
	status=$$?; rm -rf "$$tmp"; exit $$status

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# Run from the symlink's folder, so errors name fastfs/<path in the checkout>. Incremental: the cache
# in build/mypy survives the temporary symlink (a second run takes seconds).
MYPY_CACHE ?= build/mypy
typecheck:
	@$(call as_package,cd "$$tmp" && $(PYTHON) -m mypy --config-file "$(CURDIR)/pyproject.toml" \
		--cache-dir "$(abspath $(MYPY_CACHE))" -p fastfs)

unit:
	@$(call as_package,$(PYTHON) -m pytest -q tests/unit)

check: lint typecheck unit

# What CI runs (.ci/run) on a fresh machine: install what is missing, then everything.
test: setup
	$(MAKE) --no-print-directory lint typecheck
	$(PYTHON) -m pytest -q

# The fastfs(1) man page, generated from the argument parser (no install needed, see as_package).
MAN_DIR ?= build/man
man:
	@mkdir -p $(MAN_DIR)
	@$(call as_package,$(PYTHON) -m fastfs.daemon.cli.manpage -o $(MAN_DIR)/fastfs.1)
	@echo "wrote $(MAN_DIR)/fastfs.1 (read it with: man -l $(MAN_DIR)/fastfs.1)"

bench: bench-local bench-latency bench-formats bench-stats bench-disktier

# Clients of the benchmark matrix: fio, the sqlite3 shell, git (Python's sqlite3 module ships with Python);
# the network sources (--storage rclone,sshfs,s3fs): rclone, sshfs + openssh-server (the sshd binary only:
# Debian's policy-rc.d or a missing init keeps the system service from starting; the benchmark starts its
# own on a free port), s3fs (never Debian's "fuse": it conflicts with fuse3; s3fs pulls only libfuse2),
# moto's S3 server and boto3 (pip), and cc for the delay line (a source's delay=MS).
# (bench_floor.py's reference daemon needs gcc, pkg-config and libfuse3-dev: system-deps installs them.)
BENCH_APT := fio sqlite3 git rclone sshfs s3fs openssh-server gcc glusterfs-server glusterfs-client
bench-deps: setup
	@missing=; for c in fio sqlite3 git rclone sshfs s3fs /usr/sbin/sshd cc glusterfsd glusterfs; do command -v $$c >/dev/null || missing=1; done; \
		[ -z "$$missing" ] || { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $(BENCH_APT); }
	@$(PYTHON) -c "import moto.server, boto3" 2>/dev/null || $(PIP_INSTALL) 'moto[server]' boto3

# The whole matrix takes hours at --scale 1: split it with BENCH_MATRIX_ARGS="--behaviours base,serial" etc.
bench-matrix: bench-deps
	$(PYTHON) benchmarks/bench_matrix.py $(BENCH_MATRIX_ARGS)

# The floor of issue 23: fastfs next to libfuse's C passthrough example (built into /var/cache/fastfs-bench).
bench-floor: setup
	$(PYTHON) benchmarks/bench_floor.py $(BENCH_FLOOR_ARGS)

# Issue 21's network-client rows: the matrix over rclone, sshfs and s3fs on loopback (BENCH_NET_ARGS adds e.g.
# "--storage rclone:delay=2 --runs 3").
BENCH_NET_ARGS ?=
bench-net: bench-deps
	$(PYTHON) benchmarks/bench_matrix.py --storage rclone,sshfs,s3fs --workloads @net,images $(BENCH_NET_ARGS)

# Issue 22's long-timeline and changing-source scenarios (BENCH_CHANGING_ARGS="--pause 65 --runs 3").
BENCH_CHANGING_ARGS ?=
bench-changing: setup
	$(PYTHON) benchmarks/bench_changing.py $(BENCH_CHANGING_ARGS)

# Churn soaks: wrong bytes and failed reads while the source changes (BENCH_CHURN_ARGS="--seconds 60").
BENCH_CHURN_ARGS ?=
bench-churn: setup
	$(PYTHON) benchmarks/bench_churn.py $(BENCH_CHURN_ARGS)

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
