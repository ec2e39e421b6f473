# Thin wrapper over CMake and CTest. `make run` and `make test` do all set-up themselves.
#   make setup   install what is missing (Debian packages; prints the command if not root)
#   make build   configure and build everything into $(BUILD_DIR)
#   make run     the chapter tour: every chapter program at its default shape, one table
#   make test    every test through CTest (GPU tests are skipped, with the reason, without a GPU)
#   make bench   fa_bench over the standard sweep + PyTorch SDPA when torch imports; CSV + table
#   make sanitize  (GPU) every kernel on small shapes under compute-sanitizer's four tools
#   make docs    the HTML site (Doxygen, offline MathJax) into $(BUILD_DIR)/docs/html
#   make handout DEST=dir   a student copy with the exercises of classroom/exercises.json stubbed
#   make grade   score the exercises with the grader's checker: results.json (Gradescope's schema)
#   make autograder  $(BUILD_DIR)/autograder.zip for Gradescope (CPU exercises; AUTOGRADER=path elsewhere);
#                WEEK=n (or CONFIG=path, a list of exercise ids) grades that week's exercises alone
#   make format  clang-format (Debian's, 14) every tracked *.cu/*.cuh/*.h/*.cpp in place, then the
#                docs' code blocks; `make format-check` (CI) only lists what is not formatted
BUILD_DIR ?= build
CMAKE_ARGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PYTHON ?= python3

.PHONY: all setup setup-docs configure build run test bench sanitize docs handout grade autograder format format-check clean

all: build

setup:
	@bash tools/setup.sh

setup-docs:
	@bash tools/setup.sh --docs

configure: setup
	cmake -S . -B $(BUILD_DIR) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	$(PYTHON) tools/tour.py --build-dir $(BUILD_DIR)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

bench: build
	bash tools/bench.sh $(BUILD_DIR)

docs: setup-docs
	$(PYTHON) tools/docs.py --out $(BUILD_DIR)/docs

sanitize: build
	bash tools/sanitize.sh $(BUILD_DIR)

handout:
	@test -n "$(DEST)" || { echo "make handout: give the folder to write, e.g. make handout DEST=/tmp/handout" >&2; exit 2; }
	$(PYTHON) classroom/handout.py $(DEST)

grade:
	$(PYTHON) classroom/grade.py --build-dir $(BUILD_DIR)/grade --out $(or $(RESULTS),results.json) --cmake-args="$(CMAKE_ARGS)" \
	  $(if $(CONFIG),--config $(CONFIG))

autograder:
	$(PYTHON) classroom/autograder.py --out $(or $(AUTOGRADER),$(BUILD_DIR)/autograder$(if $(WEEK),_week$(WEEK)).zip) \
	  $(if $(WEEK),--week $(WEEK)) $(if $(CONFIG),--config $(CONFIG))

format:
	bash tools/format.sh

format-check:
	bash tools/format.sh --check

clean:
	rm -rf $(BUILD_DIR)
