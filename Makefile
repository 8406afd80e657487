# condukt: build, test and set-up entry points.
#
#   make setup     install the Debian packages this project needs (apt, root)
#   make           build priv/condukt-egress
#   make test      every test tier this machine can run (README)
#   make demo      the main job (README)
#   make bench     benchmarks against direct, mitmproxy and Squid (bench/README.md)
#   make soak      the sidecar under mixed traffic for an hour (SOAK_MINUTES)
#   make bench-wakeups  the added latency at one request in flight, by CPU setting
#   make bench-events   the event text of one allowed request, CPU per request
#
# `mix compile` calls `make priv/condukt-egress` through the compiler step
# in mix.exs, so a project using :condukt as a dependency gets the binary.

VERSION := $(shell sed -n 's/^ *@version "\(.*\)"/\1/p' mix.exs)
ROOT := $(abspath .)

CC ?= cc
# libwebsockets and yaml-0.1: the Kubernetes client (c_src/kube/).
PKGS := jansson libuv openssl libwebsockets yaml-0.1
# HTTP/2 (docs/http2.md).
PKGS += libnghttp2
# These are computed when a recipe first needs them, not when the Makefile
# is read: `make setup demo` reads the Makefile before `setup` has
# installed the -dev packages. ($(call lazy,VAR,...) evaluates once, then
# keeps the value.)
lazy = $(eval $(1) := $(2))$($(1))
PKG_CFLAGS = $(call lazy,PKG_CFLAGS,$$(shell pkg-config --cflags $(PKGS) 2>/dev/null) -I$$(EI_DIR)/include)
PKG_LIBS = $(call lazy,PKG_LIBS,$$(shell pkg-config --libs $(PKGS) 2>/dev/null) -lunistring -L$$(EI_DIR)/lib -lei -lpthread)
# erl_interface (ei) ships with Erlang, not pkg-config: Debian's erlang-dev
# puts it under /usr/lib/erlang/lib/erl_interface-VSN. EI_DIR overrides.
EI_DIR ?= $(call lazy,EI_DIR,$$(lastword $$(sort $$(wildcard /usr/lib/erlang/lib/erl_interface-*))))

WARN := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wstrict-prototypes \
        -Wmissing-prototypes -Wvla -Wno-unused-parameter
BASE_CFLAGS = -std=c11 -D_GNU_SOURCE -g $(WARN) -Ic_src $(PKG_CFLAGS) \
        -DCE_VERSION='"$(VERSION)"' -MMD -MP
REL_CFLAGS = $(BASE_CFLAGS) -O2 -fstack-protector-strong -D_FORTIFY_SOURCE=2 -fPIE
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all \
        -fno-omit-frame-pointer
TEST_CFLAGS = $(BASE_CFLAGS) -O1 $(SAN_FLAGS) -Inative_test \
        -DCE_SOURCE_ROOT='"$(ROOT)"'

SRCS := $(shell find c_src -name '*.c' | sort)
LIB_SRCS := $(filter-out c_src/main.c,$(SRCS))
TEST_SRCS := $(shell find native_test -name '*.c' -not -path 'native_test/fuzz/*' | sort)

# BUILD can be moved (make BUILD=/tmp/b ...) so that two checkouts or two
# concurrent builds never write the same objects.
BUILD ?= build
REL_OBJS := $(SRCS:%.c=$(BUILD)/rel/%.o)
SAN_OBJS := $(LIB_SRCS:%.c=$(BUILD)/san/%.o) $(TEST_SRCS:%.c=$(BUILD)/san/%.o)

BIN := priv/condukt-egress
TEST_BIN := $(BUILD)/san/native_tests
# The same binary under ASan+UBSan: the end-to-end tier runs the proxy
# with it, so real clients and real traffic exercise the sanitizers too.
SAN_BIN := $(BUILD)/san/condukt-egress

# libFuzzer targets: native_test/fuzz/fuzz_NAME.c, each linked with the
# library sources, built with clang. `make fuzz-smoke` (part of `make test`)
# runs each for FUZZ_SMOKE_SECONDS from its seed corpus; `make fuzz` runs
# them for FUZZ_SECONDS each (docs/fuzzing.md).
FUZZ_CC ?= clang
FUZZ_SRCS := $(sort $(wildcard native_test/fuzz/fuzz_*.c))
FUZZ_BINS := $(FUZZ_SRCS:native_test/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/fuzz/obj/%.o)
FUZZ_CFLAGS = $(filter-out -MMD -MP,$(BASE_CFLAGS)) -O1 -Inative_test \
        -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
        -fno-omit-frame-pointer -DCE_FUZZING
FUZZ_SMOKE_SECONDS ?= 15
FUZZ_SECONDS ?= 600

# Link rules only see timestamps, so a source file that disappears would
# leave its object linked in. These stamps change whenever the object list
# does, and the links depend on them.
stamp = $(shell mkdir -p $(dir $(1)) && (echo '$(2)' | cmp -s - $(1) || echo '$(2)' > $(1)))$(1)
REL_STAMP := $(call stamp,$(BUILD)/rel/objects.list,$(REL_OBJS))
SAN_STAMP := $(call stamp,$(BUILD)/san/objects.list,$(SAN_OBJS))

.PHONY: all setup test c-test elixir-test fuzz-smoke fuzz demo mozilla-pem clean \
        check-build-deps check-test-deps
all: $(BIN)

# Before anything is compiled: is every tool and -dev package there? One
# line names the Debian packages that are missing (scripts/check-build-deps.sh).
check-build-deps:
	@sh scripts/check-build-deps.sh
check-test-deps:
	@sh scripts/check-build-deps.sh --test
# (mix's compiler step runs the check itself and passes SKIP_DEPS_CHECK=1,
# so that `make -q` can tell whether the binary is up to date.)
ifndef SKIP_DEPS_CHECK
$(REL_OBJS): | check-build-deps
$(SAN_OBJS) $(FUZZ_LIB_OBJS): | check-test-deps
endif
# `make setup demo`, `make setup test`: even under -j, nothing is checked or
# built before setup has installed the packages.
ifneq ($(filter setup,$(MAKECMDGOALS)),)
check-build-deps check-test-deps: | setup
endif

$(BIN): $(REL_OBJS) $(REL_STAMP)
	@mkdir -p $(dir $@)
	$(CC) -pie -Wl,-z,relro,-z,now -o $@ $(REL_OBJS) $(PKG_LIBS)

$(BUILD)/rel/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) -c -o $@ $<

$(BUILD)/san/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(TEST_CFLAGS) -c -o $@ $<

$(SAN_BIN): $(LIB_SRCS:%.c=$(BUILD)/san/%.o) $(BUILD)/san/c_src/main.o $(SAN_STAMP)
	$(CC) $(SAN_FLAGS) -o $@ $(LIB_SRCS:%.c=$(BUILD)/san/%.o) $(BUILD)/san/c_src/main.o $(PKG_LIBS)

# The test binary alone routes our objects' allocations through the
# fault injector of native_test/support/failalloc.c, and its name lookups
# through the resolver of native_test/support/resolver.c.
TEST_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=strndup \
        -Wl,--wrap=uv_getaddrinfo

$(TEST_BIN): $(SAN_OBJS) $(SAN_STAMP)
	$(CC) $(SAN_FLAGS) $(TEST_WRAP) -o $@ $(SAN_OBJS) $(PKG_LIBS) -lcriterion

# ASan and UBSan abort the test process (a failed test); LSan reports after
# the test was counted, so scripts/run-native-tests.sh also fails the run on
# any sanitizer report in the output.
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
           UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
           LSAN_OPTIONS=exitcode=23

c-test: $(TEST_BIN) $(BIN)
	$(SAN_ENV) CONDUKT_EGRESS_BIN=$(ROOT)/$(BIN) sh scripts/run-native-tests.sh $(TEST_BIN) --jobs 2

# -MMD -MP: a changed header (an inline function in it) rebuilds the
# objects and targets that include it.
$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/fuzz/%: native_test/fuzz/%.c $(FUZZ_LIB_OBJS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -MF $@.d -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJS) $(PKG_LIBS)

# Each target starts from its committed seeds (native_test/fuzz/corpus/NAME)
# and writes new inputs to a scratch copy, so the tree stays clean.
.SECONDARY: $(FUZZ_LIB_OBJS)

fuzz-smoke: $(FUZZ_BINS)
	sh scripts/run-fuzzers.sh $(FUZZ_SMOKE_SECONDS) $(FUZZ_BINS)

# `make fuzz` merges what it finds into the committed corpora (FUZZ_MERGE=0:
# not); FUZZ_TARGETS="fuzz_h2 fuzz_http1" runs only those.
FUZZ_MERGE ?= 1
FUZZ_TARGETS ?=
fuzz: $(FUZZ_BINS)
	FUZZ_MERGE=$(FUZZ_MERGE) sh scripts/run-fuzzers.sh $(FUZZ_SECONDS) \
	  $(if $(FUZZ_TARGETS),$(addprefix $(BUILD)/fuzz/,$(FUZZ_TARGETS)),$(FUZZ_BINS))

# Two ExUnit runs: everything but the Kubernetes tier first, while the
# tier's binaries and images build in the background on a cold cache
# (scripts/k8s/prebuild.sh), then the tier, once both scripts (which wait
# for that build) have printed their directories.
elixir-test: $(BIN) $(SAN_BIN)
	sh scripts/k8s/prebuild.sh
	MIX_ENV=test mix compile --warnings-as-errors --force
	mix format --check-formatted
	$(SAN_ENV) CONDUKT_EGRESS_SAN_BIN=$(ROOT)/$(SAN_BIN) MIX_ENV=test mix test --exclude kubernetes
	sh scripts/k8s/binaries.sh >/dev/null
	sh scripts/k8s/images.sh >/dev/null
	$(SAN_ENV) CONDUKT_EGRESS_SAN_BIN=$(ROOT)/$(SAN_BIN) MIX_ENV=test mix test --only kubernetes

# k8s-prebuild first: the Kubernetes tier's builds overlap every tier before it.
test: k8s-prebuild c-test fuzz-smoke virtual-test elixir-test

.PHONY: k8s-prebuild
k8s-prebuild: $(BIN)
	sh scripts/k8s/prebuild.sh

# The Virtual sandbox's crate: clippy (warnings are errors) and its unit
# tests. Without cargo (make setup installs one) it is skipped with the
# reason, or fails under CONDUKT_REQUIRE_ALL_TIERS=1, like every tier.
.PHONY: virtual-test
virtual-test:
	@if [ -x "$(CARGO)" ]; then $(MAKE) --no-print-directory virtual-nif-check; \
	elif [ "$$CONDUKT_REQUIRE_ALL_TIERS" = 1 ]; then \
	  echo "virtual tier required (CONDUKT_REQUIRE_ALL_TIERS=1) but cargo is missing (make setup)" >&2; exit 1; \
	else echo "virtual tier skipped: cargo is missing (make setup installs it)" >&2; fi

setup:
	sh scripts/setup-debian.sh
	sh scripts/k8s/setup-go.sh
	sh scripts/setup-rust.sh
	sh scripts/setup-llm.sh

# The demo has no use for the Virtual sandbox's NIF (minutes of Rust on a
# cold cache): CONDUKT_VIRTUAL=0 leaves it out of mix's compile step.
demo: $(BIN)
	CONDUKT_VIRTUAL=0 mix run scripts/demo.exs

# Container images, from Debian packages, without a registry or a daemon
# (scripts/image/build.sh, docs/image.md): `make image` writes the sidecar
# image as an OCI archive; IMAGE_LOAD=containerd (CONTAINERD_ADDRESS,
# namespace IMAGE_NAMESPACE, default k8s.io) or IMAGE_LOAD=podman also
# imports it.
IMAGE_ARCHIVE := $(BUILD)/image/condukt-egress.oci.tar
IMAGE_NAMESPACE ?= k8s.io
.PHONY: image
image: $(BIN)
	sh scripts/image/build.sh sidecar $(IMAGE_ARCHIVE)
	@ls -l $(IMAGE_ARCHIVE) | awk '{printf "image: %s, %.1f MiB\n", $$NF, $$5 / 1048576}'
ifeq ($(IMAGE_LOAD),containerd)
	ctr $(if $(CONTAINERD_ADDRESS),-a $(CONTAINERD_ADDRESS)) -n $(IMAGE_NAMESPACE) images import $(IMAGE_ARCHIVE)
else ifeq ($(IMAGE_LOAD),podman)
	podman load -i $(IMAGE_ARCHIVE)
else ifneq ($(IMAGE_LOAD),)
	@echo "image: IMAGE_LOAD must be containerd or podman, not '$(IMAGE_LOAD)'" >&2; exit 2
endif

# Benchmarks: the sidecar against direct, mitmproxy and Squid on the
# namespace testbed (bench/README.md). BENCH_ARGS=--quick for a short run.
.PHONY: bench soak
bench:
	sh bench/run.sh $(BENCH_ARGS)

# The soak: the sidecar under mixed traffic for SOAK_MINUTES, sampled, and
# failing when its RSS, descriptors or latency trend up (bench/README.md).
SOAK_MINUTES ?= 60
soak:
	sh bench/run.sh --soak --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

# The added latency at one request in flight under three CPU settings:
# how much of it is the wake-up of idle CPUs (bench/wakeups.exs).
.PHONY: bench-wakeups
bench-wakeups:
	sh bench/run.sh --wakeups $(WAKEUPS_ARGS)

# The TLS part of a proxied connection alone: heap per pair and handshake
# CPU, with and without upstream session resumption (bench/tls_pairs.c,
# bench/PROFILE.md).
BENCH_TLS := $(BUILD)/bench/tls_pairs
LIB_REL_OBJS := $(LIB_SRCS:%.c=$(BUILD)/rel/%.o)
$(BENCH_TLS): bench/tls_pairs.c $(LIB_REL_OBJS) $(REL_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -MMD -MP,$(REL_CFLAGS)) -DCE_SOURCE_ROOT='"$(ROOT)"' -pie -o $@ bench/tls_pairs.c $(LIB_REL_OBJS) $(PKG_LIBS)
.PHONY: bench-tls
bench-tls: $(BENCH_TLS) $(BIN)
	@d=$$(mktemp -d) && $(BIN) ca new --cert $$d/ca.pem --key $$d/ca.key >/dev/null && \
	  BENCH_TLS_DIR=$$d $(BENCH_TLS) 200 && BENCH_TLS_DIR=$$d $(BENCH_TLS) 200 resume; \
	  rc=$$?; rm -rf $$d; exit $$rc

# The event text of one allowed request, alone: CPU per request against
# the same event built with jansson (bench/events.c, bench/PROFILE.md).
BENCH_EVENTS := $(BUILD)/bench/events
$(BENCH_EVENTS): bench/events.c $(LIB_REL_OBJS) $(REL_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -MMD -MP,$(REL_CFLAGS)) -pie -o $@ bench/events.c $(LIB_REL_OBJS) $(PKG_LIBS)
.PHONY: bench-events
bench-events: $(BENCH_EVENTS)
	$(BENCH_EVENTS) $(EVENTS_N)

# Refresh the Mozilla root snapshot from Debian's ca-certificates package.
mozilla-pem:
	sh scripts/refresh-mozilla-pem.sh

clean:
	rm -rf build $(BIN) $(VIRTUAL_NIF) _build

-include $(REL_OBJS:.o=.d) $(SAN_OBJS:.o=.d) $(FUZZ_LIB_OBJS:.o=.d) $(FUZZ_BINS:=.d)

# ---- The Virtual sandbox's NIF (native/condukt_virtual, Rust) ------------------------
# Separate from `all`: nothing above depends on it. mix.exs calls
# `make virtual-nif` only when cargo is on the PATH; without it
# Condukt.Sandbox.Virtual reports :not_available and everything else works.
# Crates come from the Rust crate registry, pinned by the committed Cargo.lock;
# the target directory lives outside the checkout so CI can cache it.
# rustup puts cargo in ~/.cargo/bin, which a non-login shell may not have on PATH.
CARGO ?= $(or $(shell command -v cargo 2>/dev/null),$(HOME)/.cargo/bin/cargo)
CARGO_TARGET_DIR ?= $(HOME)/.cache/condukt/cargo
CARGO_JOBS ?=
VIRTUAL_CRATE := native/condukt_virtual
VIRTUAL_NIF := priv/condukt_virtual.so
VIRTUAL_SRCS := $(wildcard $(VIRTUAL_CRATE)/src/*.rs) $(VIRTUAL_CRATE)/Cargo.toml $(VIRTUAL_CRATE)/Cargo.lock
VIRTUAL_CARGO = CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) $(CARGO)

.PHONY: virtual-nif virtual-nif-check
virtual-nif: $(VIRTUAL_NIF)

$(VIRTUAL_NIF): $(VIRTUAL_SRCS)
	$(VIRTUAL_CARGO) build --release --locked $(CARGO_JOBS) --manifest-path $(VIRTUAL_CRATE)/Cargo.toml
	@mkdir -p priv
	cp $(CARGO_TARGET_DIR)/release/libcondukt_virtual.so $@.tmp && mv $@.tmp $@

# clippy with warnings as errors, and the crate's unit tests.
virtual-nif-check:
	$(VIRTUAL_CARGO) clippy --release --locked $(CARGO_JOBS) --manifest-path $(VIRTUAL_CRATE)/Cargo.toml -- -D warnings
	$(VIRTUAL_CARGO) test --release --locked $(CARGO_JOBS) --manifest-path $(VIRTUAL_CRATE)/Cargo.toml
