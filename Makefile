# The README's two commands are `make demo` and `make test`. Both install what is missing first.
JOBS ?= 2
MAKEFLAGS += --no-print-directory
CTEST_ARGS ?=

.PHONY: deps build demo test test-asan test-tsan test-clang test-hiredis12 tidy bench package format check-format clean

deps:
	@scripts/install-deps.sh

build: deps
	cmake --preset dev >/dev/null
	cmake --build --preset dev -j $(JOBS)

# The demo builds only what it runs: the library, the example and the throwaway-server runner.
demo: deps
	cmake --preset dev >/dev/null
	cmake --build --preset dev -j $(JOBS) --target shared_limit with-redis
	build/dev/tests/with-redis build/dev/examples/shared_limit

test: build
	ctest --preset dev $(CTEST_ARGS)

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan $(CTEST_ARGS)

test-tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan $(CTEST_ARGS)

test-clang:
	@scripts/install-deps.sh clang
	cmake --preset clang-cxx20 >/dev/null
	cmake --build --preset clang-cxx20 -j $(JOBS)
	ctest --preset clang-cxx20 $(CTEST_ARGS)

# Built by clang++ as C++20 against hiredis 1.2.0, fetched with npm and built into
# build/hiredis-1.2.0 (CI's clang and ThreadSanitizer suite; Debian 12 has 0.14.1): the whole
# suite but the package tests, under ThreadSanitizer.
test-hiredis12: deps
	@scripts/ci-hiredis12.sh

bench: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)
	scripts/run-bench.sh build/release

# build/package/libredlimit-dev_<version>_<arch>.deb: the shared library, Release, installed into
# /usr (CMakeLists.txt's CPack part says what it holds). The exporter is left out of it, so that the
# package does not depend on prometheus-cpp.
package: deps
	cmake -S . -B build/package -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_INSTALL_PREFIX=/usr \
	  -DREDLIMIT_BUILD_TESTS=OFF -DREDLIMIT_BUILD_EXAMPLES=OFF -DREDLIMIT_BUILD_BENCH=OFF \
	  -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON >/dev/null
	cmake --build build/package -j $(JOBS)
	cd build/package && cpack -G DEB

# clang-format-14 with the root's .clang-format: `make format` rewrites, `make check-format` checks (CI).
format:
	git ls-files '*.cpp' '*.hpp' | xargs clang-format-14 --style=file -i

check-format:
	@scripts/check-format.sh

# clang-tidy-14 with the root's .clang-tidy on every .cpp but the test files (CI); `scripts/check-tidy.sh --all` adds them, `--fix` applies fixes.
tidy:
	@scripts/install-deps.sh clang clang-tidy-14
	@scripts/check-tidy.sh

clean:
	rm -rf build
