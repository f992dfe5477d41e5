// clang's thread-safety analysis (-Wthread-safety) for the library's locks: a Mutex and a
// SharedMutex that the analysis knows as capabilities, the scoped locks over them, and the
// attribute macros that say which mutex guards which member. Under g++ the macros are empty and
// the types are thin wrappers of std::mutex / std::shared_mutex, with the same cost.
//
// The attribute names are clang's (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html). The
// clang-cxx20 preset builds with -Werror=thread-safety.
//
// Waiting on a std::condition_variable: `cv.wait(lock.native(), pred)`. The analysis treats the
// lock as held throughout (the wait releases and re-takes it inside the standard library, where
// the analysis does not look). A predicate lambda is a function of its own to the analysis: one
// that reads guarded members starts with `mutex_.assertHeld();` (it runs with the lock held).
#pragma once

#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define REDLIMIT_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define REDLIMIT_THREAD_ANNOTATION(x)
#endif

#define REDLIMIT_CAPABILITY(x) REDLIMIT_THREAD_ANNOTATION(capability(x))
#define REDLIMIT_SCOPED_CAPABILITY REDLIMIT_THREAD_ANNOTATION(scoped_lockable)
#define REDLIMIT_GUARDED_BY(x) REDLIMIT_THREAD_ANNOTATION(guarded_by(x))
#define REDLIMIT_PT_GUARDED_BY(x) REDLIMIT_THREAD_ANNOTATION(pt_guarded_by(x))
#define REDLIMIT_REQUIRES(...) REDLIMIT_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REDLIMIT_REQUIRES_SHARED(...) REDLIMIT_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define REDLIMIT_ACQUIRE(...) REDLIMIT_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define REDLIMIT_ACQUIRE_SHARED(...) REDLIMIT_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define REDLIMIT_RELEASE(...) REDLIMIT_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define REDLIMIT_RELEASE_SHARED(...) REDLIMIT_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define REDLIMIT_RELEASE_GENERIC(...) REDLIMIT_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define REDLIMIT_TRY_ACQUIRE(...) REDLIMIT_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define REDLIMIT_EXCLUDES(...) REDLIMIT_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define REDLIMIT_ASSERT_CAPABILITY(x) REDLIMIT_THREAD_ANNOTATION(assert_capability(x))
#define REDLIMIT_RETURN_CAPABILITY(x) REDLIMIT_THREAD_ANNOTATION(lock_returned(x))
#define REDLIMIT_NO_THREAD_SAFETY_ANALYSIS REDLIMIT_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace redlimit::detail {

/// std::mutex, known to the analysis. Lockable, so std::lock_guard works too, but the analysis
/// follows only the scoped locks below.
class REDLIMIT_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() REDLIMIT_ACQUIRE() { m_.lock(); }
  void unlock() REDLIMIT_RELEASE() { m_.unlock(); }
  bool try_lock() REDLIMIT_TRY_ACQUIRE(true) { return m_.try_lock(); }
  /// Tells the analysis that the calling thread holds this mutex (a condition variable's
  /// predicate, which runs with it held); checks nothing at run time.
  void assertHeld() const REDLIMIT_ASSERT_CAPABILITY(this) {}

  /// The std::mutex itself, for a std::unique_lock a std::condition_variable can wait on.
  std::mutex& native() noexcept { return m_; }

 private:
  std::mutex m_;
};

/// std::shared_mutex, known to the analysis.
class REDLIMIT_CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() REDLIMIT_ACQUIRE() { m_.lock(); }
  void unlock() REDLIMIT_RELEASE() { m_.unlock(); }
  void lock_shared() REDLIMIT_ACQUIRE_SHARED() { m_.lock_shared(); }
  void unlock_shared() REDLIMIT_RELEASE_SHARED() { m_.unlock_shared(); }

 private:
  std::shared_mutex m_;
};

/// Holds a Mutex for its scope (std::lock_guard).
class REDLIMIT_SCOPED_CAPABILITY LockGuard {
 public:
  explicit LockGuard(Mutex& m) REDLIMIT_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~LockGuard() REDLIMIT_RELEASE() { m_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  Mutex& m_;
};

/// Holds a Mutex, may let it go and take it again (std::unique_lock), and lends itself to a
/// std::condition_variable through native().
class REDLIMIT_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& m) REDLIMIT_ACQUIRE(m) : lk_(m.native()) {}
  /// Takes over a Mutex the caller already holds (after a successful try_lock()).
  UniqueLock(Mutex& m, std::adopt_lock_t) REDLIMIT_REQUIRES(m) : lk_(m.native(), std::adopt_lock) {}
  ~UniqueLock() REDLIMIT_RELEASE() = default;
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() REDLIMIT_ACQUIRE() { lk_.lock(); }
  void unlock() REDLIMIT_RELEASE() { lk_.unlock(); }

  /// The std::unique_lock, for std::condition_variable::wait and the clocks' waitUntil.
  std::unique_lock<std::mutex>& native() noexcept { return lk_; }

 private:
  std::unique_lock<std::mutex> lk_;
};

/// Holds a SharedMutex exclusively for its scope.
class REDLIMIT_SCOPED_CAPABILITY WriteLock {
 public:
  explicit WriteLock(SharedMutex& m) REDLIMIT_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~WriteLock() REDLIMIT_RELEASE() { m_.unlock(); }
  WriteLock(const WriteLock&) = delete;
  WriteLock& operator=(const WriteLock&) = delete;

 private:
  SharedMutex& m_;
};

/// Holds a SharedMutex shared for its scope.
class REDLIMIT_SCOPED_CAPABILITY ReadLock {
 public:
  explicit ReadLock(SharedMutex& m) REDLIMIT_ACQUIRE_SHARED(m) : m_(m) { m_.lock_shared(); }
  ~ReadLock() REDLIMIT_RELEASE() { m_.unlock_shared(); }
  ReadLock(const ReadLock&) = delete;
  ReadLock& operator=(const ReadLock&) = delete;

 private:
  SharedMutex& m_;
};

}  // namespace redlimit::detail
