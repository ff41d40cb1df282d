# GDDR -- parameter server and client library.
#
#   make            build everything under build/
#   make check      install missing packages, build, run the Check suite
#   make abi-check  a program built against the first gddr.h runs on this library
#   make demo       install missing packages, build, train Fashion-MNIST
#                   (SERVERS=2: the model sharded over two servers)
#   make slurm-check  run scripts/slurm/gddr.sbatch on a one-node Slurm cluster
#   make install PREFIX=/usr/local DESTDIR=   (the gddr Python package and
#                   the manual pages too; LIBDIR=PREFIX/lib by default)
#   make deb        Debian packages under build/deb/ (gddr-ps, libgddr-client0,
#                   libgddr-client-dev, python3-gddr, libgddr-client0-cuda when
#                   the CUDA plugin is built), made with debhelper (debian/)
#   make wheel      build/wheel/gddr-VERSION-py3-none-PLATFORM.whl: the Python
#                   package with libgddr-client (and the CUDA plugin) inside
#   make man        the manual pages under build/man/ (scdoc; `all` makes them
#                   when scdoc is installed)
#   make SANITIZER=address|undefined
#   make WITH_CUDA=0  (force a CPU-only build)
#
# Every output goes under build/. The protobuf-c code is generated there.

CC        ?= cc
# A sanitized build gets its own folder, so objects of the two never mix.
BUILD     ?= build$(if $(SANITIZER),/$(SANITIZER))
PREFIX    ?= /usr/local
DESTDIR   ?=
# Where make install puts the libraries (the Debian packages: the multiarch
# folder /usr/lib/<triplet>), the CUDA plugin (libgddr-client looks for it
# next to itself, then in a gddr/ folder there: kernels/cuda_loader.c) and
# the manual pages.
LIBDIR    ?= $(PREFIX)/lib
PLUGINDIR ?= $(LIBDIR)
MANDIR    ?= $(PREFIX)/share/man
SANITIZER ?=
VERSION   := 0.1.0
# The gddr Python package installs where this python3 looks for PREFIX's
# packages (Debian: PREFIX/lib/python3.X/dist-packages); empty = skip it.
PYTHON    ?= /usr/bin/python3
PYTHON_SITE ?= $(shell $(PYTHON) -c 'import sys; print("$(PREFIX)/lib/python%d.%d/dist-packages" % sys.version_info[:2])' 2>/dev/null)

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
WITH_CUDA ?= auto
CUDA_ARCH ?= 90

ifeq ($(WITH_CUDA),0)
  USE_CUDA :=
else ifneq ($(NVCC),)
  USE_CUDA := 1
else ifeq ($(WITH_CUDA),1)
  $(error WITH_CUDA=1 but no nvcc was found; set NVCC=/path/to/nvcc)
endif

PKGS      := libzmq libprotobuf-c liburing inih
HAVE_SYSTEMD := $(shell pkg-config --exists libsystemd 2>/dev/null && echo 1)
ifeq ($(HAVE_SYSTEMD),1)
  PKGS += libsystemd
endif
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN      := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes
CFLAGS    ?= -O2 -g
# -ffp-contract=off: a*b+c is never fused into an FMA, so a result does not
# depend on which instruction set the compiler or target_clones picked.
# -fno-math-errno: sqrtf and friends never set errno (nothing reads it after
# a math call), so loops that take square roots vectorise (common/vec.h);
# no value changes.
ALL_CFLAGS := $(CFLAGS) $(WARN) -std=gnu11 -pthread -fPIC -MMD -MP -ffp-contract=off -fno-math-errno \
              -Iclient/include -Icommon -Ikernels -Iserver -Iclient/train -I$(BUILD)/proto $(PKG_CFLAGS) \
              -DGDDR_VERSION=\"$(VERSION)\"
LDLIBS    := $(PKG_LIBS) -lz -lm -pthread -ldl
ifeq ($(HAVE_SYSTEMD),1)
  ALL_CFLAGS += -DHAVE_LIBSYSTEMD
endif
ifneq ($(SANITIZER),)
  ALL_CFLAGS += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer
  LDFLAGS    += -fsanitize=$(SANITIZER)
endif

# No program and no library of the project links CUDA except the plugin
# $(BUILD)/lib/libgddr-cuda.so (kernels/cuda_*.c but the loader, and kernels/*.cu), which
# libgddr-client dlopen()s the first time a caller hands it device memory
# (kernels/cuda_loader.c). GDDR_HAVE_CUDA only tells the client library that
# a plugin was built, so it may look for one. The daemon and the tools link
# a CPU-only copy of the library (objects under $(BUILD)/cpu/), which never
# looks.
CPU_CFLAGS := $(ALL_CFLAGS)
ifeq ($(USE_CUDA),1)
  ALL_CFLAGS  += -DGDDR_HAVE_CUDA
  CUDA_CFLAGS := -I$(CUDA_HOME)/include
  CUDA_RPATH  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64
  CUDA_LIBS   := $(CUDA_RPATH) -lcublas -lcudart -lstdc++
  # -fmad=false: no multiply-add is fused on the GPU either (-ffp-contract=off
  # on the host), so kernels and CPU twins round alike.
  NVCCFLAGS   ?= -O3 -std=c++17 -arch=sm_$(CUDA_ARCH) -fmad=false -Xcompiler -fPIC \
                 -Xcompiler -fvisibility=hidden -Iclient/include -Icommon -Ikernels -DGDDR_HAVE_CUDA
endif

Q := @
ifeq ($(V),1)
  Q :=
endif

# ---- sources ---------------------------------------------------------------
PROTO_C    := $(BUILD)/proto/gddr.pb-c.c
PROTO_H    := $(BUILD)/proto/gddr.pb-c.h
COMMON_SRC := $(wildcard common/*.c)
PLUGIN_C   := kernels/cuda_rt.c kernels/cuda_err.c kernels/cuda_plugin.c
KERNEL_SRC := $(filter-out $(PLUGIN_C),$(wildcard kernels/*.c))
KERNEL_CU  := $(if $(USE_CUDA),$(wildcard kernels/*.cu))
CLIENT_SRC := $(wildcard client/src/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
TRAIN_SRC  := $(filter-out client/train/gddr-train.c,$(wildcard client/train/*.c))
TEST_SRC   := $(wildcard tests/check_*.c) tests/run_checks.c
BENCH_SRC  := $(wildcard tests/bench_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PROTO_O  := $(BUILD)/obj/proto/gddr.pb-c.o
COMMON_O := $(call obj,$(COMMON_SRC)) $(PROTO_O)
KERNEL_O := $(call obj,$(KERNEL_SRC))
PLUGIN_O := $(call obj,$(PLUGIN_C)) $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(KERNEL_CU))
CLIENT_O := $(call obj,$(CLIENT_SRC))
SERVER_O := $(call obj,$(SERVER_SRC))
TRAIN_O  := $(call obj,$(TRAIN_SRC))
TEST_O   := $(call obj,$(TEST_SRC))

CPU_O    := $(patsubst $(BUILD)/obj/%,$(BUILD)/cpu/obj/%,$(CLIENT_O) $(COMMON_O) $(call obj,$(KERNEL_SRC)))
CPU_A    := $(BUILD)/lib/libgddr-client-cpu.a
LIB_A    := $(BUILD)/lib/libgddr-client.a
LIB_SO   := $(BUILD)/lib/libgddr-client.so
PLUGIN_SO := $(if $(USE_CUDA),$(BUILD)/lib/libgddr-cuda.so)
# A stand-in plugin that runs the client's device path on the CPU, for the
# tests (tests/fake_cuda.c over the CPU twins); never installed.
FAKE_SO  := $(BUILD)/tests/libgddr-fakecuda.so
FAKE_O   := $(BUILD)/cpu/obj/tests/fake_cuda.o \
            $(patsubst %.c,$(BUILD)/cpu/obj/%.o,$(filter-out kernels/cuda_loader.c,$(KERNEL_SRC)) common/log.c)
SERVER_A := $(BUILD)/lib/libgddr-server.a
TRAIN_A  := $(BUILD)/lib/libgddr-train.a
BINS     := $(BUILD)/bin/gddr-ps $(BUILD)/bin/gddr-train $(BUILD)/bin/gddr-ctl \
            $(BUILD)/bin/gddr-keygen $(BUILD)/bin/gddr-bench
TESTBIN  := $(BUILD)/bin/gddr-tests
BENCHES  := $(patsubst tests/%.c,$(BUILD)/bin/%,$(BENCH_SRC))
# The manual pages, written once in scdoc (man/*.scd); gddr-ps.ini(5) gets
# its key list from the server's own table (gddr-ps --dump-config
# --markdown, through scripts/man-keys.sh), so it cannot drift from it.
SCDOC    ?= $(shell command -v scdoc 2>/dev/null)
MAN_SRC  := $(wildcard man/*.scd)
MANS     := $(patsubst man/%.scd,$(BUILD)/man/%,$(MAN_SRC))

.PHONY: all deps check demo install clean cuda-status bench soak soak-sync slurm-check config-table deb wheel man \
        plugin-path abi-check
all: cuda-status $(LIB_A) $(LIB_SO) $(PLUGIN_SO) $(FAKE_SO) $(BINS) $(TESTBIN) $(BENCHES) \
     $(BUILD)/gddr-client.pc $(if $(SCDOC),$(MANS))

cuda-status:
ifeq ($(USE_CUDA),1)
	@echo "✓ CUDA: building kernels with $(NVCC) for sm_$(CUDA_ARCH)"
else
	@echo "✗ CUDA: nvcc not found or WITH_CUDA=0; building the CPU kernels only"
endif

# ---- rules -----------------------------------------------------------------
# Keep every intermediate file (the tools' objects are made by a pattern
# rule only): deleting them made the second `make` relink three programs.
# scripts/run-checks.sh checks that a second make has nothing to do.
.SECONDARY:

# One protoc-c run makes both files: a grouped target (&:), so make runs it
# once. Two plain targets ran it twice in a fresh build, the second time after
# the client's objects were compiled, and a second make then rebuilt them.
$(PROTO_C) $(PROTO_H) &: proto/gddr.proto
	@mkdir -p $(BUILD)/proto
	@echo "  PROTOC $<"
	$(Q)protoc-c --c_out=$(BUILD)/proto --proto_path=proto $<

# blas.c's target_clones resolver is emitted at the end of the file, where
# GCC warns about a 32-byte vector ABI that no call ever uses (the vector
# helpers are always inlined).
$(BUILD)/obj/kernels/blas.o: ALL_CFLAGS += -Wno-psabi

# Everything may include the generated header, so it must exist first.
$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC     $<"
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(PROTO_O): $(PROTO_C) $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC     $<"
	$(Q)$(CC) $(ALL_CFLAGS) -Wno-shadow -c $< -o $@

$(BUILD)/cpu/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC     $< (cpu)"
	$(Q)$(CC) $(CPU_CFLAGS) -c $< -o $@

$(BUILD)/cpu/obj/proto/gddr.pb-c.o: $(PROTO_C) $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC     $< (cpu)"
	$(Q)$(CC) $(CPU_CFLAGS) -Wno-shadow -c $< -o $@

$(BUILD)/cpu/obj/kernels/blas.o: CPU_CFLAGS += -Wno-psabi
$(BUILD)/obj/kernels/cuda_rt.o $(BUILD)/obj/kernels/cuda_err.o $(BUILD)/obj/kernels/cuda_plugin.o: ALL_CFLAGS += $(CUDA_CFLAGS) -fvisibility=hidden
$(BUILD)/obj/tests/bench_kernels.o: ALL_CFLAGS += $(CUDA_CFLAGS)

$(CPU_A): $(CPU_O)
	@mkdir -p $(dir $@)
	@echo "  AR     $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC   $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB_A): $(CLIENT_O) $(COMMON_O) $(KERNEL_O)
	@mkdir -p $(dir $@)
	@echo "  AR     $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(CLIENT_O) $(COMMON_O) $(KERNEL_O) client/libgddr-client.map
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) -shared -Wl,-soname,libgddr-client.so.0 -Wl,--version-script=client/libgddr-client.map \
	  $(LDFLAGS) -o $@ $(filter %.o,$^) $(LDLIBS)

$(PLUGIN_SO): $(PLUGIN_O) kernels/libgddr-cuda.map
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) -shared -Wl,--version-script=kernels/libgddr-cuda.map -Wl,-Bsymbolic \
	  $(LDFLAGS) -o $@ $(filter %.o,$^) $(CUDA_LIBS) -pthread

$(FAKE_SO): $(FAKE_O) tests/fake_cuda.map
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) -shared -Wl,--version-script=tests/fake_cuda.map -Wl,-Bsymbolic \
	  $(LDFLAGS) -o $@ $(filter %.o,$^) -lm -pthread

$(SERVER_A): $(SERVER_O)
	@mkdir -p $(dir $@)
	@echo "  AR     $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(TRAIN_A): $(TRAIN_O)
	@mkdir -p $(dir $@)
	@echo "  AR     $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/gddr-ps: $(BUILD)/obj/server/main.o $(SERVER_A) $(CPU_A)
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/gddr-train: $(BUILD)/obj/client/train/gddr-train.o $(TRAIN_A) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The benchmark drives the server's apply pool in process as well.
$(BUILD)/bin/gddr-bench: $(BUILD)/obj/tools/gddr-bench.o $(BUILD)/obj/tools/bench_proc.o \
                     $(BUILD)/obj/tools/bench_raw.o $(BUILD)/obj/tools/bench_rows.o $(BUILD)/obj/tools/bench_gap.o \
                     $(BUILD)/obj/tools/bench_apply.o \
                     $(SERVER_A) $(CPU_A)
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/gddr-%: $(BUILD)/obj/tools/gddr-%.o $(CPU_A)
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(TESTBIN): $(TEST_O) $(SERVER_A) $(TRAIN_A) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(shell pkg-config --libs check) $(LDLIBS)

# bench_kernels times GPU kernels with CUDA events, so it alone links cudart
# (the kernels still come from the plugin).
$(BUILD)/bin/bench_%: $(BUILD)/obj/tests/bench_%.o $(SERVER_A) $(TRAIN_A) $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  LD     $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(if $(USE_CUDA),$(CUDA_RPATH) -lcudart)

$(BUILD)/man/%: man/%.scd
	@mkdir -p $(dir $@)
	@echo "  SCDOC  $<"
	$(Q)$(SCDOC) < $< > $@.tmp && mv $@.tmp $@

$(BUILD)/man/gddr-ps.ini.5: man/gddr-ps.ini.5.scd scripts/man-keys.sh $(BUILD)/bin/gddr-ps
	@mkdir -p $(dir $@)
	@echo "  SCDOC  $< (keys from gddr-ps --dump-config --markdown)"
	$(Q)$(BUILD)/bin/gddr-ps --dump-config --markdown > $@.md
	$(Q)scripts/man-keys.sh $< < $@.md | $(SCDOC) > $@.tmp && rm -f $@.md && mv $@.tmp $@

man: $(MANS)
ifeq ($(SCDOC),)
	@echo "man: scdoc not found (scripts/install-deps.sh installs it)" >&2; exit 1
endif

$(BUILD)/gddr-client.pc: Makefile
	@mkdir -p $(BUILD)
	@printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: gddr-client\nDescription: GDDR parameter-server client library\nVersion: %s\nRequires.private: libzmq libprotobuf-c inih\nLibs: -L$${libdir} -lgddr-client\nLibs.private: -lz -lm -pthread -ldl\nCflags: -I$${includedir}\n' \
	  '$(PREFIX)' '$(VERSION)' > $@

# ---- top-level jobs --------------------------------------------------------
deps:
	@scripts/install-deps.sh

check: deps
	@$(MAKE) --no-print-directory all
	@scripts/run-checks.sh

# A program built against the first gddr.h (tests/abi/v0/) runs on this
# library, and a struct larger than the library's is refused (make check
# runs it too, through scripts/run-checks.sh).
abi-check: all
	@tests/abi/run.sh

# make demo SERVERS=2: the model sharded over two gddr-ps.
SERVERS ?= 1
demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh --servers $(SERVERS)

bench: all
	@scripts/bench.sh

# An hour of faults against a sharded pair of gddr-ps (SOAK_S seconds;
# docs/soak.md). Not part of make check, which runs three minutes of it.
SOAK_S ?= 3600
soak: deps
	@$(MAKE) --no-print-directory all
	@SOAK_S=$(SOAK_S) /usr/bin/python3 scripts/soak.py --push-log always --baseline \
	  --max-rss-growth 0.01 --json $(BUILD)/soak.json

# The soak in sync mode (SOAK_SYNC_S seconds, default ten minutes;
# docs/soak.md "Sync mode"): make check runs a minute of it.
SOAK_SYNC_S ?= 600
soak-sync: deps
	@$(MAKE) --no-print-directory all
	@/usr/bin/python3 scripts/soaksync.py --seconds $(SOAK_SYNC_S) --json $(BUILD)/soaksync.json

# Debian packages of this build, made by debhelper from debian/ on a copy
# under $(BUILD)/debian-tree (scripts/make-deb.sh; make check lints them and
# installs them into a scratch root, scripts/test-deb.sh).
deb: all
	@scripts/make-deb.sh $(BUILD)

# The CUDA plugin this configuration builds, empty when none
# (scripts/make-deb.sh asks, to leave its package out or not).
plugin-path:
	@echo $(PLUGIN_SO)

# The Python package as a wheel with libgddr-client (and the CUDA plugin,
# when built) inside, installable offline with pip (scripts/make-wheel.sh;
# make check installs it into a venv, scripts/test-wheel.sh).
wheel: all
	@scripts/make-wheel.sh $(BUILD)

# README's configuration reference, written from the key tables
# (server/config.c, common/client_conf.c); `gddr-tests conf` fails when the
# README and the tables differ. Also docs/python.md's table of options, from
# the library's description of them (python/tests/test_layout.py checks it).
config-table: $(BUILD)/bin/gddr-ps $(LIB_SO)
	$(Q)$(BUILD)/bin/gddr-ps --dump-config --markdown > $(BUILD)/config-table.md
	$(Q)awk -v t=$(BUILD)/config-table.md '/^<!-- config-table begin/ { print; while ((getline l < t) > 0) print l; skip = 1; next } \
	  /^<!-- config-table end/ { skip = 0 } !skip' README.md > $(BUILD)/README.md.new
	$(Q)mv $(BUILD)/README.md.new README.md
	@echo "README.md: configuration table written from the key tables"
	$(Q)GDDR_LIB=$(LIB_SO) PYTHONPATH=python $(PYTHON) -c 'import re, gddr; p = "docs/python.md"; s = open(p).read(); \
	  open(p, "w").write(re.sub(r"(<!-- python-options begin.*?-->\n).*?(<!-- python-options end -->)", \
	  lambda m: m.group(1) + gddr.client._options_markdown() + m.group(2), s, flags=re.S))'
	@echo "docs/python.md: options table written from the library's option rows"

# scripts/slurm/gddr.sbatch on a throw-away one-node Slurm cluster (root;
# installs slurm-wlm and munge when missing). Not part of `make check`.
slurm-check: all
	@scripts/slurm/test-slurm.sh $(SERVERS)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig \
	  $(DESTDIR)$(PREFIX)/include/gddr $(DESTDIR)$(PREFIX)/share/gddr
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libgddr-client.so.0
	ln -sf libgddr-client.so.0 $(DESTDIR)$(LIBDIR)/libgddr-client.so
ifeq ($(USE_CUDA),1)
	install -d $(DESTDIR)$(PLUGINDIR)
	install -m 755 $(PLUGIN_SO) $(DESTDIR)$(PLUGINDIR)/
endif
	install -m 644 client/include/gddr/*.h $(DESTDIR)$(PREFIX)/include/gddr/
	# The .pc names the PREFIX and LIBDIR of this install, whatever PREFIX built it.
	sed -e 's|^prefix=.*|prefix=$(PREFIX)|' -e 's|^libdir=.*|libdir=$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))|' \
	  $(BUILD)/gddr-client.pc > $(DESTDIR)$(LIBDIR)/pkgconfig/gddr-client.pc
	chmod 644 $(DESTDIR)$(LIBDIR)/pkgconfig/gddr-client.pc
ifneq ($(SCDOC),)
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5
	install -m 644 $(filter %.1,$(MANS)) $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(filter %.5,$(MANS)) $(DESTDIR)$(MANDIR)/man5/
else
	@echo "install: scdoc not found: the manual pages are not installed"
endif
	install -m 644 config/*.ini config/*.service config/*.json $(DESTDIR)$(PREFIX)/share/gddr/
	# The local launcher as a command (S servers, W workers on this host).
	install -m 755 scripts/launch-local.sh $(DESTDIR)$(PREFIX)/bin/gddr-launch
	install -m 644 scripts/lib.sh $(DESTDIR)$(PREFIX)/share/gddr/lib.sh
ifneq ($(PYTHON_SITE),)
	install -d $(DESTDIR)$(PYTHON_SITE)/gddr $(DESTDIR)$(PREFIX)/share/gddr/examples
	install -m 644 python/gddr/*.py $(DESTDIR)$(PYTHON_SITE)/gddr/
	printf '"""Written by make install: where it put libgddr-client."""\nLIBDIR = "%s"\n' \
	  '$(LIBDIR)' > $(DESTDIR)$(PYTHON_SITE)/gddr/_install.py
	install -m 755 python/examples/*.py $(DESTDIR)$(PREFIX)/share/gddr/examples/
else
	@echo "install: $(PYTHON) not found: the gddr Python package is not installed"
endif

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj $(BUILD)/cpu/obj -name '*.d' 2>/dev/null)
