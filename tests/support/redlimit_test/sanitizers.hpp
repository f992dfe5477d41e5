#pragma once
// Which sanitizer a test binary is built with. g++ defines __SANITIZE_THREAD__ and
// __SANITIZE_ADDRESS__; clang 14 answers only __has_feature. Clang also links its sanitizer
// runtimes whole and static, their operator new among them, so a test binary built by clang under
// a sanitizer cannot replace the global operator new (see REDLIMIT_TEST_SANITIZER_OWNS_NEW).

#if defined(__SANITIZE_THREAD__)
#define REDLIMIT_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define REDLIMIT_TEST_TSAN 1
#endif
#endif
#ifndef REDLIMIT_TEST_TSAN
#define REDLIMIT_TEST_TSAN 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define REDLIMIT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REDLIMIT_TEST_ASAN 1
#endif
#endif
#ifndef REDLIMIT_TEST_ASAN
#define REDLIMIT_TEST_ASAN 0
#endif

// 1 where the sanitizer runtime defines operator new itself (clang's static runtimes): count
// allocations with __sanitizer_install_malloc_and_free_hooks there instead of a replacement.
#if defined(__clang__) && (REDLIMIT_TEST_TSAN || REDLIMIT_TEST_ASAN)
#define REDLIMIT_TEST_SANITIZER_OWNS_NEW 1
#else
#define REDLIMIT_TEST_SANITIZER_OWNS_NEW 0
#endif
